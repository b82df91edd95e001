import json

import pytest

from swift.arguments import PtArguments, SftArguments, TrainArguments
from swift.arguments.parser import ArgumentError, parse_args
from swift.utils.registry import SwiftError

BASE = ["--model", "builtin:tiny-chat", "--dataset", "builtin:arith-sft"]


def test_parts_do_not_share_flag_names():
    owners = SftArguments.field_owners()  # raises if two parts define the same field
    assert owners["model"] == "model_args" and owners["learning_rate"] == "training_args"


def test_flat_construction_and_defaults():
    a = SftArguments(model="builtin:tiny-chat", dataset=["builtin:arith-sft"])
    assert a.tuner_type == "lora" and a.learning_rate == 1e-4 and a.lora_rank == 8
    assert a.target_modules == ["all-linear"] and a.loss_scale == "default"
    full = SftArguments(model="m", dataset=["d"], tuner_type="full")
    assert full.learning_rate == 1e-5
    pt = PtArguments(model="m", dataset=["d"])
    assert pt.loss_scale == "all" and pt.tuner_type == "full"
    assert TrainArguments is SftArguments
    assert SftArguments(model="m", dataset=["d"], train_type="full").tuner_type == "full"


def test_eval_strategy_follows_validation_data():
    assert str(SftArguments(model="m", dataset=["d"]).eval_strategy.value) == "no"
    assert str(SftArguments(model="m", dataset=["d"], val_dataset=["v"]).eval_strategy.value) == "steps"
    # as ms-swift: evaluation comes with each save, not with each log line
    assert SftArguments(model="m", dataset=["d"], val_dataset=["v"]).eval_steps == 500
    assert SftArguments(model="m", dataset=["d"], val_dataset=["v"], save_steps=40).eval_steps == 40
    assert SftArguments(model="m", dataset=["d"], val_dataset=["v"], save_steps=40, eval_steps=7).eval_steps == 7
    assert str(SftArguments(model="m", dataset=["d"], val_dataset=["v"], save_strategy="epoch")
               .eval_strategy.value) == "epoch"


def test_ms_swift_infer_backend_name():
    from swift.pipelines.infer import InferArguments

    assert InferArguments(model="m", infer_backend="pt").infer_backend == "transformers"


@pytest.mark.parametrize("kwargs,message", [
    ({"tuner_type": "qlora"}, "--tuner_type 'qlora' is not one of lora, full"),
    ({"truncation_strategy": "middle"}, "--truncation_strategy 'middle' is not one of delete, left, right"),
    ({"torch_dtype": "fp8"}, "--torch_dtype 'fp8' is not one of"),
    ({"columns": "not json"}, "--columns must be a JSON object"),
    ({"split_dataset_ratio": 1.5}, "--split_dataset_ratio must be in"),
    ({"lr_rate": 1.0}, "unknown argument 'lr_rate'"),
])
def test_validation_names_the_flag(kwargs, message):
    with pytest.raises(SwiftError, match=message.replace("(", r"\(").replace("'", "'")):
        SftArguments(model="m", dataset=["d"], **kwargs)


def test_required_flags():
    with pytest.raises(SwiftError, match="--dataset is required"):
        SftArguments(model="m")


