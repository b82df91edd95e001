"""TRL's rollout_func in `swift rlhf --rlhf_type grpo --rollout_func file.py:func`: called as TRL
calls it (each prompt once per generation, the trainer with TRL's names), its token ids are what the
step trains on, its environment-masked tokens carry no loss, its extra keys reach the reward
functions, and what it gets wrong is refused in one line."""
import json
import os

import pytest
from safetensors.torch import load_file

from swift.pipelines.rlhf import rlhf_main
from swift.utils.registry import SwiftError
from tests.conftest import train_argv

ROLLOUT = '''
import json, os


def rollout_func(prompts, trainer):
    """The row's own answer, then an 'environment' suffix ($SUFFIX, env_mask 0) and the end token."""
    tok = trainer.processing_class
    with open(os.environ["SEEN"], "a") as f:
        f.write(json.dumps({"prompts": prompts, "max_completion_length": trainer.args.max_completion_length,
                            "num_generations": trainer.num_generations,
                            "learning_rate": trainer.args.learning_rate}) + "\\n")
    out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [], "env_reward": [], "tag": "t"}
    for i, messages in enumerate(prompts):
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        answer = tok.encode(messages[-1]["content"][-3:] if i % 2 else "12", add_special_tokens=False)
        suffix = tok.encode(os.environ["SUFFIX"], add_special_tokens=False)
        completion = answer + suffix + [tok.eos_token_id]
        masked = int(os.environ.get("MASK_ENV", "0"))
        out["prompt_ids"].append(tok.encode(prompt, add_special_tokens=False))
        out["completion_ids"].append(completion)
        out["logprobs"].append([None] * len(completion))
        out["env_mask"].append([1] * len(answer) + [masked] * (len(suffix) + 1))
        out["env_reward"].append(float(i % 2))
    return out


def env_reward(prompts, completions, env_reward, tag, **kwargs):
    with open(os.environ["SCORED"], "a") as f:
        f.write(json.dumps({"completions": completions, "env_reward": env_reward, "tag": tag}) + "\\n")
    return env_reward


def missing_logprobs(prompts, trainer):
    return {"prompt_ids": [[1]] * len(prompts), "completion_ids": [[2]] * len(prompts)}


def no_mask(prompts, trainer):
    """env_mask None and a row's logprobs None, as TRL accepts them."""
    tok = trainer.processing_class
    ids = [tok.encode("12", add_special_tokens=False) + [tok.eos_token_id] for _ in prompts]
    return {"prompt_ids": [[1, 2]] * len(prompts), "completion_ids": ids, "logprobs": [None] * len(prompts),
            "env_mask": None, "env_reward": [float(i % 2) for i in range(len(prompts))], "tag": "t"}


def short(prompts, trainer):
    return {"prompt_ids": [[1]], "completion_ids": [[2]], "logprobs": None}
'''


@pytest.fixture
def func_file(tmp_path, monkeypatch):
    path = tmp_path / "rollout.py"
    path.write_text(ROLLOUT)
    monkeypatch.setenv("SEEN", str(tmp_path / "seen.jsonl"))
    monkeypatch.setenv("SCORED", str(tmp_path / "scored.jsonl"))
    return path


def run(out, path, suffix, mask_env=0, *extra):
    os.environ.update(SUFFIX=suffix, MASK_ENV=str(mask_env))
    rlhf_main(train_argv(out, "--rlhf_type", "grpo", "--dataset", "builtin:arith-sft#8", "--num_generations", "2",
                         "--per_device_train_batch_size", "4", "--max_steps", "1", "--max_completion_length", "6",
                         "--rollout_func", f"{path}:rollout_func", "--reward_funcs", f"{path}:env_reward",
                         "--seed", "0", "--data_seed", "0", "--learning_rate", "1e-2", *extra))
    log = [r for r in map(json.loads, open(out / "logging.jsonl")) if "loss" in r]
    return load_file(out / "adapter_model.safetensors"), log[0]  # LoRA (train_argv)


