import asyncio
import subprocess
import sys

import pytest
import torch

from swift.infer import InferRequest, RequestConfig, TransformersEngine
from swift.template import get_template
from swift.utils.registry import SwiftError

PROMPTS = ["12+34=", "hello there", "7+5=", "a much longer prompt than the others, to force left padding"]


@pytest.fixture(scope="module")
def engine(tiny):
    model, tokenizer, _ = tiny
    return TransformersEngine(model, tokenizer, get_template("chatml", tokenizer), max_batch_size=16)


def chat(text):
    return InferRequest(messages=[{"role": "user", "content": text}])


def test_greedy_matches_hf_generate(engine, tiny):
    model, tokenizer, _ = tiny
    responses = engine.infer([chat(p) for p in PROMPTS], RequestConfig(max_tokens=12))
    for prompt, response in zip(PROMPTS, responses):
        ids = torch.tensor([engine.template.encode_prompt([{"role": "user", "content": prompt}])])
        expected = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                  pad_token_id=tokenizer.pad_token_id)[0, ids.shape[1]:].tolist()
        expected = [t for t in expected if t != tokenizer.eos_token_id]
        assert response.choices[0].token_ids == expected
        assert response.prompt_tokens == ids.shape[1]
        assert response.choices[0].finish_reason == ("length" if len(expected) == 12 else "stop")


def test_n_samples_share_prefill_and_seed_is_reproducible(engine):
    config = RequestConfig(max_tokens=8, temperature=1.0, n=4, seed=7)
    a = engine.infer([chat("12+34=")], config)[0]
    b = engine.infer([chat("12+34=")], config)[0]
    assert len(a.choices) == 4 and [c.index for c in a.choices] == [0, 1, 2, 3]
    assert [c.token_ids for c in a.choices] == [c.token_ids for c in b.choices]
    assert len({tuple(c.token_ids) for c in a.choices}) > 1  # the untrained model is nearly uniform
    assert a.completion_tokens == sum(len(c.token_ids) for c in a.choices)


def test_an_inline_engine_decodes_in_the_callers_thread_with_the_same_results(engine, tiny):
    """A trainer's engine (inline=True) has no worker thread; the same seeded requests give the same
    tokens as the threaded engine, and the streaming/async API it does not serve says so."""
    import threading

    model, tokenizer, _ = tiny
    inline = TransformersEngine(model, tokenizer, get_template("chatml", tokenizer), max_batch_size=16, inline=True)
    before = threading.active_count()
    config = RequestConfig(max_tokens=8, temperature=1.0, n=3, seed=11)
    ours = inline.infer([chat(p) for p in PROMPTS], config)
    theirs = engine.infer([chat(p) for p in PROMPTS], config)
    assert [[c.token_ids for c in r.choices] for r in ours] == [[c.token_ids for c in r.choices] for r in theirs]
    assert threading.active_count() == before
    with pytest.raises(SwiftError, match="serves infer\\(\\) only"):
        asyncio.run(inline.infer_async(chat("1+1="), config))
    inline.close()


