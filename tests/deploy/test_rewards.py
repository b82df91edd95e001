"""`swift deploy --task_type seq_cls`: the reward routes training uses as a remote reward."""
import json
import urllib.error
import urllib.request

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from swift.model import load_model
from swift.template import get_template
from tests.deploy.serving import deploy


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("rm")
    model, tokenizer, _ = load_model("builtin:tiny-chat", task_type="seq_cls")
    torch.nn.init.normal_(model.score.weight, std=1.0)  # a value head that separates texts clearly
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def reference(path, texts):
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    with torch.no_grad():
        return [model(**tokenizer(t, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item() for t in texts]


def test_reward_routes_match_the_model(reward_model):
    texts = ["07+45=52", "a longer text that is certainly different", "x"]
    conversation = [{"role": "user", "content": "07+45="}, {"role": "assistant", "content": "52"}]
    tokenizer = AutoTokenizer.from_pretrained(reward_model)
    rendered = get_template("jinja", tokenizer).render(conversation)[0]
    with deploy("--model", reward_model, "--task_type", "seq_cls", "--served_model_name", "rm") as base:
        code, openrlhf = post(base, "/get_reward", {"query": texts})
        assert code == 200
        assert openrlhf["rewards"] == pytest.approx(reference(reward_model, texts), abs=1e-4)
        code, v1 = post(base, "/v1/rewards", {"model": "rm", "messages": [conversation]})
        assert code == 200 and v1["rewards"] == pytest.approx(reference(reward_model, [rendered]), abs=1e-4)
        assert v1["data"][0]["reward"] == v1["rewards"][0]
        code, bad = post(base, "/get_reward", {"query": []})
        assert code == 400 and bad["error"]["param"] == "query"
        code, chat = post(base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        assert code == 400 and "reward model" in chat["error"]["message"]


def test_grpo_reward_model_local_and_remote_agree(reward_model):
    """`--reward_model DIR` and `--reward_model_url` (this server) score a completion the same way."""
    from swift.rewards.manager import RemoteRewardModel, RewardModelReward

    messages = [[{"role": "user", "content": "07+45="}], [{"role": "user", "content": "10+10="}]]
    completions = ["52", "21"]
    local = RewardModelReward(reward_model)(completions, messages=messages)
    template = get_template("chatml", AutoTokenizer.from_pretrained(reward_model))
    texts = [template.render([*m, {"role": "assistant", "content": c}])[0] for m, c in zip(messages, completions)]
    assert local == pytest.approx(reference(reward_model, texts), abs=1e-5)
    with deploy("--model", reward_model, "--task_type", "seq_cls") as base:
        remote = RemoteRewardModel(base)(completions, messages=messages)
    assert remote == pytest.approx(local, abs=1e-5)


def test_a_reward_request_nobody_waits_for_stops_and_frees_the_scorer(reward_model):
    """A request that runs past --request_timeout gets 504, and one whose client leaves is dropped:
    either way its scoring stops at the next batch, so the next request is answered at once (before
    2026-11-29 the scoring thread ran on holding the scorer, and later requests timed out behind it)."""
    import socket
    import time

    big = {"query": ["1+1=2 " * 150] * 3000}  # ~2.7 MB, one text per batch: minutes of scoring
    small = {"query": ["07+45=52"]}
    with deploy("--model", reward_model, "--task_type", "seq_cls", "--max_batch_size", "1",
                "--request_timeout", "2") as base:
        start = time.time()
        code, answer = post(base, "/get_reward", big)
        assert code == 504 and time.time() - start < 30, answer
        start = time.time()
        code, _ = post(base, "/get_reward", small)
        assert code == 200 and time.time() - start < 1.5
    with deploy("--model", reward_model, "--task_type", "seq_cls", "--max_batch_size", "1",
                "--request_timeout", "120") as base:
        # a client that sends the big request and leaves after 0.5 s
        host, port = base.split("//")[1].split(":")
        data = json.dumps(big).encode()
        with socket.create_connection((host, int(port))) as s:
            s.sendall(f"POST /get_reward HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
            time.sleep(0.5)
        start = time.time()
        code, _ = post(base, "/get_reward", small)
        assert code == 200 and time.time() - start < 1.5


def test_max_length_refuses_a_long_text_before_scoring_or_cuts_it(reward_model):
    """`--max_length N` of a reward server: a longer text is refused with a 400 naming it (delete,
    the default: a cut text would be scored without its end) and the next request is answered; with
    left the reward is the model's on the text's last N tokens. (Before 2026-11-29 every text was cut
    to its first 2048 tokens, silently.)"""
    from swift.deploy.server import create_app
    from swift.infer.factory import build_scorer
    from swift.pipelines.deploy import DeployArguments
    from tests.deploy.serving import serve_in_thread

    tokenizer = AutoTokenizer.from_pretrained(reward_model)
    model = AutoModelForSequenceClassification.from_pretrained(reward_model).eval()
    long, short = "07+45=52 " * 6, "07+45=52"
    ids = tokenizer(long, add_special_tokens=False)["input_ids"]
    assert len(ids) > 8
    for cut in ("delete", "left"):
        scorer = build_scorer(DeployArguments(model=reward_model, task_type="seq_cls", max_length=8,
                                              truncation_strategy=cut))
        with serve_in_thread(create_app("rm", scorer=scorer)) as base:
            code, body = post(base, "/get_reward", {"query": [short, long]})
            if cut == "delete":
                assert code == 400 and f"text 1: the text's {len(ids)} tokens exceed --max_length 8" in \
                    body["error"]["message"]
                code, body = post(base, "/get_reward", {"query": [short]})
                assert code == 200 and body["rewards"] == pytest.approx(reference(reward_model, [short]), abs=1e-4)
            else:
                with torch.no_grad():
                    expected = model(input_ids=torch.tensor([ids[-8:]])).logits[0, 0].item()
                assert code == 200 and body["rewards"][1] == pytest.approx(expected, abs=1e-4)
