"""The algorithm registry. Shared code looks an algorithm up here and never branches on its name."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from swift.utils.registry import Registry


@dataclass(frozen=True)
class Algorithm:
    """What an offline algorithm needs from the shared trainer path.

    trainer: "preference" (sequence log-probs of a causal LM), "classifier" (a value head's logits),
        "distill" (student and teacher next-token distributions) or "rollout" (online RL: sample,
        score, update).
    data: how a row becomes sequences: "pair" (chosen + rejected), "unpaired" (one completion and a
        mismatched one for the KL baseline), "steps" (step-labelled solutions), "conversation",
        "prompt" (a prompt and its other columns, for online RL).
    loss: returns (terms, metrics), the terms being sums over the micro-batch keyed by the kind of count
        they are divided by (`swift.rlhf.reduce`); its inputs depend on the trainer:
        preference: `loss(policy, ref, batch, args)` with `SequenceLogps` (ref None without a reference);
        classifier: `loss(logits, batch, args)`; distill: `loss(student_logits, teacher_logits, args)`
        (the logits of the labelled positions only); rollout: `swift.rlhf.grpo.policy_loss`.
    defaults: default argument values (e.g. beta) that the user did not set.
    flags: the `swift rlhf` flags (RlhfArguments fields) this algorithm reads; a value other than its
        default for any other one is refused in one line (`swift.arguments.rlhf`).
    unread_by_loss_types: a flag of `flags` that some built-in `loss_types` do not read -> those loss
        types; a value other than its default is refused when every `--loss_type` given is one of them.
    whole_sequence_nll: the preference trainer also sums log-probs over every token (prompt included).
    critic: online RL with a learned value model (PPO): per-token advantages by GAE.
    proposal: online RL with a learned proposal that samples the policy's bad outputs (RePULSe).
    """

    trainer: str
    data: str
    loss: Callable
    reference: bool = False
    task_type: str = "causal_lm"
    num_labels: int | None = None
    defaults: dict = field(default_factory=dict)
    loss_types: Registry | None = None
    whole_sequence_nll: bool = False
    critic: bool = False
    proposal: bool = False
    flags: frozenset = frozenset()
    unread_by_loss_types: dict = field(default_factory=dict)


# flag groups the algorithms' `flags` are built from
COMMON_FLAGS = frozenset({"rlhf_type", "disable_dropout"})
REFERENCE_FLAGS = frozenset({"ref_model", "ref_adapters"})
SAMPLING_FLAGS = frozenset({"max_completion_length", "temperature", "top_p", "top_k", "repetition_penalty"})
ROLLOUT_FLAGS = COMMON_FLAGS | REFERENCE_FLAGS | SAMPLING_FLAGS | frozenset({
    "beta", "loss_type", "num_generations", "reward_funcs", "reward_weights", "reward_model", "prm_model",
    "custom_reward_function_path", "custom_reward_function_name", "environment_factory", "rollout_func",
    "reward_model_url", "step_separator", "epsilon", "epsilon_high", "delta", "tau_pos", "tau_neg", "num_iterations",
    "steps_per_generation", "generation_batch_size", "advantage_estimator", "importance_sampling_level",
    "kl_estimator", "top_entropy_quantile", "overlong_filter", "soft_max_length", "soft_cache_length",
    "cosine_max_len", "cosine_min_len_value_correct", "cosine_max_len_value_correct", "cosine_min_len_value_wrong",
    "cosine_max_len_value_wrong", "repetition_n_grams", "repetition_max_penalty", "multi_turn_scheduler",
    "max_turns", "gym_env", "log_completions", "use_vllm", "vllm_mode", "rollout_mode", "vllm_server_host",
    "vllm_server_port", "vllm_server_api_key", "vllm_server_timeout", "weight_sync_bucket_mb", "async_generate",
    "rollout_importance_sampling_mode", "rollout_importance_sampling_threshold", "vllm_gpu_memory_utilization",
    "vllm_max_model_len", "vllm_enforce_eager"})
# other names for flags (TRL's, OpenRLHF's, ms-swift's): read wherever what they name is read
FLAG_ALIASES = {"n_samples_per_prompt": "num_generations", "num_ppo_epochs": "num_iterations", "kl_coef": "beta",
                "init_kl_coef": "beta", "cliprange": "epsilon", "remote_rm_url": "reward_funcs",
                "vllm_server_base_url": "vllm_server_host"}


ALGORITHMS: Registry[Algorithm] = Registry("rlhf algorithm")