def test_cli_parsing_and_unknown_flag():
    a = parse_args(SftArguments, BASE + ["--lora_rank", "4", "--packing", "true", "--max_steps", "3"])
    assert a.lora_rank == 4 and a.packing is True and a.max_steps == 3
    with pytest.raises(ArgumentError, match="unknown flag '--lora_rnak'. Did you mean '--lora_rank'"):
        parse_args(SftArguments, BASE + ["--lora_rnak", "4"])
    with pytest.raises(ArgumentError, match="invalid choice"):
        parse_args(SftArguments, BASE + ["--loss_scale", "everything"])


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_config_file_supplies_defaults_and_flags_win(tmp_path, suffix):
    cfg = {"model": "builtin:tiny-chat", "dataset": ["builtin:arith-sft"], "lora_rank": 16, "max_length": 128}
    path = tmp_path / f"c{suffix}"
    path.write_text(json.dumps(cfg))  # JSON is valid YAML
    leading = parse_args(SftArguments, [str(path), "--lora_rank", "2"])
    flag = parse_args(SftArguments, ["--config", str(path)])
    assert leading.lora_rank == 2 and leading.max_length == 128
    assert flag.lora_rank == 16
    bad = tmp_path / "bad.yaml"
    bad.write_text("lora_rnak: 3\n")
    with pytest.raises(ArgumentError, match="unknown key 'lora_rnak'"):
        parse_args(SftArguments, [str(bad)] + BASE)


def test_args_json_round_trip(tmp_path):
    a = parse_args(SftArguments, BASE + ["--lora_rank", "4", "--output_dir", str(tmp_path), "--warmup_ratio", "0.1"])
    path = tmp_path / "args.json"
    path.write_text(json.dumps(a.to_dict()))
    b = parse_args(SftArguments, [str(path)])
    assert b.to_dict() == a.to_dict()
    # replayed with another warmup ratio (before 2026-12-07 args.json held the ratio in warmup_steps
    # too, and this was refused as both set)
    c = parse_args(SftArguments, [str(path), "--warmup_ratio", "0.05"])
    assert (c.training_args.warmup_steps, c.to_dict()["warmup_steps"]) == (0.05, 0)


def test_vllm_server_base_url_sets_host_and_port():
    from swift.arguments.rlhf import RLHFArguments

    a = RLHFArguments(model="m", dataset=["d"], rlhf_type="grpo", reward_funcs=["accuracy"], rollout_mode="server",
                      vllm_server_base_url="http://10.0.0.5:8123")
    assert (a.vllm_server_host, a.vllm_server_port) == ("10.0.0.5", 8123)
    with pytest.raises(SwiftError, match="must look like http://HOST:PORT"):
        RLHFArguments(model="m", dataset=["d"], rlhf_type="grpo", reward_funcs=["accuracy"],
                      vllm_server_base_url="https://10.0.0.5:8123/v1")


def test_colocated_engine_flags_are_named_as_ignored_where_no_colocated_vllm_runs():
    """--vllm_enforce_eager / --vllm_max_model_len / --vllm_gpu_memory_utilization set the vLLM engine
    `swift rlhf` builds itself; with a rollout server they belong to `swift rollout`, and with the
    built-in engine to nothing, and the trainer says so (parsed as from the command line)."""
    import logging

    from swift.arguments.parser import parse_args
    from swift.arguments.rlhf import RLHFArguments

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("swift").addHandler(handler)
    common = ["--model", "m", "--dataset", "d", "--reward_funcs", "accuracy"]
    try:
        parse_args(RLHFArguments, [*common, "--rlhf_type", "grpo", "--use_vllm", "true", "--vllm_enforce_eager", "true",
                                   "--vllm_max_model_len", "512", "--vllm_gpu_memory_utilization", "0.5"])
        parse_args(RLHFArguments, [*common, "--rlhf_type", "grpo", "--use_vllm", "true", "--vllm_mode", "server",
                                   "--vllm_gpu_memory_utilization", "0.30", "--vllm_enforce_eager", "false"])
        assert not records  # colocated vLLM: they apply; in server mode, left at their defaults
        parse_args(RLHFArguments, [*common, "--rlhf_type", "grpo", "--use_vllm", "true", "--vllm_mode", "server",
                                   "--vllm_gpu_memory_utilization", "0.5", "--vllm_enforce_eager", "true"])
        parse_args(RLHFArguments, [*common, "--rlhf_type", "ppo", "--rollout_mode", "server",
                                   "--vllm_max_model_len", "512"])
        parse_args(RLHFArguments, [*common, "--rlhf_type", "grpo", "--vllm_enforce_eager", "true"])
    finally:
        logging.getLogger("swift").removeHandler(handler)
    assert [r.getMessage() for r in records] == [
        "--vllm_gpu_memory_utilization, --vllm_enforce_eager apply only to a colocated vLLM engine (--use_vllm true "
        "--vllm_mode colocate); ignored here, the engine is the rollout server's: give them to `swift rollout` (with "
        "vLLM)",
        "--vllm_max_model_len applies only to a colocated vLLM engine (--use_vllm true --vllm_mode colocate); ignored "
        "here, the engine is the rollout server's: give them to `swift rollout` (with vLLM)",
        "--vllm_enforce_eager applies only to a colocated vLLM engine (--use_vllm true --vllm_mode colocate); ignored "
        "here, the built-in engine generates (--use_vllm false)"]


