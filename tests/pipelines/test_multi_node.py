"""Multi-node launch as users do it, on one machine: two `swift` launchers as two nodes (`NNODES=2`,
`NODE_RANK=0|1`, `MASTER_ADDR=127.0.0.1`, `MASTER_PORT`), one gloo rank each, compute what one node
with two ranks computes (logged losses and final weights after two plain-SGD steps, equal within
1e-6); a node that never joins, or dies mid-run, ends the other with one line within the rendezvous
timeout instead of a hang."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import SWIFT, TEXT_LENGTH, train_argv
from tests.deploy.serving import free_port

CASES = {
    "sft": ["sft", "--tuner_type", "full"],
    "grpo": ["rlhf", "--tuner_type", "full", "--rlhf_type", "grpo", "--dataset", "builtin:arith-sft#16", *TEXT_LENGTH,
             "--num_generations", "2", "--temperature", "1", "--max_completion_length", "6"],
}


def launch(out, node: int | None, port: int, command: str, *extra: str, steps: int = 2,
           timeout: str = "60", fresh: bool = True) -> subprocess.Popen:
    """`swift <command>` as node `node` of 2 (one rank), or as one node of 2 ranks (node None); not
    `fresh`: forked from the worker's fork server."""
    log = f"{out}.node{node}.stderr"  # a file, not a pipe: a node never stalls on output nobody reads
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "RDZV_TIMEOUT": timeout, "SWIFT_TEST_NODE": log}  # the mark kill_node finds its processes by
    env.update(NPROC_PER_NODE="2") if node is None else env.update(NNODES="2", NODE_RANK=str(node),
                                                                    NPROC_PER_NODE="1")
    argv = train_argv(out, "--optim", "sgd", "--learning_rate", "0.1", "--lr_scheduler_type", "constant",
                      "--max_steps", str(steps), *extra)
    with open(log, "w") as err:
        swift = [sys.executable, "-m", "swift"] if fresh else SWIFT
        proc = subprocess.Popen([*swift, command, *argv], env=env, stdout=subprocess.DEVNULL, stderr=err)
    proc.log = log
    return proc


def kill_node(proc: subprocess.Popen) -> None:
    """SIGKILL a node: its launcher, torchrun and the ranks torchrun started in sessions of their own —
    the launcher's process tree, and every process started with the node's mark in its environment (a
    forked launcher is the fork server's child, not the client's, and its torchrun runs in a session of
    its own; the ranks it forks through the server die with their clients)."""
    parents, marked = {}, set()
    mark = f"SWIFT_TEST_NODE={proc.log}".encode()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    marked.add(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    tree, grew = {proc.pid} | marked, True
    while grew:
        found = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree, grew = tree | found, bool(found)
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, str]:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_node(proc)
        pytest.fail(f"still running after {timeout} s: {open(proc.log).read()[-3000:]}")
    return proc.returncode, open(proc.log).read()


def results(out) -> tuple[list[dict], dict]:
    with open(os.path.join(out, "logging.jsonl")) as f:
        logs = [r for r in map(json.loads, f) if "loss" in r]
    return logs, load_file(os.path.join(out, "model.safetensors"))


@pytest.mark.parametrize("case", list(CASES))
def test_two_nodes_equal_one_node_with_two_ranks(tmp_path, case):
    command, *extra = CASES[case]
    code, err = finish(launch(tmp_path / "one", None, free_port(), command, *extra, fresh=False))
    assert code == 0, err[-6000:]
    port = free_port()
    nodes = [launch(tmp_path / f"node{n}", n, port, command, *extra, fresh=False) for n in (0, 1)]
    try:
        for proc in nodes:
            code, err = finish(proc)
            assert code == 0, err[-6000:]
    finally:
        for proc in nodes:
            if proc.poll() is None:
                kill_node(proc)
    (one_logs, one), (two_logs, two) = results(tmp_path / "one"), results(tmp_path / "node0")
    assert not os.path.exists(tmp_path / "node1" / "model.safetensors")  # global rank 0 saves
    assert len(one_logs) == len(two_logs) == 2
    for a, b in zip(one_logs, two_logs):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6, abs=1e-6)
    assert one.keys() == two.keys()
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-6, atol=1e-6, msg=name)
    if case == "grpo":
        assert one_logs[1]["loss"] != 0


def test_a_node_that_never_joins_ends_the_other_with_one_line(tmp_path):
    port, started = free_port(), time.time()
    code, err = finish(launch(tmp_path, 0, port, "sft", timeout="10"), timeout=300)
    assert code != 0
    assert err.strip().splitlines()[-1] == (
        f"swift sft: error: node 0 of 2 ends (exit code {code}): a rank failed, or a node died or did not join "
        f"within RDZV_TIMEOUT=10 s (master 127.0.0.1:{port})")
    assert "1/2 clients joined" in err
    assert time.time() - started < 10 + 120  # the timeout, plus starting Python and torch under load


def test_a_node_that_dies_mid_run_ends_the_other_with_one_line(tmp_path):
    port = free_port()
    nodes = [launch(tmp_path / f"node{n}", n, port, "sft", "--tuner_type", "full", steps=100000, fresh=False)
             for n in (0, 1)]  # forked: kill_node must find a forked node's torchrun and ranks
    log = tmp_path / "node0" / "logging.jsonl"
    deadline = time.time() + 300
    try:
        while not (log.exists() and '"loss"' in log.read_text()):  # both nodes are training
            assert nodes[0].poll() is None and nodes[1].poll() is None and time.time() < deadline
            time.sleep(0.2)
        kill_node(nodes[1])
        killed = time.time()
        code, err = finish(nodes[0], timeout=120)
    finally:
        for proc in nodes:
            if proc.poll() is None:
                kill_node(proc)
    assert code != 0
    assert err.strip().splitlines()[-1].startswith("swift sft: error: node 0 of 2 ends (exit code "), err[-3000:]
    assert "Connection closed by peer" in err or "Connection reset by peer" in err, err[-3000:]  # the lost node
    assert time.time() - killed < 120
