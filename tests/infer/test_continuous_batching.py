"""Continuous batching: queued requests join the batch being decoded between steps, and nothing a
request gets depends on when it joined or whom it decoded with."""
import asyncio

import pytest

from swift.infer import InferRequest, RequestConfig, TransformersEngine
from swift.template import get_template

from .test_transformers_engine import POISON, idle, poisoned_engine

LONG_PROMPT = "a prompt much longer than the first request's prompt and its first tokens, " * 2


def chat(text):
    return InferRequest(messages=[{"role": "user", "content": text}])


@pytest.fixture(scope="module")
def engine(tiny):
    model, tokenizer, _ = tiny
    engine = TransformersEngine(model, tokenizer, get_template("chatml", tokenizer), max_batch_size=16)
    engine.infer([chat("warm-up")], RequestConfig(max_tokens=4))  # the lean step is verified: joining is on
    assert engine._fast_verified
    yield engine
    engine.close()


def config(engine, max_tokens, **kwargs):
    """No EOS (so lengths are exact and the first request outlives the others), log-probs on."""
    bias = {e: -100.0 for e in engine.eos_ids}
    return RequestConfig(max_tokens=max_tokens, logit_bias=bias, logprobs=True, **kwargs)


async def stream(engine, request, cfg, progress: list | None = None):
    """(token ids, log-probs) of a streamed request; `progress` receives its token count as it goes."""
    tokens, logprobs = [], []
    async for delta in engine.stream_async(request, cfg):
        tokens += delta.token_ids
        logprobs += [lp.logprob for lp in delta.logprobs or []]
        if progress is not None:
            progress.append(len(tokens))
    return tokens, logprobs


async def until(progress: list, tokens: int):
    while not progress or progress[-1] < tokens:
        await asyncio.sleep(0.002)


def alone(engine, request, cfg):
    choice = engine.infer([request], cfg)[0].choices[0]
    return choice.token_ids, [lp.logprob for lp in choice.logprobs]


def assert_same(got, want):
    assert got[0] == want[0]
    assert max(abs(a - b) for a, b in zip(got[1], want[1])) < 1e-4


@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=1.0, seed=5)], ids=["greedy", "seeded"])
def test_requests_that_join_a_running_batch_get_what_they_get_alone(engine, sampling):
    """A (short prompt, 90 tokens) starts alone; after 3 of its tokens B (a prompt longer than A's
    columns so far: the running rows move right) and C join; after 40, D joins far to the right of
    A's first column, and outlives A, B and C (the columns only they used are dropped). B, C and
    D finish before A: they joined its batch rather than waiting for it. Every request's tokens
    equal its tokens alone (greedy, and seeded sampling: the same draws), log-probs within 1e-4."""
    requests = {"A": (chat("1+1="), 90), "B": (chat(LONG_PROMPT), 40), "C": (chat("7+5="), 10),
                "D": (chat("3+4="), 120)}
    cfgs = {name: config(engine, n, **sampling) for name, (_, n) in requests.items()}
    finished = []

    async def run():
        progress_a, progress_b = [], []

        async def go(name, progress=None):
            result = await stream(engine, requests[name][0], cfgs[name], progress)
            finished.append(name)
            return name, result

        tasks = [asyncio.ensure_future(go("A", progress_a))]
        await until(progress_a, 3)
        tasks += [asyncio.ensure_future(go("B", progress_b)), asyncio.ensure_future(go("C"))]
        await until(progress_a, 40)
        tasks.append(asyncio.ensure_future(go("D")))
        return dict(await asyncio.gather(*tasks))

    joined = asyncio.run(run())
    assert finished.index("A") > finished.index("C") and finished.index("A") > finished.index("B")
    assert finished[-1] == "D"
    assert idle(engine)
    for name, (request, _) in requests.items():
        assert len(joined[name][0]) == requests[name][1]
        assert_same(joined[name], alone(engine, request, cfgs[name]))


def test_a_joined_stream_that_is_cancelled_leaves_and_the_others_are_unchanged(engine):
    cfg = config(engine, 60)
    first, second = chat("2+2="), chat(LONG_PROMPT)

    async def run():
        progress_a, progress_b = [], []
        a = asyncio.ensure_future(stream(engine, first, cfg, progress_a))
        await until(progress_a, 3)
        b = asyncio.ensure_future(stream(engine, second, cfg, progress_b))
        await until(progress_b, 5)
        b.cancel()  # the client left
        await asyncio.gather(b, return_exceptions=True)
        while engine.load()["running"] > 1 and not a.done():
            await asyncio.sleep(0.002)
        left_first = not a.done()  # B's rows left the batch at a step while A went on
        return await a, left_first

    result, left_first = asyncio.run(run())
    assert left_first
    assert_same(result, alone(engine, first, cfg))
    assert idle(engine)


def test_a_request_with_other_settings_is_not_starved_by_newer_ones_that_could_join(engine):
    """X (sampled) cannot join greedy A's batch; Y (greedy, queued after X) could, but waits behind X:
    the batch drains and X is served before Y."""
    finished = []

    async def run():
        progress = []

        async def go(name, request, cfg, progress=None):
            await stream(engine, request, cfg, progress)
            finished.append(name)

        a = asyncio.ensure_future(go("A", chat("1+2="), config(engine, 300), progress))
        await until(progress, 3)
        x = asyncio.ensure_future(go("X", chat("3+4="), config(engine, 5, temperature=1.0, seed=1)))
        await asyncio.sleep(0.05)
        y = asyncio.ensure_future(go("Y", chat("5+6="), config(engine, 5)))
        await asyncio.sleep(0)
        a_running = not a.done()  # Y was queued while A's batch could still take it
        await asyncio.gather(a, x, y)
        return a_running

    assert asyncio.run(run())
    assert finished == ["A", "X", "Y"]
    assert idle(engine)


