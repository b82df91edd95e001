"""GRPO with colocated vLLM (`--use_vllm true --vllm_mode colocate`); runs wherever vLLM imports."""
import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from swift.infer import InferRequest, RequestConfig  # noqa: E402
from swift.infer.transformers_engine import TransformersEngine  # noqa: E402
from swift.infer.vllm_engine import colocated_vllm_engine  # noqa: E402
from swift.model import load_model  # noqa: E402
from swift.template import get_template  # noqa: E402
from swift.tuners import prepare_model  # noqa: E402

PROMPTS = ["12+34=", "07+45=", "99+99="]


def greedy(engine):
    requests = [InferRequest(messages=[{"role": "user", "content": p}]) for p in PROMPTS]
    return [r.choices[0].token_ids for r in engine.infer(requests, RequestConfig(max_tokens=6))]


def test_weight_sync_makes_vllm_generate_like_the_trainer():
    from types import SimpleNamespace

    model, tokenizer, _ = load_model("builtin:tiny-chat")
    lora = SimpleNamespace(adapters=[], tuner_type="lora", lora_rank=4, lora_alpha=8, lora_dropout=0.0,
                           target_modules=["all-linear"])
    model = prepare_model(model, lora)
    template = get_template("chatml", tokenizer)
    engine = colocated_vllm_engine(model, template, gpu_memory_utilization=0.2, seed=0, enforce_eager=True)
    try:
        assert engine.engine.model_config.enforce_eager  # no torch.compile: the engine starts sooner on CPU
        with torch.no_grad():  # the trainer changes the adapters: vLLM must follow after a sync
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.add_(0.5 * torch.randn_like(p))
        reference = greedy(TransformersEngine(model, tokenizer, template, default_adapter="default"))
        assert greedy(engine) != reference  # stale weights before the sync
        engine.sync_weights(model)
        assert greedy(engine) == reference
    finally:
        engine.close()


@pytest.mark.parametrize("rlhf_type", ["grpo", "ppo"])
def test_online_rl_trains_with_colocated_vllm(tmp_path, rlhf_type):
    """GRPO, and PPO on the same loop (its critic beside the policy), sample with colocated vLLM."""
    from swift.pipelines.rlhf import rlhf_main

    group = ["--num_generations", "4"] if rlhf_type == "grpo" else []
    result = rlhf_main(["--rlhf_type", rlhf_type, "--model", "builtin:tiny-chat", "--dataset", "builtin:arith-sft#16",
                        "--reward_funcs", "accuracy", *group, "--per_device_train_batch_size", "8",
                        "--max_completion_length", "6", "--max_steps", "2", "--logging_steps", "1",
                        "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true",
                        "--use_vllm", "true", "--vllm_mode", "colocate", "--vllm_gpu_memory_utilization", "0.2",
                        "--vllm_enforce_eager", "true",
                        "--output_dir", str(tmp_path), "--add_version", "false"])
    assert result["global_step"] == 2
    logs = [json.loads(line) for line in open(tmp_path / "logging.jsonl")]
    assert all(r["completions/mean_length"] > 0 for r in logs if "reward" in r)
    if rlhf_type == "ppo":
        assert all("loss/value_avg" in r for r in logs if "loss" in r)
