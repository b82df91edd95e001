"""Shared fixtures: the built-in tiny model and tokenizer, built offline from the repo's assets."""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest

from tests.built import built, key_of, run_ahead

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The suite runs on every core with pytest-xdist (`-n auto`, set in pyproject.toml). Each worker, and
# every process it starts, gets its share of the cores as intra-op threads: one each on a 2-core
# machine, where that ran a sample of the suite faster than two threads per worker (docs/benchmarks.md). Set
# before torch is imported; a test that starts 2-rank runs sets its own.
# CORE_SHARE: the cores this worker may keep busy (all of them without xdist).
CORE_SHARE = max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("OMP_NUM_THREADS", str(CORE_SHARE))

# a key exported in the developer's shell would make every test server demand it (tests/deploy/test_keys.py
# sets its own)
os.environ.pop("SWIFT_API_KEY", None)

# xdist groups (`--dist loadgroup`): the tests of one group run one after another on one worker.
# Node-id prefix -> group. "ranks": runs of 2 ranks (or 2 nodes) on this machine's 2 cores; the others
# share a module-scoped server or run that would otherwise be started once per worker.
GROUPS = {
    "tests/pipelines/test_sharding.py": "ranks",
    "tests/pipelines/test_two_ranks.py": "ranks",
    "tests/pipelines/test_multi_node.py": "ranks",
    "tests/pipelines/test_train.py::test_two_rank_ddp_ends_in_sync": "ranks",
    "tests/eval/test_train_eval.py::test_two_ranks_share_the_questions": "ranks",
    "tests/cli/test_ms_swift_replay.py": "replay",  # its lines run CORE_SHARE at a time
    "tests/deploy/test_completions.py": "completions",
    "tests/deploy/test_hostile.py": "hostile",
    "tests/deploy/test_server.py": "deploy_server",
    "tests/deploy/test_tools.py": "tools",
    "tests/rollout/test_trl_env.py": "tools",  # the same trained tool-calling model
    "tests/deploy/test_conformance.py": "conformance",
    "tests/rollout/test_server.py": "rollout_server",
    "tests/eval/test_sample.py": "sample",
    "tests/infer/test_transformers_engine.py": "engine",
    "tests/app/test_console.py": "console",  # its runs train on one core while the browser and page use the other
    "tests/app/test_app.py": "app",
}


def pytest_configure(config):
    # `swift <command> --help` keeps its text in SWIFT_CACHE_HOME: here, not the user's ~/.cache
    os.environ["SWIFT_CACHE_HOME"] = str(config.cache.mkdir("swift-home"))


def pytest_collection_finish(session):
    """The test modules and what they import (the training stack) stay for the whole run: frozen out of
    the cyclic collector's full passes, which in-process training makes (as `swift` does after its
    imports: swift/cli/main.py)."""
    import gc

    gc.freeze()


# `swift` as a test's process (`[*SWIFT, "sft", ...]` where a test would run `python -m swift sft
# ...`): forked from this worker's fork server, which has imported the pipelines once
# (tests/forkserver.py), or `python -m swift` itself where the server cannot stand in for a fresh
# interpreter. Tests that look at the process itself (its memory, its imports) run `python -m swift`.
FORKSERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forkserver.py")
SWIFT = [sys.executable, "-S", FORKSERVER, "--"]


def start_forkserver(directory: str, env: dict | None = None):
    """A fork server (tests/forkserver.py) for this worker, ready in the background (its clients wait
    for it while it imports: on a CPU-bound run a fresh interpreter would pay the same imports again);
    returns the process and its socket path."""
    import subprocess

    path = os.path.join(directory, "swift.sock")
    proc = subprocess.Popen([sys.executable, FORKSERVER, path], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, cwd=directory)
    from tests.forkserver import process_stat

    with open(path + ".pid", "w") as f:  # whom a client waits for (tests/forkserver.py `client`)
        f.write(f"{proc.pid} {process_stat(proc.pid)[1]}")
    return proc, path