@pytest.mark.parametrize("kwargs,message", [
    ({"rlhf_type": "dpo", "lazy_tokenize": True, "precompute_ref_log_probs": True}, "--precompute_ref_log_probs stores"),
    ({"rlhf_type": "grpo", "reward_funcs": ["accuracy"], "use_dora": True, "use_vllm": True},
     "--use_dora: the weights sent to vLLM"),
    ({"rlhf_type": "dpo", "lora_bias": "all"}, "no longer the reference: pass --ref_model"),
    ({"rlhf_type": "dpo", "init_weights": "pissa"}, "no longer the reference: pass --ref_model"),
    ({"rlhf_type": "dpo", "tuner_type": "full", "use_dora": True}, "--use_dora shapes a new LoRA adapter"),
    ({"rlhf_type": "grpo", "reward_funcs": ["accuracy"], "vllm_server_base_url": "http://h:99999"},
     "must look like http://HOST:PORT"),
    ({"rlhf_type": "grpo", "reward_funcs": ["accuracy"], "advantage_estimator": "reinforce", "scale_rewards": "batch"},
     "would divide by a std twice"),
])
def test_combinations_that_cannot_work_are_refused_in_one_line(kwargs, message):
    from swift.arguments.rlhf import RLHFArguments

    with pytest.raises(SwiftError, match=message):
        RLHFArguments(model="m", dataset=["d"], **kwargs)


ONLINE = {"reward_funcs": ["accuracy"]}
GKD = {"rlhf_type": "gkd", "teacher_model": "t"}


@pytest.mark.parametrize("kwargs,message", [
    *[({"rlhf_type": t, "loss_scale": scale, **extra}, rf"^--loss_scale {scale} does not apply to --rlhf_type {t} \(")
      for t, scale, extra in [("dpo", "all", {}), ("dpo", "default", {}), ("orpo", "default", {}), ("cpo", "all", {}),
                              ("simpo", "all", {}), ("rm", "default", {}), ("kto", "default", {}), ("prm", "all", {}),
                              ("grpo", "default", ONLINE), ("ppo", "all", ONLINE)]],
    ({**GKD, "loss_scale": "all", "lmbda": 1.0},
     r"^--loss_scale all does not apply to --rlhf_type gkd \(with --seq_kd"),
    ({**GKD, "loss_scale": "default", "seq_kd": True}, r"^--loss_scale default does not apply to --rlhf_type gkd"),
    *[({"rlhf_type": t, "streaming": True, "max_steps": 4, **extra}, r"^--streaming encodes sft/pt samples")
      for t, extra in [("dpo", {}), ("kto", {}), ("rm", {}), ("prm", {}), ("gkd", GKD), ("grpo", ONLINE),
                       ("ppo", ONLINE)]],
    ({"rlhf_type": "dpo", "loss_type": ["ipo"], "label_smoothing": 0.1},
     r"^--label_smoothing does nothing with --loss_type ipo; it is read by --loss_type sigmoid, robust$"),
    ({"rlhf_type": "dpo", "loss_type": ["hinge", "apo_zero"], "label_smoothing": 0.1},
     r"^--label_smoothing does nothing with --loss_type hinge apo_zero"),
    ({**GKD, "sft_alpha": 0.1, "lmbda": 1.0}, r"^--sft_alpha weighs the NLL on steps that train on the dataset's"),
    *[({**GKD, "lmbda": 0.0, flag: value},
       rf"^--{flag} sets how answers are sampled, and with --lmbda 0 and no --seq_kd")
      for flag, value in [("temperature", 0.5), ("top_k", 5), ("max_completion_length", 64)]],
])
def test_rlhf_settings_nothing_would_read_are_refused(kwargs, message):
    """--loss_scale other than last_round where the loss covers the last answer alone (pairs and KTO
    split prompt from answer at the first token with loss), --streaming (its samples are sft's), DPO's
    --label_smoothing with loss types that ignore it, GKD's --sft_alpha with --lmbda 1 and its
    sampling flags when nothing samples. (Before 2026-11-29 all were accepted: the first two broke
    the run, the others did nothing.)"""
    from swift.arguments.rlhf import RLHFArguments

    with pytest.raises(SwiftError, match=message):
        RLHFArguments(model="m", dataset=["d"], **kwargs)


