"""`swift rollout` as a real server process: endpoints, exact weight sync, faults, GRPO server mode."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import requests
import torch

from swift.infer.protocol import RequestConfig
from swift.infer.transformers_engine import TransformersEngine
from swift.model import load_model
from swift.pipelines.rlhf import rlhf_main
from swift.rollout import client as client_module
from swift.rollout.client import RolloutClient
from swift.rollout.multi_turn import RolloutInferRequest
from swift.template import get_template
from swift.utils.registry import SwiftError
from tests.conftest import ROOT, train_argv
from tests.deploy.serving import free_port, serve, start


@pytest.fixture(scope="module")
def server():
    """Two data-parallel TransformersEngine workers on the built-in tiny model."""
    with serve("rollout", "--model", "builtin:tiny-chat", "--data_parallel_size", "2", health="/health/") as base:
        yield base


def port_of(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


def perturbed_model(seed: int):
    model, tokenizer, _ = load_model("builtin:tiny-chat")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model, tokenizer


PROMPTS = [RolloutInferRequest(messages=[{"role": "user", "content": f"What is {i} + {2 * i}?"}]) for i in range(5)]


def test_endpoints(server):
    assert requests.get(server + "/health/").json() == {"status": "ok", "weights": "complete"}
    assert requests.get(server + "/get_world_size/").json() == {"world_size": 2}
    info = requests.post(server + "/get_engine_type/").json()
    assert info["engine_type"] == "TransformersEngine" and info["enable_multi_turn"] is False
    # TRL's /generate/: one prompt_ids per prompt, n completions per prompt, a log-prob per token
    out = requests.post(server + "/generate/", json={"prompts": ["1+1=", "2+2=", "3+3="], "n": 2, "max_tokens": 5,
                                                     "temperature": 1.0}).json()
    assert len(out["prompt_ids"]) == 3 and len(out["completion_ids"]) == 6
    assert [len(lp) for lp in out["logprobs"]] == [len(c) for c in out["completion_ids"]]
    # ms-swift's /infer/: n choices per request, each with token ids and a loss mask
    body = {"infer_requests": [{"messages": r.messages} for r in PROMPTS],
            "request_config": {"n": 3, "max_tokens": 6, "temperature": 1.0}}
    outputs = requests.post(server + "/infer/", json=body).json()
    assert len(outputs) == 5 and all(len(o["choices"]) == 3 for o in outputs)
    choice = outputs[0]["choices"][0]
    assert choice["response_token_ids"] == choice["completion_ids"]
    assert len(choice["response_loss_mask"]) == len(choice["completion_ids"]) and choice["message"]["role"] == "assistant"


def test_max_completion_length_caps_a_single_turn_answer(server):
    """/infer/'s max_completion_length is the completion's budget on a server without a multi-turn
    scheduler too (before 2026-11-29 only multi-turn read it)."""
    body = {"infer_requests": [{"messages": r.messages} for r in PROMPTS[:2]], "max_completion_length": 3,
            "request_config": {"n": 2, "max_tokens": 40, "temperature": 1.0}}
    outputs = requests.post(server + "/infer/", json=body).json()
    lengths = [len(c["completion_ids"]) for o in outputs for c in o["choices"]]
    assert len(lengths) == 4 and max(lengths) <= 3, lengths


def test_weight_sync_is_exact_after_many_syncs(server):
    client = RolloutClient(port=port_of(server), timeout=60, bucket_mb=0.25)  # several buckets
    try:
        for seed in range(3):
            model, tokenizer = perturbed_model(seed)
            client.sync_weights(model)  # raises unless every worker's checksum equals ours, bucket by bucket
        # generation on the server now equals generation with the trainer's weights, token for token
        local = TransformersEngine(model, tokenizer, get_template("jinja", tokenizer))
        config = RequestConfig(max_tokens=12, temperature=0.0)
        remote = client.rollout(PROMPTS, config, 1)
        mine = [r.choices[0].token_ids for r in local.infer([local_request(local, p) for p in PROMPTS], config)]
        assert [t.completion_ids[:len(m)] for t, m in zip(remote, mine)] == mine
        # the comparison is real: a trainer whose checksum differs stops with one line naming the server
        original = client_module.checksum
        client_module.checksum = lambda tensors: original(tensors) + 1
        try:
            with pytest.raises(SwiftError, match="checksum mismatch"):
                client.sync_weights(model)
        finally:
            client_module.checksum = original
        # a sync abandoned after its first bucket (the trainer closed the communicator on the mismatch):
        # nothing is generated from a mix of weights (before 2026-11-29 the server answered from it)
        # until a sync completes
        assert requests.get(server + "/health/").json() == {"status": "ok", "weights": "partial"}
        for path, body in (("/infer/", {"infer_requests": [{"messages": PROMPTS[0].messages}]}),
                           ("/generate/", {"prompts": ["1+1="], "max_tokens": 2})):
            answer = requests.post(server + path, json=body)
            assert answer.status_code == 503 and answer.json()["error"]["code"] == "weights_partial", answer.text
        client.sync_weights(model)
        assert requests.get(server + "/health/").json()["weights"] == "complete"
        remote = client.rollout(PROMPTS, config, 1)
        assert [t.completion_ids[:len(m)] for t, m in zip(remote, mine)] == mine
    finally:
        client.close()


def local_request(engine, prompt):
    from swift.infer.protocol import InferRequest

    return InferRequest(input_ids=engine.template.encode_continuation(prompt.messages))


def test_second_trainer_gets_409_until_the_first_leaves(server):
    model, _ = perturbed_model(0)
    first = RolloutClient(port=port_of(server), timeout=60)
    first.sync_weights(model)
    second = RolloutClient(port=port_of(server), timeout=60)
    with pytest.raises(SwiftError, match="409.*already holds the weight-sync communicator"):
        second.init_communicator()
    first.close()
    second.sync_weights(model)
    # a trainer that dies without closing: its store stops listening, and the next trainer may join
    second.group.close()
    second.group = None
    import gc
    gc.collect()
    third = RolloutClient(port=port_of(server), timeout=60)
    third.sync_weights(model)
    third.close()


def test_a_trainer_gone_mid_sync_leaves_no_half_updated_model_serving(server):
    """A trainer that loaded one bucket and died (its store stops listening, nothing closed): the
    next generation request finds it gone and is refused with 503 until another trainer completes a
    sync (before 2026-11-29 the mix of weights was served)."""
    import gc

    from swift.rollout.client import sync_state_dict

    model, _ = perturbed_model(5)
    trainer = RolloutClient(port=port_of(server), timeout=60)
    trainer.init_communicator()
    trainer._send(sync_state_dict(model, getattr(torch, trainer.info["dtype"]))[:1])  # one bucket, loaded
    assert requests.get(server + "/health/").json()["weights"] == "partial"
    trainer.group.close()  # it dies without a word
    trainer.group = None
    gc.collect()
    answer = requests.post(server + "/generate/", json={"prompts": ["1+1="], "max_tokens": 2})
    assert answer.status_code == 503 and "is gone" in answer.json()["error"]["message"], answer.text
    other = RolloutClient(port=port_of(server), timeout=60)
    other.sync_weights(model)
    other.close()
    assert requests.post(server + "/generate/", json={"prompts": ["1+1="], "max_tokens": 2}).status_code == 200


@pytest.mark.parametrize("path,body", [
    ("/update_named_param/", {"name": "model.norm.weight", "dtype": "torch.float32", "shape": [7]}),
    ("/update_named_param/", {"name": "model.norm.weight", "dtype": "torch.int8", "shape": [128]}),
    ("/update_named_param/", {"name": "no.such.weight", "dtype": "float32", "shape": [128]}),
    ("/update_named_param/", {"name": "model.norm.weight", "dtype": "float32", "shape": "128"}),
    ("/update_flattened_params/", {"metadatas": [{"name": "model.norm.weight", "dtype": "float32", "shape": [128],
                                                  "start_idx": 5, "end_idx": 133, "numel": 128}]}),
    ("/update_flattened_params/", {"metadatas": "x"}),
    ("/infer/", {"infer_requests": [{"messages": "hi"}]}),
    ("/infer/", {"infer_requests": [{"messages": [{"role": "user", "content": "hi"}]}],
                 "request_config": {"temperature": -1}}),
    ("/generate/", {"prompts": [3]}),
    ("/generate/", {"prompts": ["1+1="], "min_p": 0.1}),
    ("/init_communicator/", {"host": "127.0.0.1", "port": 0}),
])
def test_bad_requests_get_4xx_and_the_server_keeps_serving(server, path, body):
    response = requests.post(server + path, json=body)
    assert 400 <= response.status_code < 500, response.text
    assert "message" in response.json()["error"]
    assert requests.post(server + "/infer/", data=b"{not json").status_code == 400
    assert requests.get(server + "/health/").status_code == 200


def grpo_server_argv(out, port, *extra):
    return train_argv(out, "--rlhf_type", "grpo", "--dataset", "builtin:arith-sft#64", "--reward_funcs",
                      "tests.rollout.test_server:digit_reward", "--num_generations", "2",
                      "--per_device_train_batch_size", "8", "--max_completion_length", "8", "--temperature", "0",
                      "--advantage_estimator", "reinforce", "--learning_rate", "5e-3", "--beta", "0.04",
                      "--vllm_server_port", str(port), *extra)


def colocated(argv: list[str]) -> list[str]:
    """The same run without a rollout server: no --vllm_server_port (refused there: nothing reads it)."""
    i = argv.index("--vllm_server_port")
    return argv[:i] + argv[i + 2:]


def digit_reward(completions, **kwargs):
    """Varies between prompts even for the untrained model's greedy answers: digits count double."""
    return [(len(set(c)) + sum(ch.isdigit() for ch in c)) / max(len(c), 1) for c in completions]


