"""The suite's fork server (tests/forkserver.py): a client whose server is still importing waits for
it and is forked, instead of paying the same imports again in a fresh interpreter; a client whose
server ended before it was ready runs fresh at once; what a test sets in the worker's environment
does not outlive it (tests/conftest.py `environment_restored`)."""
import os
import resource
import shutil
import subprocess
import sys
import tempfile

from tests.conftest import SWIFT, start_forkserver

# a command that imports transformers' training arguments before it stops: seconds of CPU when fresh
REFUSED = ["sft", "--no_such_flag", "1"]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def test_a_client_waits_for_its_server_and_is_forked():
    directory = tempfile.mkdtemp(prefix="swift-fork-")  # short: a socket path has at most 107 bytes
    proc, path = start_forkserver(directory)
    try:
        assert not os.path.exists(path + ".env")  # the server is importing the pipelines
        before = children_cpu()
        run = subprocess.run([*SWIFT, *REFUSED], env={**os.environ, "SWIFT_TEST_FORKSERVER": path},
                             capture_output=True, text=True, timeout=600)
        used = children_cpu() - before  # the client's own CPU: a forked `swift` is the server's child
        assert run.returncode != 0 and "--no_such_flag" in run.stderr.strip().splitlines()[-1], run.stderr[-2000:]
        assert os.path.exists(path + ".env")
        assert used < 1.0, f"the client used {used:.1f} s of CPU: it ran fresh"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(directory, ignore_errors=True)


def test_a_client_whose_server_ended_unready_runs_fresh(tmp_path):
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path = str(tmp_path / "swift.sock")
    with open(path + ".pid", "w") as f:  # as start_forkserver writes it, for a server that is gone
        f.write(ended.stdout.strip())
    before = children_cpu()
    run = subprocess.run([*SWIFT, *REFUSED], env={**os.environ, "SWIFT_TEST_FORKSERVER": path},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "--no_such_flag" in run.stderr.strip().splitlines()[-1], run.stderr[-2000:]
    assert children_cpu() - before >= 1.0  # the imports were made in the client's own (fresh) process


def test_what_a_test_sets_in_the_environment_is_gone_after_it():
    from tests.conftest import environment_kept

    before = dict(os.environ)
    with environment_kept():
        os.environ["HF_HOME"] = "/tmp/elsewhere"  # as gptqmodel's import sets it where it is unset
        os.environ.pop("SWIFT_TEST_FORKSERVER", None)
    assert dict(os.environ) == before