def forkserver_env(env: dict) -> tuple[dict, object]:
    """`env` for a script that runs `swift` from PATH (examples/*.sh), with a fork server of its own
    started with that environment (so that variables read at import time, such as
    ATEN_CPU_CAPABILITY, take effect) and waited for; returns the environment and the server."""
    import tempfile
    import time

    directory = tempfile.mkdtemp(prefix="swift-fork-")  # short: a socket path has at most 107 bytes
    bin_dir = os.path.join(directory, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    shim = os.path.join(bin_dir, "swift")
    with open(shim, "w") as f:
        f.write(f'#!/bin/sh\nexec "{sys.executable}" -S "{FORKSERVER}" -- "$@"\n')
    os.chmod(shim, 0o755)
    proc, path = start_forkserver(directory, env)
    deadline = time.time() + 300
    while not os.path.exists(path + ".env") and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    return {**env, "SWIFT_TEST_FORKSERVER": path, "PATH": bin_dir + os.pathsep + env.get("PATH", "")}, proc


@pytest.fixture(autouse=True)
def environment_restored():
    """Each test ends with the worker's environment as it began. A library imported in a test may set
    variables there (gptqmodel's tokenicer sets HF_HOME and three more, deepspeed
    PYTORCH_NVML_BASED_CUDA_CHECK): left in place they reach every later test's processes, and every
    later `swift` of this worker differed from its fork server in a variable read at import, so ran as a
    fresh interpreter (2026-12-07: 70 processes, ~700 s of CPU)."""
    with environment_kept():
        yield


@contextlib.contextmanager
def environment_kept():
    """os.environ as it was before the block, whatever the block set or removed; only what differs is
    set again (not PYTEST_CURRENT_TEST, which pytest itself moves on)."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for name in [k for k in os.environ if k not in saved and k != "PYTEST_CURRENT_TEST"]:
            del os.environ[name]
        for name, value in saved.items():
            if name != "PYTEST_CURRENT_TEST" and os.environ.get(name) != value:
                os.environ[name] = value
        # a native library may set the process's C environment itself (KMP_BLOCKTIME=200 appeared
        # there in the export tests), which os.environ does not see but a started process inherits
        for name, value in c_environment().items():
            if name not in os.environb:
                os.unsetenv(name)
            elif os.environb[name] != value:
                os.putenv(name, os.environb[name])


def c_environment() -> dict[bytes, bytes]:
    """The process's C `environ`, as a process started without `env=` inherits it."""
    import ctypes

    entries, out, i = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ"), {}, 0
    while entries[i] is not None:
        name, _, value = entries[i].partition(b"=")
        out[name] = value
        i += 1
    return out


@pytest.fixture(scope="session", autouse=True)
def forkserver(tmp_path_factory):
    import importlib.util
    import tempfile

    if importlib.util.find_spec("vllm") is not None:  # the vLLM environment: its engine starts its own
        yield None                                     # worker processes; every `swift` there is fresh
        return
    directory = tempfile.mkdtemp(prefix="swift-fork-")  # short: a socket path has at most 107 bytes
    proc, path = start_forkserver(directory)
    os.environ["SWIFT_TEST_FORKSERVER"] = path
    yield path
    import shutil

    os.environ.pop("SWIFT_TEST_FORKSERVER", None)
    proc.terminate()
    proc.wait(timeout=30)
    shutil.rmtree(directory, ignore_errors=True)


# the longest tests and groups, longest first (worker-seconds in a run on 2 cores, 2026-11-26: the
# ranks group 1,110, the learning checks 600, the replay 290, iterative DPO 290, sample 300)
LONGEST = ["tests/pipelines/test_sharding.py", "tests/test_iterative_dpo.py", "tests/rlhf/test_learning.py",
           "tests/eval/test_sample.py", "tests/cli/test_ms_swift_replay.py", "tests/rollout/test_server.py",
           "tests/safety/test_red_team.py"]


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker more than the cores this process may run on (xdist itself counts the
    machine's). Each worker computes on one thread, and a worker also waits (for a server to start, a
    build another worker holds the lock of, a timeout a test provokes): with one worker per core a
    clean CI run kept 1.29 of 2 cores busy on average (2026-11-27); a third worker fills those waits."""
    return len(os.sched_getaffinity(0)) + 1


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """Order the run for two workers: the quickstart's own check first (it builds the model that
    later checks start from), then the long groups and slow checks that do not need that model,
    the other independent tests, and last the tests that start from the quickstart, slow ones first.
    A worker that reaches a quickstart test early waits on the build's file lock (tests/built.py)."""
    for item in items:
        group = next((g for prefix, g in GROUPS.items() if item.nodeid.startswith(prefix)), None)
        if item.get_closest_marker("vllm"):  # one vLLM engine at a time: each takes every core
            group = "vllm"
        if group:
            item.add_marker(pytest.mark.xdist_group(group))

    def rank(item) -> tuple[int, int]:
        if item.nodeid.endswith("test_quickstart.py::test_quickstart_learns_addition"):
            return 0, 0
        later = 4 if "quickstart" in item.fixturenames else 1
        if item.get_closest_marker("xdist_group"):
            kind = later
        else:
            kind = later + (1 if item.get_closest_marker("slow") else 2)
        # within a kind, the longest first (so that no long test is left for one worker at the end)
        return kind, next((i for i, prefix in enumerate(LONGEST) if item.nodeid.startswith(prefix)), len(LONGEST))

    items.sort(key=rank)  # stable: collection order within a rank


