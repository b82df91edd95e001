"""The TRL/verl `rlhf.yaml` (one file for a TRL DPO script and verl PPO/GRPO scripts) as our flags:
DPO reads the top-level keys (`data`, `beta`, `loss_type`, `training_args`), PPO and GRPO the `ppo:`
section (each key one of verl's, applied through `verl_overrides.VERL`); `peft`, `trace` and the
model keys are read for all three. The part the algorithm does not read is checked, not applied.
"""
from __future__ import annotations

import os
from typing import Any

from swift.arguments.parser import ArgumentError
from swift.arguments.peer_configs import Translation, closest_key, refuse, typed
from swift.arguments.verl_overrides import A, R, VERL

TOP = ("rlhf_type", "model_name_or_path", "ref_model_name_or_path", "tokenizer_name_or_path", "data", "beta",
       "loss_type", "peft", "training_args", "trace", "ppo")
MARKERS = {"model_name_or_path", "ref_model_name_or_path", "tokenizer_name_or_path", "training_args", "ppo", "peft",
           "trace"}
DATA = {"train_file": ("dataset", "strs"), "eval_file": ("val_dataset", "strs"), "max_length": ("max_length", "int")}
# PEFT's LoraConfig (and the QLoRA switches next to it) → our flag and kind
PEFT = {"r": ("lora_rank", "int"), "lora_alpha": ("lora_alpha", "int"), "lora_dropout": ("lora_dropout", "float"),
        "target_modules": ("target_modules", "strs"), "bias": ("lora_bias", "str"), "use_dora": ("use_dora", "bool"),
        "use_rslora": ("use_rslora", "bool"), "modules_to_save": ("modules_to_save", "strs"),
        "init_lora_weights": ("init_weights", "str"), "task_type": ("task_type", "str"), "enabled": ("", "bool"),
        "use_qlora": ("quant_bits", "bool"), "load_in_4bit": ("quant_bits", "bool"),
        "load_in_8bit": ("quant_bits", "bool"), "bnb_4bit_compute_dtype": ("bnb_4bit_compute_dtype", "str"),
        "bnb_4bit_quant_type": ("bnb_4bit_quant_type", "str"),
        "bnb_4bit_use_double_quant": ("bnb_4bit_use_double_quant", "bool")}
# the `ppo:` section → the verl key its scripts set
PPO = {"train_file": "data.train_files", "eval_file": "data.val_files", "prompt_key": "data.prompt_key",
       "max_prompt_length": "data.max_prompt_length", "max_response_length": "data.max_response_length",
       "rollout_backend": R + "name", "rollout_n": R + "n", "rollout_tp": R + "tensor_model_parallel_size",
       "rollout_gpu_memory_utilization": R + "gpu_memory_utilization", "load_format": R + "load_format",
       "actor_lr": A + "optim.lr", "ppo_epochs": A + "ppo_epochs", "ppo_mini_batch_size": A + "ppo_mini_batch_size",
       "ppo_micro_batch_size_per_gpu": A + "ppo_micro_batch_size_per_gpu", "kl_loss_coef": A + "kl_loss_coef",
       "kl_loss_type": A + "kl_loss_type", "use_kl_loss": A + "use_kl_loss",
       "use_kl_in_reward": "algorithm.use_kl_in_reward", "reward_model_name_or_path": "reward_model.model.path",
       "reward_micro_batch_size_per_gpu": "reward_model.micro_batch_size_per_gpu",
       "reward_max_length": "reward_model.max_length", "n_gpus_per_node": "trainer.n_gpus_per_node",
       "nnodes": "trainer.nnodes", "logger": "trainer.logger", "project_name": "trainer.project_name",
       "experiment_name": "trainer.experiment_name", "save_freq": "trainer.save_freq", "test_freq": "trainer.test_freq"}
TRACE = {"wandb": ["wandb"], "tensorboard": ["tensorboard"], "none": ["none"], "console": ["none"]}


def is_rlhf_yaml(config: dict[str, Any]) -> bool:
    return bool(MARKERS & config.keys()) or isinstance(config.get("data"), dict)


def _section(config: dict, key: str, path: str) -> dict:
    value = config.get(key)
    if value is not None and not isinstance(value, dict):
        raise ArgumentError(f"{path}: {key} takes a mapping of keys, got {value!r}")
    return value or {}


def _unknown(path: str, key: str, known) -> ArgumentError:
    section, _, name = key.rpartition(".")
    hint = closest_key(name, known)
    return ArgumentError(f"{path}: unknown key '{key}' in a TRL/verl rlhf.yaml"
                         + (hint.replace("'", f"'{section}.", 1) if section else hint))