def test_stop_words_and_length(engine):
    free = engine.infer([chat("7+5=")], RequestConfig(max_tokens=20))[0].choices[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 20
    stop = free.text[3:5]
    cut = engine.infer([chat("7+5=")], RequestConfig(max_tokens=20, stop=[stop]))[0].choices[0]
    assert cut.finish_reason == "stop" and cut.text == free.text[: free.text.find(stop)]


@pytest.mark.parametrize("template", ["chatml", "qwen2_5"])
def test_the_templates_end_of_turn_token_ends_the_answer_when_eos_is_another(template):
    """A base model trained on a chat template (Qwen2.5 base: EOS <|endoftext|>, turns end with
    <|im_end|>) stops at the template's end-of-turn token, as ms-swift's template stop words make it
    (before 2026-11-29 it wrote on to the length limit, and no --stop_words could name the token)."""
    from swift.model import load_model

    model, tokenizer, _ = load_model("builtin:tiny-chat")
    tokenizer.eos_token = "<|endoftext|>"
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end != tokenizer.eos_token_id
    engine = TransformersEngine(model, tokenizer, get_template(template, tokenizer))
    try:
        answer = engine.infer([chat("7+5=")], RequestConfig(max_tokens=12, logit_bias={im_end: 100.0}))[0]
    finally:
        engine.close()
    choice = answer.choices[0]
    assert choice.finish_reason == "stop" and choice.token_ids == [] and choice.stop_token_id == im_end


def test_logprobs_match_a_manual_forward(engine, tiny):
    model, _, _ = tiny
    choice = engine.infer([chat("hi")], RequestConfig(max_tokens=3, logprobs=True, top_logprobs=3))[0].choices[0]
    ids = engine.template.encode_prompt([{"role": "user", "content": "hi"}])
    with torch.no_grad():
        logits = model(torch.tensor([ids + choice.token_ids])).logits[0, len(ids) - 1:-1]
    expected = torch.log_softmax(logits.float(), -1)
    for step, lp in enumerate(choice.logprobs):
        assert lp.logprob == pytest.approx(expected[step, lp.token_id].item(), abs=1e-4)
        assert len(lp.top_logprobs) == 3 and lp.top_logprobs[0][1] >= lp.logprob - 1e-6


def test_concurrent_requests_all_complete(engine):
    async def run():
        return await asyncio.gather(*(engine.infer_async(chat(f"{i}+{i}="), RequestConfig(max_tokens=6))
                                      for i in range(24)))

    responses = asyncio.run(run())
    assert len(responses) == 24 and all(r.choices[0].finish_reason in ("stop", "length") for r in responses)


def test_streaming_concatenates_to_the_full_text(engine):
    async def run():
        pieces, finish = [], None
        async for delta in engine.stream_async(chat("12+34="), RequestConfig(max_tokens=10)):
            pieces.append(delta.text)
            finish = delta.finish_reason or finish
        return "".join(pieces), finish

    text, finish = asyncio.run(run())
    assert text == engine.infer([chat("12+34=")], RequestConfig(max_tokens=10))[0].choices[0].text
    assert finish in ("stop", "length")


def test_context_overflow_is_a_clear_error(engine):
    with pytest.raises(SwiftError, match="exceeds the model's context of 512 tokens"):
        engine.infer([chat("hi")], RequestConfig(max_tokens=100_000))
    with pytest.raises(SwiftError, match="temperature must be a finite number >= 0"):
        RequestConfig(temperature=-1)
    with pytest.raises(SwiftError, match="repetition_penalty must be a finite number"):
        RequestConfig(repetition_penalty=float("inf"))


def test_text_too_long_for_the_context_is_refused_before_tokenising(engine, monkeypatch):
    """A prompt of more characters than the context can hold is refused without tokenising it (the
    tokenizer is never called); one that may fit is tokenised and, if too long, refused as before."""
    calls = []
    real = engine.template._tokenize
    monkeypatch.setattr(engine.template, "_tokenize", lambda *a, **k: calls.append(1) or real(*a, **k))
    huge = "word " * (512 * engine.longest_token // 5 + 1)  # more characters than 512 tokens can spell
    with pytest.raises(SwiftError, match="characters are more than the model's context of 512 tokens"):
        engine.infer([chat(huge)], RequestConfig(max_tokens=4))
    assert calls == []
    with pytest.raises(SwiftError, match="exceeds the model's context of 512 tokens"):
        engine.infer([chat("word " * 600)], RequestConfig(max_tokens=4))  # may fit by characters: tokenised
    assert calls


def test_token_ids_outside_the_vocabulary_are_refused_before_batching(engine):
    vocab = engine.vocab_size
    for bad in ([5, vocab], [5, -1], [5, 2 ** 40]):
        with pytest.raises(SwiftError, match="not in the vocabulary"):
            engine.infer([InferRequest(input_ids=bad)], RequestConfig(max_tokens=2))
    assert engine.infer([InferRequest(input_ids=[5, vocab - 1])], RequestConfig(max_tokens=2))[0].choices


POISON = 1234


def idle(engine, seconds: float = 10.0) -> bool:
    """The engine's worker leaves its batch just after delivering the last result."""
    import time

    deadline = time.time() + seconds
    while engine.load() != {"queued": 0, "running": 0}:
        if time.time() > deadline:
            return False
        time.sleep(0.01)
    return True


def poisoned_engine():
    """An engine whose model fails any forward pass that sees token POISON: a fault that only one
    request of a batch carries, as an engine bug or a numerical failure would."""
    from swift.model import load_model

    model, tokenizer, _ = load_model("builtin:tiny-chat")
    forward = model.forward
    failures = []

    def fragile(*args, input_ids=None, **kwargs):
        if input_ids is not None and bool((input_ids == POISON).any()):
            failures.append(input_ids.shape[0])
            raise RuntimeError("poisoned batch")
        return forward(*args, input_ids=input_ids, **kwargs)

    model.forward = fragile
    return TransformersEngine(model, tokenizer, get_template("chatml", tokenizer), max_batch_size=16), failures


def test_a_request_that_breaks_its_batch_fails_alone():
    engine, failures = poisoned_engine()
    config = RequestConfig(max_tokens=6, temperature=1.0, seed=3)
    good = [InferRequest(input_ids=[5 + i, 6, 7]) for i in range(3)]

    async def run():
        async def streamed():
            return [d async for d in engine.stream_async(InferRequest(input_ids=[9, 9]), config)]

        calls = [engine.infer_async(r, config) for r in good]
        calls.insert(1, engine.infer_async(InferRequest(input_ids=[5, POISON, 7]), config))
        calls.append(streamed())
        with engine._wake:  # the worker waits until all five are queued: they share one batch
            tasks = [asyncio.ensure_future(c) for c in calls]
            await asyncio.sleep(0)
        return await asyncio.gather(*tasks, return_exceptions=True)

    try:
        results = asyncio.run(run())
        assert failures == [5, 1]  # the batch of five failed, then the poisoned request alone
        assert isinstance(results[1], RuntimeError) and "poisoned" in str(results[1])
        fine = [results[0], *results[2:4]]
        assert all(r.choices[0].finish_reason in ("stop", "length") for r in fine)
        # each survivor's answer is what it gets alone (same seed): the failed batch left no trace
        assert [r.choices[0].token_ids for r in fine] == [
            engine.infer([r], config)[0].choices[0].token_ids for r in good]
        assert results[4][-1].finish_reason in ("stop", "length")
        assert idle(engine)
    finally:
        engine.close()


def test_close_fails_waiting_requests_and_stops_the_worker(tiny):
    model, tokenizer, _ = tiny
    engine = TransformersEngine(model, tokenizer, get_template("chatml", tokenizer))
    assert engine.infer([chat("1+2=")], RequestConfig(max_tokens=4))[0].choices[0].token_ids

    async def long_request():
        return await engine.infer_async(chat("1+2="), RequestConfig(max_tokens=400, temperature=1.0, seed=0))

    async def close_while_generating():
        task = asyncio.ensure_future(long_request())
        await asyncio.sleep(0.05)
        await asyncio.to_thread(engine.close)
        return await asyncio.gather(task, return_exceptions=True)

    [result] = asyncio.run(close_while_generating())
    assert isinstance(result, SwiftError) and "closed" in str(result)
    assert not engine._thread.is_alive()
    engine.close()  # idempotent


def test_a_process_exits_cleanly_after_generating(tmp_path):
    """The engine's daemon thread used to abort the interpreter at exit now and then (SIGABRT,
    `terminate called without an active exception`); engines are closed at exit."""
    script = tmp_path / "gen.py"
    script.write_text(
        "from swift.model import load_model\n"
        "from swift.infer import InferRequest, RequestConfig, TransformersEngine\n"
        "from swift.template import get_template\n"
        "model, tok, _ = load_model('builtin:tiny-chat')\n"
        "engine = TransformersEngine(model, tok, get_template('chatml', tok))\n"
        "engine.infer([InferRequest(messages=[{'role': 'user', 'content': '1+2='}])] * 8,\n"
        "             RequestConfig(max_tokens=16, temperature=1.0))\n"
        "raise SystemExit(3)\n")
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
        assert proc.returncode == 3, proc.stderr[-2000:]
        assert "terminate called" not in proc.stderr


def test_a_batch_that_fails_mid_decode_reruns_its_requests_alone():
    """A fault that strikes a decoding step of a batch (any batch of more than one row): each
    request that has sent nothing yet runs again alone and gets the answer it would have had alone;
    a stream that already sent text gets the error (it cannot be replayed)."""
    from swift.model import load_model

    model, tokenizer, _ = load_model("builtin:tiny-chat")
    forward = model.forward

    def fragile(*args, input_ids=None, **kwargs):
        if input_ids is not None and input_ids.shape == (input_ids.shape[0], 1) and input_ids.shape[0] > 1:
            raise RuntimeError("decoding step failed")
        return forward(*args, input_ids=input_ids, **kwargs)

    model.forward = fragile
    engine = TransformersEngine(model, tokenizer, get_template("chatml", tokenizer), fast_decode=False)
    config = RequestConfig(max_tokens=5)
    requests = [InferRequest(input_ids=[5 + i, 6, 7]) for i in range(3)]

    async def run():
        async def streamed():
            return [d async for d in engine.stream_async(InferRequest(input_ids=[40, 41, 42]), config)]

        with engine._wake:  # one batch of four
            tasks = [asyncio.ensure_future(c) for c in [*(engine.infer_async(r, config) for r in requests),
                                                        streamed()]]
            await asyncio.sleep(0)
        return await asyncio.gather(*tasks, return_exceptions=True)

    try:
        results = asyncio.run(run())
        model.forward = forward
        alone = [engine.infer([r], config)[0].choices[0].token_ids for r in requests]
        assert [r.choices[0].token_ids for r in results[:3]] == alone
        assert isinstance(results[3], RuntimeError)  # its first token had reached the client
        assert idle(engine)
    finally:
        engine.close()
