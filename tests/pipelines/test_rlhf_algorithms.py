"""`swift rlhf` end to end for orpo, cpo, simpo, kto, rm, prm and gkd, and --precompute_ref_log_probs."""
import json
import os
from types import SimpleNamespace

import pytest
import torch

from swift.dataset.loader import load_rows
from swift.pipelines.rlhf import SequenceCollator, add_mismatched, encode_steps, encode_unpaired, rlhf_main
from swift.template import IGNORE_INDEX, get_template
from swift.utils.registry import SwiftError
from tests.conftest import save_perturbed, train_argv


def read_log(out):
    with open(os.path.join(out, "logging.jsonl")) as f:
        return [json.loads(line) for line in f]


def train_logs(out):
    return [r for r in read_log(out) if "loss" in r]


@pytest.mark.parametrize("rlhf_type", ["orpo", "cpo", "simpo"])
def test_reference_free_algorithms_learn_a_small_preference_set(tmp_path, rlhf_type):
    out = tmp_path / rlhf_type
    rlhf_main(train_argv(out, "--rlhf_type", rlhf_type, "--dataset", "builtin:arith-dpo#16", "--tuner_type", "full",
                         "--learning_rate", "1e-3", "--max_steps", "30", "--per_device_train_batch_size", "8",
                         "--beta", "2.0" if rlhf_type == "simpo" else "1.0"))
    logs = train_logs(out)
    last = logs[-4:]
    assert sum(r["rewards/margins"] for r in last) / 4 > logs[0]["rewards/margins"] + 0.005
    assert sum(r["rewards/accuracies"] for r in last) / 4 >= 0.75
    assert sum(r["loss"] for r in last) / 4 < logs[0]["loss"]


def test_kto_pairs_each_prompt_with_a_mismatched_completion(tokenizer):
    template = get_template("chatml", tokenizer, loss_scale="last_round")
    rows = load_rows(["builtin:arith-kto#4"]).rows
    samples = add_mismatched([encode_unpaired(template, r) for r in rows], block=4)
    for i, s in enumerate(samples):
        (ids, labels), (kl_ids, kl_labels) = s["sequences"]
        prompt_len = next(j for j, t in enumerate(labels) if t != IGNORE_INDEX)
        previous_completion = samples[i - 1]["sequences"][0][0][prompt_len_of(samples[i - 1]):]
        assert kl_ids[:prompt_len] == ids[:prompt_len] and kl_ids[prompt_len:] == previous_completion
        assert s["label"] == rows[i]["label"]
    batch = SequenceCollator(tokenizer.pad_token_id)(samples)
    assert batch["input_ids"].shape[0] == 8 and batch["label"].tolist() == [r["label"] for r in rows]


def prompt_len_of(sample):
    return next(j for j, t in enumerate(sample["sequences"][0][1]) if t != IGNORE_INDEX)


def kto_pipeline(out, *extra):
    from swift.pipelines.base import resolve_args
    from swift.pipelines.rlhf import RLHFArguments, RLHFPipeline

    return RLHFPipeline(resolve_args(RLHFArguments, train_argv(out, "--rlhf_type", "kto", *extra), "swift rlhf"))


def test_kto_never_pairs_a_row_with_its_own_completion(tmp_path, tokenizer):
    """ms-swift's kto.sh setting, batch 1 × accumulation 16 on one rank: the mismatched pairs are
    formed in blocks of one optimizer step's rows over all ranks (ms-swift's prepare_kto_dataset), and
    17 rows leave a last block of one row, which joins the block before it. (Before 2026-11-29 the
    block was batch × ranks, here 1: every row's KL baseline was its own answer.) One row per
    optimizer step is refused in one line."""
    template = get_template("chatml", tokenizer, loss_scale="last_round")
    samples = kto_pipeline(tmp_path, "--per_device_train_batch_size", "1", "--gradient_accumulation_steps",
                           "16").encode(load_rows(["builtin:arith-kto#17"]), template, "encode train")
    answers = [tuple(s["sequences"][0][0][prompt_len_of(s):]) for s in samples]
    assert len(samples) == 17 and len(set(answers)) == 17  # distinct answers: a self-pairing would show
    for own, s in zip(answers, samples):
        mismatched = tuple(s["sequences"][1][0][prompt_len_of(s):])
        assert mismatched in answers and mismatched != own
    with pytest.raises(SwiftError, match=r"^--rlhf_type kto needs more than 1 row per optimizer step "
                                         r"\(--per_device_train_batch_size 1 × --gradient_accumulation_steps 1 × 1"):
        rlhf_main(train_argv(tmp_path / "one", "--rlhf_type", "kto", "--dataset", "builtin:arith-kto#4",
                             "--per_device_train_batch_size", "1"))


