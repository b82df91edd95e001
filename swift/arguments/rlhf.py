"""Arguments of `swift rlhf`: the flags of `swift.arguments.rlhf_flags` composed and checked
(aliases, per-algorithm defaults, flags an algorithm does not read), and the composed command."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from swift.arguments.rlhf_flags import (COLOCATE_ENGINE_FLAGS, DistillFlags, HarmlessFlags, OnlineFlags, PPOFlags,
                                        PreferenceFlags, RlhfCommonFlags, SamplingFlags)
from swift.arguments.rlhf_harmless import HarmlessChecks
from swift.arguments.rlhf_online import refuse_unread_online, refuse_unread_sync
from swift.arguments.train import SftArguments
from swift.utils.registry import SwiftError


@dataclass
class RlhfArguments(HarmlessChecks, HarmlessFlags, PPOFlags, OnlineFlags, DistillFlags, SamplingFlags,
                    PreferenceFlags, RlhfCommonFlags):
    """Every `swift rlhf` flag, in groups by the algorithms that read them (each group's own class;
    `swift rlhf --help` lists them under the group's title)."""
    flag_groups: ClassVar[tuple[type, ...]] = (RlhfCommonFlags, PreferenceFlags, SamplingFlags, DistillFlags,
                                               OnlineFlags, PPOFlags, HarmlessFlags)

    def __post_init__(self) -> None:
        from swift.rlhf import ALGORITHMS

        if self.do_harmlessness_training and self.rlhf_type == "dpo":  # the fork's switch (dpo: our default)
            self.rlhf_type = "harmless"  # with another --rlhf_type it is refused below as unread
        self._refuse_unread(ALGORITHMS.get(self.rlhf_type))
        for name in ("vllm_server_host", "vllm_server_port"):
            value = getattr(self, name)
            if isinstance(value, (list, tuple)):
                if len(value) != 1:
                    raise SwiftError(f"--{name} with several rollout servers is an ms-swift feature this version does "
                                     "not support: give one server (it can run several workers: --data_parallel_size)")
                setattr(self, name, value[0])
        if self.vllm_server_base_url:
            from urllib.parse import urlsplit

            url = urlsplit(self.vllm_server_base_url)
            try:
                port = url.port
            except ValueError:
                port = -1
            if url.scheme != "http" or not url.hostname or url.path not in ("", "/") or port == -1:
                raise SwiftError(f"--vllm_server_base_url {self.vllm_server_base_url!r} must look like "
                                 "http://HOST:PORT (the rollout server speaks plain HTTP)")
            self.vllm_server_host, self.vllm_server_port = url.hostname, port or 80
        algo = ALGORITHMS.get(self.rlhf_type)
        self._apply_aliases()
        for name, value in algo.defaults.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        if isinstance(self.loss_type, str):
            self.loss_type = [self.loss_type]
        for name in self.loss_type or []:
            algo.loss_types.get(name)  # a miss lists the valid names
        if self.loss_weights and len(self.loss_weights) != len(self.loss_type or []):
            raise SwiftError(f"--loss_weights has {len(self.loss_weights)} values for "
                             f"{len(self.loss_type or [])} --loss_type")
        if not 0 <= self.label_smoothing < 0.5:
            raise SwiftError(f"--label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        self._refuse_unread_by_loss_types(algo)
        if self.beta is not None and self.beta <= 0 and algo.trainer == "preference":
            raise SwiftError(f"--beta must be > 0, got {self.beta}")
        self._check_ppo()
        if self.rlhf_type == "harmless":
            self._check_harmless()
        if algo.trainer == "rollout":
            self._check_online()
        if algo.trainer == "distill":
            self._check_distill()

    def _check_distill(self) -> None:
        """Distillation's values, and its flags that this --lmbda / --seq_kd never reach: --sft_alpha
        applies on the steps that train on the dataset's answers, the sampling flags on those that sample."""
        if not 0 <= self.beta <= 1:
            raise SwiftError(f"--beta must be in [0, 1] for gkd, got {self.beta}")
        if not self.teacher_model:
            raise SwiftError("--rlhf_type gkd needs --teacher_model")
        if not 0 <= self.lmbda <= 1:
            raise SwiftError(f"--lmbda must be in [0, 1], got {self.lmbda}")
        if self.sft_alpha and self.lmbda == 1:
            raise SwiftError("--sft_alpha weighs the NLL on steps that train on the dataset's (or --seq_kd teacher's) "
                             "answers, and with --lmbda 1 every step trains on the student's own samples: lower "
                             "--lmbda or drop --sft_alpha")
        if self.lmbda == 0 and not self.seq_kd:
            for f in dataclasses.fields(SamplingFlags):
                if getattr(self, f.name) != f.default:
                    raise SwiftError(f"--{f.name} sets how answers are sampled, and with --lmbda 0 and no --seq_kd "
                                     "no step samples any: raise --lmbda, add --seq_kd, or drop it")

    def _refuse_unread_by_loss_types(self, algo) -> None:
        """A flag only some loss types read (DPO's --label_smoothing: sigmoid and robust), given when
        none of the --loss_type given reads it (TRL ignores it), is refused naming those that do."""
        for name, unread_by in algo.unread_by_loss_types.items():
            default = algo.defaults.get(name, next(f.default for f in dataclasses.fields(self) if f.name == name))
            if getattr(self, name) == default or not all(t in unread_by for t in self.loss_type or []):
                continue
            readers = [t for t in algo.loss_types if t not in unread_by]
            raise SwiftError(f"--{name} does nothing with --loss_type {' '.join(self.loss_type)}; it is read by "
                             f"--loss_type {', '.join(readers)}")

    def _refuse_unread(self, algo) -> None:
        """A flag this algorithm does not read, given a value other than its default, is refused in
        one line (before aliases and defaults change any value), naming the algorithms that read it."""
        from swift.rlhf import ALGORITHMS
        from swift.rlhf.base import FLAG_ALIASES

        for f in dataclasses.fields(RlhfArguments):
            name = FLAG_ALIASES.get(f.name, f.name)
            if name in algo.flags:
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            value = getattr(self, f.name)
            if value == default or (isinstance(default, list) and len(default) == 1 and value == default[0]):
                continue
            readers = [t for t in ALGORITHMS if name in ALGORITHMS.get(t).flags]
            raise SwiftError(f"--{f.name} does nothing for --rlhf_type {self.rlhf_type}; it is read by --rlhf_type "
                             f"{', '.join(readers) or '(none)'}")

    def _apply_aliases(self) -> None:
        """TRL's and OpenRLHF's names for our flags; both given with different values is an error."""
        for alias, name in (("n_samples_per_prompt", "num_generations"), ("num_ppo_epochs", "num_iterations"),
                            ("kl_coef", "beta"), ("init_kl_coef", "beta"), ("cliprange", "epsilon")):
            value = getattr(self, alias)
            if value is None:
                continue
            ours = getattr(self, name)
            if ours is not None and ours != value:
                raise SwiftError(f"--{alias} {value} and --{name} {ours} name the same setting; give one")
            # written once, under our name (args.json then repeats the run without a conflict)
            setattr(self, name, value)
            setattr(self, alias, None)
        if self.advantage_estimator in OPENRLHF_ESTIMATORS:
            self.advantage_estimator = OPENRLHF_ESTIMATORS[self.advantage_estimator]
        if self.remote_rm_url:
            if self.remote_rm_url.startswith(("http://", "https://")):
                if self.reward_model_url and self.reward_model_url != self.remote_rm_url:
                    raise SwiftError("--remote_rm_url and --reward_model_url name the same setting; give one")
                self.reward_model_url = self.remote_rm_url
            elif self.remote_rm_url.endswith(".py"):
                if self.remote_rm_url not in self.reward_funcs:
                    self.reward_funcs = [*self.reward_funcs, self.remote_rm_url]
            else:
                raise SwiftError(f"--remote_rm_url {self.remote_rm_url!r} must be an http(s) URL or a .py file "
                                 "defining reward_func")
            self.remote_rm_url = None
        if self.custom_reward_function_name and not self.custom_reward_function_path:
            raise SwiftError("--custom_reward_function_name names a function of --custom_reward_function_path; "
                             "give the file too")

    def _check_ppo(self) -> None:
        # PPO's own flags given to another algorithm are refused by `_refuse_unread`
        if not self.algorithm.critic:
            if self.advantage_estimator == "gae":
                raise SwiftError("--advantage_estimator gae needs a learned critic: use --rlhf_type ppo")
            return
        if self.advantage_estimator != "gae":
            raise SwiftError(f"--rlhf_type ppo estimates advantages with its critic (gae), not "
                             f"--advantage_estimator {self.advantage_estimator}; for critic-free estimators use "
                             "--rlhf_type grpo")
        if self.critic_backbone is None:
            self.critic_backbone = "separate"
        if self.critic_backbone not in ("separate", "shared"):
            raise SwiftError(f"--critic_backbone must be separate or shared, got {self.critic_backbone!r}")
        if self.critic_backbone == "shared" and self.critic_model:
            raise SwiftError("--critic_model starts a separate critic; --critic_backbone shared puts the value head on "
                             "the policy itself: give one")
        if not 0 <= self.gamma <= 1 or not 0 <= self.lam <= 1:
            raise SwiftError(f"--gamma and --lam must be in [0, 1], got {self.gamma} and {self.lam}")
        if self.vf_coef < 0 or self.cliprange_value <= 0:
            raise SwiftError("--vf_coef must be >= 0 and --cliprange_value > 0")
        if self.kl_target is not None and (self.kl_target <= 0 or self.kl_horizon <= 0):
            raise SwiftError("--kl_target and --kl_horizon must be positive")
        if self.kl_target is not None and not self.beta:
            raise SwiftError("--kl_target adapts the KL coefficient from --beta / --kl_coef, which is 0 here (no "
                             "reference model); give a starting coefficient > 0")
        if self.reward_clip_range and (len(self.reward_clip_range) != 2
                                       or self.reward_clip_range[0] >= self.reward_clip_range[1]):
            raise SwiftError(f"--reward_clip_range takes LOW HIGH with LOW < HIGH, got {self.reward_clip_range}")
        if self.num_mini_batches is not None and self.num_mini_batches < 1:
            raise SwiftError(f"--num_mini_batches must be >= 1, got {self.num_mini_batches}")
        if self.num_mini_batches is not None and (self.steps_per_generation or self.generation_batch_size):
            raise SwiftError("give --num_mini_batches or --steps_per_generation / --generation_batch_size, not both")
        if self.critic_learning_rate is not None and self.critic_learning_rate < 0:
            raise SwiftError(f"--critic_learning_rate must be >= 0, got {self.critic_learning_rate}")

    def _check_rollout_source(self) -> None:
        """What replaces the engine's single-turn rollout: TRL's environment_factory (our
        trl_environment scheduler) or rollout_func (the whole rollout)."""
        if self.environment_factory:
            if self.server_mode:
                raise SwiftError("--environment_factory runs its environments in the trainer: it needs a colocated "
                                 "engine (no --vllm_mode server / --rollout_mode server)")
            if self.multi_turn_scheduler not in (None, "trl_environment"):
                raise SwiftError(f"--environment_factory drives the multi-turn rollout itself; drop "
                                 f"--multi_turn_scheduler {self.multi_turn_scheduler}")
            self.multi_turn_scheduler = "trl_environment"
        if self.rollout_func:
            if self.server_mode or self.use_vllm:
                raise SwiftError("--rollout_func generates in the trainer's processes in place of the engine: drop "
                                 "--use_vllm / --vllm_mode server / --rollout_mode server")
            other = ("--async_generate" if self.async_generate else "--multi_turn_scheduler / --environment_factory"
                     if self.multi_turn_scheduler else "--gym_env" if self.gym_env else "--max_turns" if self.max_turns
                     else None)
            if other:
                raise SwiftError(f"--rollout_func replaces the whole rollout; drop {other}")
            from swift.plugin import load_attr

            load_attr(self.rollout_func, "--rollout_func")  # a missing file or function stops here, before the model

    def _check_online(self) -> None:
        from swift.rlhf.grpo import ADVANTAGE_ESTIMATORS, scale_for

        if self.advantage_estimator != "gae":
            ADVANTAGE_ESTIMATORS.get(self.advantage_estimator)
            if self.scale_rewards in ("group", "batch", "none"):
                try:
                    scale_for(self.advantage_estimator, self.scale_rewards)
                except ValueError as e:
                    raise SwiftError(str(e)) from None
        choices = {"scale_rewards": (None, "group", "batch", "none"), "importance_sampling_level": ("token", "sequence"),
                   "kl_estimator": ("k1", "k2", "k3"), "vllm_mode": ("colocate", "server"),
                   "rollout_mode": ("colocate", "server"),
                   "rollout_importance_sampling_mode": ("token_truncate", "token_mask", "none")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise SwiftError(f"--{name} {getattr(self, name)!r} is not one of "
                                 f"{', '.join(a for a in allowed if a)}")
        if self.num_generations < 1:
            raise SwiftError(f"--num_generations must be >= 1, got {self.num_generations}")
        if self.num_generations < 2 and self.advantage_estimator not in ("reinforce", "gae"):
            raise SwiftError(f"--num_generations must be at least 2 for --advantage_estimator "
                             f"{self.advantage_estimator} (advantages compare completions of one prompt)")
        if self.num_iterations < 1:
            raise SwiftError(f"--num_iterations must be >= 1, got {self.num_iterations}")
        if self.steps_per_generation is not None and self.generation_batch_size is not None:
            raise SwiftError("give --steps_per_generation or --generation_batch_size, not both")
        if len(self.loss_type) != 1:
            raise SwiftError(f"--loss_type takes one loss for {self.rlhf_type} (grpo, bnpo, dr_grpo, dapo, cispo or "
                             f"sapo), got "
                             f"{' '.join(self.loss_type)}")
        if not 0 < self.top_entropy_quantile <= 1:
            raise SwiftError(f"--top_entropy_quantile must be in (0, 1], got {self.top_entropy_quantile}")
        if self.beta < 0:
            raise SwiftError(f"--beta must be >= 0, got {self.beta}")
        if self.async_generate and not self.server_mode:
            raise SwiftError("--async_generate needs a rollout server (--use_vllm true --vllm_mode server, or "
                             "--rollout_mode server): a colocated engine shares the weights being trained")
        self._check_rollout_source()
        if self.server_mode and self.multi_turn_scheduler:
            raise SwiftError("--multi_turn_scheduler runs on the rollout server in server mode: pass it to "
                             "`swift rollout` instead of the trainer")
        if self.delta is not None and self.delta <= 1 + self.epsilon:
            raise SwiftError(f"--delta must be greater than 1 + --epsilon ({1 + self.epsilon}), got {self.delta}")
        if self.loss_type[0] == "cispo" and self.epsilon_high is not None and self.epsilon_high <= 1:
            raise SwiftError(f"--epsilon_high {self.epsilon_high}: with --loss_type cispo it caps the importance "
                             "weight itself (e.g. 5.0), so a value <= 1 would scale down every token")
        if self.delta is not None and self.loss_type[0] in ("cispo", "sapo"):
            raise SwiftError(f"--delta applies to the clipped losses, not --loss_type {self.loss_type[0]}")
        if self.tau_pos <= 0 or self.tau_neg <= 0:
            raise SwiftError("--tau_pos and --tau_neg must be positive")
        if self.rollout_importance_sampling_threshold <= 0:
            raise SwiftError("--rollout_importance_sampling_threshold must be positive")
        refuse_unread_online(self)  # flags this configuration would parse and never read
        colocate_only = [f"--{name}" for name, default in COLOCATE_ENGINE_FLAGS.items()
                         if getattr(self, name) != default]
        if colocate_only and not (self.use_vllm and not self.server_mode):
            from swift.utils.logging import get_logger

            where = ("the engine is the rollout server's: give them to `swift rollout` (with vLLM)"
                     if self.server_mode else "the built-in engine generates (--use_vllm false)")
            verb = "apply" if len(colocate_only) > 1 else "applies"
            get_logger(__name__).warning(f"{', '.join(colocate_only)} {verb} only to a colocated vLLM engine "
                                         f"(--use_vllm true --vllm_mode colocate); ignored here, {where}")

    @property
    def server_mode(self) -> bool:
        return (self.use_vllm and self.vllm_mode == "server") or self.rollout_mode == "server"

    @property
    def algorithm(self):
        from swift.rlhf import ALGORITHMS

        return ALGORITHMS.get(self.rlhf_type)


OPENRLHF_ESTIMATORS = {"group_norm": "grpo"}
# the data kinds (`Algorithm.data`) whose loss covers the last answer alone, and why
LOSS_SCALE_UNREAD = {"pair": "its loss compares the chosen and rejected last answers; other tokens would join them",
                     "unpaired": "its loss scores the last answer; other tokens would join it",
                     "steps": "its labels sit on the --step_separator tokens"}


class RLHFArguments(SftArguments):
    """`swift rlhf`: preference alignment, reward models and distillation on the shared trainer path."""

    parts: ClassVar[dict[str, type]] = {**SftArguments.parts, "rlhf_args": RlhfArguments}
    defaults: ClassVar[dict[str, Any]] = {"loss_scale": None}  # resolved in _check_loss_scale
    # the RePULSe fork's names of flags we have (its --init_kl_coef is OpenRLHF's, an alias of --beta)
    aliases: ClassVar[dict[str, str]] = {"pretrain": "model", "base_actor_learning_rate": "learning_rate",
                                         "duplicate_rollout_batch_by": "num_generations",
                                         "harmlessness_training_num_episodes": "num_train_epochs"}

    def __init__(self, **kwargs: Any):
        # not given: last_round, or for online RL with a multi-turn scheduler in the trainer default (as ms-swift)
        object.__setattr__(self, "_loss_scale_given", kwargs.get("loss_scale") is not None)
        super().__init__(**{**kwargs, "loss_scale": kwargs.get("loss_scale") or "last_round"})

    def builds_a_lora_beside_adapters(self) -> bool:
        # PPO's separate critic gets a new LoRA from these flags (`swift.pipelines.rlhf`), also when
        # the policy continues from --adapters
        return self.rlhf_type == "ppo" and self.critic_backbone == "separate"

    def __post_init__(self) -> None:
        algo = self.rlhf_args.algorithm
        if algo.task_type != "causal_lm":  # a value head: rm → seq_cls, prm → token_cls
            self.model_args.task_type = algo.task_type
            self.model_args.num_labels = self.model_args.num_labels or algo.num_labels
        if self.cached_dataset:
            raise SwiftError("--cached_dataset holds sft/pt samples; swift rlhf encodes its pairs, groups and prompts "
                             "from --dataset at start")
        if self.streaming:  # (before 2026-11-29 every type stopped at its first batch: KeyError, TypeError)
            raise SwiftError("--streaming encodes sft/pt samples as training reads them; swift rlhf encodes its pairs, "
                             "groups and prompts from --dataset at start: drop --streaming")
        self._check_loss_scale(algo)
        super().__post_init__()
        if self.packing or self.padding_free:
            raise SwiftError(f"--{'packing' if self.packing else 'padding_free'} is not supported with swift rlhf "
                             "(each row's sequences are kept together); it applies to swift pt and swift sft")
        if self.lazy_tokenize and algo.data in ("unpaired", "prompt"):
            raise SwiftError(f"--lazy_tokenize does not apply to --rlhf_type {self.rlhf_type} (its rows are "
                             "encoded up front: KTO pairs rows across the batch, online RL encodes prompts only)")
        if self.lazy_tokenize and self.precompute_ref_log_probs:
            raise SwiftError("--precompute_ref_log_probs stores log-probs in encoded rows, which --lazy_tokenize does "
                             "not keep; use one of them")
        if self.quant_bits and (self.use_vllm or self.rlhf_args.server_mode):
            raise SwiftError("--quant_bits: the weights sent to vLLM or a rollout server would be quantized ones; "
                             "generate with the built-in colocated engine")
        if self.use_dora and (self.use_vllm or self.rlhf_args.server_mode):
            raise SwiftError("--use_dora: the weights sent to vLLM or a rollout server are merged as plain LoRA, "
                             "which DoRA is not; generate with the built-in colocated engine")
        if self.ref_adapters and not (algo.reference and self.beta != 0):
            raise SwiftError(f"--ref_adapters: --rlhf_type {self.rlhf_type} uses no reference model here")
        uses_reference = algo.reference and not self.ref_model and not self.ref_adapters \
            and not (algo.trainer == "rollout" and not self.beta)
        changes_base = self.lora_bias != "none" or str(self.init_weights).lower() in ("pissa", "olora")
        if self.tuner_type == "lora" and uses_reference and changes_base:
            raise SwiftError("--lora_bias / --init_weights pissa|olora change the base model's weights, so the model "
                             "with its adapter switched off is no longer the reference: pass --ref_model")
        if algo.critic and self.training_args.fp16:
            raise SwiftError("--fp16 with --rlhf_type ppo: the critic's gradients are clipped outside the fp16 loss "
                             "scaler; use --bf16 or fp32")
        if algo.critic and (self.training_args.deepspeed_config or self.training_args.fsdp):
            engine = "deepspeed" if self.training_args.deepspeed_config else "fsdp"
            raise SwiftError(f"--rlhf_type ppo under --{engine} is not in this version yet (its critic is trained "
                             "beside the policy on each rank); use DDP (NPROC_PER_NODE) or one process")
        if self.rlhf_type == "harmless":
            self._check_harmless()
        if self.training_args.deepspeed_config:
            self._check_deepspeed(algo)
        refuse_unread_sync(self)

    def _check_loss_scale(self, algo) -> None:
        """--loss_scale other than last_round (the default here, as in ms-swift) is read by distillation,
        on the dataset's answers, and by online RL, on multi-turn rollouts (`default`: every generated
        turn; `last_round`: the final assistant message; `swift.rollout.runner.rollout`), where it
        defaults to `default` with a --multi_turn_scheduler in the trainer, as ms-swift. Pairs and KTO
        split prompt from answer at the first token with loss (under `all` the prompt would be empty,
        under `default` earlier turns would join the answer); PRM labels its step separators."""
        r = self.rlhf_args
        if algo.data == "prompt":
            if not self._loss_scale_given and r.multi_turn_scheduler:
                self.loss_scale = "default"
            if self.loss_scale == "all":
                raise SwiftError(f"--loss_scale all does not apply to --rlhf_type {self.rlhf_type} (it trains on the "
                                 "tokens it generates, never on prompt or environment tokens); use default or "
                                 "last_round")
            if self.loss_scale == "default" and not (r.multi_turn_scheduler or r.server_mode):
                raise SwiftError(f"--loss_scale default does not apply to --rlhf_type {self.rlhf_type} (without a "
                                 "--multi_turn_scheduler, here or on a rollout server, each completion is one "
                                 "answer); drop it")
            return
        if self.loss_scale == "last_round":
            return
        why = LOSS_SCALE_UNREAD.get(algo.data)
        if algo.data == "conversation" and (r.seq_kd or r.lmbda == 1):
            why = "with --seq_kd or --lmbda 1 every step trains on sampled answers, not the dataset's"
        if why:
            raise SwiftError(f"--loss_scale {self.loss_scale} does not apply to --rlhf_type {self.rlhf_type} ({why}); "
                             "leave it at last_round, the default")

    def _check_harmless(self) -> None:
        r = self.rlhf_args
        if self.training_args.deepspeed_config or self.training_args.fsdp:
            engine = "deepspeed" if self.training_args.deepspeed_config else "fsdp"
            raise SwiftError(f"--rlhf_type harmless under --{engine} is not in this version yet (its proposal is "
                             "trained beside the policy on each rank); use DDP (NPROC_PER_NODE) or one process")
        learns_q = r.harmlessness_training_loss_type != "reinforce" and not r.use_base_as_proposal
        if learns_q and r.proposal is None and not r.parameterization.startswith("modulation_"):
            r.proposal = "adapter" if self.tuner_type == "lora" else "copy"
        if r.parameterization == "modulation_model" and self.tuner_type != "full":
            raise SwiftError(f"--parameterization modulation_model trains a second whole model with a new output layer "
                             f"(as the fork): it needs --tuner_type full, got {self.tuner_type}; with LoRA use "
                             "modulation_linear_head or modulation_nn_head")
        if r.proposal == "adapter" and self.tuner_type != "lora":
            raise SwiftError(f"--proposal adapter is a second LoRA adapter beside the policy's: it needs --tuner_type "
                             f"lora (got {self.tuner_type}); use --proposal copy")
        if r.proposal == "adapter" and (self.use_dora or self.quant_bits or self.lora_bias != "none"):
            raise SwiftError("--proposal adapter with --use_dora / --quant_bits / --lora_bias is not in this version "
                             "(PEFT holds one biased adapter per model); use --proposal copy")

    def _check_deepspeed(self, algo) -> None:
        from swift.arguments.deepspeed import zero3

        if not zero3(self.training_args):
            return
        if self.precompute_ref_log_probs:
            raise SwiftError("--precompute_ref_log_probs runs before DeepSpeed has set up the model, which ZeRO-3 "
                             "partitions; leave it off (the reference then runs beside the policy) or use ZeRO-2")
        if algo.trainer == "rollout" and self.tuner_type == "lora" and (self.use_dora or self.lora_bias != "none"):
            raise SwiftError("--use_dora / --lora_bias: under ZeRO-3 the rollout engine receives the weights merged "
                             "as plain LoRA, which these are not; use --deepspeed zero2")
        if algo.trainer == "distill" and (self.lmbda > 0 or self.seq_kd):
            raise SwiftError("--rlhf_type gkd samples answers (--lmbda > 0 or --seq_kd), which is not implemented "
                             "under ZeRO-3; use --lmbda 0 without --seq_kd, or --deepspeed zero2")
