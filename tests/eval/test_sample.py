"""`swift sample`: kept answers scored by the outcome reward, chosen/rejected pairs, output that `swift
sft` and `swift rlhf --rlhf_type dpo` load unchanged, sharding with --data_range and --resume losing
and repeating nothing, scoring a dataset's own answers with a reward model, a process reward model's
step scores and threshold, and a teacher behind `swift deploy` (client engine, distill)."""
import json
import os
import subprocess
from collections import Counter

import pytest
import torch

from swift.utils.registry import SwiftError

from tests.conftest import SWIFT

SAMPLE = ["--dataset", "builtin:arith-sft:eval#24", "--num_return_sequences", "6", "--n_best_to_keep", "3",
          "--orm_model", "accuracy", "--max_new_tokens", "6", "--temperature", "1.6", "--seed", "3"]


def swift(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SWIFT, *argv], capture_output=True, text=True, timeout=900)


def rows_of(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def sampled(tmp_path_factory, quickstart):
    _, out = quickstart
    model = os.path.join(out, "sft")
    path = tmp_path_factory.mktemp("sample")
    proc = swift("sample", "--model", model, *SAMPLE, "--output_dir", str(path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return model, path


def test_kept_answers_and_pairs(sampled):
    from swift.rewards.builtin import is_correct

    _, path = sampled
    kept, pairs = rows_of(path / "sample.jsonl"), rows_of(path / "sample_pairs.jsonl")
    per_prompt = Counter(r["row_index"] for r in kept)
    assert set(per_prompt) == set(range(24)) and max(per_prompt.values()) <= 3
    for r in kept:
        answer = r["messages"][-1]["content"]
        assert r["messages"][-1]["role"] == "assistant" and r["score"] == is_correct(answer, r["solution"])
    for i in per_prompt:  # distinct answers, best first
        answers = [r for r in kept if r["row_index"] == i]
        assert len({r["messages"][-1]["content"] for r in answers}) == len(answers)
        assert [r["score"] for r in answers] == sorted((r["score"] for r in answers), reverse=True)
    assert pairs, "a sampling temperature of 1.6 gives some wrong answers"
    for p in pairs:
        assert p["score"] == 1.0 and p["rejected_score"] == 0.0
        assert p["messages"][-1]["content"] == p["solution"] != p["rejected_response"]
    first = {r["row_index"]: r for r in reversed(kept)}  # the best row of each prompt
    assert [p for p in pairs] == [first[p["row_index"]] for p in pairs]
    for r in kept:  # ms-swift's layout: a kept row above the worst answer carries it as the rejected one
        if "rejected_response" in r:
            assert r["score"] > r["rejected_score"] and r["rejected_response"] != r["messages"][-1]["content"]
        elif r["score"] > min(x["score"] for x in kept if x["row_index"] == r["row_index"]):
            raise AssertionError(f"a row above a kept worse answer has no rejected_response: {r}")


def test_output_trains_with_sft_and_dpo(sampled, tmp_path):
    model, path = sampled
    common = ["--model", model, "--max_steps", "2", "--per_device_train_batch_size", "4", "--save_strategy", "no",
              "--report_to", "none", "--add_version", "false", "--tuner_type", "lora"]
    sft = swift("sft", *common, "--dataset", str(path / "sample.jsonl"), "--output_dir", str(tmp_path / "sft"),
                "--strict", "true")
    assert sft.returncode == 0, sft.stderr[-3000:]
    dpo = swift("rlhf", "--rlhf_type", "dpo", *common, "--dataset", str(path / "sample_pairs.jsonl"),
                "--output_dir", str(tmp_path / "dpo"), "--strict", "true")
    assert dpo.returncode == 0, dpo.stderr[-3000:]


def test_shards_and_resume_lose_and_repeat_nothing(sampled, tmp_path):
    """Two --data_range shards cover the rows once; a shard interrupted in the middle of a prompt's
    rows and resumed ends with every prompt exactly once (the same rows as an uninterrupted shard:
    the sampling seed is per request); a resume with another seed, temperature, model or scoring
    setting is refused in one line naming it."""
    model, whole = sampled
    argv = ["sample", "--model", model, *SAMPLE, "--output_dir", str(tmp_path)]
    for shard, resume in (("0", "false"), ("1", "true")):  # --resume with nothing written yet starts afresh
        proc = swift(*argv, "--data_range", shard, "2", "--resume", resume)
        assert proc.returncode == 0, proc.stderr[-3000:]
    shards = [rows_of(tmp_path / f"sample_{i}_of_2.jsonl") for i in (0, 1)]
    ids = [{r["row_index"] for r in s} for s in shards]
    assert ids[0] == set(range(12)) and ids[1] == set(range(12, 24))
    path, pairs = tmp_path / "sample_0_of_2.jsonl", tmp_path / "sample_0_of_2_pairs.jsonl"
    progress = tmp_path / "sample_0_of_2_progress.jsonl"
    first, first_pairs, records = shards[0], rows_of(pairs), rows_of(progress)
    # interrupted while writing the rows of a prompt with several: its first row whole, half of its
    # second, its pair written, no progress record for it
    counts = Counter(r["row_index"] for r in first)
    victim = next(i for i in range(1, 12) if counts[i] >= 2)
    lines = path.read_text().splitlines(keepends=True)
    cut = next(k for k, line in enumerate(lines) if json.loads(line)["row_index"] == victim) + 1
    path.write_text("".join(lines[:cut]) + lines[cut][:20])
    pairs.write_text("".join(json.dumps(p) + "\n" for p in first_pairs if p["row_index"] <= victim))
    # ... and the progress line of the prompt before it cut in half: that prompt is sampled again too
    kept_records = [json.dumps(r) + "\n" for r in records if r.get("row_index", -1) < victim]
    progress.write_text("".join(kept_records[:-1]) + kept_records[-1][:8])
    refused = swift(*argv, "--data_range", "0", "2")
    assert refused.returncode != 0 and "--resume continues it" in refused.stderr
    for other, named in ((["--seed", "4"], "--seed 3 (now 4)"), (["--temperature", "0.5"], "--temperature"),
                         (["--model", "builtin:tiny-chat"], "--model"), (["--n_best_to_keep", "2"], "--n_best_to_keep")):
        refused = swift(*argv[:-2], *other, *argv[-2:], "--data_range", "0", "2", "--resume", "true")
        assert refused.returncode != 0 and "was written with other settings" in refused.stderr, refused.stderr[-2000:]
        assert named in refused.stderr.strip().splitlines()[-1]
    proc = swift(*argv, "--data_range", "0", "2", "--resume", "true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert rows_of(path) == first and rows_of(pairs) == first_pairs  # every line whole, none lost or repeated
    assert rows_of(progress) == records


def test_bad_settings_stop_before_the_engine_and_touch_nothing(tmp_path):
    """--override_exist_file with a reward name that does not exist: the earlier output stays."""
    from swift.pipelines.sample import sample_main

    out = tmp_path / "out"
    out.mkdir()
    for name in ("sample.jsonl", "sample_progress.jsonl"):
        (out / name).write_text('{"earlier": 1}\n')
    for bad in (["--orm_model", "no_such_reward"], ["--orm_model", "accuracy", "--temperature", "-1"]):
        with pytest.raises(SwiftError):
            sample_main(["--model", "builtin:tiny-chat", "--dataset", "builtin:arith-sft:eval#4", *bad,
                         "--override_exist_file", "true", "--output_dir", str(out)])
        assert sorted(os.listdir(out)) == ["sample.jsonl", "sample_progress.jsonl"]
        assert (out / "sample.jsonl").read_text() == '{"earlier": 1}\n'


def test_scoring_a_dataset_with_a_reward_model(tmp_path):
    """OpenRLHF's batch scoring: --sampler_engine no keeps each row's own answer, scored by a seq_cls
    model exactly as the reward model scores it directly."""
    from swift.infer.reward import RewardScorer
    from swift.model import load_model
    from swift.template import get_template, infer_template

    model, tokenizer, info = load_model("builtin:tiny-chat", task_type="seq_cls", num_labels=1)
    model.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    proc = swift("sample", "--sampler_engine", "no", "--dataset", "builtin:arith-sft:eval#6", "--reward_model",
                 str(tmp_path / "rm"), "--output_dir", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = rows_of(tmp_path / "out" / "sample.jsonl")
    scorer = RewardScorer(model, tokenizer, get_template(infer_template(info.model_type, tokenizer), tokenizer))
    assert len(rows) == 6
    expected = scorer.score([scorer.render(r["messages"]) for r in rows])
    assert [r["score"] for r in rows] == pytest.approx(expected, abs=1e-5)


def test_process_reward_model_scores_steps_where_it_was_trained(tmp_path):
    from swift.eval.prm import PRMScorer
    from swift.model import load_model

    model, tokenizer, _ = load_model("builtin:tiny-chat", task_type="token_cls", num_labels=2)
    model.eval()  # its classifier has dropout
    model.save_pretrained(tmp_path / "prm")
    tokenizer.save_pretrained(tmp_path / "prm")
    prm = PRMScorer(str(tmp_path / "prm"))
    messages = [{"role": "user", "content": "12+34+5="}]
    scores = prm.step_scores(messages, "12+34=46\n46+5=51")
    ids = prm.template.encode_prompt(messages)
    ends = []
    for step in ("12+34=46", "46+5=51"):
        ids = ids + tokenizer.encode(step + "\n", add_special_tokens=False)
        ends.append(len(ids) - 1)
    with torch.no_grad():
        direct = model(input_ids=torch.tensor([ids])).logits[0, ends].softmax(-1)[:, 1]
    assert scores == pytest.approx(direct.tolist(), abs=1e-6) and prm.score(messages, "12+34=46\n46+5=51") == min(scores)
    # --prm_threshold above every step score drops every answer
    from swift.pipelines.sample import select

    class A:
        easy_query_threshold, n_best_to_keep, pair_min_margin = None, 2, 0.0

    assert select(messages, ["x", "y"], [None, None], None, A)[2] == "no answer passed the filters"


def test_client_engine_and_distill_from_a_deployed_teacher(tmp_path, quickstart):
    from tests.deploy.serving import deploy

    _, out = quickstart
    with deploy("--model", os.path.join(out, "sft")) as base:
        proc = swift("sample", "--sampler_type", "distill", "--sampler_engine", "client", "--engine_kwargs",
                     json.dumps({"base_url": base + "/v1"}), "--dataset", "builtin:arith-sft:eval#8",
                     "--num_return_sequences", "1", "--temperature", "0", "--max_new_tokens", "6",
                     "--output_dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = rows_of(tmp_path / "sample.jsonl")
    assert len(rows) == 8 and sum(r["messages"][-1]["content"] == r["solution"] for r in rows) >= 6


@pytest.mark.parametrize("argv,message", [
    (["--sampler_type", "mcts"], "--sampler_type mcts is an ms-swift sampler this version does not support"),
    (["--sampler_engine", "client"], "--sampler_engine client needs --engine_kwargs"),
    (["--data_range", "2", "2"], "--data_range 2 2: give I N with 0 <= I < N"),
    (["--easy_query_threshold", "0.5"], "--easy_query_threshold counts answers that earn the outcome reward"),
    # flags nothing reads in this run
    (["--sampler_type", "distill", "--sampler_engine", "client", "--engine_kwargs", '{"base_url": "http://h:1/v1"}',
      "--orm_model", "accuracy"], "--orm_model does nothing with --sampler_type distill"),
    (["--sampler_type", "distill", "--sampler_engine", "client", "--engine_kwargs", '{"base_url": "http://h:1/v1"}',
      "--pair_min_margin", "0.5"], "--pair_min_margin does nothing with --sampler_type distill"),
    (["--prm_threshold", "0.3"], "--prm_threshold applies to --prm_model's scores; there is no --prm_model"),
    (["--sampler_engine", "no", "--num_return_sequences", "4"], "--num_return_sequences does nothing with "
                                                                "--sampler_engine no"),
    (["--sampler_engine", "client", "--engine_kwargs", '{"base_url": "http://h:1/v1"}', "--adapters", "a"],
     "--adapters does nothing with --sampler_engine client"),
    (["--sampler_engine", "client", "--engine_kwargs", '{"base_url": "http://h:1/v1", "model": "m"}'],
     "--model builtin:tiny-chat and --engine_kwargs model m: give the served model once"),
])
def test_bad_flags_are_one_line(argv, message):
    from swift.arguments.parser import parse_args
    from swift.pipelines.sample import SampleArguments

    with pytest.raises(SwiftError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        parse_args(SampleArguments, ["--model", "builtin:tiny-chat", "--dataset", "builtin:arith-sft", *argv])


def test_the_resume_fingerprint_keeps_secrets_out_and_reads_older_files(tmp_path):
    """A client engine's options from a config file (a mapping): its key is not written to the
    progress file and its concurrency is not a setting that must match; a progress file written by
    an earlier version (data, seed, shard and rows only) still resumes."""
    from swift.arguments.parser import parse_args
    from swift.pipelines.sample import SampleArguments, fingerprint, prepare_resume

    config = tmp_path / "sample.yaml"
    config.write_text("model: builtin:tiny-chat\ndataset: [builtin:arith-sft:eval#4]\nsampler_engine: client\n"
                      "engine_kwargs: {base_url: 'http://127.0.0.1:9/v1', api_key: sk-secret, concurrency: 4}\n")
    a = parse_args(SampleArguments, ["--config", str(config)])
    expected = fingerprint(a, 4)
    assert expected["engine_kwargs"] == {"base_url": "http://127.0.0.1:9/v1"} and "sk-secret" not in json.dumps(expected)
    out = tmp_path / "sample.jsonl"
    out.write_text(json.dumps({"row_index": 0, "response": "x"}) + "\n")
    # (files of versions before 2026-11-29 also record --max_length 2048, which nothing read then)
    older = {"dataset": ["builtin:arith-sft:eval#4"], "seed": 42, "data_range": [], "rows": 4, "max_length": 2048,
             "truncation_strategy": "delete"}
    (tmp_path / "sample_progress.jsonl").write_text(json.dumps({"fingerprint": older}) + "\n"
                                                    + json.dumps({"row_index": 0}) + "\n")
    assert prepare_resume(str(out), expected) == {0}
    older["seed"] = 7
    (tmp_path / "sample_progress.jsonl").write_text(json.dumps({"fingerprint": older}) + "\n")
    with pytest.raises(SwiftError, match=r"--seed 7 \(now 42\)"):
        prepare_resume(str(out), expected)


def test_answers_the_reward_cannot_score_fail_their_prompt_alone(tmp_path):
    """A reward that returns None for some answers (no reward: those answers are not kept) and a row
    it cannot read (no `solution`: that prompt fails with a warning, is not written and is counted);
    the run goes on. A dataset it can read in no row: the first batch fails whole, and the run stops
    there with one line (rather than sampling every prompt for nothing)."""
    from swift.pipelines.sample import sample_main

    plugin = tmp_path / "rw.py"
    plugin.write_text("def half(completions, solution, **kwargs):  # conversational rows: TRL's message lists\n"
                      "    texts = [c[-1]['content'] for c in completions]\n"
                      "    return [None if i % 2 else float(t.strip() == s) for i, (t, s) in enumerate(zip(texts, solution))]\n")
    data = tmp_path / "rows.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"{i}+1="}], "solution": str(i + 1)} for i in range(3)]
    del rows[1]["solution"]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["--model", "builtin:tiny-chat", "--num_return_sequences", "4", "--max_new_tokens", "3",
              "--num_sampling_batch_size", "1"]
    out = sample_main([*common, "--dataset", str(data), "--orm_model", f"{plugin}:half", "--output_dir",
                       str(tmp_path / "out")])
    assert out["prompts"] == 3 and out["failed"] == 1
    written = rows_of(tmp_path / "out" / "sample.jsonl") if os.path.exists(tmp_path / "out" / "sample.jsonl") else []
    skipped = rows_of(tmp_path / "out" / "sample_skipped.jsonl") if os.path.exists(
        tmp_path / "out" / "sample_skipped.jsonl") else []
    assert {r["row_index"] for r in written + skipped} == {0, 2}  # the unreadable second row is in neither
    assert {r["row_index"] for r in rows_of(tmp_path / "out" / "sample_progress.jsonl")[1:]} == {0, 2}
    assert len(written) <= 2 * len({r["row_index"] for r in written})  # at most the two scored answers of each
    for r in rows:
        r.pop("solution", None)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SwiftError, match="every prompt failed .*missing 1 required positional argument: 'solution'"):
        sample_main([*common, "--dataset", str(data), "--orm_model", f"{plugin}:half", "--output_dir",
                     str(tmp_path / "none")])
    progress = rows_of(tmp_path / "none" / "sample_progress.jsonl")
    assert len(progress) == 1  # its fingerprint only: the first prompt failed, and nothing more was sampled


def test_a_row_index_column_in_any_row_is_refused(tmp_path):
    from swift.pipelines.sample import sample_main

    data = tmp_path / "rows.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"{i}+1="}]} for i in range(3)]
    rows[2]["row_index"] = 7
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SwiftError, match="rows.jsonl row 3: a 'row_index' column"):  # origins count from 1
        sample_main(["--model", "builtin:tiny-chat", "--dataset", str(data), "--output_dir", str(tmp_path / "out")])
    assert not os.path.exists(tmp_path / "out")


def test_scoring_own_answers_checks_every_row_has_one_before_writing(tmp_path):
    """--sampler_engine no: a row without its own answer stops the run before anything is written
    (before 2026-11-29 the rows before it were written first)."""
    from swift.pipelines.sample import sample_main

    data = tmp_path / "rows.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"{i}+1="}, {"role": "assistant", "content": str(i + 1)}],
             "solution": str(i + 1)} for i in range(3)]
    rows[2]["messages"].pop()
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SwiftError, match="rows.jsonl row 3 has none"):
        sample_main(["--sampler_engine", "no", "--dataset", str(data), "--orm_model", "accuracy",
                     "--num_sampling_batch_size", "1", "--output_dir", str(tmp_path / "out")])
    assert not os.path.exists(tmp_path / "out")