def test_kto_last_block_of_one_row_joins_the_one_before():
    def samples(n):
        return [{"sequences": [([i], [i])], "_prompt": [100 + i], "_completion": ([i], [i])} for i in range(n)]

    mismatched = [s["sequences"][1][0][1] for s in add_mismatched(samples(5), block=2)]
    assert mismatched == [1, 0, 4, 2, 3]  # blocks [0, 1] and [2, 3, 4]
    with pytest.raises(SwiftError, match="^the val data holds 1 row after encoding: KTO's KL baseline"):
        add_mismatched(samples(1), block=2, what="the val data")


def test_kto_mismatched_sequences_are_cut_to_max_length(tmp_path, tokenizer):
    """A prompt with another row's answer can exceed --max_length when each row fits alone: the
    prompt is kept and the answer's end cut. (Before 2026-11-29 it was not cut: up to 2 × --max_length.)"""
    data = tmp_path / "kto.jsonl"
    rows = [{"prompt": "1+1=", "completion": " ".join(["2"] * 40), "label": True},
            {"prompt": "Add these numbers: " + " + ".join(["1"] * 40) + " =", "completion": "40", "label": False}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plain = get_template("chatml", tokenizer, loss_scale="last_round")
    limit = max(len(encode_unpaired(plain, r)["sequences"][0][0]) for r in load_rows([str(data)]).rows)
    template = get_template("chatml", tokenizer, max_length=limit, loss_scale="last_round")
    samples = kto_pipeline(tmp_path / "out", "--max_length", str(limit)).encode(load_rows([str(data)]), template,
                                                                                "encode train")
    for i, s in enumerate(samples):
        (ids, _), (kl_ids, kl_labels) = s["sequences"]
        other_ids, other_labels = samples[1 - i]["sequences"][0]
        n, m = prompt_len_of(s), prompt_len_of(samples[1 - i])
        kept = len(kl_ids) - n  # of the other row's answer, from its start
        assert len(kl_ids) <= limit and kl_ids[:n] == ids[:n] and set(kl_labels[:n]) == {IGNORE_INDEX}
        assert kept > 0 and kl_ids[n:] == other_ids[m:m + kept] and kl_labels[n:] == other_labels[m:m + kept]
    assert len(samples[1]["sequences"][1][0]) == limit  # the long prompt's: cut


def test_kto_trains_and_logs_the_kl_baseline(tmp_path, monkeypatch):
    import swift.rlhf.kto as kto

    seen = []
    original = kto.kl_baseline

    def spy(mismatched):
        seen.append(mismatched.detach().mean().item())
        return original(mismatched)

    monkeypatch.setattr(kto, "kl_baseline", spy)
    rlhf_main(train_argv(tmp_path, "--rlhf_type", "kto", "--dataset", "builtin:arith-kto#16", "--learning_rate",
                         "5e-3", "--max_steps", "20", "--per_device_train_batch_size", "8", "--undesirable_weight", "1.2"))
    logs = train_logs(tmp_path)
    # the logged baseline is max(0, mean log-ratio of the step's mismatched pairs), step by step
    assert len(seen) == len(logs) == 20 and any(m != 0 for m in seen)
    assert [r["kl"] for r in logs] == pytest.approx([max(0.0, m) for m in seen], rel=1e-3, abs=1e-6)
    assert logs[0]["loss"] == pytest.approx(0.5 * (1 + 1.2) / 2, abs=0.05)  # σ(0) = ½ per row at step 0
    assert sum(r["loss"] for r in logs[-4:]) / 4 < logs[0]["loss"] - 0.05
    assert logs[-1]["rewards/chosen"] > logs[-1]["rewards/rejected"]


def test_kto_needs_a_label(tmp_path):
    with pytest.raises(SwiftError, match="label"):
        rlhf_main(train_argv(tmp_path, "--rlhf_type", "kto", "--dataset", "builtin:arith-sft#4", "--strict", "true"))


@pytest.mark.parametrize("tuner", ["full", "lora"])
def test_precomputed_reference_gives_the_same_losses(tmp_path, tuner):
    runs = {}
    for precompute in ("false", "true"):
        out = tmp_path / precompute
        rlhf_main(train_argv(out, "--dataset", "builtin:arith-dpo#16", "--tuner_type", tuner, "--learning_rate", "1e-3",
                             "--max_steps", "4", "--per_device_train_batch_size", "8",
                             "--precompute_ref_log_probs", precompute))
        runs[precompute] = [r["loss"] for r in train_logs(out)]
    assert runs["true"] == pytest.approx(runs["false"], abs=1e-5)


def test_reward_model_trains_and_loads_with_auto_class(tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    data = tmp_path / "pairs.jsonl"
    rows = load_rows(["builtin:arith-dpo#16"]).rows
    with open(data, "w") as f:
        for i, r in enumerate(rows):
            f.write(json.dumps({"prompt": r["messages"][0]["content"], "chosen": r["messages"][1]["content"],
                                "rejected": r["rejected_response"], "margin": i % 3}) + "\n")
    out = tmp_path / "rm"
    rlhf_main(train_argv(out, "--rlhf_type", "rm", "--dataset", str(data), "--tuner_type", "full", "--learning_rate",
                         "1e-3", "--max_steps", "40", "--per_device_train_batch_size", "8",
                         "--center_rewards_coefficient", "0.01"))
    logs = train_logs(out)
    assert sum(r["accuracy"] for r in logs[-4:]) / 4 >= 0.9 and logs[-1]["margin"] > logs[0]["margin"] + 1
    model = AutoModelForSequenceClassification.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.config.num_labels == 1
    good = tokenizer.apply_chat_template([{"role": "user", "content": rows[0]["messages"][0]["content"]},
                                          {"role": "assistant", "content": rows[0]["messages"][1]["content"]}],
                                         tokenize=False)
    bad = good.replace(rows[0]["messages"][1]["content"] + "<|im_end|>", rows[0]["rejected_response"] + "<|im_end|>")
    with torch.no_grad():
        scores = [model(**tokenizer(t, return_tensors="pt")).logits.item() for t in (good, bad)]
    assert scores[0] > scores[1]


def test_prm_labels_sit_on_step_separators(tokenizer):
    template = get_template("chatml", tokenizer)
    row = load_rows(["builtin:arith-prm#1"]).rows[0]
    (ids, labels), = encode_steps(template, row, SimpleNamespace(step_separator="\n", max_length=None))["sequences"]
    positions = [i for i, t in enumerate(labels) if t != IGNORE_INDEX]
    assert [labels[i] for i in positions] == [int(x) for x in row["labels"]]
    assert all(tokenizer.decode(ids[i]) == "\n" for i in positions)
    assert tokenizer.decode(ids[positions[0] + 1:positions[1] + 1]) == row["completions"][1] + "\n"


def test_prm_step_labels_must_be_booleans(tokenizer):
    """bool, 0/1 or the strings true/false, 1/0, yes/no (any case; the same reader as KTO's labels);
    any other value drops the row, counted with its value. (Before 2026-11-29 a label was
    bool(value): "false" trained as correct, None as wrong; before 2026-11-30 "yes" was refused here
    and read by KTO.)"""
    from functools import partial

    from swift.dataset.encode import encode_rows
    from swift.dataset.loader import RowSet

    template = get_template("chatml", tokenizer)
    row = load_rows(["builtin:arith-prm#1"]).rows[0]  # two steps
    rows = [{**row, "labels": labels} for labels in (["false", "TRUE"], [0, True], [True, None], ["yes", 1], [2, 0],
                                                     [0.0, 1.0], [0.5, 1])]
    rowset = RowSet(rows=rows, origins=[f"row {i}" for i in range(len(rows))])
    samples = encode_rows(rowset, partial(encode_steps, template, a=SimpleNamespace(step_separator="\n",
                                                                                   max_length=None)), strict=False)
    assert [[t for t in s["sequences"][0][1] if t != IGNORE_INDEX] for s in samples] == [[0, 1], [0, 1], [1, 1],
                                                                                         [0, 1]]
    assert {reason: rowset.first_bad[reason] for reason in rowset.dropped} == {
        "step label None is not a boolean (true/false, 1/0, yes/no)": "row 2",
        "step label 2 is not a boolean (true/false, 1/0, yes/no)": "row 4",
        "step label 0.5 is not a boolean (true/false, 1/0, yes/no)": "row 6"}


def test_prm_trains_and_loads_as_token_classifier(tmp_path):
    from transformers import AutoModelForTokenClassification

    out = tmp_path / "prm"
    rlhf_main(train_argv(out, "--rlhf_type", "prm", "--dataset", "builtin:arith-prm#8", "--tuner_type", "full",
                         "--learning_rate", "3e-3", "--max_steps", "30", "--per_device_train_batch_size", "8"))
    logs = train_logs(out)  # memorises eight step-labelled rows
    assert logs[-1]["step_accuracy"] == 1.0 and logs[-1]["loss"] < 0.5 * logs[0]["loss"]
    model = AutoModelForTokenClassification.from_pretrained(out)
    assert model.config.num_labels == 2


def test_prm_with_lora_trains_its_head_whole(tmp_path):
    """LoRA on a token classifier: the value head is trained and saved whole (modules_to_save), not
    given LoRA itself (PEFT's all-linear picked it, then failed to save it as a whole module)."""
    from safetensors.torch import load_file

    out = tmp_path / "prm"
    rlhf_main(train_argv(out, "--rlhf_type", "prm", "--dataset", "builtin:arith-prm#8", "--tuner_type", "lora",
                         "--max_steps", "2"))
    names = list(load_file(out / "adapter_model.safetensors"))
    assert any(n.endswith("score.weight") for n in names) and not any("score.lora" in n for n in names)


def test_gkd_distils_a_teacher_on_and_off_policy(tmp_path):
    from swift.pipelines.train import sft_main

    teacher = tmp_path / "teacher"
    sft_main(train_argv(teacher, "--tuner_type", "full", "--learning_rate", "3e-3", "--max_steps", "10",
                        "--per_device_train_batch_size", "16"))
    out = tmp_path / "gkd"
    rlhf_main(train_argv(out, "--rlhf_type", "gkd", "--teacher_model", str(teacher), "--tuner_type", "full",
                         "--learning_rate", "3e-3", "--max_steps", "16", "--per_device_train_batch_size", "8",
                         "--lmbda", "0.5", "--sft_alpha", "0.1", "--max_completion_length", "6", "--seed", "1", "--data_seed", "1"))
    logs = train_logs(out)
    on_policy = [r["on_policy"] for r in logs]
    assert 0 < sum(on_policy) < len(logs)  # some steps sampled from the student, some used the dataset
    assert all(("sft_loss" in r) == (not r["on_policy"]) for r in logs)
    assert sum(r["jsd"] for r in logs[-4:]) / 4 < logs[0]["jsd"]


def test_gkd_needs_a_teacher(tmp_path):
    with pytest.raises(SwiftError, match="--teacher_model"):
        rlhf_main(train_argv(tmp_path, "--rlhf_type", "gkd"))


def test_a_resumed_gkd_run_matches_an_uninterrupted_one(tmp_path, tiny):
    """The on/off-policy coin and the sampling seeds come from (seed, step, micro-batch): a run resumed
    from step 2 draws what the uninterrupted run drew (it replayed steps 1-2's pattern before)."""
    import shutil

    from safetensors.torch import load_file

    save_perturbed(tiny, tmp_path / "teacher")

    def argv(out, *extra):
        return train_argv(out, "--rlhf_type", "gkd", "--teacher_model", str(tmp_path / "teacher"), "--tuner_type",
                          "full", "--max_steps", "6", "--lmbda", "0.5", "--max_completion_length", "4",
                          "--temperature", "1.0", "--save_strategy", "steps", "--save_steps", "1",
                          "--gradient_accumulation_steps", "2", "--per_device_train_batch_size", "2", *extra)

    rlhf_main(argv(tmp_path / "straight"))
    straight = {r["global_step"]: r for r in train_logs(tmp_path / "straight")}
    assert 0 < sum(r["on_policy"] for r in straight.values()) < 6  # both kinds of step occur
    out = tmp_path / "resumed"
    shutil.copytree(tmp_path / "straight" / "checkpoint-2", out / "checkpoint-2")
    rlhf_main(argv(out, "--resume_from_checkpoint", str(out / "checkpoint-2")))
    resumed = {r["global_step"]: r for r in train_logs(out)}
    assert sorted(resumed) == [3, 4, 5, 6]
    for s, r in resumed.items():
        assert r["on_policy"] == straight[s]["on_policy"] and r["loss"] == pytest.approx(straight[s]["loss"]), s
    final, weights = load_file(tmp_path / "straight" / "model.safetensors"), load_file(out / "model.safetensors")
    for name, tensor in final.items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=1e-6, msg=name)
