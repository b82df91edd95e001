"""`--template jinja` (the tokenizer's own chat template): prompts are the template's rendering
with the generation prompt; training labels each assistant turn as the template renders it in the
whole conversation, templates that render earlier turns differently (Qwen3) or prompt with a
`<think>\\n` the turn lacks (R1-style) included. A row the template refuses or whose turns cannot
be located is dropped and counted, never fatal."""
import copy
import json
import logging
import os

import pytest
import requests

from swift.template import IGNORE_INDEX, RowError, get_template
from tests.conftest import train_argv

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "chat_templates")
with open(os.path.join(HERE, "qwen3.jinja")) as f:
    QWEN3 = f.read()
# QwQ / DeepSeek-R1 style: the prompt ends in <think>\n, every assistant turn is rendered without its reasoning
R1 = ("{% for m in messages %}{% if m['role'] == 'assistant' %}{% set c = m['content'] %}"
      "{% if '</think>' in c %}{% set c = c.split('</think>')[-1].lstrip() %}{% endif %}"
      "{{ '<|im_start|>assistant\\n' + c + '<|im_end|>\\n' }}"
      "{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}")
# Gemma-style: a system message is refused by the template itself
GEMMA = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
         "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
         "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
TWO_TURNS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "<think>\nadd again\n</think>\n\n6"},
]


def with_template(tokenizer, chat_template: str):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = chat_template
    return tok


def trained_pieces(tokenizer, labels) -> list[str]:
    """The decoded runs of labelled tokens."""
    runs, run = [], []
    for label in [*labels, IGNORE_INDEX]:
        if label != IGNORE_INDEX:
            run.append(label)
        elif run:
            runs.append(tokenizer.decode(run))
            run = []
    return runs


@pytest.mark.parametrize("chat_template, trained", [
    (QWEN3, ["4<|im_end|>", "<think>\nadd again\n</think>\n\n6<|im_end|>"]),  # earlier turn without its reasoning
    (R1, ["4<|im_end|>", "6<|im_end|>"]),
], ids=["qwen3", "r1"])
def test_multi_turn_prompts_and_labels_follow_the_chat_template(tokenizer, chat_template, trained):
    """Before 2026-11-30 both raised "not prefix-stable" (a SwiftError that ended the run): Qwen3's
    template renders earlier turns without the `<think>` block the last turn gets, and an R1-style
    prompt ends in `<think>\\n`, which the rendered turn lacks."""
    tok = with_template(tokenizer, chat_template)
    template = get_template("jinja", tok)
    for prompt in (TWO_TURNS[:4], TWO_TURNS):  # a final assistant message is left out of a prompt
        assert template.encode_prompt(prompt) == tok.apply_chat_template(
            TWO_TURNS[:4], tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]
    enc = template.encode({"messages": TWO_TURNS})
    assert enc.input_ids == tok(tok.apply_chat_template(TWO_TURNS, tokenize=False), add_special_tokens=False).input_ids
    assert trained_pieces(tok, enc.labels) == trained
    last = get_template("jinja", tok, loss_scale="last_round").encode({"messages": TWO_TURNS})
    assert trained_pieces(tok, last.labels) == trained[-1:]


def test_rows_the_template_refuses_or_cannot_split_are_row_errors(tokenizer):
    """Before 2026-11-30 the template's raise_exception escaped as jinja2's TemplateError and an
    unsplittable row as a SwiftError, both fatal."""
    with pytest.raises(RowError, match="the tokenizer's chat_template refused this conversation: System role not"):
        get_template("jinja", with_template(tokenizer, GEMMA)).encode({"messages": TWO_TURNS})
    # two assistant messages in a row: Qwen3's template renders the first one as the last turn (with an
    # empty <think> block) when it ends the conversation, and without one when another follows
    back_to_back = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"},
                    {"role": "assistant", "content": "b"}]
    with pytest.raises(RowError, match="cannot locate assistant message 3"):
        get_template("jinja", with_template(tokenizer, QWEN3)).encode({"messages": back_to_back})


def test_sft_drops_and_counts_such_rows_and_trains_on_the_others(tiny, tmp_path):
    from swift import sft_main

    model, tokenizer, _ = tiny
    model.save_pretrained(tmp_path / "model")  # Qwen3's template, refusing a system message as Gemma's does
    with_template(tokenizer, GEMMA.split("{% for")[0] + QWEN3).save_pretrained(tmp_path / "model")
    rows = [{"messages": [{"role": "user", "content": f"{i}+1="}, {"role": "assistant", "content": str(i + 1)}]}
            for i in range(7)]
    rows.insert(3, {"messages": TWO_TURNS})  # refused: a system message
    rows.insert(5, {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                                 {"role": "assistant", "content": "b"}]})  # cannot be split
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("swift").addHandler(handler)
    try:
        result = sft_main(train_argv(tmp_path / "out", "--model", str(tmp_path / "model"), "--dataset",
                                     str(tmp_path / "d.jsonl"), "--max_steps", "1"))
    finally:
        logging.getLogger("swift").removeHandler(handler)
    assert result["global_step"] == 1
    report = next(r.getMessage() for r in records if "rows read" in r.getMessage())
    assert "dropped 2 of 9 rows read" in report and "refused this conversation" in report
    assert "cannot locate assistant message 3" in report


def test_deploy_answers_400_for_a_conversation_the_template_refuses(tiny):
    from swift.deploy.server import create_app
    from swift.infer.transformers_engine import TransformersEngine
    from tests.deploy.serving import serve_in_thread

    model, tokenizer, _ = tiny
    tok = with_template(tokenizer, GEMMA)
    engine = TransformersEngine(model, tok, get_template("jinja", tok))
    user = [{"role": "user", "content": "hi"}]
    try:
        with serve_in_thread(create_app("tiny", engine=engine)) as base:
            ask = {"model": "tiny", "max_tokens": 2, "temperature": 0}
            bad = requests.post(base + "/v1/chat/completions", timeout=60,
                                json={**ask, "messages": [{"role": "system", "content": "s"}, *user]})
            assert bad.status_code == 400 and "System role not supported" in bad.json()["error"]["message"]
            assert requests.post(base + "/v1/chat/completions", json={**ask, "messages": user}, timeout=60).ok
    finally:
        engine.close()
