"""tests/built.py, which builds the suite's start models once for all xdist workers: two processes
asking at once build once; a second run with the same key reuses the build; a new key, or a build
that a test wrote into, is built again."""
import os
import subprocess
import sys

import pytest

from tests.built import ROOT, built, key_of, run_ahead

ASK = """
import sys, time
from pathlib import Path
from tests.built import built

def build(out):
    with open(sys.argv[2], "a") as log:
        log.write("built\\n")
    time.sleep(2)  # long enough for the other process to ask meanwhile
    (out / "model.txt").write_text("weights")

print(built(Path(sys.argv[1]), "start", sys.argv[3], build))
"""


def ask(cache, log, key):
    return subprocess.Popen([sys.executable, "-c", ASK, str(cache), str(log), key], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_two_processes_build_once_and_a_later_run_reuses_it(tmp_path):
    log = tmp_path / "builds.log"
    first, second = ask(tmp_path / "cache", log, "k1"), ask(tmp_path / "cache", log, "k1")
    paths = {first.communicate()[0].strip(), second.communicate()[0].strip()}
    assert first.returncode == second.returncode == 0
    assert paths == {str(tmp_path / "cache" / "start-k1")}
    assert log.read_text() == "built\n"
    assert ask(tmp_path / "cache", log, "k1").communicate()[0].strip() in paths  # a later run
    assert log.read_text() == "built\n"


def test_a_new_key_or_an_altered_build_is_built_again(tmp_path):
    calls = []

    def build(out):
        calls.append(out)
        (out / "model.txt").write_text("weights")

    one = built(tmp_path, "start", "k1", build)
    (one / "model.txt").write_text("changed by a test")
    assert built(tmp_path, "start", "k1", build) == one and len(calls) == 2
    assert (one / "model.txt").read_text() == "weights"
    two = built(tmp_path, "start", "k2", build)
    assert len(calls) == 3 and two != one and one.exists()  # the newest other key stays
    built(tmp_path, "start", "k3", build)
    assert len(calls) == 4 and two.exists() and not one.exists()  # older ones go


def test_the_key_follows_the_code_the_flags_and_the_kernels(monkeypatch):
    base = key_of("--lr 1e-3", files=("examples/quickstart.sh",))
    assert key_of("--lr 1e-3", files=("examples/quickstart.sh",)) == base
    assert key_of("--lr 2e-3", files=("examples/quickstart.sh",)) != base
    assert key_of("--lr 1e-3", files=("examples/iterative_dpo.sh",)) != base
    monkeypatch.setenv("MKL_CBWR", os.environ.get("MKL_CBWR", "") + "-other")
    assert key_of("--lr 1e-3", files=("examples/quickstart.sh",)) != base


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_run_ahead_runs_a_build_in_a_session_of_its_own_at_a_raised_priority():
    """The quickstart's build runs in a session of its own, whose (autogroup) priority is raised where
    the kernel and the user allow it (probed here the same way, on another process)."""
    if not os.path.exists("/proc/self/autogroup"):
        pytest.skip("this kernel has no autogroup scheduling")
    probe = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        with open(f"/proc/{probe.pid}/autogroup", "w") as f:
            f.write("-5")
        allowed = True
    except OSError:
        allowed = False
    finally:
        probe.kill()
        probe.wait()
    proc = run_ahead([sys.executable, "-c", "import os; print(os.getsid(0), open('/proc/self/autogroup').read())"])
    assert proc.returncode == 0, proc.stderr
    sid, _, nice_word, nice = proc.stdout.split()
    assert int(sid) not in (os.getsid(0), 0) and nice_word == "nice"
    assert int(nice) == (-5 if allowed else 0)


def test_an_interrupted_build_stops_every_process_of_its_session(tmp_path):
    """Outside the terminal's session a Ctrl-C would not reach the build's processes: when the caller
    is interrupted (here: a timeout), run_ahead stops all of them, not only the one it started."""
    pidfile = tmp_path / "pid"
    script = f'sh -c "echo \\$\\$ > {pidfile}; exec sleep 300"; sleep 300'
    with pytest.raises(subprocess.TimeoutExpired):
        run_ahead(["bash", "-c", script], timeout=5)
    grandchild = int(pidfile.read_text())
    assert not _alive(grandchild)


TERMINATED = """
import sys
from tests.built import run_ahead

run_ahead(["bash", "-c", sys.argv[1]])
"""


def test_a_terminated_caller_stops_its_builds_processes(tmp_path):
    """SIGTERM (or SIGHUP) to the caller, which before reached the build only when sent to the whole
    process group, stops the build's processes too, and the caller exits as terminated."""
    import signal
    import time

    pidfile = tmp_path / "pid"
    script = f'sh -c "echo \\$\\$ > {pidfile}; exec sleep 300"; sleep 300'
    caller = subprocess.Popen([sys.executable, "-c", TERMINATED, script], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.time() + 60
    while not (pidfile.exists() and pidfile.read_text().strip()) and time.time() < deadline:
        time.sleep(0.1)
    grandchild = int(pidfile.read_text())
    caller.send_signal(signal.SIGTERM)
    assert caller.wait(timeout=30) == 128 + signal.SIGTERM
    assert not _alive(grandchild)