def test_a_joiner_whose_prefill_fails_fails_alone_and_the_batch_goes_on():
    """Two requests join a running batch and their prefill fails: the running request goes on
    undisturbed, and each joiner reruns alone, where only the faulty one fails."""
    engine, failures = poisoned_engine()
    progress: list[int] = []
    at_failure = []  # the running request's token count when the joiners' prefill failed
    fragile = engine.model.forward

    def watched(*args, input_ids=None, **kwargs):
        if input_ids is not None and bool((input_ids == POISON).any()):
            at_failure.append(progress[-1] if progress else 0)
        return fragile(*args, input_ids=input_ids, **kwargs)

    engine.model.forward = watched
    try:
        engine.infer([InferRequest(input_ids=[5, 6, 7])], RequestConfig(max_tokens=4))  # verifies the lean step
        cfg = config(engine, 40, temperature=1.0, seed=3)
        cfg.logprobs = False
        runner, good, bad = InferRequest(input_ids=[5, 6, 7]), InferRequest(input_ids=[8, 9]), \
            InferRequest(input_ids=[5, POISON, 7])

        async def run():
            a = asyncio.ensure_future(stream(engine, runner, cfg, progress))
            await until(progress, 3)
            with engine._wake:  # both queued at once: they are prefilled together
                joiners = [asyncio.ensure_future(engine.infer_async(r, cfg)) for r in (good, bad)]
                await asyncio.sleep(0)
            return await a, await asyncio.gather(*joiners, return_exceptions=True)

        (tokens, _), (fine, error) = asyncio.run(run())
        assert isinstance(error, RuntimeError) and "poisoned" in str(error)
        assert failures == [2, 1]  # the two joiners' prefill, then the poisoned one alone
        assert at_failure[0] < 40  # they were joining the running request, not waiting for it to end
        assert tokens == engine.infer([runner], cfg)[0].choices[0].token_ids
        assert fine.choices[0].token_ids == engine.infer([good], cfg)[0].choices[0].token_ids
        assert idle(engine)
    finally:
        engine.close()


def test_an_inline_engine_refills_its_batch_with_queued_requests(tiny):
    """A trainer's inline engine given more rows than max_batch_size: rows that finish early make room
    and queued requests join; every request gets its tokens alone (seeded sampling)."""
    model, tokenizer, _ = tiny
    inline = TransformersEngine(model, tokenizer, get_template("chatml", tokenizer), max_batch_size=4, inline=True)
    try:
        inline.infer([chat("warm-up")], RequestConfig(max_tokens=4))
        bias = {e: -100.0 for e in inline.eos_ids}
        configs = [RequestConfig(max_tokens=n, temperature=1.0, seed=i, logit_bias=bias)
                   for i, n in enumerate([5, 40, 8, 40, 30, 12, 6, 20])]
        requests = [chat(f"{i}+{2 * i}=") for i in range(8)]
        joined_before = []
        take = inline._take_joiners

        def counting(*args):
            taken = take(*args)
            joined_before.extend(taken)
            return taken

        inline._take_joiners = counting
        together = inline.infer(requests, configs)
        assert joined_before  # queued requests joined the running batch
        for request, cfg, response in zip(requests, configs, together):
            assert response.choices[0].token_ids == inline.infer([request], cfg)[0].choices[0].token_ids
    finally:
        inline.close()


def test_a_row_that_leaves_before_the_lean_step_is_trusted_keeps_the_model_cache_in_step(tiny):
    """In a fresh engine the first decoding steps run both the model's forward (its cache) and the
    lean step, and compare them. A leaves after its first token, so the lean step moves C into
    A's place; the model's cache and mask must follow the same order, or the comparison fails
    (the lean step is then switched off) and B and C get tokens that are not theirs alone."""
    model, tokenizer, _ = tiny
    fresh = TransformersEngine(model, tokenizer, get_template("chatml", tokenizer), max_batch_size=8)
    try:
        assert not fresh._fast_verified
        selected = []
        select = fresh._fast.select
        fresh._fast.select = lambda keep: selected.append(select(keep)) or selected[-1]
        bias = {e: -100.0 for e in fresh.eos_ids}
        configs = [RequestConfig(max_tokens=n, temperature=0, logit_bias=bias, logprobs=True) for n in (1, 6, 6)]
        requests = [chat("1+1="), chat(LONG_PROMPT), chat("7+5=")]
        together = fresh.infer(requests, configs)
        assert selected[0] == [2, 1]  # C took A's place before the lean step was trusted
        assert fresh._fast_verified and fresh._fast is not None
        for request, cfg, response in zip(requests, configs, together):
            choice = response.choices[0]
            got = (choice.token_ids, [lp.logprob for lp in choice.logprobs])
            assert_same(got, alone(fresh, request, cfg))
    finally:
        fresh.close()
