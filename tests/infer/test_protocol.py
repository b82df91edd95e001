"""--max_length of the commands that generate: a longer prompt is refused (delete) or cut (left
keeps its end, right its start), as ms-swift's inference does; through `build_engine`, as the
commands build their engine. (Before 2026-11-29 the flag was parsed and read by nothing.)"""
import pytest

from swift.infer import InferRequest, RequestConfig
from swift.infer.factory import build_engine
from swift.pipelines.infer import InferArguments
from swift.utils.registry import SwiftError

MESSAGES = [{"role": "user", "content": "12+34= " * 20}]


@pytest.fixture(scope="module")
def engines():
    built = {}
    for cut in ("delete", "left", "right"):
        built[cut], _ = build_engine(InferArguments(model="builtin:tiny-chat", max_length=24, truncation_strategy=cut))
    built[None], _ = build_engine(InferArguments(model="builtin:tiny-chat"))
    yield built
    for engine in built.values():
        engine.close()


def test_a_prompt_over_max_length_is_refused_or_cut(engines):
    full = engines[None].encode(InferRequest(messages=MESSAGES))
    assert len(full) > 24
    with pytest.raises(SwiftError, match=f"the prompt's {len(full)} tokens exceed --max_length 24"):
        engines["delete"].encode(InferRequest(messages=MESSAGES))
    assert engines["left"].encode(InferRequest(messages=MESSAGES)) == full[-24:]
    assert engines["right"].encode(InferRequest(messages=MESSAGES)) == full[:24]
    assert engines["left"].encode(InferRequest(input_ids=full)) == full[-24:]  # token-id prompts too
    short = [{"role": "user", "content": "1+2="}]
    assert engines["delete"].encode(InferRequest(messages=short)) == engines[None].encode(InferRequest(messages=short))


def test_the_answer_to_a_cut_prompt_is_the_answer_to_its_kept_tokens(engines):
    config = RequestConfig(max_tokens=6, temperature=0.0)
    full = engines[None].encode(InferRequest(messages=MESSAGES))
    cut = engines["left"].infer([InferRequest(messages=MESSAGES)], config)[0]
    kept = engines[None].infer([InferRequest(input_ids=full[-24:])], config)[0]
    assert cut.choices[0].token_ids == kept.choices[0].token_ids
    assert cut.prompt_tokens == 24


def test_truncation_strategy_without_max_length_is_refused():
    with pytest.raises(SwiftError, match="--truncation_strategy left says what happens to a prompt over --max_length"):
        InferArguments(model="builtin:tiny-chat", truncation_strategy="left")


def test_text_too_long_for_any_tokenisation_is_refused_under_left_too(engines):
    """The character precheck (more characters than context × the longest token) runs before any cut."""
    text = "1" * (engines["left"].max_model_len * engines["left"].longest_token + 1)
    with pytest.raises(SwiftError, match="more than the model's context"):
        engines["left"].encode(InferRequest(messages=[{"role": "user", "content": text}]))