def curves(out):
    with open(os.path.join(out, "logging.jsonl")) as f:
        rows = [json.loads(line) for line in f if '"loss"' in line]
    return [r["reward"] for r in rows], [r["loss"] for r in rows]


def test_grpo_server_mode_matches_colocate(server, tmp_path):
    """Greedy rollouts (with a batch baseline, so they still carry a signal): the rewards and losses of
    server mode equal colocate mode's, step by step, over several weight syncs."""
    rlhf_main(colocated(grpo_server_argv(tmp_path / "colocate", port_of(server), "--max_steps", "4")))
    rlhf_main(grpo_server_argv(tmp_path / "server", port_of(server), "--max_steps", "4", "--rollout_mode", "server"))
    rewards_c, loss_c = curves(tmp_path / "colocate")
    rewards_s, loss_s = curves(tmp_path / "server")
    assert len(rewards_c) == 4
    assert len({round(r, 6) for r in rewards_c}) > 1  # the weights moved and the rollouts changed with them
    assert rewards_s == pytest.approx(rewards_c, abs=1e-6)
    assert loss_s == pytest.approx(loss_c, rel=1e-3, abs=1e-6)


def ppo_server_argv(out, port, *extra):
    return train_argv(out, "--rlhf_type", "ppo", "--dataset", "builtin:arith-sft#64", "--reward_funcs",
                      "tests.rollout.test_server:digit_reward", "--per_device_train_batch_size", "8",
                      "--max_completion_length", "8", "--temperature", "0", "--learning_rate", "5e-3",
                      "--num_ppo_epochs", "1", "--max_steps", "4", "--vllm_server_port", str(port), *extra)