@pytest.fixture(scope="session")
def tiny():
    from swift.model import load_model

    model, tokenizer, info = load_model("builtin:tiny-chat")
    return model, tokenizer, info


@pytest.fixture(scope="session")
def tokenizer(tiny):
    return tiny[1]


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, tiny):
    """The tiny model saved as an ordinary local HF directory."""
    path = tmp_path_factory.mktemp("tiny-chat")
    model, tokenizer, _ = tiny
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def save_perturbed(tiny, path, scale: float = 0.05) -> str:
    """The tiny model with seeded noise of `scale` on every weight, saved with its tokenizer at
    `path` (a teacher or reference that differs from the policy); returns the path."""
    import copy

    import torch

    model, tokenizer, _ = tiny
    other = copy.deepcopy(model)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(scale * torch.randn_like(p))
    other.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def train_argv(output_dir, *extra: str) -> list[str]:
    """A fast sft command line on the tiny model and built-in arithmetic data."""
    return ["--model", "builtin:tiny-chat", "--dataset", "builtin:arith-sft#64", "--output_dir", str(output_dir),
            "--max_steps", "4", "--per_device_train_batch_size", "4", "--logging_steps", "1",
            "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true", "--add_version", "false", *extra]


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_cache(config) -> Path:
    """Where `tests/built.py` keeps what it builds: pytest's cache folder (`--cache-clear` empties it)."""
    return Path(str(config.cache.mkdir("swift-built")))


def quickstart_key() -> str:
    return key_of(files=("examples/quickstart.sh",))


@pytest.fixture(scope="session")
def quickstart(request):
    """examples/quickstart.sh (pt then sft on built-in arithmetic), run once for all workers and kept
    for later runs while the code that trains it is unchanged (tests/built.py).

    Returns (its stdout, its output dir); learning checks of later stages (DPO, RM, GRPO) start
    from `<dir>/sft`. Set SWIFT_TEST_QUICKSTART to an existing output dir to reuse one."""
    reuse = os.environ.get("SWIFT_TEST_QUICKSTART")
    if reuse and os.path.exists(os.path.join(reuse, "sft", "result.json")):
        return None, reuse

    def build(out: Path) -> None:  # the script's default seed, whatever SEED this shell has
        env = {**{k: v for k, v in os.environ.items() if k != "SEED"}, "OUT": str(out / "qs"),
               # the script runs `swift`: this interpreter's, whether or not its environment is activated
               "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
        proc = run_ahead(["bash", os.path.join(ROOT, "examples", "quickstart.sh")], cwd=out, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (out / "stdout.txt").write_text(proc.stdout)

    out = built(build_cache(request.config), "quickstart", quickstart_key(), build)
    return (out / "stdout.txt").read_text(), str(out / "qs")


@pytest.fixture(scope="session")
def trained_model(request) -> str:
    """The quickstart's sft model, for a test that needs a trained model but not the weights of this
    process's kernel settings: the one the main (xdist) run built, whose workers run one intra-op
    thread each (a `-n 0` run such as the vLLM tests' has another key), else `quickstart`."""
    from tests.built import _intact

    if not os.environ.get("SWIFT_TEST_QUICKSTART"):
        with environment_kept():
            os.environ["OMP_NUM_THREADS"] = "1"
            key = quickstart_key()
        directory = build_cache(request.config) / f"quickstart-{key}"
        if _intact(directory):
            return str(directory / "qs" / "sft")
    return os.path.join(request.getfixturevalue("quickstart")[1], "sft")


# a reward that varies between completions (tests/plugins/text_length_reward.py)
TEXT_LENGTH = ["--reward_funcs", "text_length", "--external_plugins",
               os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugins", "text_length_reward.py")]
