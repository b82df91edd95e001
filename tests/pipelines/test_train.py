"""End-to-end `swift sft` / `swift pt` runs on the built-in tiny model (a few steps each)."""
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from swift import SftArguments, pt_main, sft_main
from swift.utils.registry import SwiftError
from tests.conftest import SWIFT, train_argv


def read_log(out):
    with open(os.path.join(out, "logging.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_lora_sft_writes_every_output(tmp_path):
    out = tmp_path / "run"
    result = sft_main(train_argv(out, "--max_steps", "6", "--val_dataset", "builtin:arith-sft:eval#8",
                                 "--eval_steps", "3", "--save_strategy", "steps", "--save_steps", "3",
                                 "--report_to", "tensorboard"))
    assert result["global_step"] == 6 and result["last_checkpoint"].endswith("checkpoint-6")
    assert "eval_loss" in result["metrics"]
    for name in ("args.json", "logging.jsonl", "adapter_model.safetensors", "adapter_config.json", "result.json",
                 "checkpoint-3/args.json", "checkpoint-3/optimizer.pt"):
        assert os.path.exists(out / name), name
    assert glob.glob(str(out / "runs" / "*" / "events.out.tfevents.*"))
    assert {"loss.png", "learning_rate.png"} <= {os.path.basename(p) for p in glob.glob(str(out / "images" / "*.png"))}
    logs = read_log(out)
    assert any("eval_loss" in r for r in logs) and sum("loss" in r for r in logs) == 6
    assert json.load(open(out / "args.json"))["lora_rank"] == 8


def test_python_api_takes_dataclass(tmp_path):
    args = SftArguments(model="builtin:tiny-chat", dataset=["builtin:arith-sft#16"], output_dir=str(tmp_path),
                        max_steps=2, per_device_train_batch_size=4, report_to="none", save_strategy="no",
                        disable_tqdm=True)
    assert sft_main(args)["global_step"] == 2


def test_full_tuning_reduces_loss_and_freeze_keeps_frozen(tmp_path):
    from swift.model import load_model

    out = tmp_path / "full"
    sft_main(train_argv(out, "--tuner_type", "full", "--learning_rate", "3e-3", "--max_steps", "20",
                        "--freeze_parameters", "model.layers.0", "--dataset", "builtin:arith-sft#32"))
    losses = [r["loss"] for r in read_log(out) if "loss" in r]
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.5
    base = dict(load_model("builtin:tiny-chat")[0].named_parameters())
    tuned = load_file(out / "model.safetensors")
    assert torch.equal(tuned["model.layers.0.mlp.up_proj.weight"], base["model.layers.0.mlp.up_proj.weight"])
    assert not torch.equal(tuned["model.layers.1.mlp.up_proj.weight"], base["model.layers.1.mlp.up_proj.weight"])


def test_pt_trains_every_token(tmp_path):
    result = pt_main(train_argv(tmp_path, "--dataset", "builtin:arith-pt#32", "--packing", "true",
                                "--max_length", "64"))
    assert result["global_step"] == 4


def test_repeat_run_from_args_json(tmp_path):
    first = sft_main(train_argv(tmp_path / "a", "--tuner_type", "full", "--learning_rate", "1e-3"))
    again = sft_main([str(tmp_path / "a" / "args.json"), "--output_dir", str(tmp_path / "b")])
    w1 = load_file(tmp_path / "a" / "model.safetensors")
    w2 = load_file(tmp_path / "b" / "model.safetensors")
    assert all(torch.allclose(w1[k], w2[k], atol=1e-6) for k in w1)
    assert first["metrics"]["train_loss"] == pytest.approx(again["metrics"]["train_loss"], abs=1e-6)


def test_bad_rows_reported_and_strict_stops(tmp_path):
    data = tmp_path / "d.jsonl"
    good = {"query": "1+1=", "response": "2"}
    data.write_text("\n".join([json.dumps(good)] * 7 + ['{"messages": []}']) + "\n")
    cmd = [*SWIFT, "sft", *train_argv(tmp_path / "o", "--dataset", str(data), "--max_steps", "1")]
    ok = subprocess.run(cmd, capture_output=True, text=True)
    assert ok.returncode == 0 and "dropped 1 of 8 rows read: 1 × messages is empty" in ok.stderr
    strict_cmd = [*SWIFT, "sft", *train_argv(tmp_path / "s", "--dataset", str(data), "--max_steps", "1",
                                             "--strict", "true")]
    strict = subprocess.run(strict_cmd, capture_output=True, text=True)
    assert strict.returncode == 1 and not os.path.exists(tmp_path / "s")
    assert strict.stderr.strip().splitlines()[-1] == (
        f"swift sft: error: {data} row 8: messages is empty (fix the row, or run with --strict false to drop bad rows)")


def test_streaming(tmp_path):
    result = sft_main(train_argv(tmp_path, "--streaming", "true", "--dataset", "builtin:arith-sft#10"))
    assert result["global_step"] == 4


def _weights(path):
    return load_file(os.path.join(path, "model.safetensors"))


def test_killed_run_resumes_to_identical_weights(tmp_path):
    argv = train_argv(tmp_path / "x", "--tuner_type", "full", "--learning_rate", "1e-3", "--max_steps", "12",
                      "--save_strategy", "steps", "--save_steps", "4", "--dataset", "builtin:arith-sft#200",
                      "--lr_scheduler_type", "cosine", "--warmup_ratio", "0.1")
    sft_main([*argv[:argv.index("--output_dir")], "--output_dir", str(tmp_path / "straight"),
              *argv[argv.index("--output_dir") + 2:]])
    # a real process: the test resumes in its directory as soon as it is dead, which the fork server
    # only reports after killing its forked process
    proc = subprocess.Popen([sys.executable, "-m", "swift", "sft", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not os.path.exists(tmp_path / "x" / "checkpoint-8") and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert os.path.exists(tmp_path / "x" / "checkpoint-4" / "trainer_state.json")
    sft_main(argv + ["--resume_from_checkpoint", str(tmp_path / "x" / "checkpoint-4")])
    straight, resumed = _weights(tmp_path / "straight"), _weights(tmp_path / "x")
    assert max((straight[k] - resumed[k]).abs().max().item() for k in straight) < 1e-5
    # each step logged once (the killed run's lines after checkpoint-4 went), and args.json of the
    # resumed run, given back to `--config`, starts a run rather than resuming this one again
    assert [r["global_step"] for r in read_log(tmp_path / "x") if "loss" in r] == list(range(1, 13))
    assert "resume_from_checkpoint" not in json.load(open(tmp_path / "x" / "args.json"))


def test_each_run_gets_its_own_version_directory(tmp_path):
    """--add_version (the default): runs into the same --output_dir land in v0-..., v1-...; the first
    run's files are left as they were; `--resume_from_checkpoint last` continues the newest run that
    has a checkpoint, in its own directory."""
    first = sft_main(train_argv(tmp_path, "--add_version", "true", "--save_strategy", "steps", "--save_steps", "2"))
    kept = open(os.path.join(first["output_dir"], "logging.jsonl")).read()
    second = sft_main(train_argv(tmp_path, "--add_version", "true"))
    runs = sorted(os.listdir(tmp_path))
    assert [r.split("-")[0] for r in runs] == ["v0", "v1"] and all(re.fullmatch(r"v\d-\d{8}-\d{6}", r) for r in runs)
    assert first["output_dir"] == str(tmp_path / runs[0]) and second["output_dir"] == str(tmp_path / runs[1])
    assert open(os.path.join(first["output_dir"], "logging.jsonl")).read() == kept
    assert json.load(open(os.path.join(first["output_dir"], "args.json")))["output_dir"] == str(tmp_path)
    resumed = sft_main(train_argv(tmp_path, "--add_version", "true", "--resume_from_checkpoint", "last",
                                  "--max_steps", "6"))
    assert resumed["output_dir"] == first["output_dir"] and resumed["global_step"] == 6
    assert sorted(os.listdir(tmp_path)) == runs
    # a checkpoint path of one of these runs goes on there; one from elsewhere starts a new version
    checkpoint = os.path.join(first["output_dir"], "checkpoint-2")
    again = sft_main(train_argv(tmp_path, "--add_version", "true", "--resume_from_checkpoint", checkpoint))
    assert again["output_dir"] == first["output_dir"]
    other = sft_main(train_argv(tmp_path / "elsewhere", "--add_version", "true", "--resume_from_checkpoint",
                                checkpoint))
    assert os.path.dirname(other["output_dir"]) == str(tmp_path / "elsewhere")
    with pytest.raises(SwiftError, match="no run under .* has a checkpoint"):
        sft_main(train_argv(tmp_path / "empty", "--add_version", "true", "--resume_from_checkpoint", "last"))
    with pytest.raises(SwiftError, match="no such checkpoint directory"):
        sft_main(train_argv(tmp_path, "--add_version", "true", "--resume_from_checkpoint", str(tmp_path / "nope")))
    assert sorted(os.listdir(tmp_path)) == sorted([*runs, "elsewhere"])


def test_other_ranks_take_the_run_directory_rank_0_picked(tmp_path, monkeypatch):
    """Ranks never name a run themselves: a rank other than 0 creates nothing and takes the
    broadcast name (here a fake process group hands it over)."""
    import swift.pipelines.train as train

    args = SftArguments(model="m", dataset=["d"], output_dir=str(tmp_path))
    monkeypatch.setattr(train, "_is_main", lambda: False)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "broadcast_object_list",
                        lambda shared, src: shared.__setitem__(0, str(tmp_path / "v7-20990101-000000")))
    assert train.resolve_output_dir(args) == str(tmp_path / "v7-20990101-000000") == args.output_dir
    assert os.listdir(tmp_path) == []


def test_two_rank_ddp_ends_in_sync(tmp_path):
    from tests.deploy.serving import free_port

    env = {**os.environ, "NPROC_PER_NODE": "2", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    base = tmp_path / "ddp"
    # with --add_version (ms-swift's default) rank 0 names the run's directory and rank 1 takes it
    proc = subprocess.run([*SWIFT, "sft",
                           *train_argv(base, "--tuner_type", "full", "--add_version", "true")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    [run] = os.listdir(base)
    out = base / run
    assert re.fullmatch(r"v0-\d{8}-\d{6}", run)
    result = json.load(open(out / "result.json"))
    assert len(result["rank_checksums"]) == 2 and len(set(result["rank_checksums"])) == 1
    # each rank took its own shard: 4 steps x 4 rows x 2 ranks = half of the 64 rows
    assert result["metrics"]["epoch"] == 0.5


def test_eval_loss_is_the_token_mean_whatever_the_eval_batch_size(tmp_path):
    """7 validation rows of different answer lengths: eval_loss is the mean over every labelled token
    (one batch holding all rows gives it) at any --per_device_eval_batch_size, a last batch shorter
    than the others (3 + 3 + 1) and with --padding_free (one joined row per batch). Before
    2026-11-29 it was the mean of each batch's own token mean, and moved with the batch size."""
    losses = {}
    for bs, extra in ((8, ()), (3, ()), (1, ()), (3, ("--padding_free", "true"))):
        result = sft_main(train_argv(tmp_path / f"bs{bs}{len(extra)}", "--max_steps", "1", "--eval_steps", "1",
                                     "--val_dataset", "builtin:arith-sft:eval#5", "builtin:self-cognition#2",
                                     "--per_device_eval_batch_size", str(bs), *extra))
        losses[bs, bool(extra)] = result["metrics"]["eval_loss"]
    for key, loss in losses.items():
        assert loss == pytest.approx(losses[8, False], rel=1e-5), key


def test_resume_into_output_dir_itself_is_checked_as_into_a_version(tmp_path):
    """--add_version false: `last` without a checkpoint, or a checkpoint that does not exist, stops in
    one line (before 2026-11-29 the first trained from scratch and the second ended in HF's traceback)."""
    with pytest.raises(SwiftError, match="--resume_from_checkpoint last: .* has no checkpoint"):
        sft_main(train_argv(tmp_path / "empty", "--resume_from_checkpoint", "last"))
    with pytest.raises(SwiftError, match="--resume_from_checkpoint .*nowhere: no such checkpoint directory"):
        sft_main(train_argv(tmp_path / "run", "--resume_from_checkpoint", str(tmp_path / "nowhere")))


def test_a_checkpoint_without_optimizer_state_or_a_run_in_the_directory_is_refused(tmp_path):
    """A --save_only_model checkpoint holds no optimizer, scheduler or RNG state: resuming from it
    is refused (before 2026-12-07 HF restarted the optimizer and the schedule silently); a run's final
    directory is no checkpoint; a new run into a directory that holds one (--add_version false) is
    refused rather than appending to its log; a --config file inside the run's directory is not
    copied onto itself (before 2026-12-07: SameFileError)."""
    run = tmp_path / "run"
    sft_main(train_argv(run, "--save_strategy", "steps", "--save_steps", "2", "--save_only_model", "true"))
    with pytest.raises(SwiftError, match=r"checkpoint-4 holds no optimizer state \(saved with --save_only_model\?\)"):
        sft_main(train_argv(tmp_path / "again", "--resume_from_checkpoint", str(run / "checkpoint-4")))
    with pytest.raises(SwiftError, match="--resume_from_checkpoint last: .*checkpoint-4 holds no optimizer state"):
        sft_main(train_argv(run, "--resume_from_checkpoint", "last"))
    with pytest.raises(SwiftError, match=r"run is no checkpoint \(no trainer_state.json\)"):
        sft_main(train_argv(tmp_path / "again", "--resume_from_checkpoint", str(run)))
    log = (run / "logging.jsonl").read_text()
    with pytest.raises(SwiftError, match=r"--output_dir .*run already holds a run \(checkpoint-2, checkpoint-4, "
                                         r"logging.jsonl\) and --add_version false writes into it"):
        sft_main(train_argv(run))
    assert (run / "logging.jsonl").read_text() == log
    config = tmp_path / "cfg" / "train.yaml"
    config.parent.mkdir()
    config.write_text(f"output_dir: {config.parent}\n")
    sft_main([str(config), *train_argv(config.parent)])  # the run's directory is the config file's
    assert config.read_text() == f"output_dir: {config.parent}\n"


def test_a_run_that_fails_to_load_leaves_no_empty_version_directory(tmp_path):
    """The version directory is claimed before the model loads (its checks come first); a load that
    fails removes it while it is still empty."""
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "q"}]}\n')  # no answer: no usable rows
    with pytest.raises(SwiftError):
        sft_main(train_argv(tmp_path / "out", "--add_version", "true", "--dataset", str(bad)))
    assert not (tmp_path / "out").exists()  # nor the --output_dir made for it


def test_several_gpus_in_one_process_are_refused(tmp_path, monkeypatch):
    """HF would train under DataParallel, which splits every tensor argument across the replicas, our
    `logits_to_keep` positions too (GPU only: HF's GPU count is faked here)."""
    from swift.arguments.train import TrainingArguments

    monkeypatch.setattr(TrainingArguments, "n_gpu", property(lambda self: 2))
    with pytest.raises(SwiftError, match="2 GPUs are visible to one process: launch one process per GPU with "
                                         "NPROC_PER_NODE=2"):
        sft_main(train_argv(tmp_path))


def test_validation_data_none_of_whose_rows_encode_stops_in_one_line(tmp_path):
    val = tmp_path / "val.jsonl"
    val.write_text(json.dumps({"messages": [{"role": "user", "content": "no answer"}]}) + "\n")
    with pytest.raises(SwiftError, match="validation data: none of its rows could be encoded .*no assistant message"):
        sft_main(train_argv(tmp_path / "run", "--val_dataset", str(val)))
