"""The suite's fork server (tests/forkserver.py): a client whose server is still importing waits for
it and is forked, instead of paying the same imports again in a fresh interpreter; a client whose
server ended before it was ready runs fresh at once; what a test sets in the worker's environment
does not outlive it (tests/conftest.py `environment_restored`)."""
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from tests.conftest import SWIFT, start_forkserver

# a command that imports transformers' training arguments before it stops: seconds of CPU when fresh
REFUSED = ["sft", "--no_such_flag", "1"]


def client(path: str) -> tuple[int, str, float]:
    """`swift REFUSED` as a client of the server at `path`: (exit code, stderr, the CPU seconds of the
    client's own process and what it waited for — not of a `swift` forked by the server)."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([*SWIFT, *REFUSED], env={**os.environ, "SWIFT_TEST_FORKSERVER": path},
                                stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)  # this process alone, whatever else the worker reaps
        err.seek(0)
        return os.waitstatus_to_exitcode(status), err.read().decode(errors="replace"), usage.ru_utime + usage.ru_stime


def test_a_client_waits_for_its_server_and_is_forked():
    import torch

    if torch.cuda.is_available():
        pytest.skip("where CUDA is available the server does not serve (CUDA cannot start again in a fork)")
    directory = tempfile.mkdtemp(prefix="swift-fork-")  # short: a socket path has at most 107 bytes
    proc, path = start_forkserver(directory)
    try:
        assert not os.path.exists(path + ".env")  # the server is importing the pipelines
        code, err, used = client(path)
        assert code != 0 and "--no_such_flag" in err.strip().splitlines()[-1], err[-2000:]
        assert os.path.exists(path + ".env")
        assert used < 1.0, f"the client used {used:.1f} s of CPU: it ran fresh"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize("how", ["reaped", "zombie"])
def test_a_client_whose_server_ended_unready_runs_fresh(tmp_path, how):
    from tests.forkserver import process_stat

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    start = process_stat(ended.pid)[1]
    if how == "reaped":
        ended.wait()
    else:  # ended, not yet waited for (as a worker's own server that stopped early)
        while process_stat(ended.pid)[0] != "Z":
            pass
    path = str(tmp_path / "swift.sock")
    with open(path + ".pid", "w") as f:  # as start_forkserver writes it
        f.write(f"{ended.pid} {start}")
    began = time.monotonic()
    try:
        code, err, used = client(path)
    finally:
        ended.wait()
    assert time.monotonic() - began < 250  # not the client's 300 s wait for a server that never comes
    assert code != 0 and "--no_such_flag" in err.strip().splitlines()[-1], err[-2000:]
    assert used >= 1.0  # the imports were made in the client's own (fresh) process


def test_what_a_test_sets_in_the_environment_is_gone_after_it(request):
    import ctypes

    from tests.conftest import c_environment, environment_kept

    assert "environment_restored" in request.fixturenames  # every test's (autouse)
    before = dict(os.environ)
    with environment_kept():
        os.environ["HF_HOME"] = "/tmp/elsewhere"  # as gptqmodel's import sets it where it is unset
        os.environ.pop("SWIFT_TEST_FORKSERVER", None)
        ctypes.CDLL(None).setenv(b"KMP_BLOCKTIME", b"200", 1)  # a native library's own setenv
        assert c_environment()[b"KMP_BLOCKTIME"] == b"200"
    assert dict(os.environ) == before
    assert c_environment() == dict(os.environb)