def test_ppo_server_mode_matches_colocate(server, tmp_path):
    """PPO on the same loop: its greedy rollouts come from the server after each weight sync, and its
    rewards and losses (policy and critic) equal colocate mode's."""
    rlhf_main(colocated(ppo_server_argv(tmp_path / "colocate", port_of(server))))
    rlhf_main(ppo_server_argv(tmp_path / "server", port_of(server), "--rollout_mode", "server"))
    rewards_c, loss_c = curves(tmp_path / "colocate")
    rewards_s, loss_s = curves(tmp_path / "server")
    assert len(rewards_c) == 4 and len({round(r, 6) for r in rewards_c}) > 1
    assert rewards_s == pytest.approx(rewards_c, abs=1e-6)
    assert loss_s == pytest.approx(loss_c, rel=1e-3, abs=1e-6)


@pytest.mark.parametrize("rlhf_type", ["grpo", "ppo"])
def test_async_generate_logs_importance_sampling(server, tmp_path, rlhf_type):
    """Each rollout is sampled while the previous batch trains: the samples are one update behind,
    and the importance-sampling correction shows it (PPO: on the same loop, with its critic)."""
    argv = grpo_server_argv if rlhf_type == "grpo" else ppo_server_argv
    rlhf_main(argv(tmp_path, port_of(server), "--max_steps", "4", "--rollout_mode", "server",
                   "--async_generate", "true", "--temperature", "1.0"))
    with open(tmp_path / "logging.jsonl") as f:
        rows = [json.loads(line) for line in f if '"loss"' in line]
    assert len(rows) == 4
    for name in ("min", "mean", "max"):
        assert all(f"sampling/importance_sampling_ratio/{name}" in r for r in rows)
    # from the second rollout on, samples come from the weights one update behind: ratios move off 1
    later = rows[1:]
    assert max(r["sampling/importance_sampling_ratio/max"] for r in later) > 1.0
    assert all(r["sampling/importance_sampling_ratio/min"] > 0 for r in rows)
    if rlhf_type == "ppo":
        assert all("loss/value_avg" in r for r in rows)


