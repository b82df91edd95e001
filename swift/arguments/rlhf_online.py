"""Online RL's (grpo, ppo, harmless) flags that this configuration would parse and never read, each
refused in one line naming it (the flags an algorithm never reads are `RlhfArguments._refuse_unread`'s,
those only some loss types read `Algorithm.unread_by_loss_types`'). A flag is refused only when given
a value other than its default."""
from __future__ import annotations

from swift.utils.registry import SwiftError

# the built-in reward functions that read these flags (a plugin's may read any of them)
REWARD_FUNC_FLAGS = {"soft_overlong": ("soft_max_length", "soft_cache_length"),
                     "cosine": ("cosine_max_len", "cosine_min_len_value_correct", "cosine_max_len_value_correct",
                                "cosine_min_len_value_wrong", "cosine_max_len_value_wrong"),
                     "repetition": ("repetition_n_grams", "repetition_max_penalty")}
SERVER_FLAGS = ("vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_api_key",
                "vllm_server_timeout")
# the estimators ms-swift subtracts β·KL from the rewards for by default (--kl_in_reward true)
KL_IN_REWARD_ESTIMATORS = ("rloo", "reinforce_plus_plus")


def _default(a, name: str):
    """The flag's value when not given: its algorithm's default, else the field's."""
    import dataclasses

    if name in a.algorithm.defaults:
        return a.algorithm.defaults[name]
    f = next(f for f in dataclasses.fields(a) if f.name == name)
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _given(a, *names: str) -> str | None:
    """The first of `names` set away from its default, as `--flag`."""
    for name in names:
        value, default = getattr(a, name), _default(a, name)
        if isinstance(default, list) and len(default) == 1:  # the server lists, one value once checked
            default = default[0]
        if value != default:
            return f"--{name}"
    return None


def refuse_unread_online(a) -> None:
    """`a`: the RlhfArguments of an online algorithm, its defaults applied and checked."""
    algo = a.algorithm
    if not a.beta:
        flag = "--ref_model" if a.ref_model else _given(a, "kl_estimator")
        if flag:
            raise SwiftError(f"{flag} does nothing with --beta 0: there is no KL term, so no reference model is "
                             "loaded; give --beta > 0 or drop it")
    if "kl_in_reward" in algo.flags:
        if a.kl_in_reward is None:  # ms-swift's default (false without a KL: args.json's value stays valid)
            a.kl_in_reward = a.advantage_estimator in KL_IN_REWARD_ESTIMATORS and bool(a.beta)
        elif a.kl_in_reward and not a.beta:
            raise SwiftError("--kl_in_reward true does nothing with --beta 0: there is no KL to subtract")
        if a.kl_in_reward and _given(a, "kl_estimator"):
            raise SwiftError("--kl_estimator does nothing with --kl_in_reward true: the KL taken off each reward is "
                             "the sum of log π_old − log π_ref over the completion's tokens (as ms-swift's)")
    if not a.dynamic_sample and _given(a, "max_resample_times"):
        raise SwiftError("--max_resample_times does nothing without --dynamic_sample true")
    flag = _given(a, "rollout_importance_sampling_mode", "rollout_importance_sampling_threshold")
    if flag and not (a.async_generate or a.rollout_func):
        raise SwiftError(f"{flag} weighs tokens by the sampler's log-probs, which only --async_generate (or a "
                         "--rollout_func returning logprobs) provides: every completion here is sampled by the "
                         "weights it is trained against")
    if not a.multi_turn_scheduler:
        flag = "--max_turns" if a.max_turns is not None else "--gym_env" if a.gym_env else None
        if flag:
            where = " (in server mode, give both to `swift rollout`)" if a.server_mode else ""
            raise SwiftError(f"{flag} does nothing without --multi_turn_scheduler{where}")
    elif a.gym_env:  # a scheduler that does not read it (before 2026-12-07 it was dropped without a word)
        from swift.rollout.multi_turn import refuse_unread_env

        refuse_unread_env(a.multi_turn_scheduler, a.gym_env, "--environment_factory" if a.environment_factory else None)
    if not a.prm_model and _given(a, "step_separator"):
        raise SwiftError("--step_separator splits completions into steps for --prm_model; there is none here")
    flag = _given(a, *SERVER_FLAGS) if not a.server_mode else None
    if flag:
        raise SwiftError(f"{flag} does nothing without a rollout server (--use_vllm true --vllm_mode server, or "
                         "--rollout_mode server)")
    _refuse_unread_reward_options(a)


def _refuse_unread_reward_options(a) -> None:
    """The built-in reward functions' options: soft_overlong's lengths checked, and each option given
    without the function that reads it refused (only when every --reward_funcs entry is a built-in
    one: a plugin's may read them)."""
    from swift.rewards import orms
    from swift.rewards.builtin import SoftOverlong, soft_overlong_lengths

    if "soft_overlong" in a.reward_funcs and orms.get("soft_overlong") is SoftOverlong:
        soft_overlong_lengths(a)  # a missing or too long --soft_cache_length, before the model loads
    if any(name not in orms or not orms.get(name).__module__.startswith("swift.") for name in a.reward_funcs):
        return
    for func, names in REWARD_FUNC_FLAGS.items():
        flag = _given(a, *names) if func not in a.reward_funcs else None
        if flag:
            raise SwiftError(f"{flag} is an option of the {func} reward function, which --reward_funcs does not "
                             f"name ({' '.join(a.reward_funcs) or 'none'})")


def refuse_unread_sync(args) -> None:
    """`args`: RLHFArguments. --weight_sync_bucket_mb sizes the weight pushes to a rollout server or
    from ZeRO-3 / FSDP partitions; a plain colocated engine receives the weights whole."""
    from swift.arguments.deepspeed import zero3

    r = args.rlhf_args
    if args.rlhf_args.algorithm.trainer != "rollout" or r.server_mode or zero3(args.training_args) \
            or args.training_args.fsdp:
        return
    if _given(r, "weight_sync_bucket_mb"):
        raise SwiftError("--weight_sync_bucket_mb does nothing here: it sizes the weight pushes to a rollout server "
                         "or under ZeRO-3 / FSDP; a colocated engine receives the weights whole")
