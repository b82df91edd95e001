"""`NPROC_PER_NODE=2 swift rlhf` (torchrun, gloo): two ranks with half the batch each compute what
one rank with the whole batch does, for the statistics a loss takes over the batch: KTO's KL
baseline, batch-scaled advantages, the entropy threshold and dapo's token count. Compared after
two plain-SGD steps: logged losses (4 significant digits) and weights (atol 1e-5)."""
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import SWIFT, TEXT_LENGTH, train_argv


def run(out, nproc: int, batch: int, *extra, lr: str = "0.1") -> tuple[list[dict], dict]:
    from tests.deploy.serving import free_port

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if nproc > 1:
        env.update(NPROC_PER_NODE=str(nproc), MASTER_PORT=str(free_port()))
    argv = train_argv(out, "--tuner_type", "full", "--optim", "sgd", "--learning_rate", lr, "--max_steps", "2",
                      "--lr_scheduler_type", "constant", "--per_device_train_batch_size", str(batch), *extra)
    proc = subprocess.run([*SWIFT, "rlhf", *argv], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    with open(os.path.join(out, "logging.jsonl")) as f:
        logs = [r for r in map(json.loads, f) if "loss" in r]
    return logs, load_file(os.path.join(out, "model.safetensors"))


def assert_same_run(tmp_path, keys, *extra, lr="0.1"):
    logs1, w1 = run(tmp_path / "one", 1, 8, *extra, lr=lr)
    logs2, w2 = run(tmp_path / "two", 2, 4, *extra, lr=lr)
    assert len(logs1) == len(logs2) == 2
    for a, b in zip(logs1, logs2):
        for key in ["loss", *keys]:
            assert b[key] == pytest.approx(a[key], rel=1e-3, abs=1e-5), key
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=1e-5, atol=1e-5, msg=name)
    return logs1


def test_kto_kl_baseline_is_the_global_batch_s(tmp_path):
    logs = assert_same_run(tmp_path, ["kl"], "--rlhf_type", "kto", "--dataset", "builtin:arith-kto#16", lr="1.0")
    assert logs[1]["kl"] > 0  # the policy moved: the baseline is exercised in step 2


def test_grpo_batch_statistics_are_the_global_batch_s(tmp_path, quickstart):
    # greedy sampling, so both layouts draw the same completions: from the quickstart's sft model,
    # whose answers are confident (an untrained model's near-ties flip with the batch shape)
    sft = os.path.join(quickstart[1], "sft")
    logs = assert_same_run(tmp_path, ["reward"], "--model", sft, "--rlhf_type", "grpo",
                           "--dataset", "builtin:arith-sft#16",
                           *TEXT_LENGTH, "--num_generations", "2", "--temperature", "0",
                           "--max_completion_length", "6", "--advantage_estimator", "reinforce", "--top_entropy_quantile", "0.5", "--loss_type", "dapo")
    assert logs[0]["loss"] != 0  # the advantages are not all zero


def test_grpo_with_unscored_rows_on_two_ranks_equals_one_rank(tmp_path, quickstart):
    # completions with a 7 get no reward: the ranks' micro-batches hold different numbers of
    # rows that carry loss; grpo's per-row mean divides by every row (as TRL), so 2 ranks × 4 rows
    # equal 1 rank × 8 (dividing by the rows with loss did not)
    sft = os.path.join(quickstart[1], "sft")
    logs = assert_same_run(tmp_path, ["reward"], "--model", sft, "--rlhf_type", "grpo",
                           "--dataset", "builtin:arith-sft#16", "--reward_funcs", "text_length_sevens_unscored",
                           "--external_plugins", TEXT_LENGTH[-1], "--num_generations", "2", "--temperature", "0",
                           "--max_completion_length", "6", "--loss_type", "grpo", "--advantage_estimator", "reinforce",
                           "--log_completions", "true")
    assert logs[0]["loss"] != 0  # batch-whitened advantages: greedy completions of a prompt are alike
    with open(tmp_path / "one" / "completions.jsonl") as f:
        rewards = [json.loads(line)["reward"] for line in f]
    assert 0 < sum(r is None for r in rewards) < len(rewards)  # some rows, not all, got no reward (null)


