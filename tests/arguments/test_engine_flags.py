"""vLLM's own flags are refused by every command that builds an engine when that engine is not vLLM
(before 2026-11-29 only `swift infer` refused them; deploy, eval, sample, app and rollout ignored
them)."""
import pytest

from swift.pipelines.app import AppArguments
from swift.pipelines.base import resolve_args
from swift.pipelines.deploy import DeployArguments
from swift.pipelines.eval import EvalArguments
from swift.pipelines.rollout import RolloutArguments
from swift.pipelines.sample import SampleArguments
from swift.utils.registry import SwiftError

COMMANDS = {
    "deploy": (DeployArguments, []),
    "eval": (EvalArguments, ["--eval_dataset", "arith"]),
    "app": (AppArguments, []),
    "rollout": (RolloutArguments, []),
    "sample": (SampleArguments, ["--dataset", "rows.jsonl"]),
}
VLLM_FLAGS = [["--vllm_max_model_len", "256"], ["--vllm_enforce_eager", "true"],
              ["--vllm_gpu_memory_utilization", "0.5"]]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("flag", VLLM_FLAGS, ids=lambda f: f[0])
def test_vllm_flags_are_refused_with_the_transformers_engine(command, flag):
    cls, extra = COMMANDS[command]
    with pytest.raises(SwiftError, match=f"^{flag[0]} is read by the vllm engine only \\(this run uses transformers; --infer_backend vllm"):
        resolve_args(cls, ["--model", "tiny", *extra, *flag], f"swift {command}")


@pytest.mark.parametrize("command", COMMANDS)
def test_vllm_flags_are_taken_with_the_vllm_engine(command):
    cls, extra = COMMANDS[command]
    engine = ["--sampler_engine", "vllm"] if command == "sample" else ["--infer_backend", "vllm"]
    a = resolve_args(cls, ["--model", "tiny", *extra, *engine, "--vllm_max_model_len", "256"], f"swift {command}")
    assert a.vllm_max_model_len == 256


def test_sample_refuses_an_infer_backend_that_is_not_its_sampler_engine():
    with pytest.raises(SwiftError, match="^--infer_backend vllm: swift sample's engine is --sampler_engine"):
        resolve_args(SampleArguments, ["--model", "tiny", "--dataset", "rows.jsonl", "--infer_backend", "vllm"], "s")


def test_a_reward_model_is_not_served_by_vllm():
    with pytest.raises(SwiftError, match="^--infer_backend vllm: a reward model"):
        resolve_args(DeployArguments, ["--model", "tiny", "--task_type", "seq_cls", "--infer_backend", "vllm"], "d")