@pytest.mark.parametrize("kwargs", [
    {**GKD, "loss_scale": "default"}, {**GKD, "loss_scale": "all", "lmbda": 0.5},
    {"rlhf_type": "dpo", "loss_scale": "last_round"}, {"rlhf_type": "dpo", "loss_type": ["ipo", "sigmoid"],
                                                       "label_smoothing": 0.1},
    {"rlhf_type": "dpo", "loss_type": ["robust"], "label_smoothing": 0.1}, {"rlhf_type": "cpo", "label_smoothing": 0.1},
    {**GKD, "lmbda": 0.0, "seq_kd": True, "temperature": 0.5}, {**GKD, "lmbda": 0.0, "sft_alpha": 0.1},
    {**GKD, "lmbda": 1.0, "temperature": 0.5}])
def test_rlhf_settings_that_are_read_pass(kwargs):
    from swift.arguments.rlhf import RLHFArguments

    RLHFArguments(model="m", dataset=["d"], **kwargs)


def test_packing_with_flash_attention_is_refused():
    with pytest.raises(SwiftError, match="--packing builds a block-diagonal attention mask"):
        SftArguments(model="m", dataset=["d"], packing=True, attn_impl="flash_attn")


def test_deepspeed_presets_files_and_refusals(tmp_path, monkeypatch):
    """ms-swift's preset names and JSON files resolve to a config; parsing starts nothing (no process
    group, no launcher variables); bad values and a missing package stop with one line."""
    import importlib.util
    import os

    import torch.distributed as dist

    from swift.arguments.deepspeed import PRESETS

    base = ["--model", "builtin:tiny-chat", "--dataset", "builtin:arith-sft"]
    args = parse_args(SftArguments, [*base, "--deepspeed", "zero3_offload"])
    config = args.training_args.deepspeed_config
    assert config["zero_optimization"]["stage"] == 3 and config["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert args.training_args.deepspeed is None and not dist.is_initialized() and "RANK" not in os.environ
    assert set(PRESETS) == {"zero0", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload"}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    assert parse_args(SftArguments, [*base, "--deepspeed", str(path)]).training_args.deepspeed_config == \
        {"zero_optimization": {"stage": 2}}
    with pytest.raises(SwiftError, match="^--deepspeed zero4: not one of zero0, zero1"):
        parse_args(SftArguments, [*base, "--deepspeed", "zero4"])
    with pytest.raises(SwiftError, match="^--fsdp and --deepspeed both shard"):
        parse_args(SftArguments, [*base, "--deepspeed", "zero2", "--fsdp", "fsdp2"])
    fsdp = parse_args(SftArguments, [*base, "--fsdp", "fsdp2", "--use_cpu", "true"]).training_args  # CPU too
    assert fsdp.fsdp_config["version"] == 2 and fsdp.fsdp_config["reshard_after_forward"] is True
    from swift.arguments.rlhf import RLHFArguments

    with pytest.raises(SwiftError, match=r"^--rlhf_type gkd samples answers \(--lmbda > 0 or --seq_kd\)"):
        parse_args(RLHFArguments, [*base, "--rlhf_type", "gkd", "--teacher_model", "builtin:tiny-chat",
                                   "--deepspeed", "zero3"])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    with pytest.raises(SwiftError, match=r'^--deepspeed needs the deepspeed package: pip install -e "\.\[deepspeed\]"$'):
        parse_args(SftArguments, [*base, "--deepspeed", "zero2"])


def test_gradient_checkpointing_is_on_by_default_as_in_ms_swift():
    args = parse_args(SftArguments, ["--model", "builtin:tiny-chat", "--dataset", "builtin:arith-sft"])
    assert args.gradient_checkpointing is True
    assert args.training_args.gradient_checkpointing_kwargs == {"use_reentrant": False}
    off = parse_args(SftArguments, ["--model", "builtin:tiny-chat", "--dataset", "x", "--gradient_checkpointing",
                                    "false"])
    assert off.gradient_checkpointing is False


def test_quantization_and_liger_flags_stop_in_one_line_where_they_cannot_work():
    base = ["--model", "builtin:tiny-chat", "--dataset", "builtin:arith-sft"]
    with pytest.raises(SwiftError, match="^--use_liger_kernel: Liger's kernels are Triton GPU kernels"):
        parse_args(SftArguments, [*base, "--use_liger_kernel", "true", "--use_cpu", "true"])
    with pytest.raises(SwiftError, match="^--quant_method hqq is an ms-swift method this version does not support"):
        parse_args(SftArguments, [*base, "--quant_method", "hqq", "--quant_bits", "4"])
    with pytest.raises(SwiftError, match="^--quant_bits trains LoRA adapters"):
        parse_args(SftArguments, [*base, "--quant_bits", "4", "--tuner_type", "full"])
    with pytest.raises(SwiftError, match="^--quant_bits must be 4 or 8"):
        parse_args(SftArguments, [*base, "--quant_bits", "3"])
    assert parse_args(SftArguments, [*base, "--quant_bits", "4", "--quant_method", "bnb"]).quant_bits == 4


def _other_value(f):
    """A value of the field's kind that differs from its default."""
    import dataclasses

    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    kind = str(f.type)
    if isinstance(default, bool) or "bool" in kind:
        return not default
    if isinstance(default, list) or "list" in kind:
        return ["x"] if not default else default + default
    if "int" in kind and "float" not in kind:
        return (default or 0) + 3
    if "float" in kind:
        return (default or 0.0) + 0.25
    return "x" if default != "x" else "y"


def test_every_flag_is_refused_where_its_algorithm_does_not_read_it():
    """Every `swift rlhf` flag × every algorithm: a non-default value of a flag the algorithm does
    not declare is refused in one line naming who reads it; a declared one is never refused as
    unread (it may fail other checks for the value chosen here)."""
    import dataclasses

    from swift.arguments.rlhf import RlhfArguments
    from swift.rlhf import ALGORITHMS
    from swift.rlhf.base import FLAG_ALIASES

    names = {f.name for f in dataclasses.fields(RlhfArguments)}
    for rlhf_type in ALGORITHMS:
        algo = ALGORITHMS.get(rlhf_type)
        assert algo.flags <= names, (rlhf_type, algo.flags - names)  # no typo in a declaration
        for f in dataclasses.fields(RlhfArguments):
            if f.name == "rlhf_type" or (f.name, rlhf_type) == ("do_harmlessness_training", "dpo"):
                continue  # the algorithm's name, and the fork's switch to harmless from our default (dpo)
            read = FLAG_ALIASES.get(f.name, f.name) in algo.flags
            kwargs = {"rlhf_type": rlhf_type, f.name: _other_value(f)}
            if rlhf_type == "gkd" and f.name != "teacher_model":
                kwargs.setdefault("teacher_model", "t")
            try:
                RlhfArguments(**kwargs)
                error = None
            except SwiftError as e:
                error = str(e)
            except Exception as e:  # another check met the made-up value: it was read
                error = f"{type(e).__name__}: {e}"
            unread = error is not None and f"--{f.name} does nothing for --rlhf_type {rlhf_type}" in error
            assert unread != read, (rlhf_type, f.name, error)


def test_rlhf_flags_are_grouped_by_the_algorithms_that_read_them():
    """Each flag of `swift rlhf` is in the group of the smallest family of algorithms that alone
    reads it (by the registry entries' declarations; the common group: no family alone), every flag
    is in one group, and `swift rlhf --help` shows the groups under their titles."""
    import dataclasses

    from swift.arguments.rlhf import RlhfArguments
    from swift.cli.main import help_text
    from swift.rlhf import ALGORITHMS
    from swift.rlhf.base import FLAG_ALIASES

    def readers(name):
        return {t for t in ALGORITHMS if FLAG_ALIASES.get(name, name) in ALGORITHMS.get(t).flags}

    owned = [f.name for group in RlhfArguments.flag_groups for f in dataclasses.fields(group)]
    assert sorted(owned) == sorted(f.name for f in dataclasses.fields(RlhfArguments))  # each flag in one group
    families = [set(g.algorithms) for g in RlhfArguments.flag_groups if g.algorithms is not None]
    text = help_text("rlhf")
    for group in RlhfArguments.flag_groups:
        assert f"\n{group._argument_group_name}:\n" in text, group.__name__
        for f in dataclasses.fields(group):
            who = readers(f.name)
            assert who, f.name  # read by some algorithm
            # the smallest family whose algorithms alone read it (none: the common group's)
            fits = sorted((family for family in families if who <= family), key=len)
            assert (set(group.algorithms) if group.algorithms else None) == (fits[0] if fits else None), \
                (group.__name__, f.name, who)


def test_flags_ignored_before_are_refused_in_one_line():
    from swift.arguments.rlhf import RlhfArguments

    for kwargs, message in [
        ({"rlhf_type": "dpo", "reward_funcs": ["accuracy"]}, "--reward_funcs does nothing for --rlhf_type dpo; it is "
                                                             "read by --rlhf_type grpo, ppo"),
        ({"rlhf_type": "dpo", "use_vllm": True}, "--use_vllm does nothing for --rlhf_type dpo"),
        ({"rlhf_type": "grpo", "num_iterations": 2, "teacher_model": "t"}, "--teacher_model does nothing"),
        ({"rlhf_type": "kto", "rpo_alpha": 0.1}, "--rpo_alpha does nothing for --rlhf_type kto"),
        ({"rlhf_type": "orpo", "label_smoothing": 0.1}, "--label_smoothing does nothing for --rlhf_type orpo"),
        ({"rlhf_type": "grpo", "label_smoothing": 0.1}, "--label_smoothing does nothing for --rlhf_type grpo"),
        ({"rlhf_type": "orpo", "ref_model": "m"}, "--ref_model does nothing for --rlhf_type orpo"),
        ({"rlhf_type": "dpo", "cliprange": 0.3}, "--cliprange does nothing for --rlhf_type dpo"),
        ({"rlhf_type": "rm", "beta": 0.5}, "--beta does nothing for --rlhf_type rm"),
    ]:
        with pytest.raises(SwiftError, match=message):
            RlhfArguments(**kwargs)
    RlhfArguments(rlhf_type="dpo", max_completion_length=512, temperature=0.9)  # defaults pass
    RlhfArguments(rlhf_type="dpo", kl_coef=0.2)  # TRL's name for beta