@pytest.mark.parametrize("backbone", ["separate", "shared"])
def test_ppo_policy_and_critic_match_one_rank(tmp_path, quickstart, backbone):
    # greedy rollouts of the quickstart's sft model (as above); the critic (a separate model, or a
    # value head on the policy's backbone) has its gradients averaged over ranks by the trainer: its
    # weights must match the one-rank run's too
    sft = os.path.join(quickstart[1], "sft")
    assert_same_run(tmp_path, ["objective/scores", "loss/value_avg", "val/var_explained"], "--model", sft,
                    "--rlhf_type", "ppo", "--critic_backbone", backbone, "--dataset", "builtin:arith-sft#16",
                    *TEXT_LENGTH, "--temperature", "0", "--max_completion_length", "6", "--num_ppo_epochs", "1",
                    "--kl_coef", "0.1")
    saved = os.path.join("critic", "model.safetensors") if backbone == "separate" else "value_head.safetensors"
    one, two = load_file(os.path.join(tmp_path / "one", saved)), load_file(os.path.join(tmp_path / "two", saved))
    if backbone == "shared":
        assert set(one) == {"weight", "bias"}
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-5, atol=1e-5, msg=name)


def test_harmless_on_two_ranks_equals_one_rank(tmp_path, quickstart):
    # RePULSe with its proposal (a copy): the policy's loss divides by every rank's P·N samples, the
    # proposal's gradients are averaged over ranks by the trainer; greedy rollouts of the quickstart's
    # sft model (as above), a reward with some unscored rows
    sft = os.path.join(quickstart[1], "sft")
    logs = assert_same_run(tmp_path, ["reward", "loss/neg", "loss/proposal"], "--model", sft, "--rlhf_type",
                           "harmless", "--dataset", "builtin:arith-sft#16", "--reward_funcs",
                           "text_length_sevens_unscored", "--external_plugins", TEXT_LENGTH[-1], "--num_generations",
                           "2", "--temperature", "0", "--max_completion_length", "6", "--target_dist_beta", "-0.5",
                           "--alpha", "0.5", "--actor_learning_rate", "1e-3", "--beta", "0.1", "--save_negdata",
                           "--save_negdata_threshold", "1000")
    assert logs[0]["loss/neg"] != 0
    # every rank's samples reach the one file rank 0 writes
    saved = [{(tuple(r["prompt_ids"]), tuple(r["completion_ids"])) for r in map(json.loads, open(tmp_path / run /
                                                                                               "negdata.jsonl"))}
             for run in ("one", "two")]
    assert saved[0] and saved[0] == saved[1]


def test_harmless_proposal_step_on_two_ranks_equals_one_rank(tmp_path):
    """The proposal's gradients are summed over ranks and divided by every rank's rows: one step of q
    on the same sampled negatives (tests/pipelines/proposal_ranks.py), split over 2 gloo ranks, moves
    q's weights as one rank with all of them does, and both ranks end equal."""
    from tests.deploy.serving import free_port

    script = os.path.join(os.path.dirname(__file__), "proposal_ranks.py")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    runs = {"one": [sys.executable, script],
            "two": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                    str(free_port()), script]}
    for name, argv in runs.items():
        proc = subprocess.run([*argv, str(tmp_path / name)], env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-6000:]
    one = json.load(open(tmp_path / "one" / "proposal_step-rank0.json"))
    two = [json.load(open(tmp_path / "two" / f"proposal_step-rank{rank}.json")) for rank in (0, 1)]
    assert two[0]["rewards"] + two[1]["rewards"] == one["rewards"]  # the same samples in both layouts
    assert len(set(one["rewards"])) > 1  # the samples differ: the proposal's loss is not 0
    for part in two:  # the logged loss is the global mean on every rank
        assert abs(one["loss/proposal"]) > 1e-4
        assert part["loss/proposal"] == pytest.approx(one["loss/proposal"], rel=1e-4)
    w1 = load_file(tmp_path / "one" / "proposal-rank0.safetensors")
    for rank in (0, 1):
        w2 = load_file(tmp_path / "two" / f"proposal-rank{rank}.safetensors")
        for name in w1:
            torch.testing.assert_close(w2[name], w1[name], rtol=1e-5, atol=1e-6, msg=f"rank {rank}: {name}")
