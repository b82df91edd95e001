"""verl's Hydra overrides (`key=value` after the flags) as our flags: the key table `VERL` (the
table of docs/ppo.md, printed by `python -m swift.arguments.peer_configs`), reading and applying
overrides, and the keys verl reads together (`settle`) or counts in prompts and rollouts
(`resolve_counts`). The `ppo:` section of the TRL/verl rlhf.yaml goes through the same table.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Callable

from swift.arguments.parser import ArgumentError
from swift.arguments.peer_configs import Translation, closest_key, is_override, parse_value, refuse, typed


@dataclass(frozen=True)
class Rule:
    kind: str
    apply: Callable[[Translation, Any, str], None]
    ours: str  # what it becomes, for the docs
    note: str = ""


def _flag(name: str, kind: str, note: str = "", online: tuple[str, ...] = ("grpo", "ppo")) -> Rule:
    def apply(t: Translation, value: Any, where: str) -> None:
        if t.rlhf_type not in online:
            raise refuse(where, f"does nothing for --rlhf_type {t.rlhf_type}; it is read by {' and '.join(online)}")
        t.set(name, value, where)
    return Rule(kind, apply, f"`--{name}`", note)


def _stage(key: str, kind: str, ours: str, note: str = "") -> Rule:
    return Rule(kind, lambda t, value, where: t.stage(key, value, where), ours, note)


def _accept(kind: str, note: str) -> Rule:
    """A key that changes only how verl runs (memory, loading), not what is computed."""
    return Rule(kind, lambda t, value, where: None, "(none)", note)


def _files(name: str) -> Rule:
    def apply(t: Translation, value: list[str], where: str) -> None:
        t.set(name, [os.path.expanduser(v) for v in value], where)
    return Rule("strs", apply, f"`--{name}`", "jsonl, json, csv or parquet")


def _rollout_name(t: Translation, value: str, where: str) -> None:
    if value == "sglang":
        raise refuse(where, "SGLang rollouts are not in this version; use vllm (--use_vllm true) or hf (the built-in "
                            "engine)")
    if value not in ("vllm", "hf"):
        raise refuse(where, f"{value!r} is not a rollout engine here: vllm or hf")
    t.set("use_vllm", value == "vllm", where)


def _tp(t: Translation, value: int, where: str) -> None:
    if value != 1:
        raise refuse(where, f"{value}: each vLLM engine runs on one device here (tensor-parallel rollouts are not "
                            "wired up); give 1")


def _entropy(t: Translation, value: float, where: str) -> None:
    if value != 0:
        raise refuse(where, f"{value}: swift's policy loss has no entropy bonus; give 0")


def _lora_rank(t: Translation, value: int, where: str) -> None:
    t.set("tuner_type", "lora" if value > 0 else "full", where)
    if value > 0:
        t.set("lora_rank", value, where)


AGG_MODES = {"token-mean": "dapo", "seq-mean-token-mean": "grpo"}


def _loss_agg(t: Translation, value: str, where: str) -> None:
    if value == "seq-mean-token-sum-norm":
        raise refuse(where, "verl divides the summed token losses by the response length only, not also by the "
                            "number of sequences as swift's dr_grpo does (a loss that scales with the micro-batch); "
                            "no --loss_type equals it")
    if value not in AGG_MODES:
        raise refuse(where, f"{value!r}: no --loss_type equals it (token-mean is dapo, seq-mean-token-mean is grpo)")
    t.set("loss_type", [AGG_MODES[value]], where)


def _logger(t: Translation, value: list[str], where: str) -> None:
    """verl's loggers → --report_to: console is always on here (the log line and logging.jsonl)."""
    out = []
    for name in value:
        if name == "swanlab":
            raise refuse(where, "SwanLab is not built in; use wandb or tensorboard")
        if name not in ("console", "wandb", "tensorboard", "mlflow"):
            raise refuse(where, f"{name!r} is not a logger here: console, wandb, tensorboard, mlflow")
        if name != "console":
            out.append(name)
    t.set("report_to", out or ["none"], where)


