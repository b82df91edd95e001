"""Arguments of `swift rlhf` (offline preference alignment, reward models, distillation)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from swift.arguments.train import SftArguments
from swift.utils.registry import SwiftError

# flags of the engine `swift rlhf` builds in its own process (colocate), with their defaults: a rollout
# server's engine takes them from `swift rollout`
COLOCATE_ENGINE_FLAGS = {"vllm_gpu_memory_utilization": 0.3, "vllm_max_model_len": None, "vllm_enforce_eager": False}


@dataclass
class RlhfCommonFlags:
    """`swift rlhf` flags of every --rlhf_type, or of several families of them. Each group below
    names the --rlhf_type values that read its flags (`algorithms`; the registry entries' `flags`
    say which exactly, tests/arguments checks that they agree)."""
    _argument_group_name: ClassVar[str] = "every --rlhf_type"
    algorithms: ClassVar[tuple[str, ...] | None] = None

    rlhf_type: str = field(default="dpo", metadata={
        "help": "Algorithm: dpo, orpo, simpo, cpo, kto, rm, prm, gkd, grpo, ppo."})
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
    external_plugins: list[str] = field(default_factory=list, metadata={
        "help": "Python files imported at start (register rewards in swift.rewards.orms, schedulers in "
                "swift.rollout.multi_turn.multi_turns)."})
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
    """`swift rlhf` flags of on-policy sampling (gkd, grpo, ppo)."""
    _argument_group_name: ClassVar[str] = "on-policy sampling (gkd, grpo, ppo)"
    algorithms: ClassVar[tuple[str, ...] | None] = ("gkd", "grpo", "ppo")

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
    sft_alpha: float = field(default=0.0, metadata={"help": "gkd: weight of the NLL of the dataset answers."})


@dataclass
class OnlineFlags:
    """`swift rlhf` flags of online RL (grpo, ppo)."""
    _argument_group_name: ClassVar[str] = "online RL (grpo, ppo)"
    algorithms: ClassVar[tuple[str, ...] | None] = ("grpo", "ppo")

    num_generations: int | None = field(default=None, metadata={
        "help": "grpo: completions sampled per prompt (a group; default 8, ppo 1). OpenRLHF: --n_samples_per_prompt."})
    n_samples_per_prompt: int | None = field(default=None, metadata={"help": "OpenRLHF's name for --num_generations."})
    reward_funcs: list[str] = field(default_factory=list, metadata={
        "help": "grpo: reward functions: accuracy, format, react_format, cosine, repetition, soft_overlong, toolbench, "
                "gym_reward, names added by --external_plugins, module:Class, or an OpenRLHF reward_func .py file."})
    reward_weights: list[float] = field(default_factory=list, metadata={
        "help": "grpo: weight of each reward (functions, then --reward_model, then --reward_model_url; default 1)."})
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
    scale_rewards: str | None = field(default=None, metadata={
        "help": "grpo: divide advantages by a std over the group or the batch: group, batch, none (default "
                "group for grpo, batch for reinforce_plus_plus, none otherwise; refused for reinforce, which is "
                "whitened already). The std is of the rewards, or for reinforce_plus_plus and "
                "reinforce_baseline of the centred rewards, as ms-swift and OpenRLHF compute them."})
    importance_sampling_level: str = field(default="token", metadata={"help": "grpo: token, or sequence (GSPO)."})
    kl_estimator: str | None = field(default=None, metadata={
        "help": "KL estimator k1, k2 or k3, weighted by --beta (grpo default k3, in the loss; ppo k1, in the reward)."})
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
class RlhfArguments(PPOFlags, OnlineFlags, DistillFlags, SamplingFlags, PreferenceFlags, RlhfCommonFlags):
    """Every `swift rlhf` flag, in groups by the algorithms that read them (each group's own class;
    `swift rlhf --help` lists them under the group's title)."""
    flag_groups: ClassVar[tuple[type, ...]] = (RlhfCommonFlags, PreferenceFlags, SamplingFlags, DistillFlags,
                                               OnlineFlags, PPOFlags)

    def __post_init__(self) -> None:
        from swift.rlhf import ALGORITHMS

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
        if self.beta is not None and self.beta <= 0 and algo.trainer == "preference":
            raise SwiftError(f"--beta must be > 0, got {self.beta}")
        self._check_ppo()
        if algo.trainer == "rollout":
            self._check_online()
        if algo.trainer == "distill":
            if not 0 <= self.beta <= 1:
                raise SwiftError(f"--beta must be in [0, 1] for gkd, got {self.beta}")
            if not self.teacher_model:
                raise SwiftError("--rlhf_type gkd needs --teacher_model")
            if not 0 <= self.lmbda <= 1:
                raise SwiftError(f"--lmbda must be in [0, 1], got {self.lmbda}")

    def _refuse_unread(self, algo) -> None:
        """A flag this algorithm does not read, given a value other than its default, is refused in
        one line (before aliases and defaults change any value), naming the algorithms that read it."""
        import dataclasses

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


class RLHFArguments(SftArguments):
    """`swift rlhf`: preference alignment, reward models and distillation on the shared trainer path."""

    parts: ClassVar[dict[str, type]] = {**SftArguments.parts, "rlhf_args": RlhfArguments}
    defaults: ClassVar[dict[str, Any]] = {"loss_scale": "last_round"}

    def __post_init__(self) -> None:
        algo = self.rlhf_args.algorithm
        if algo.task_type != "causal_lm":  # a value head: rm → seq_cls, prm → token_cls
            self.model_args.task_type = algo.task_type
            self.model_args.num_labels = self.model_args.num_labels or algo.num_labels
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
        if self.training_args.deepspeed_config:
            self._check_deepspeed(algo)

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