def read_rlhf_yaml(t: Translation, config: dict[str, Any], path: str, cls) -> None:
    """DPO from the top-level keys, PPO and GRPO from `ppo:`; `peft`, `trace` and the model keys for all
    three. The part the algorithm does not read is checked key by key, not applied."""
    for key in config:
        if key not in TOP:
            raise _unknown(path, key, TOP)
    if t.rlhf_type not in ("dpo", "ppo", "grpo"):
        raise ArgumentError(f"{path} (a TRL/verl rlhf.yaml) runs --rlhf_type dpo, ppo or grpo, not {t.rlhf_type}")
    at = lambda key: f"{path}: {key}"  # noqa: E731
    value = {k: typed(config[k], kind, at(k)) for k, kind in (
        ("rlhf_type", "str"), ("model_name_or_path", "str"), ("ref_model_name_or_path", "str"),
        ("tokenizer_name_or_path", "str"), ("beta", "float"), ("loss_type", "strs"), ("trace", "str"))
        if config.get(k) is not None}
    sections = {k: _section(config, k, path) for k in ("data", "peft", "training_args", "ppo")}
    if "rlhf_type" in value and "rlhf_type" not in t.explicit:
        t.set("rlhf_type", value["rlhf_type"], at("rlhf_type"))
    model = value.get("model_name_or_path")
    if model:
        t.set("model", model, at("model_name_or_path"))
    if value.get("ref_model_name_or_path", model) != model:  # the same model: our default reference
        t.set("ref_model", value["ref_model_name_or_path"], at("ref_model_name_or_path"))
    if value.get("tokenizer_name_or_path", model) != model:
        raise refuse(at("tokenizer_name_or_path"), "swift loads the tokenizer from the model's directory; give "
                                                   "model_name_or_path's path or leave it out")
    _read_peft(t, sections["peft"] if config.get("peft") is not None else None, path)
    if "trace" in value:
        if value["trace"] not in TRACE:
            raise refuse(at("trace"), f"{value['trace']!r}: " + ("SwanLab is not built in; use wandb" if
                                                                 value["trace"] == "swanlab" else
                                                                 f"give one of {', '.join(TRACE)}"))
        t.set("report_to", TRACE[value["trace"]], at("trace"))
    dpo = t.rlhf_type == "dpo"
    _read_dpo_part(t, value, sections, path, cls, apply=dpo)
    _read_ppo_part(t, sections["ppo"], path, apply=not dpo)


def _read_dpo_part(t: Translation, value: dict, sections: dict, path: str, cls, apply: bool) -> None:
    """`data`, `beta`, `loss_type`, `training_args`: the DPO script's."""
    at = lambda key: f"{path}: {key}"  # noqa: E731
    for key, entry in sections["data"].items():
        if key not in DATA:
            raise _unknown(path, f"data.{key}", DATA)
        if entry is not None:
            flag, kind = DATA[key]
            entry = typed(entry, kind, at(f"data.{key}"))
            if apply:
                t.set(flag, [os.path.expanduser(e) for e in entry] if kind == "strs" else entry, at(f"data.{key}"))
    if apply and "loss_type" in value:
        from swift.rlhf import ALGORITHMS

        known = ALGORITHMS.get(t.rlhf_type).loss_types
        for name in value["loss_type"]:
            if name not in known:
                raise refuse(at("loss_type"), f"{name!r} is not a DPO loss here: {', '.join(known)}")
    for key in ("beta", "loss_type"):
        if apply and key in value:
            t.set(key, value[key], at(key))
    from swift.arguments.base import part_fields

    training = {f.name for f in part_fields(cls.parts["training_args"])}
    for key, entry in sections["training_args"].items():
        if key not in training:
            raise refuse(at(f"training_args.{key}"), "is not a Transformers TrainingArguments field that swift "
                                                      f"rlhf has.{closest_key(key, training)}")
        if apply and entry is not None:
            t.set(key, entry, at(f"training_args.{key}"))


def _read_ppo_part(t: Translation, ppo: dict, path: str, apply: bool) -> None:
    """The `ppo:` section: the verl scripts', each key one of verl's (`PPO`)."""
    for key, entry in ppo.items():
        if key not in PPO:
            raise _unknown(path, f"ppo.{key}", PPO)
        if entry is None:
            continue
        where, rule = f"{path}: ppo.{key}", VERL[PPO[key]]
        entry = typed(entry, rule.kind, where)
        if apply:
            rule.apply(t, entry, where)
            if key == "reward_model_name_or_path":  # the script turns the reward model on with its path
                t.stage("reward_model_enable", True, where)


def _read_peft(t: Translation, peft: dict | None, path: str) -> None:
    """No `peft` (or `enabled: false`): full fine-tuning, as TRL without a peft_config and verl with
    lora_rank 0; otherwise LoRA (QLoRA with use_qlora / load_in_4bit)."""
    enabled = peft is not None and peft.get("enabled", True) is not False
    where = f"{path}: peft"
    for key, value in (peft or {}).items():
        if key not in PEFT:
            raise _unknown(path, f"peft.{key}", PEFT)
        if value is None:
            continue
        flag, kind = PEFT[key]
        at = f"{where}.{key}"
        value = typed(str(value).lower() if key == "init_lora_weights" else value, kind, at)
        if not enabled or key == "enabled":
            continue
        if key == "task_type":
            if value.upper() != "CAUSAL_LM":
                raise refuse(at, f"{value}: swift trains causal LMs (CAUSAL_LM)")
        elif flag == "quant_bits":
            if value:
                t.set("quant_bits", 8 if key == "load_in_8bit" else 4, at)
        else:
            t.set(flag, value, at)
    t.set("tuner_type", "lora" if enabled else "full", where)
