"""`swift sft`/`swift pt` refuse in one line what they would parse and not read (each of these was
accepted and did nothing before 2026-11-29)."""
import pytest

from swift.arguments import SftArguments
from swift.utils.registry import SwiftError

BASE = {"model": "builtin:tiny-chat", "dataset": ["builtin:arith-sft#8"]}


@pytest.mark.parametrize("kwargs,message", [
    ({"label_smoothing_factor": 0.1}, "--label_smoothing_factor is not applied"),
    ({"sortish_sampler": True}, "--sortish_sampler is Seq2SeqTrainer's sampler"),
    ({"generation_num_beams": 4}, "--generation_num_beams does nothing: --predict_with_generate decodes greedily"),
    ({"generation_max_length": 32}, "--generation_max_length caps the answers of --predict_with_generate"),
    ({"predict_with_generate": True}, "--predict_with_generate answers the validation rows"),
    ({"val_dataset": ["builtin:arith-sft:eval#4"], "split_dataset_ratio": 0.1}, "--val_dataset is the validation data"),
    ({"streaming": True, "max_steps": 2, "split_dataset_ratio": 0.1}, "--streaming reads rows in order"),
    ({"streaming": True, "max_steps": 2, "dataset_num_proc": 2}, "--dataset_num_proc encodes rows up front"),
    ({"streaming": True, "max_steps": 2, "dataloader_num_workers": 2}, "every worker would yield every row"),
    ({"eval_limit": 5}, "--eval_limit shapes the benchmarks scored during training"),
    ({"eval_dataset_args": "{}"}, "--eval_dataset_args shapes the benchmarks"),
    ({"eval_generation_config": "{}"}, "--eval_generation_config shapes the benchmarks"),
    ({"generation_config": "x"}, "--generation_config does nothing"),
    ({"lazy_tokenize": True, "dataset_num_proc": 2}, "--dataset_num_proc encodes rows up front; with --lazy_tokenize"),
    ({"tuner_type": "full", "lora_alpha": 16}, "--lora_alpha shapes a new LoRA adapter"),
    ({"tuner_type": "full", "lora_dropout": 0.1}, "--lora_dropout shapes a new LoRA adapter"),
    ({"num_labels": 3}, "--num_labels applies to --task_type seq_cls"),
    ({"tuner_type": "full", "lora_rank": 16}, "--lora_rank shapes a new LoRA adapter; it does not apply to --tuner_type full"),
    ({"tuner_type": "full", "target_modules": ["q_proj"]}, "--target_modules shapes a new LoRA adapter"),
    ({"trainable_parameters": ["lm_head"]}, "--trainable_parameters apply to --tuner_type full"),
    ({"adapters": ["a"], "lora_rank": 16}, "--lora_rank shapes a new LoRA adapter; it does not apply to --adapters"),
    ({"adapters": ["a"], "use_dora": True}, "--use_dora shapes a new LoRA adapter; it does not apply to --adapters"),
    ({"warmup_ratio": 0.1, "warmup_steps": 50}, "--warmup_ratio and --warmup_steps both set the warmup"),
    ({"fsdp_config": {"version": 2}}, "--fsdp_config configures --fsdp, which is not set"),
    ({"eval_strategy": "steps", "load_best_model_at_end": True}, "--load_best_model_at_end picks a checkpoint"),
])
def test_flags_nothing_reads_are_refused(kwargs, message, tmp_path):
    if kwargs.get("adapters"):  # an adapter directory: parsing reads its adapter_config.json
        (tmp_path / "adapter_config.json").write_text("{}")
        kwargs = {**kwargs, "adapters": [str(tmp_path)]}
    with pytest.raises(SwiftError, match=message):
        SftArguments(**BASE, **kwargs)


def test_eval_strategy_without_validation_data_is_turned_off_as_in_ms_swift():
    # ms-swift's examples/eval/train_eval/train.sh: --eval_strategy steps with benchmarks and no val data
    a = SftArguments(**BASE, eval_strategy="steps", eval_use_evalscope=True, eval_dataset=["arith"])
    assert a.training_args.eval_strategy == "no"


def test_the_same_flags_where_they_are_read_pass():
    SftArguments(**BASE, val_dataset=["builtin:arith-sft:eval#4"], predict_with_generate=True, generation_max_length=32)
    SftArguments(**BASE, tuner_type="full", trainable_parameters=["lm_head"])
    SftArguments(**BASE, lora_rank=16, target_modules=["q_proj"])
    SftArguments(**BASE, tuner_type="full", target_modules="all-linear")  # a config file's string: the default
    SftArguments(**BASE, warmup_ratio=0.1)
    SftArguments(**BASE, num_labels=3, task_type="seq_cls")


def test_a_list_flag_given_one_value_in_a_config_file_is_a_list_of_it(tmp_path):
    """(before 2026-11-29 `modules_to_save: lm_head` became the characters l, m, _, ... and PEFT
    wrapped every module whose name ends in one of them)"""
    from swift.arguments.parser import parse_args

    config = tmp_path / "sft.yaml"
    config.write_text("model: builtin:tiny-chat\ndataset: builtin:arith-sft#8\nmodules_to_save: lm_head\n"
                      "target_modules: all-linear\nreport_to: none\n")
    a = parse_args(SftArguments, ["--config", str(config)])
    assert (a.modules_to_save, a.target_modules, a.dataset) == (["lm_head"], ["all-linear"], ["builtin:arith-sft#8"])
    # ms-swift's examples/yaml writes the default this way; with full tuning it is not a LoRA flag set
    config.write_text("model: builtin:tiny-chat\ndataset: builtin:arith-sft#8\ntarget_modules: all-linear\n")
    assert parse_args(SftArguments, ["--config", str(config), "--tuner_type", "full"]).tuner_type == "full"


def test_ppo_with_adapters_takes_the_lora_flags_its_separate_critic_reads(tmp_path):
    from swift.arguments.rlhf import RLHFArguments

    (tmp_path / "adapter_config.json").write_text("{}")
    ppo = dict(model="builtin:tiny-chat", dataset=["builtin:arith-grpo#8"], rlhf_type="ppo", reward_funcs=["accuracy"],
               adapters=[str(tmp_path)])
    assert RLHFArguments(**ppo, lora_rank=16, use_dora=True).lora_rank == 16
    with pytest.raises(SwiftError, match="--lora_rank shapes a new LoRA adapter; it does not apply to --adapters"):
        RLHFArguments(**{**ppo, "rlhf_type": "grpo"}, lora_rank=16)