def test_server_killed_mid_training_then_resume(tmp_path):
    port = free_port()
    # a fresh process: the test kills its process group
    base, proc = start("rollout", "--model", "builtin:tiny-chat", port=port, health="/health/", fresh=True)
    out = tmp_path / "run"
    argv = grpo_server_argv(out, port, "--max_steps", "30", "--rollout_mode", "server", "--temperature", "1.0",
                            "--save_strategy", "steps", "--save_steps", "2", "--vllm_server_timeout", "20")
    trainer = subprocess.Popen([sys.executable, "-m", "swift", "rlhf", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 180
        while not (out / "checkpoint-2").is_dir():
            assert trainer.poll() is None and time.time() < deadline, trainer.stderr.read() if trainer.poll() else ""
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)  # the whole server: HTTP process and workers
        killed = time.time()
        _, err = trainer.communicate(timeout=60)
        assert trainer.returncode != 0
        assert time.time() - killed < 40  # within --vllm_server_timeout (plus shutdown), never a hang
        last = err.strip().splitlines()[-1]
        assert f"rollout server http://127.0.0.1:{port}" in last, err[-2000:]
    finally:
        if trainer.poll() is None:
            trainer.kill()
    # a fresh server on the same port, and the run resumes from its last checkpoint
    checkpoints = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    with serve("rollout", "--model", "builtin:tiny-chat", port=port, health="/health/"):
        argv = grpo_server_argv(out, port, "--max_steps", str(checkpoints[-1] + 2), "--rollout_mode", "server",
                                "--temperature", "1.0", "--resume_from_checkpoint",
                                str(out / f"checkpoint-{checkpoints[-1]}"))
        result = rlhf_main(argv)
    assert result["global_step"] == checkpoints[-1] + 2


def test_server_mode_without_a_server_fails_fast_naming_it(tmp_path):
    port = free_port()
    start_time = time.time()
    with pytest.raises(SwiftError, match=f"rollout server http://127.0.0.1:{port} is not reachable"):
        rlhf_main(grpo_server_argv(tmp_path, port, "--rollout_mode", "server", "--vllm_server_timeout", "3"))
    assert time.time() - start_time < 30


def test_async_generate_needs_a_server(tmp_path):
    with pytest.raises(SwiftError, match="--async_generate needs a rollout server"):
        rlhf_main(grpo_server_argv(tmp_path, 1, "--async_generate", "true"))


def test_use_vllm_server_refuses_a_server_without_vllm(server, tmp_path):
    with pytest.raises(SwiftError, match="runs TransformersEngine"):
        rlhf_main(grpo_server_argv(tmp_path, port_of(server), "--use_vllm", "true", "--vllm_mode", "server"))


def test_multi_turn_scheduler_runs_in_the_server_worker(quickstart):
    """The worker a server runs (here in process): a gym scheduler's turns and loss masks. The
    quickstart's sft model answers the sum and ends its turn, so the environment replies; what it
    says to "higher" is out of its training, so a later turn may end on the length limit instead."""
    from swift.pipelines.rollout import RolloutArguments
    from swift.rollout.worker import _Worker

    args = RolloutArguments(model=os.path.join(quickstart[1], "sft"), multi_turn_scheduler="gym",
                            gym_env="guess_number", max_turns=3)
    worker = _Worker(args, 0)
    assert worker.info()["enable_multi_turn"] is True
    # the quickstart's own prompt format: a question put otherwise is out of its training, and what the
    # model answers to it changed with the summation order of its training loss
    out = worker.infer([{"messages": [{"role": "user", "content": "12+30="}], "data_dict": {"solution": "999"}}],
                       {"max_tokens": 8, "temperature": 0.0}, 2, 64)
    assert len(out) == 2
    for t in out:
        assert t["turns"] >= 2, t["messages"]  # the hidden number is not the sum: the environment answered
        assert t["messages"][2] == {"role": "user", "content": "higher"}
        assert t["turns"] == 3 or t["truncated"], t  # a trajectory ends on max_turns or on the length limit
        assert 0 in t["loss_mask"] and 1 in t["loss_mask"]  # environment replies carry no loss
        assert t["response_loss_mask"] == t["loss_mask"]
    # a row the environment cannot start from is the request's fault (the server answers 400), found
    # before anything is generated; it used to fail after generation, a 500 for the whole call
    with pytest.raises(SwiftError, match=r"infer_requests\[1\]: environment GuessNumber cannot start from this row"):
        worker.infer([{"messages": [{"role": "user", "content": "1+1="}], "data_dict": {"solution": "3"}},
                      {"messages": [{"role": "user", "content": "1+1="}], "data_dict": {"solution": "\\boxed{11}"}}],
                     {"max_tokens": 8, "temperature": 0.0}, 2, 64)


@pytest.mark.parametrize("metadatas,message", [
    ([{"name": "w", "dtype": "float32", "shape": [4], "start_idx": 0, "end_idx": 4.0}], "end_idx must be an integer"),
    ([{"name": "w", "dtype": "float32", "shape": [4], "start_idx": 0, "end_idx": 4},
      {"name": "w", "dtype": "float32", "shape": [4], "start_idx": 4, "end_idx": 8}], "'w' appears twice in one bucket"),
    ([{"name": "w", "dtype": "float32", "shape": [4], "start_idx": 1, "end_idx": 5}], "do not describe 4 contiguous"),
])
def test_a_bucket_that_would_load_wrongly_is_refused_before_anything_is_received(metadatas, message):
    """(the server answers these with 400, holding the communicator; a repeated name was loaded twice
    and a float end_idx failed in the worker before 2026-11-29)"""
    from swift.rollout.weight_sync import validate_metadata

    with pytest.raises(ValueError, match=message):
        validate_metadata(metadatas, {"w": [4], "v": [4]})
    assert validate_metadata([{"name": "w", "dtype": "float32", "shape": [4], "start_idx": 0, "end_idx": 4},
                              {"name": "v", "dtype": "float32", "shape": [4], "start_idx": 4, "end_idx": 8}],
                             {"w": [4], "v": [4]}) == torch.float32


@pytest.mark.parametrize("argv,message", [
    (["--task_type", "seq_cls"], "--task_type seq_cls: swift rollout generates text (causal_lm)"),
    (["--num_labels", "3"], "--num_labels applies to --task_type seq_cls / token_cls"),
    (["--truncation_strategy", "left"], "--truncation_strategy left says what happens to a prompt over --max_length"),
    (["--max_length", "64", "--truncation_strategy", "left"],
     "--max_length caps prompts this command encodes; swift rollout does not cap prompts"),
    (["--loss_scale", "all"], "--loss_scale applies to training (which tokens get loss); this command only generates"),
    # before 2026-12-07 the server ran single-turn, or without the environment
    (["--max_turns", "3"], "--max_turns does nothing without --multi_turn_scheduler (the server would run single-turn"),
    (["--gym_env", "guess_number"], "--gym_env does nothing without --multi_turn_scheduler"),
    (["--multi_turn_scheduler", "math_tip_trick", "--gym_env", "guess_number"],
     "--gym_env names the environment of --multi_turn_scheduler gym; --multi_turn_scheduler math_tip_trick does not "
     "read it: drop --gym_env"),
])
def test_flags_a_generation_server_does_not_read_are_refused(argv, message):
    """(before 2026-11-29 `swift rollout --task_type seq_cls` started and served a causal LM)"""
    from swift.arguments.parser import parse_args
    from swift.pipelines.rollout import RolloutArguments

    with pytest.raises(SwiftError, match="^" + re.escape(message)):
        parse_args(RolloutArguments, ["--model", "builtin:tiny-chat", *argv])


def test_the_multi_turn_flags_where_they_are_read_pass():
    from swift.arguments.parser import parse_args
    from swift.pipelines.rollout import RolloutArguments

    for argv in (["--multi_turn_scheduler", "gym", "--gym_env", "guess_number", "--max_turns", "3"],
                 ["--multi_turn_scheduler", "math_tip_trick", "--max_turns", "2"]):
        parse_args(RolloutArguments, ["--model", "builtin:tiny-chat", *argv])


def test_a_bucket_that_failed_after_loading_keeps_the_model_refused():
    """The server's bookkeeping of a sync's buckets, as the workers' answers arrive: a bucket that
    failed after reaching the engines leaves them half-updated, and a later bucket that reached none
    (another trainer's group that never formed) does not clear that; only a completed sync does."""
    import asyncio
    import concurrent.futures

    from swift.rollout.server import RolloutServer
    from swift.rollout.weight_sync import NothingLoaded
    from swift.serving.errors import RequestError

    def answer(error=None):
        f = concurrent.futures.Future()
        f.set_exception(error) if error else f.set_result(1)
        return f

    server = object.__new__(RolloutServer)  # its state alone: no worker processes
    server.communicator, server.sync_error = {"token": "t1", "host": "127.0.0.1", "port": 1}, None
    server.weights_partial, server.weights_abandoned, server.buckets_loaded = True, False, 0
    server._on_sync_done(answer(RuntimeError("checksum allgather failed")), "t1", "receive")  # after its load
    assert server.communicator is None and server.weights_partial and server.weights_abandoned
    server.communicator = {"token": "t2", "host": "127.0.0.1", "port": 1}  # the next trainer
    server.buckets_loaded = 0
    server._on_sync_done(answer(NothingLoaded("could not form")), "t2", "receive")
    assert server.weights_partial and server.weights_abandoned
    with pytest.raises(RequestError, match="half-updated weights"):
        asyncio.run(server.check_weights())
    # a bucket that reached no engine, in a sync that loaded nothing before: the weights are untouched
    server.communicator, server.weights_partial, server.weights_abandoned = {"token": "t3"}, True, False
    server._on_sync_done(answer(NothingLoaded("could not form")), "t3", "receive")
    assert not server.weights_partial and server.communicator is None
    asyncio.run(server.check_weights())  # serves
