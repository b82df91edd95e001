"""tests/built.py, which builds the suite's start models once for all xdist workers: two processes
asking at once build once; a second run with the same key reuses the build; a new key, or a build
that a test wrote into, is built again."""
import os
import subprocess
import sys

import pytest

from tests.built import ROOT, built, key_of

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


SESSION = """
import os, sys
from pathlib import Path
from tests.built import built

os.setsid()
def nice():
    return int(open("/proc/self/autogroup").read().split()[-1])

def build(out):
    (out / "during.txt").write_text(str(nice()))

print(nice(), open(built(Path(sys.argv[1]), "start", "k", build) / "during.txt").read(), nice())
"""


def test_a_build_runs_at_a_higher_session_priority_where_allowed(tmp_path):
    """In a session of its own (an xdist worker), a build raises the session's (autogroup's) priority
    while it runs and gives it back after; where the kernel or the user cannot, it runs as before."""
    if not os.path.exists("/proc/self/autogroup"):
        pytest.skip("this kernel has no autogroup scheduling")
    proc = subprocess.run([sys.executable, "-c", SESSION, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    before, during, after = map(int, proc.stdout.split())
    assert before == after == 0
    assert during == (-5 if os.geteuid() == 0 else 0)


def test_an_xdist_worker_leads_a_session_of_its_own():
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("not run by an xdist worker")
    assert os.getsid(0) == os.getpid()