def _launch() -> tuple[int, int]:
    """(processes per node, nodes) of this run as torchrun set them (`swift` starts torchrun when
    NPROC_PER_NODE / NNODES are set: docs/cli.md); 1 and 1 without torchrun."""
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return per_node, max(1, int(os.environ.get("WORLD_SIZE", str(per_node))) // per_node)


def _shape(index: int, env: str) -> Callable[[Translation, int, str], None]:
    def apply(t: Translation, value: int, where: str) -> None:
        have = _launch()[index]
        if value != have:
            raise refuse(where, f"{value}, but this run has {have}: launch with {env}={value} swift rlhf ... "
                                "(swift starts torchrun)")
    return apply


def _output_part(index: int) -> Callable[[Translation, str, str], None]:
    """verl writes to checkpoints/<project_name>/<experiment_name> (trainer.default_local_dir)."""
    def apply(t: Translation, value: str, where: str) -> None:
        parts = t.staged.get("output_parts", (["verl_examples", "gsm8k"], where))[0]
        parts[index] = value
        t.stage("output_parts", parts, where)
        t.set("run_name" if index else "project", value, where)
    return apply


A, R, M = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "actor_rollout_ref.model."
KL_TYPES = "kl/k1 → k1, mse/k2 → k2, low_var_kl/k3 → k3 (verl clamps k3 at 10 per token)"
# verl key → rule; `python -m swift.arguments.peer_configs` prints the table of docs/ppo.md
VERL: dict[str, Rule] = {
    "algorithm.adv_estimator": _stage("adv_estimator", "str", "`--rlhf_type ppo` / `--advantage_estimator`",
                                      "gae: --rlhf_type ppo; grpo → grpo, rloo → rloo, reinforce_plus_plus → "
                                      "reinforce, reinforce_plus_plus_baseline → reinforce_baseline --scale_rewards "
                                      "batch (sequence-level analogues of verl's token-level whitening)"),
    "algorithm.gamma": _flag("gamma", "float", "ppo only (GAE)", ("ppo",)),
    "algorithm.lam": _flag("lam", "float", "ppo only (GAE)", ("ppo",)),
    "algorithm.kl_ctrl.kl_coef": _stage("kl_coef", "float", "`--beta` (ppo)",
                                        "the KL in the reward; as an override, only with use_kl_in_reward=true "
                                        "(verl ignores it otherwise); grpo refuses it (its KL is in the loss)"),
    "algorithm.kl_ctrl.type": _stage("kl_ctrl_type", "str", "(none)",
                                     "fixed only: verl's adaptive controller steers the per-token mean KL, "
                                     "swift's (--kl_target, TRL's) the per-sequence sum"),
    "algorithm.use_kl_in_reward": _stage("use_kl_in_reward", "bool", "`--beta` (ppo)",
                                         "ppo: false → --beta 0; grpo: true refused (its KL is in the loss)"),
    "algorithm.kl_penalty": _stage("kl_penalty", "str", "`--kl_estimator` (ppo)", KL_TYPES + "; abs refused"),
    "algorithm.norm_adv_by_std_in_grpo": _stage("norm_adv", "bool", "`--scale_rewards` group / none",
                                                "with adv_estimator grpo (true: group, false: none, Dr. GRPO)"),
    "data.train_files": _files("dataset"),
    "data.val_files": _files("val_dataset"),
    "data.train_batch_size": _stage("train_batch_size", "int", "`--num_mini_batches` (ppo) / "
                                    "`--steps_per_generation` (grpo)",
                                    "prompts per rollout batch: × rollout.n completions ÷ one optimizer step's"),
    "data.max_prompt_length": _accept("int", "no flag: verl stops at a longer prompt (data.truncation=error), "
                                             "swift generates from the whole prompt"),
    "data.max_response_length": _flag("max_completion_length", "int"),
    "data.prompt_key": _stage("prompt_key", "str", "`--columns '{\"KEY\": \"prompt\"}'`"),
    M + "path": _flag("model", "str"),
    M + "lora_rank": Rule("int", _lora_rank, "`--tuner_type lora --lora_rank`", "0: --tuner_type full"),
    M + "lora_alpha": _flag("lora_alpha", "int"),
    M + "target_modules": _flag("target_modules", "strs"),
    M + "enable_gradient_checkpointing": _flag("gradient_checkpointing", "bool"),
    A + "optim.lr": _flag("learning_rate", "float"),
    A + "ppo_mini_batch_size": _stage("ppo_mini_batch_size", "int", "`--gradient_accumulation_steps`",
                                      "prompts per optimizer step: × rollout.n ÷ (micro batch × ranks)"),
    A + "ppo_micro_batch_size_per_gpu": _flag("per_device_train_batch_size", "int",
                                              "completions per forward; a multiple of rollout.n here"),
    A + "ppo_epochs": _flag("num_iterations", "int"),
    A + "clip_ratio": _stage("clip_ratio", "float", "`--epsilon`"),
    A + "clip_ratio_low": _stage("clip_ratio_low", "float", "`--epsilon`"),
    A + "clip_ratio_high": _stage("clip_ratio_high", "float", "`--epsilon_high`"),
    A + "use_kl_loss": _stage("use_kl_loss", "bool", "`--beta` (grpo)",
                              "grpo: false → --beta 0; ppo: true refused (its KL is in the reward)"),
    A + "kl_loss_coef": _stage("kl_loss_coef", "float", "`--beta` (grpo)",
                               "as an override, only with use_kl_loss=true (verl ignores it otherwise)"),
    A + "kl_loss_type": _stage("kl_loss_type", "str", "`--kl_estimator` (grpo)",
                               KL_TYPES + "; abs refused; as an override, only with use_kl_loss=true"),
    A + "entropy_coeff": Rule("float", _entropy, "(none)", "0 only: swift's loss has no entropy bonus"),
    A + "loss_agg_mode": Rule("str", _loss_agg, "`--loss_type`",
                              "token-mean → dapo, seq-mean-token-mean → grpo; seq-mean-token-sum(-norm) refused"),
    R + "n": _flag("num_generations", "int"),
    R + "name": Rule("str", _rollout_name, "`--use_vllm`", "vllm → true, hf → false (built-in engine), sglang "
                                                           "refused"),
    R + "temperature": _flag("temperature", "float"),
    R + "top_p": _flag("top_p", "float"),
    R + "tensor_model_parallel_size": Rule("int", _tp, "(none)", "1 only"),
    R + "gpu_memory_utilization": _flag("vllm_gpu_memory_utilization", "float"),
    R + "load_format": _accept("str", "no flag: how verl's vLLM gets its first weights; swift's engines start "
                                      "from the policy's"),
    "critic.model.path": _flag("critic_model", "str", online=("ppo",)),
    "critic.optim.lr": _flag("critic_learning_rate", "float", online=("ppo",)),
    "critic.cliprange_value": _flag("cliprange_value", "float", online=("ppo",)),
    "reward_model.enable": _stage("reward_model_enable", "bool", "(with model.path)"),
    "reward_model.model.path": _stage("reward_model", "str", "`--reward_model`",
                                      "a seq_cls directory; needs reward_model.enable=true, as in verl"),
    "reward_model.micro_batch_size_per_gpu": _accept("int", "no flag: the reward model scores 32 conversations "
                                                            "per forward"),
    "reward_model.max_length": _stage("reward_max_length", "int", "(none)",
                                      "2048 only: swift's reward model reads up to 2048 tokens"),
    "custom_reward_function.path": _flag("custom_reward_function_path", "str"),
    "custom_reward_function.name": _flag("custom_reward_function_name", "str"),
    "trainer.total_epochs": _flag("num_train_epochs", "int"),
    "trainer.total_training_steps": _stage("total_training_steps", "int", "`--max_steps`",
                                           "× the optimizer steps of one rollout batch"),
    "trainer.save_freq": _stage("save_freq", "int", "`--save_steps`", "× the optimizer steps of one rollout "
                                                                      "batch; -1: --save_strategy no"),
    "trainer.test_freq": _stage("test_freq", "int", "`--eval_steps`", "likewise; -1: --eval_strategy no"),
    "trainer.default_local_dir": _flag("output_dir", "str"),
    "trainer.logger": Rule("strs", _logger, "`--report_to`", "console is always on; wandb, tensorboard, mlflow"),
    "trainer.project_name": Rule("str", _output_part(0), "`--project`, `--output_dir`",
                                 "output_dir checkpoints/PROJECT/EXPERIMENT, as verl (wandb's project: "
                                 "WANDB_PROJECT)"),
    "trainer.experiment_name": Rule("str", _output_part(1), "`--run_name`, `--output_dir`"),
    "trainer.n_gpus_per_node": Rule("int", _shape(0, "NPROC_PER_NODE"), "(checked)", "must equal this run's "
                                                                                  "processes per node"),
    "trainer.nnodes": Rule("int", _shape(1, "NNODES"), "(checked)", "must equal this run's nodes"),
}
OVERRIDE = re.compile(r"\+{0,2}([A-Za-z_]\w*(?:\.\w+)+)=(.*)", re.S)


def apply_override(t: Translation, key: str, text: str) -> None:
    where = f"verl override {key}"
    if key not in VERL:
        raise ArgumentError(f"unknown verl override '{key}'.{closest_key(key, VERL)}")
    if t.rlhf_type not in ("grpo", "ppo"):
        raise ArgumentError(f"verl overrides ({key}=...) run --rlhf_type grpo or ppo, not {t.rlhf_type}; give "
                            "--rlhf_type")
    if "${" in text:
        raise refuse(where, "interpolations (${...}) are not resolved here; give the value")
    value = parse_value(text)
    if value is not None:  # null: verl's default, which here is swift's
        rule = VERL[key]
        rule.apply(t, typed(value, rule.kind, where), where)


def split_overrides(argv: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """Positional `dotted.key=value` arguments (verl's Hydra overrides) and the rest. A flag's value
    that looks like one is written `--flag=value`."""
    overrides, rest = [], []
    for arg in argv:
        m = None if arg.startswith("-") else OVERRIDE.fullmatch(arg)
        if m:
            overrides.append((m.group(1), m.group(2)))
        else:
            rest.append(arg)
    return overrides, rest


# -- the keys verl reads together -----------------------------------------------------------------------

ESTIMATORS = {"grpo": ("grpo", None), "grpo_vectorized": ("grpo", None), "rloo": ("rloo", None),
              "rloo_vectorized": ("rloo", None), "reinforce_plus_plus": ("reinforce", None),
              "reinforce_plus_plus_baseline": ("reinforce_baseline", "batch")}
KL_ESTIMATORS = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}
RM_MAX_LENGTH = 2048  # swift.infer.reward.RewardScorer's


def settle(t: Translation) -> None:
    """The staged keys, which mean something only together (estimator, KL, clip range, reward model)."""
    ppo = t.rlhf_type == "ppo"
    est, est_at = t.get("adv_estimator")
    if est == "gae" and not ppo:
        raise refuse(est_at, "gae learns a critic: run it with --rlhf_type ppo")
    if est not in (None, "gae"):
        if ppo:
            raise refuse(est_at, f"{est}: --rlhf_type ppo estimates advantages with its critic (gae); for a "
                                 "critic-free estimator use --rlhf_type grpo")
        if est not in ESTIMATORS:
            raise refuse(est_at, f"{est!r} has no swift estimator (gae, {', '.join(ESTIMATORS)})")
        name, scale = ESTIMATORS[est]
        t.set("advantage_estimator", name, est_at)
        if scale:
            t.set("scale_rewards", scale, est_at)
    norm, norm_at = t.get("norm_adv")
    if norm is not None:
        if ppo or ESTIMATORS.get(est, ("grpo",))[0] != "grpo":
            raise refuse(norm_at, "is read with algorithm.adv_estimator=grpo only")
        t.set("scale_rewards", "group" if norm else "none", norm_at)
    kind, kind_at = t.get("kl_ctrl_type")
    if kind not in (None, "fixed"):
        raise refuse(kind_at, f"{kind}: verl's adaptive controller steers the per-token mean KL, swift's "
                              "(--kl_target, TRL's) the per-sequence sum; give fixed")
    _settle_kl(t, ppo)
    _settle_clip(t)
    key, key_at = t.get("prompt_key")
    if key not in (None, "prompt"):
        t.set("columns", json.dumps({key: "prompt"}), key_at)
    path, path_at = t.get("reward_model")
    enable, enable_at = t.get("reward_model_enable")
    if path is not None and enable is None and is_override(path_at):
        raise refuse(path_at, "verl loads it only with reward_model.enable=true; add that")
    if path is not None and enable is not False:
        t.set("reward_model", path, path_at)
    elif enable and path is None:
        raise refuse(enable_at, "needs reward_model.model.path")
    length, length_at = t.get("reward_max_length")
    if length not in (None, RM_MAX_LENGTH):
        raise refuse(length_at, f"{length}: swift's reward model reads up to {RM_MAX_LENGTH} tokens of each "
                                f"conversation (no flag); give {RM_MAX_LENGTH} or leave it out")
    parts, parts_at = t.get("output_parts")
    if parts and "output_dir" not in t.flags:
        t.set("output_dir", os.path.join("checkpoints", *parts), parts_at)


def _settle_kl(t: Translation, ppo: bool) -> None:
    """verl has a KL in the reward (algorithm.*) and one in the actor's loss (actor.*); swift's ppo
    has the first (--beta, --kl_estimator), its grpo the second."""
    reward = [t.get(k) for k in ("use_kl_in_reward", "kl_coef", "kl_penalty")]
    loss = [t.get(k) for k in ("use_kl_loss", "kl_loss_coef", "kl_loss_type")]
    (on, on_at), (coef, coef_at), (kind, kind_at) = reward if ppo else loss
    other = loss if ppo else reward
    here = "the reward (algorithm.use_kl_in_reward, kl_ctrl.kl_coef, kl_penalty)" if ppo else \
        "the loss (actor_rollout_ref.actor.use_kl_loss, kl_loss_coef, kl_loss_type)"
    if other[0][0]:
        raise refuse(other[0][1], f"swift's --rlhf_type {t.rlhf_type} has its KL term in {here}, not there")
    for value, at in other[1:]:
        if value is not None and is_override(at):  # a file's key may be there for the other algorithm
            raise refuse(at, f"swift's --rlhf_type {t.rlhf_type} has its KL term in {here}, not there")
    if on is False:
        for value, at in ((coef, coef_at), (kind, kind_at)):
            if value is not None and is_override(at):
                raise refuse(at, f"does nothing with {on_at.split()[-1]}=false")
        t.set("beta", 0.0, on_at)
        return
    switch = "algorithm.use_kl_in_reward" if ppo else "actor_rollout_ref.actor.use_kl_loss"
    for value, at in ((coef, coef_at), (kind, kind_at)):
        if on is None and value is not None and is_override(at):  # verl's default for the switch is false
            raise refuse(at, f"does nothing in verl unless {switch}=true (its default is false); give both")
    if on and not ppo:  # verl's KL loss: a loss term for every estimator (ms-swift's rloo would subtract it)
        t.set("kl_in_reward", False, on_at)
    if coef is not None:
        t.set("beta", coef, coef_at)
    if kind is not None:
        if kind not in KL_ESTIMATORS:
            raise refuse(kind_at, f"{kind!r}: swift's KL estimators are k1 (kl), k2 (mse) and k3 (low_var_kl)")
        t.set("kl_estimator", KL_ESTIMATORS[kind], kind_at)


def _settle_clip(t: Translation) -> None:
    """verl: low = clip_ratio_low or clip_ratio, high = clip_ratio_high or clip_ratio (0.2, as ours)."""
    (clip, clip_at), (low, low_at), (high, high_at) = (t.get(k) for k in ("clip_ratio", "clip_ratio_low",
                                                                          "clip_ratio_high"))
    if low is not None or clip is not None:
        t.set("epsilon", low if low is not None else clip, low_at or clip_at)
    if high is not None:
        t.set("epsilon_high", high, high_at)
    elif low is not None:  # ours falls back to --epsilon (the low end), verl's to clip_ratio
        t.set("epsilon_high", clip if clip is not None else 0.2, clip_at or low_at)


def resolve_counts(t: Translation, values: dict[str, Any]) -> dict[str, Any]:
    """verl counts prompts (data.train_batch_size per rollout batch, ppo_mini_batch_size per optimizer
    step) and rollout batches (save_freq, test_freq, total_training_steps); ours count completions
    and optimizer steps. `values`: every parsed flag."""
    counts = {k: t.get(k) for k in ("train_batch_size", "ppo_mini_batch_size", "total_training_steps", "save_freq",
                                    "test_freq")}
    micro_at = t.origin.get("per_device_train_batch_size", "")
    micro_at = micro_at if micro_at.endswith("ppo_micro_batch_size_per_gpu") else None
    if all(v is None for v, _ in counts.values()) and not micro_at:
        return values
    from swift.rlhf import ALGORITHMS

    values = dict(values)
    algo = ALGORITHMS.get(values["rlhf_type"])
    n = values.get("num_generations") or values.get("n_samples_per_prompt") or algo.defaults.get("num_generations", 1)
    per_device, ranks = values["per_device_train_batch_size"], _launch()[0] * _launch()[1]
    if micro_at and per_device % n:
        raise refuse(micro_at, f"{per_device} is not a multiple of {n} completions per prompt: swift keeps a "
                               "prompt's completions in one micro-batch")
    mini, mini_at = counts["ppo_mini_batch_size"]
    if mini is not None:
        ga, rest = divmod(mini * n, per_device * ranks)
        if rest or not ga:
            raise refuse(mini_at, f"{mini} prompts × {n} completions is not a whole number of micro-batches of "
                                  f"{per_device} completions × {ranks} rank(s)")
        t.derive(values, "gradient_accumulation_steps", ga, mini_at)
    ga = values["gradient_accumulation_steps"]
    step = per_device * ranks * ga  # completions per optimizer step
    train, train_at = counts["train_batch_size"]
    if train is not None:
        k, rest = divmod(train * n, step)
        if rest or not k:
            raise refuse(train_at, f"{train} prompts × {n} completions is not a whole number of optimizer steps of "
                                   f"{step} completions ({per_device} per micro-batch × {ranks} rank(s) × {ga})")
        if "num_mini_batches" in algo.flags:
            t.derive(values, "num_mini_batches", k, train_at)
        else:
            t.derive(values, "steps_per_generation", k * ga, train_at)
    if values.get("num_mini_batches"):
        batches = values["num_mini_batches"]
    elif values.get("steps_per_generation"):
        batches = values["steps_per_generation"] // ga
    else:
        batches = (values.get("generation_batch_size") or step) // step
    # optimizer steps of one verl training step (one rollout batch)
    per_rollout = batches * (values.get("num_iterations") or values.get("num_ppo_epochs")
                             or algo.defaults.get("num_iterations", 1))
    total, total_at = counts["total_training_steps"]
    if total is not None:
        t.derive(values, "max_steps", total * per_rollout, total_at)
    for key, strategy, steps in (("save_freq", "save_strategy", "save_steps"),
                                 ("test_freq", "eval_strategy", "eval_steps")):
        freq, at = counts[key]
        if freq is not None and freq > 0:
            t.derive(values, steps, freq * per_rollout, at)
        elif freq is not None:
            t.derive(values, strategy, "no", at)
    return values
