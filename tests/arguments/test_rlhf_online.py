"""Online RL flags that a configuration parses and never reads are refused in one line naming them
(`swift.arguments.rlhf_online`, `Algorithm.unread_by_loss_types`); before 2026-11-30 each was accepted
and the run trained without it."""
import pytest

from swift.utils.registry import SwiftError

BASE = ["--model", "m", "--dataset", "d", "--rlhf_type", "grpo", "--reward_funcs", "accuracy"]
SERVER = ["--rollout_mode", "server"]


def parse(*argv: str):
    from swift.arguments.parser import parse_args
    from swift.arguments.rlhf import RLHFArguments

    return parse_args(RLHFArguments, [*BASE, *argv])


@pytest.mark.parametrize("argv,message", [
    (["--beta", "0", "--ref_model", "r"], "--ref_model does nothing with --beta 0"),
    (["--beta", "0", "--kl_estimator", "k1"], "--kl_estimator does nothing with --beta 0"),
    (["--rlhf_type", "ppo", "--beta", "0", "--kl_estimator", "k3"], "--kl_estimator does nothing with --beta 0"),
    (["--tau_pos", "2"], "--tau_pos does nothing with --loss_type grpo; it is read by --loss_type sapo"),
    (["--loss_type", "cispo", "--tau_neg", "2"], "--tau_neg does nothing with --loss_type cispo"),
    (["--loss_type", "cispo", "--epsilon", "0.3"], "--epsilon does nothing with --loss_type cispo"),
    (["--loss_type", "sapo", "--epsilon", "0.3"], "--epsilon does nothing with --loss_type sapo"),
    (["--loss_type", "sapo", "--epsilon_high", "0.3"], "--epsilon_high does nothing with --loss_type sapo"),
    (["--rlhf_type", "ppo", "--loss_type", "sapo", "--cliprange", "0.3"],
     "--epsilon does nothing with --loss_type sapo"),
    (["--max_resample_times", "5"], "--max_resample_times does nothing without --dynamic_sample true"),
    (["--rollout_importance_sampling_mode", "token_mask"], "--rollout_importance_sampling_mode weighs tokens by the "
                                                           "sampler's log-probs, which only --async_generate"),
    ([*SERVER, "--rollout_importance_sampling_threshold", "3"], "--rollout_importance_sampling_threshold weighs"),
    (["--max_turns", "3"], "--max_turns does nothing without --multi_turn_scheduler$"),
    ([*SERVER, "--max_turns", "3"], r"--max_turns does nothing without --multi_turn_scheduler \(in server mode"),
    (["--gym_env", "guess_number"], "--gym_env does nothing without --multi_turn_scheduler"),
    # before 2026-12-07 a scheduler that does not read it dropped it without a word
    (["--multi_turn_scheduler", "math_tip_trick", "--gym_env", "guess_number"],
     "^--gym_env names the environment of --multi_turn_scheduler gym; --multi_turn_scheduler math_tip_trick does not "
     "read it: drop --gym_env$"),
    (["--environment_factory", "my_env.py:ToolEnv", "--gym_env", "guess_number"],
     "^--gym_env names the environment of --multi_turn_scheduler gym; --environment_factory does not read it"),
    # ms-swift asserts it (before 2026-12-07 a missing one became L_max // 4, and one of L_max passed)
    (["--reward_funcs", "soft_overlong"], "^the soft_overlong reward needs --soft_cache_length: L_cache, the last "
                                          r"tokens before --soft_max_length \(512\)"),
    (["--reward_funcs", "soft_overlong", "--soft_cache_length", "512"],
     r"^--soft_cache_length 512 must be in 1\.\.511: below --soft_max_length \(or --max_completion_length\), 512$"),
    (["--reward_funcs", "soft_overlong", "--soft_max_length", "100", "--soft_cache_length", "100"],
     r"^--soft_cache_length 100 must be in 1\.\.99"),
    (["--reward_funcs", "soft_overlong", "--soft_cache_length", "0"], r"^--soft_cache_length 0 must be in 1\.\.511"),
    (["--soft_max_length", "100"], "--soft_max_length is an option of the soft_overlong reward function, which "
                                   r"--reward_funcs does not name \(accuracy\)"),
    (["--soft_cache_length", "10"], "--soft_cache_length is an option of the soft_overlong reward function"),
    (["--cosine_max_len", "100"], "--cosine_max_len is an option of the cosine reward function"),
    (["--cosine_min_len_value_wrong", "-1"], "--cosine_min_len_value_wrong is an option of the cosine"),
    (["--repetition_n_grams", "4"], "--repetition_n_grams is an option of the repetition reward function"),
    (["--repetition_max_penalty", "-2"], "--repetition_max_penalty is an option of the repetition"),
    (["--step_separator", "\n\n"], "--step_separator splits completions into steps for --prm_model; there is none"),
    (["--vllm_server_port", "9000"], "--vllm_server_port does nothing without a rollout server"),
    (["--vllm_server_host", "10.0.0.1"], "--vllm_server_host does nothing without a rollout server"),
    (["--vllm_server_base_url", "http://10.0.0.1:9000"], "--vllm_server_base_url does nothing without a rollout"),
    (["--vllm_server_timeout", "30"], "--vllm_server_timeout does nothing without a rollout server"),
    (["--weight_sync_bucket_mb", "8"], "--weight_sync_bucket_mb does nothing here"),
    (["--weight_sync_bucket_mb", "8", "--deepspeed", "zero2"], "--weight_sync_bucket_mb does nothing here"),
    (["--kl_in_reward", "true", "--beta", "0"], "--kl_in_reward true does nothing with --beta 0"),
])
def test_a_flag_this_configuration_never_reads_is_refused_in_one_line(argv, message):
    with pytest.raises(SwiftError, match=message) as e:
        parse(*argv)
    assert "\n" not in str(e.value).replace("'\\n\\n'", "")


