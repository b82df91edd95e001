"""The legacy `/v1/completions` contract peer evaluators rely on (lm-eval's `local-completions`):
`prompt` as a string, a list of strings, a token list or a list of token lists; `echo` with the
prompt tokens' log-probs; `max_tokens: 0`; integer `logprobs`. Log-probs equal a direct forward
pass of the model; lm-eval itself scores a multiple-choice task (accuracy equal to one computed from
the forward pass) and a generate-until task against a real `swift deploy` process."""
import json
import os

import openai
import pytest
import torch

from tests.deploy.serving import deploy


@pytest.fixture(scope="module")
def served(quickstart):
    _, out = quickstart
    model = os.path.join(out, "sft")
    with deploy("--model", model, "--served_model_name", "qs") as base:
        yield model, base


@pytest.fixture(scope="module")
def reference(served):
    from swift.model import load_model

    model, tokenizer, _ = load_model(served[0])
    return model.eval(), tokenizer


def direct_logprobs(reference, ids: list[int]) -> list[float]:
    model, _ = reference
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits[:-1], -1)
    return [lp[t, ids[t + 1]].item() for t in range(len(ids) - 1)]


def test_prompt_forms_echo_and_max_tokens_zero(served, reference):
    _, base = served
    _, tokenizer = reference
    c = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
    a, b = tokenizer.encode("12+34=46", add_special_tokens=False), tokenizer.encode("7+8=15", add_special_tokens=False)
    # a batch of token lists, echoed, nothing generated: the log-probs of every prompt token
    r = c.completions.create(model="qs", prompt=[a, b], max_tokens=0, echo=True, logprobs=1, temperature=0)
    assert [ch.index for ch in r.choices] == [0, 1]
    for ch, ids, text in zip(r.choices, (a, b), ("12+34=46", "7+8=15")):
        assert ch.text == text and ch.logprobs.token_logprobs[0] is None and len(ch.logprobs.tokens) == len(ids)
        assert ch.logprobs.token_logprobs[1:] == pytest.approx(direct_logprobs(reference, ids), abs=1e-4)
        assert all(len(top) == 1 for top in ch.logprobs.top_logprobs[1:])
        assert "".join(ch.logprobs.tokens) == text
    assert r.usage.prompt_tokens == len(a) + len(b) and r.usage.completion_tokens == 0
    # echo with one generated token (lm-eval's request): the prompt's log-probs then the answer's
    r = c.completions.create(model="qs", prompt=a, max_tokens=1, echo=True, logprobs=2, temperature=0)
    lp = r.choices[0].logprobs
    assert len(lp.token_logprobs) == len(a) + 1 and r.choices[0].text.startswith("12+34=46")
    assert lp.token_logprobs[1:len(a)] == pytest.approx(direct_logprobs(reference, a), abs=1e-4)
    assert all(len(top) == 2 for top in lp.top_logprobs[1:len(a)])
    # a list of strings, n samples each: choice i·n + j
    r = c.completions.create(model="qs", prompt=["1+1=", "2+2="], max_tokens=3, n=2, temperature=0)
    assert [ch.index for ch in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text and r.choices[2].text == r.choices[3].text
    single = c.completions.create(model="qs", prompt="2+2=", max_tokens=3, temperature=0)
    assert single.choices[0].text == r.choices[2].text
    # echo and max_tokens 0 without `logprobs`: the prompt back, and no log-probs
    r = c.completions.create(model="qs", prompt=[a, "7+8="], max_tokens=0, echo=True, temperature=0)
    assert [ch.text for ch in r.choices] == ["12+34=46", "7+8="] and all(ch.logprobs is None for ch in r.choices)


@pytest.mark.parametrize("body,status,param", [
    ({"prompt": [[1, 2], "x"], "max_tokens": 1}, 200, None),  # mixed forms are allowed
    ({"prompt": [[1, 2], []], "max_tokens": 1}, 400, "prompt"),
    ({"prompt": [[1, 99999999]], "max_tokens": 1}, 400, None),
    ({"prompt": "x", "max_tokens": 0, "stream": True}, 400, "stream"),
    ({"prompt": "x", "echo": "yes"}, 400, "echo"),
    ({"prompt": "x", "echo": True, "max_tokens": 2, "stream": True}, 400, "stream"),
    ({"prompt": "x", "max_tokens": -1}, 400, None),
])
def test_bad_completions_requests_are_4xx(served, body, status, param):
    from tests.deploy.test_server import post

    _, base = served
    code, answer = post(base, "/v1/completions", json.dumps({"model": "qs", **body}).encode())
    assert code == status, answer
    if status != 200:
        assert answer["error"]["message"] and (param is None or answer["error"]["param"] == param)


TASKS = """
task: swift_arith_mc
dataset_path: json
dataset_kwargs:
  data_files: {data}
test_split: train
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
"""
GEN_TASK = """
task: swift_arith_gen
dataset_path: json
dataset_kwargs:
  data_files: {data}
test_split: train
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 4
  temperature: 0
  do_sample: false
metric_list:
  - metric: exact_match
"""


def test_lm_eval_harness_scores_swift_deploy(served, reference, tmp_path):
    """lm-eval's local-completions: log-likelihood multiple choice (as a batch of token lists, echo,
    logprobs) and generate-until, both on 12 held-out sums written as plain-text prompts."""
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    from swift.dataset.arith import BUILTIN_DATASETS

    model_dir, base = served
    rows = list(BUILTIN_DATASETS.get("arith-pt")("eval"))[:12]
    docs = []
    for i, row in enumerate(rows):
        question, answer = row["text"].split("=")
        wrong = str(int(answer) + 1 + i % 3)
        choices = [answer, wrong] if i % 2 == 0 else [wrong, answer]
        docs.append({"question": question + "=", "choices": choices, "label": choices.index(answer),
                     "answer": answer})
    data = tmp_path / "arith.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "mc.yaml").write_text(TASKS.format(data=data))
    (tmp_path / "gen.yaml").write_text(GEN_TASK.format(data=data))
    out = lm_eval.simple_evaluate(
        model="local-completions", tasks=["swift_arith_mc", "swift_arith_gen"],
        model_args=f"base_url={base}/v1/completions,model=qs,tokenizer={model_dir},tokenizer_backend=huggingface,"
                   "num_concurrent=2,max_retries=1,tokenized_requests=True",
        task_manager=TaskManager(include_path=str(tmp_path)), batch_size=4)
    model, tokenizer = reference
    correct = 0
    for d in docs:  # the choice with the highest summed log-prob of its tokens after the question
        context = tokenizer.encode(d["question"], add_special_tokens=False)
        totals = []
        for choice in d["choices"]:
            whole = tokenizer.encode(d["question"] + " " + choice, add_special_tokens=False)
            totals.append(sum(direct_logprobs(reference, whole)[len(context) - 1:]))
        correct += totals.index(max(totals)) == d["label"]
    assert out["results"]["swift_arith_mc"]["acc,none"] == pytest.approx(correct / len(docs))
    assert 0.0 <= out["results"]["swift_arith_gen"]["exact_match,none"] <= 1.0