def test_the_functions_tokens_are_trained_on_and_its_extra_keys_reach_the_rewards(tmp_path, func_file, monkeypatch):
    from swift.model import load_model

    tokenizer = load_model("builtin:tiny-chat")[1]
    a, log = run(tmp_path / "a", func_file, " and so on")
    seen = [json.loads(line) for line in open(tmp_path / "seen.jsonl")]
    scored = [json.loads(line) for line in open(tmp_path / "scored.jsonl")]
    # TRL's call: each prompt once per generation, consecutively; the trainer answers TRL's names
    prompts = seen[0]["prompts"]
    assert len(prompts) == 4 and prompts[0] == prompts[1] and prompts[2] == prompts[3] and prompts[0] != prompts[2]
    assert prompts[0][-1]["role"] == "user"
    assert (seen[0]["max_completion_length"], seen[0]["num_generations"], seen[0]["learning_rate"]) == (6, 2, 1e-2)
    # the reward gets the decoded completions and the function's extra keys, per row (a scalar: every row)
    expected = [tokenizer.decode(tokenizer.encode(p[-1]["content"][-3:] if i % 2 else "12", add_special_tokens=False)
                                 + tokenizer.encode(" and so on", add_special_tokens=False), skip_special_tokens=True)
                for i, p in enumerate(prompts)]
    assert scored[0] == {"completions": [[{"role": "assistant", "content": c}] for c in expected],
                         "env_reward": [0.0, 1.0, 0.0, 1.0], "tag": ["t"] * 4}
    assert log["reward"] == 0.5
    # tokens the environment added (env_mask 0) carry no loss: another suffix of as many tokens trains to
    # the same weights (bit for bit: the same shapes), and a longer one leaves the step's gradient as it
    # was (to rounding: other shapes sum in another order), so they are not counted in its mean either ...
    b, _ = run(tmp_path / "b", func_file, " or so on")
    assert all((a[k] - b[k]).abs().max() == 0 for k in a)
    _, longer = run(tmp_path / "b2", func_file, " then more words here")
    assert longer["grad_norm"] == pytest.approx(log["grad_norm"], rel=1e-4)
    # ... unless they are marked as the model's (env_mask 1)
    c, _ = run(tmp_path / "c", func_file, " and so on", 1)
    assert max(float((a[k] - c[k]).abs().max()) for k in a) > 1e-4


def test_nones_are_taken_as_trl_takes_them(tmp_path, func_file):
    from swift.rollout.trl_rollout_func import RolloutFunc

    class Trainer:  # what RolloutFunc reads of the trainer
        from swift.model import load_model

        processing_class = load_model("builtin:tiny-chat")[1]
        model, args = None, None
        rlhf_args = type("A", (), {"num_generations": 2})()

    from swift.rollout.multi_turn import RolloutInferRequest

    (t, _) = RolloutFunc(f"{func_file}:no_mask", Trainer())([RolloutInferRequest([{"role": "user", "content": "x"}])], 2)
    assert t.loss_mask == [1] * len(t.completion_ids) and not t.truncated  # ends with the end token
    assert len(t.logprobs) == len(t.completion_ids) and all(v != v for v in t.logprobs)  # NaN: unknown


def test_what_the_function_gets_wrong_is_refused_in_one_line(tmp_path, func_file):
    def argv(func, *extra):
        return train_argv(tmp_path, "--rlhf_type", "grpo", "--dataset", "builtin:arith-sft#8", "--num_generations",
                          "2", "--per_device_train_batch_size", "4", "--max_steps", "1", "--rollout_func",
                          f"{func_file}:{func}", "--reward_funcs", "accuracy", *extra)

    with pytest.raises(SwiftError, match="must return the keys prompt_ids, completion_ids, logprobs; missing logprobs"):
        rlhf_main(argv("missing_logprobs"))
    with pytest.raises(SwiftError, match="'prompt_ids' has 1 entries for 4 prompts"):
        rlhf_main(argv("short"))
    with pytest.raises(SwiftError, match="defines no nothing"):
        rlhf_main(argv("nothing"))
    with pytest.raises(SwiftError, match="--rollout_func replaces the whole rollout; drop --max_turns"):
        rlhf_main(argv("rollout_func", "--max_turns", "2"))
    with pytest.raises(SwiftError, match="--rollout_func replaces the whole rollout; drop --multi_turn_scheduler"):
        rlhf_main(argv("rollout_func", "--multi_turn_scheduler", "math_tip_trick"))
    with pytest.raises(SwiftError, match="--rollout_func generates in the trainer's processes"):
        rlhf_main(argv("rollout_func", "--rollout_mode", "server"))