@pytest.mark.parametrize("argv", [
    ["--beta", "0", "--kl_estimator", "k3"],  # the default, given
    ["--beta", "0.1", "--ref_model", "r", "--kl_estimator", "k1"],
    ["--loss_type", "sapo", "--tau_pos", "2", "--tau_neg", "0.5", "--epsilon", "0.2"],
    ["--loss_type", "cispo", "--epsilon_high", "3"],
    ["--loss_type", "dapo", "--epsilon", "0.3", "--epsilon_high", "0.28"],
    ["--dynamic_sample", "true", "--max_resample_times", "5"],
    [*SERVER, "--async_generate", "true", "--rollout_importance_sampling_mode", "token_mask",
     "--rollout_importance_sampling_threshold", "3"],
    ["--multi_turn_scheduler", "gym", "--gym_env", "guess_number", "--max_turns", "3"],
    ["--reward_funcs", "soft_overlong", "--soft_cache_length", "128"],
    ["--reward_funcs", "soft_overlong", "--max_completion_length", "64", "--soft_max_length", "100",
     "--soft_cache_length", "99"],
    ["--reward_funcs", "soft_overlong", "cosine", "repetition", "--soft_max_length", "100", "--soft_cache_length",
     "10", "--cosine_max_len", "100", "--repetition_n_grams", "4"],
    ["--reward_funcs", "my_plugin_reward", "--cosine_max_len", "100"],  # a plugin's function may read it
    ["--prm_model", "p", "--step_separator", "\n\n"],
    [*SERVER, "--vllm_server_port", "9000", "--weight_sync_bucket_mb", "8", "--vllm_server_timeout", "30"],
    ["--weight_sync_bucket_mb", "8", "--deepspeed", "zero3"],
    ["--weight_sync_bucket_mb", "8", "--fsdp", "fsdp2"],
    ["--advantage_estimator", "rloo", "--beta", "0"],
    ["--advantage_estimator", "rloo"],  # the KL in the reward (ms-swift's default for rloo)
    ["--advantage_estimator", "reinforce_plus_plus", "--beta", "0.1", "--kl_in_reward", "false"],
    ["--algo.advantage.estimator", "rloo", "--algo.kl.init_coef", "0.01"],
    ["--advantage_estimator", "dr_grpo"],
])
def test_the_same_flags_where_they_are_read_pass(argv):
    parse(*argv)


@pytest.mark.parametrize("where", ["command line", "config"])
def test_ms_swifts_use_gym_env_is_refused_naming_what_does_it_here(where, tmp_path):
    """ms-swift's --use_gym_env true adds the environment's total_reward as a reward column; here that
    reward is the gym_reward function (before 2026-12-07 the flag was an unknown one)."""
    argv = ["--multi_turn_scheduler", "gym", "--gym_env", "guess_number"]
    if where == "config":
        config = tmp_path / "rlhf.yaml"
        config.write_text("use_gym_env: true\n")
        argv += ["--config", str(config)]
    else:
        argv += ["--use_gym_env", "true"]
    with pytest.raises(SwiftError, match="--use_gym_env is an ms-swift flag this version does not support: the "
                                         "environment's summed reward of --multi_turn_scheduler gym is the gym_reward "
                                         "reward function: name it in --reward_funcs$"):
        parse(*argv)
