"""The `swift rlhf` flags, declared in groups by the algorithms that read them (each group's
`algorithms`; the registry entries' `flags` say exactly which, and `tests/arguments` checks that the
two agree). `swift.arguments.rlhf.RlhfArguments` composes them and checks their values."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

# flags of the engine `swift rlhf` builds in its own process (colocate), with their defaults: a rollout
# server's engine takes them from `swift rollout`
COLOCATE_ENGINE_FLAGS = {"vllm_gpu_memory_utilization": 0.3, "vllm_max_model_len": None, "vllm_enforce_eager": False}


@dataclass
class RlhfCommonFlags:
    """`swift rlhf` flags of every --rlhf_type, or of several families of them (`algorithms` None)."""
    _argument_group_name: ClassVar[str] = "every --rlhf_type"
    algorithms: ClassVar[tuple[str, ...] | None] = None

    rlhf_type: str = field(default="dpo", metadata={
        "help": "Algorithm: dpo, orpo, simpo, cpo, kto, rm, prm, gkd, grpo, ppo, harmless (RePULSe)."})
    ref_model: str | None = field(default=None, metadata={
        "help": "Reference model (default: the frozen starting model; for LoRA and --adapters, the policy with its "
                "adapters disabled, i.e. the base model without --adapters, as in ms-swift)."})
    ref_adapters: list[str] = field(default_factory=list, metadata={
        "help": "LoRA adapters merged into the reference model (--ref_model, else --model), e.g. the SFT adapter "
                "the policy starts from (give the --adapters directories to make the reference the adapted model)."})
    beta: float | None = field(default=None, metadata={
        "help": "β: KL strength (dpo, kto 0.1), odds-ratio weight (orpo 0.1), reward scale (cpo 0.1, simpo 2.0), "
                "JSD interpolation (gkd 0.5), KL weight (grpo 0.04; 0 loads no reference model), initial KL "
                "coefficient of the reward (ppo 0.05; also --kl_coef, OpenRLHF's --init_kl_coef)."})
    loss_type: list[str] | None = field(default=None, metadata={
        "help": "dpo: losses, summed: sigmoid (default), ipo, hinge, robust, bco_pair, sppo_hard, nca_pair, apo_zero, "
                "apo_down. grpo: grpo (default), bnpo, dr_grpo, dapo (aggregations of the clipped loss), cispo, sapo; "
                "bnpo alone is a token mean per micro-batch (TRL's meaning), so it changes with gradient "
                "accumulation and ranks. "
                "ppo: the same, default dapo (the token mean over the optimizer step); the value loss is "
                "aggregated alike."})
    step_separator: str = field(default="\n", metadata={"help": "prm: text that ends each step; its token is labelled."})
    disable_dropout: bool = field(default=True, metadata={
        "help": "Turn off every dropout layer of the policy and reference (TRL's default), so that log-probs "
                "computed twice (old and new, policy and reference) come from the same function."})
    kl_coef: float | None = field(default=None, metadata={"help": "ppo: TRL's name for --beta (0.05)."})
    init_kl_coef: float | None = field(default=None, metadata={"help": "ppo: OpenRLHF's name for --beta."})


@dataclass
class PreferenceFlags:
    """`swift rlhf` flags of preference and reward models (dpo, orpo, simpo, cpo, kto, rm, prm)."""
    _argument_group_name: ClassVar[str] = "preference and reward models (dpo, orpo, simpo, cpo, kto, rm, prm)"
    algorithms: ClassVar[tuple[str, ...] | None] = ("dpo", "orpo", "simpo", "cpo", "kto", "rm", "prm")

    precompute_ref_log_probs: bool = field(default=False, metadata={
        "help": "Compute the reference log-probs of every sample once before training, then free the reference."})
    loss_weights: list[float] = field(default_factory=list, metadata={"help": "Weight of each --loss_type (default 1)."})
    label_smoothing: float = field(default=0.0, metadata={
        "help": "Assumed label-flip rate ε: cDPO with sigmoid, the robust loss's ε; also cpo and simpo."})
    rpo_alpha: float | None = field(default=None, metadata={"help": "dpo: add rpo_alpha × NLL of the chosen answer (RPO)."})
    cpo_alpha: float | None = field(default=None, metadata={"help": "cpo/simpo: weight of the chosen answer's NLL (1)."})
    simpo_gamma: float = field(default=1.0, metadata={"help": "simpo: target reward margin γ."})
    desirable_weight: float = field(default=1.0, metadata={"help": "kto: weight λ_D of desirable answers."})
    undesirable_weight: float = field(default=1.0, metadata={"help": "kto: weight λ_U of undesirable answers."})
    center_rewards_coefficient: float | None = field(default=None, metadata={
        "help": "rm: add c × mean (r_chosen + r_rejected)² to centre the rewards."})


@dataclass
class SamplingFlags:
    """`swift rlhf` flags of on-policy sampling (gkd, grpo, ppo, harmless)."""
    _argument_group_name: ClassVar[str] = "on-policy sampling (gkd, grpo, ppo, harmless)"
    algorithms: ClassVar[tuple[str, ...] | None] = ("gkd", "grpo", "ppo", "harmless")

    max_completion_length: int = field(default=512, metadata={"help": "Most tokens the policy generates (gkd, grpo)."})
    temperature: float = field(default=0.9, metadata={"help": "Sampling temperature of on-policy generation (gkd, grpo)."})
    top_p: float = field(default=1.0, metadata={"help": "Sampling top-p of rollouts."})
    top_k: int = field(default=0, metadata={"help": "Sampling top-k of rollouts (0 = off)."})
    repetition_penalty: float = field(default=1.0, metadata={"help": "Repetition penalty of rollouts."})


@dataclass
class DistillFlags:
    """`swift rlhf` flags of distillation (gkd)."""
    _argument_group_name: ClassVar[str] = "distillation (gkd)"
    algorithms: ClassVar[tuple[str, ...] | None] = ("gkd",)

    teacher_model: str | None = field(default=None, metadata={"help": "gkd: the teacher (same vocabulary)."})
    seq_kd: bool = field(default=False, metadata={
        "help": "gkd: sequence-level KD — train on the teacher's own answers to the prompts (sampled with "
                "--temperature, up to --max_completion_length) instead of the dataset's."})
    lmbda: float = field(default=0.5, metadata={"help": "gkd: fraction of steps trained on the student's own samples."})
    sft_alpha: float = field(default=0.0, metadata={
        "help": "gkd: weight of the NLL of the dataset's answers (the teacher's with --seq_kd) on the steps that "
                "do not sample (refused with --lmbda 1)."})


@dataclass
class OnlineFlags:
    """`swift rlhf` flags of online RL (grpo, ppo, harmless)."""
    _argument_group_name: ClassVar[str] = "online RL (grpo, ppo, harmless)"
    algorithms: ClassVar[tuple[str, ...] | None] = ("grpo", "ppo", "harmless")

    num_generations: int | None = field(default=None, metadata={
        "help": "grpo: completions sampled per prompt (a group; default 8, ppo 1). OpenRLHF: --n_samples_per_prompt."})
    n_samples_per_prompt: int | None = field(default=None, metadata={"help": "OpenRLHF's name for --num_generations."})
    reward_funcs: list[str] = field(default_factory=list, metadata={
        "help": "grpo: reward functions: accuracy, format, react_format, cosine, repetition, soft_overlong, toolbench, "
                "gym_reward, names added by --external_plugins, module:Class, or an OpenRLHF reward_func .py file."})
    environment_factory: list[str] = field(default_factory=list, metadata={
        "help": "grpo/ppo/harmless: TRL's environment_factory: file.py:Class (or module:Class), whose reset(**row) may "
                "add to the prompt and whose public methods are the tools of a multi-turn rollout (get_reward(), if "
                "defined, is one more reward); several as NAME=file.py:Class, picked by each row's `environment` "
                "column. Colocated engines only."})
    rollout_func: str | None = field(default=None, metadata={
        "help": "grpo/ppo: TRL's rollout_func: file.py:func (or module:func, package.module.func) called as "
                "func(prompts, trainer) in place of the engine, returning prompt_ids, completion_ids, logprobs, "
                "optionally env_mask, and extra per-row keys handed to the reward functions. Colocated runs."})
    custom_reward_function_path: str | None = field(default=None, metadata={
        "help": "grpo/ppo/harmless: verl's custom reward: a .py file whose function (--custom_reward_function_name, "
                "default compute_score) is called compute_score(data_source, solution_str, ground_truth, "
                "extra_info) for every completion; a dict return gives its 'score'. Added after --reward_funcs."})
    custom_reward_function_name: str | None = field(default=None, metadata={
        "help": "verl's name of the function in --custom_reward_function_path (default compute_score)."})
    reward_weights: list[float] = field(default_factory=list, metadata={
        "help": "grpo: weight of each reward (functions, then --custom_reward_function_path, then --reward_model, then "
                "--reward_model_url; default 1)."})
    reward_model: str | None = field(default=None, metadata={"help": "grpo: a local seq_cls reward model directory."})
    prm_model: str | None = field(default=None, metadata={
        "help": "grpo/ppo: a process reward model (from --rlhf_type prm, same tokenizer) scoring every step of a "
                "completion at --step_separator: ppo adds each step's score to its last token's reward, grpo adds "
                "group-normalised process advantages (summed over the steps that follow each token)."})
    reward_model_url: str | None = field(default=None, metadata={
        "help": "grpo: URL of a `swift deploy --task_type seq_cls` server (its /v1/rewards)."})
    remote_rm_url: str | None = field(default=None, metadata={
        "help": "OpenRLHF's name: an http(s) URL is --reward_model_url, a .py file defining reward_func is added "
                "to --reward_funcs."})
    epsilon: float | None = field(default=None, metadata={
        "help": "grpo/ppo: clip range ε of the importance ratio (0.2; --cliprange is TRL's PPO name)."})
    epsilon_high: float | None = field(default=None, metadata={
        "help": "grpo: upper clip ε_high (default ε; DAPO 0.28); with --loss_type cispo the cap of the importance "
                "weight itself (default 5.0)."})
    delta: float | None = field(default=None, metadata={
        "help": "grpo: two-sided clipping (INTELLECT-2): also cap the importance ratio at δ (> 1 + ε) for negative "
                "advantages."})
    tau_pos: float = field(default=1.0, metadata={"help": "grpo --loss_type sapo: gate temperature where A > 0."})
    tau_neg: float = field(default=1.05, metadata={"help": "grpo --loss_type sapo: gate temperature where A ≤ 0."})
    num_iterations: int | None = field(default=None, metadata={
        "help": "grpo: optimizer passes over each generation batch; each pass is its own optimizer step(s) "
                "(default 1, ppo 4; --num_ppo_epochs is TRL's name)."})
    steps_per_generation: int | None = field(default=None, metadata={
        "help": "grpo: micro-batches per generation batch (default --gradient_accumulation_steps); a multiple of it."})
    generation_batch_size: int | None = field(default=None, metadata={
        "help": "grpo: completions per generation batch over all ranks (TRL's name; instead of "
                "--steps_per_generation): per_device_train_batch_size × world size × steps_per_generation."})
    advantage_estimator: str | None = field(default=None, metadata={
        "help": "grpo: grpo (default), rloo, dr_grpo, reinforce_plus_plus (ms-swift's: group baseline, ÷ batch std "
                "of the centred rewards), and OpenRLHF's reinforce (rewards whitened over the batch), "
                "reinforce_baseline and group_norm (= grpo). ppo: gae (a learned critic)."})
    kl_in_reward: bool | None = field(default=None, metadata={
        "help": "grpo: subtract β × each completion's KL to the reference (the sum over its tokens of log π_old − "
                "log π_ref) from its reward before the advantages, and leave the KL out of the loss; false: β·KL is "
                "a loss term. Default (as ms-swift): true for rloo and reinforce_plus_plus, false otherwise."})
    scale_rewards: str | None = field(default=None, metadata={
        "help": "grpo: divide advantages by a std over the group or the batch: group, batch, none (default "
                "group for grpo, batch for reinforce_plus_plus, none otherwise; refused for reinforce, which is "
                "whitened already). The std is of the rewards, or for reinforce_plus_plus and "
                "reinforce_baseline of the centred rewards, as ms-swift and OpenRLHF compute them."})
    importance_sampling_level: str = field(default="token", metadata={"help": "grpo: token, or sequence (GSPO)."})
    kl_estimator: str | None = field(default=None, metadata={
        "help": "KL estimator k1, k2 or k3, weighted by --beta (grpo default k3, in the loss; ppo k1, in the reward; "
                "not read with --kl_in_reward true, which takes the summed k1 off each reward)."})
    top_entropy_quantile: float = field(default=1.0, metadata={
        "help": "grpo: train only on this top fraction of completion tokens by entropy (1.0 = all)."})
    dynamic_sample: bool = field(default=False, metadata={
        "help": "grpo: sample again groups whose rewards are all equal (up to --max_resample_times)."})
    max_resample_times: int = field(default=3, metadata={"help": "grpo: most resampling rounds per batch."})
    overlong_filter: bool = field(default=False, metadata={"help": "grpo: truncated completions get no loss."})
    soft_max_length: int | None = field(default=None, metadata={
        "help": "soft_overlong reward: L_max (default --max_completion_length)."})
    soft_cache_length: int | None = field(default=None, metadata={"help": "soft_overlong reward: L_cache."})
    cosine_max_len: int | None = field(default=None, metadata={"help": "cosine reward: T (default --max_completion_length)."})
    cosine_min_len_value_correct: float = field(default=1.0, metadata={"help": "cosine reward: correct, length 0."})
    cosine_max_len_value_correct: float = field(default=0.5, metadata={"help": "cosine reward: correct, length T."})
    cosine_min_len_value_wrong: float = field(default=-0.5, metadata={"help": "cosine reward: wrong, length 0."})
    cosine_max_len_value_wrong: float = field(default=0.0, metadata={"help": "cosine reward: wrong, length T."})
    repetition_n_grams: int = field(default=3, metadata={"help": "repetition reward: n."})
    repetition_max_penalty: float = field(default=-1.0, metadata={"help": "repetition reward: its most negative value."})
    multi_turn_scheduler: str | None = field(default=None, metadata={
        "help": "grpo: multi-turn rollouts: math_tip_trick, gym, a name from a plugin, module:Class, or an OpenRLHF "
                "AgentInstance .py file."})
    max_turns: int | None = field(default=None, metadata={"help": "grpo: most turns of a multi-turn rollout."})
    gym_env: str | None = field(default=None, metadata={
        "help": "gym scheduler: environment when rows have no 'env' column (built in: guess_number)."})
    log_completions: bool = field(default=False, metadata={
        "help": "grpo: write every completion with its rewards to <output_dir>/completions.jsonl."})
    use_vllm: bool = field(default=False, metadata={"help": "grpo: generate rollouts with vLLM."})
    vllm_mode: str = field(default="colocate", metadata={
        "help": "grpo with --use_vllm: colocate (vLLM in the trainer process) or server (a `swift rollout "
                "--infer_backend vllm` server at --vllm_server_host/--vllm_server_port)."})
    rollout_mode: str = field(default="colocate", metadata={
        "help": "grpo with the built-in engine: colocate (in the trainer process) or server (a `swift rollout` "
                "server at --vllm_server_host/--vllm_server_port)."})
    vllm_server_host: list[str] = field(default_factory=lambda: ["127.0.0.1"], metadata={
        "help": "grpo server mode: the rollout server's host (one server; ms-swift's several are not supported)."})
    vllm_server_port: list[int] = field(default_factory=lambda: [8000], metadata={
        "help": "grpo server mode: the rollout server's port."})
    vllm_server_base_url: str | None = field(default=None, metadata={
        "help": "grpo server mode: the rollout server as http://HOST:PORT (sets --vllm_server_host/--vllm_server_port)."})
    vllm_server_api_key: str | None = field(default=None, metadata={
        "help": "grpo server mode: the rollout server's --api_key (vLLM or built-in engine alike; default: the "
                "SWIFT_API_KEY environment variable, which keeps it out of `ps`)."})
    vllm_server_timeout: float = field(default=240.0, metadata={
        "help": "grpo server mode: seconds to wait for the server (startup, each request, each weight-sync step)."})
    weight_sync_bucket_mb: float = field(default=64.0, metadata={
        "help": "grpo server mode: weights travel in flattened buckets of at most this many MiB; under ZeRO-3 "
                "the policy's weights are gathered this many MiB at a time for any engine."})
    async_generate: bool = field(default=False, metadata={
        "help": "grpo server mode: generate the next batch while this one trains (one step off-policy, corrected "
                "by importance sampling)."})
    rollout_importance_sampling_mode: str = field(default="token_truncate", metadata={
        "help": "Off-policy correction with the sampler's log-probs (--async_generate): token_truncate "
                "(weight min(ratio, threshold)), token_mask (drop tokens above the threshold) or none."})
    rollout_importance_sampling_threshold: float = field(default=2.0, metadata={
        "help": "Cap of the importance ratio π_θ_old / π_sampler per token."})
    vllm_gpu_memory_utilization: float = field(
        default=COLOCATE_ENGINE_FLAGS["vllm_gpu_memory_utilization"],
        metadata={"help": "grpo colocate: fraction of accelerator memory vLLM may take."})
    vllm_max_model_len: int | None = field(default=COLOCATE_ENGINE_FLAGS["vllm_max_model_len"], metadata={
        "help": "grpo colocate: vLLM context length."})
    vllm_enforce_eager: bool = field(default=COLOCATE_ENGINE_FLAGS["vllm_enforce_eager"], metadata={
        "help": "grpo colocate: run vLLM's model eagerly (no CUDA graphs; on CPU, no torch.compile): the engine "
                "starts sooner."})
    num_ppo_epochs: int | None = field(default=None, metadata={"help": "ppo: TRL's name for --num_iterations (4)."})
    cliprange: float | None = field(default=None, metadata={"help": "ppo: TRL's name for --epsilon (0.2)."})


@dataclass
class PPOFlags:
    """`swift rlhf` flags of ppo."""
    _argument_group_name: ClassVar[str] = "ppo"
    algorithms: ClassVar[tuple[str, ...] | None] = ("ppo",)

    critic_model: str | None = field(default=None, metadata={
        "help": "ppo: the critic's starting weights (a causal LM or seq_cls directory, e.g. a reward model from "
                "--rlhf_type rm); a value head is put on it. Default: --model. LoRA or full as --tuner_type."})
    critic_backbone: str | None = field(default=None, metadata={
        "help": "ppo: separate (default: a value model of its own, --critic_model) or shared (a value head on the "
                "policy's last hidden state; the value loss also trains the policy's weights)."})
    critic_learning_rate: float | None = field(default=None, metadata={
        "help": "ppo: the critic's learning rate (default --learning_rate; the same schedule)."})
    num_mini_batches: int | None = field(default=None, metadata={
        "help": "ppo: optimizer steps per pass over a rollout batch (TRL's name; --steps_per_generation = "
                "num_mini_batches × --gradient_accumulation_steps; default 1)."})
    kl_target: float | None = field(default=None, metadata={
        "help": "ppo: adaptive KL controller: steer the mean sequence KL towards this value (off by default)."})
    kl_horizon: int | None = field(default=None, metadata={
        "help": "ppo: horizon of the adaptive KL controller (10000; with --kl_target)."})
    cliprange_value: float | None = field(default=None, metadata={"help": "ppo: clip range of the value update (0.2)."})
    vf_coef: float | None = field(default=None, metadata={"help": "ppo: weight of the value loss (0.1)."})
    gamma: float | None = field(default=None, metadata={"help": "ppo: discount γ of GAE (1.0)."})
    lam: float | None = field(default=None, metadata={"help": "ppo: λ of GAE (0.95)."})
    whiten_rewards: bool = field(default=False, metadata={
        "help": "ppo: whiten the per-token rewards over the batch (their mean kept) before GAE."})
    missing_eos_penalty: float | None = field(default=None, metadata={
        "help": "ppo: subtract this from the score of a completion cut at --max_completion_length."})
    reward_clip_range: list[float] = field(default_factory=list, metadata={
        "help": "ppo: LOW HIGH: clip each completion's score to this range (OpenRLHF clips to -10 10)."})


@dataclass
class HarmlessFlags:
    """`swift rlhf` flags of harmlessness training (RePULSe, arXiv 2510.21184; the fork's names)."""
    _argument_group_name: ClassVar[str] = "harmless (RePULSe)"
    algorithms: ClassVar[tuple[str, ...] | None] = ("harmless",)

    do_harmlessness_training: bool = field(default=False, metadata={
        "help": "harmless: the fork's switch; the same as --rlhf_type harmless."})
    harmlessness_training_loss_type: str = field(default="neg_training", metadata={
        "help": "harmless: neg_training (RePULSe: the RL loss plus --alpha × the importance-weighted log-prob of the "
                "proposal's samples), neg_reinforce (the fork's REINFORCE term on the proposal's samples with "
                "return log φ − KL; needs --alpha < 0 to push bad samples down) or reinforce (the RL loss alone: "
                "REINFORCE, with --reward_transform the reward transform baseline)."})
    alpha: float = field(default=0.5, metadata={
        "help": "harmless: α, the weight of the negative term (also --rew_trans_alpha's default)."})
    target_dist_beta: float | None = field(default=None, metadata={
        "help": "harmless: β < 0 of the target σ(s) ∝ p(s)·exp(β r(s)) the proposal learns (e.g. -10); 1 with "
                "--rm_type indicator_below_threshold."})
    rm_type: str = field(default="rlhf", metadata={
        "help": "harmless: rlhf (log φ = β r) or indicator_below_threshold (log φ = log(1[r < --threshold] + 1e-16))."})
    threshold: float = field(default=-5.0, metadata={
        "help": "harmless: a reward below this is bad (the indicator, minus_alpha_ind, the bad-rate metrics)."})
    reward_transform: str | None = field(default=None, metadata={
        "help": "harmless: the policy's reward r' = r - a·exp(b·r) (minus_alpha_exp_beta_r) or r - a·1[r < "
                "--threshold] (minus_alpha_ind); off by default."})
    rew_trans_alpha: float | None = field(default=None, metadata={"help": "harmless: a of --reward_transform (--alpha)."})
    rew_trans_beta: float | None = field(default=None, metadata={
        "help": "harmless: b of --reward_transform (--target_dist_beta)."})
    reinforce_baseline_type: str = field(default="expectation", metadata={
        "help": "harmless: expectation (the mean return of the prompt's other samples, RLOO) or none."})
    neg_baseline_type: str | None = field(default=None, metadata={
        "help": "harmless, neg_reinforce: the baseline of the proposal samples' returns: none (default), expectation "
                "(leave-one-out mean over the prompt's samples), hardcoded (--neg_hardcoded_baseline) or "
                "other_expectation (the mean return of the prompt's policy samples)."})
    neg_hardcoded_baseline: float | None = field(default=None, metadata={
        "help": "harmless, neg_reinforce: the constant baseline of --neg_baseline_type hardcoded."})
    actor_loss_type: str = field(default="ctl", metadata={
        "help": "harmless: the proposal's loss: ctl (contrastive twist learning), ctl_nosecondterm (its first "
                "term), dpg (weighted log-likelihood of its samples; --parameterization policy)."})
    parameterization: str = field(default="policy_psi_q_p_s_t", metadata={
        "help": "harmless: policy_psi_q_p_s_t (twist log ψ_t = log q(s_t) - log p(s_t)), policy_psi_q_p_s_1_to_t "
                "(summed over t' <= t), policy (with --actor_loss_type dpg), or modulation_linear_head / "
                "modulation_nn_head / modulation_model (q = softmax(log p + m), m a linear or 3-layer head on the "
                "policy's last hidden state or a second model's logits (full tuning), twist log ψ_t = m_t)."})
    additional_sd_divider: float = field(default=1.0, metadata={
        "help": "harmless, modulation_linear_head / modulation_model: the new linear layer's initial weights are "
                "divided by this."})
    init_head_from_base: bool = field(default=False, metadata={
        "help": "harmless, modulation_linear_head / modulation_model: start the new linear layer from the output "
                "layer (÷ --additional_sd_divider) instead of Xavier-normal weights."})
    num_episodes: int = field(default=1, metadata={
        "help": "harmless: proposal updates per policy update; the first num_episodes - 1 on fresh proposal "
                "samples alone."})
    actor_learning_rate: float = field(default=1e-6, metadata={
        "help": "harmless: the proposal's learning rate (the fork's name; the policy's is --learning_rate, the "
                "fork's --base_actor_learning_rate). AdamW with the policy's betas, eps and weight decay, constant."})
    proposal: str | None = field(default=None, metadata={
        "help": "harmless: the proposal q: copy (a second copy of the starting model, tuned as --tuner_type, as the "
                "fork) or adapter (a second LoRA adapter on the policy's base: no second copy of the weights; needs "
                "--tuner_type lora). Default: adapter with LoRA, else copy."})
    use_base_as_proposal: bool = field(default=False, metadata={
        "help": "harmless: no proposal: the policy's own samples, weighted by softmax(β r), are the negatives."})
    sampling_target_updated_base: bool = field(default=False, metadata={
        "help": "harmless: update the policy first, then the proposal against the updated policy."})
    separate_reweighting_beta: float | None = field(default=None, metadata={
        "help": "harmless: the policy's importance weights use log φ = this × r (the proposal keeps β)."})
    uniform_reweight: bool = field(default=False, metadata={
        "help": "harmless: weights 1/N instead of the importance weights (an ablation)."})
    save_negdata: bool = field(default=False, metadata={
        "help": "harmless: write every distinct sample with reward below --save_negdata_threshold to "
                "<output_dir>/negdata.jsonl."})
    save_negdata_threshold: float = field(default=-10000.0, metadata={
        "help": "harmless: the reward below which --save_negdata keeps a sample."})
    evaluate_on_neg_data: str | None = field(default=None, metadata={
        "help": "harmless: a negdata.jsonl (--save_negdata); after training, its samples' mean log-prob under the "
                "trained policy and, per prompt, the log-sum-exp (logged as neg_data/*)."})
