"""The online (GRPO-family) trainer: sample → score → advantages → `num_iterations` clipped
policy updates → push weights to the engine, on the HF Trainer loop.

Each dataloader batch holds `per_device_train_batch_size / num_generations` prompts (one
micro-batch of completions). A generation batch is `steps_per_generation` micro-batches (by
default the gradient-accumulation steps, so one optimizer step): their prompts are sampled and
scored together, and the batch is trained on `num_iterations` times, each pass its own optimizer
step(s) against the log-probs the completions had when they were sampled. The sampler repeats
each block of `steps_per_generation` batches `num_iterations` times, so that the HF loop counts
those passes as steps.

The parts live in their own modules: the sampler and the read-ahead / background rollout queue
(`rollout_queue`), the log-prob and value kernels (`completion_logps`), the rollout and evaluation
metrics (`rollout_metrics`), the estimators and losses (`swift.rlhf.grpo`, by `--loss_type` and
`--advantage_estimator`). PPO (`swift.trainers.ppo`) is this loop with a critic: it replaces the
advantage step and the loss."""
from __future__ import annotations

import contextlib

import os

import torch
import torch.distributed as dist

from swift.infer.protocol import RequestConfig
from swift.rewards.process import process_advantages
from swift.rlhf.grpo import compute_advantages, high_entropy_mask, rollout_importance_weights
from swift.rlhf.reduce import set_step_counts
from swift.rollout.multi_turn import RolloutInferRequest
from swift.rollout.runner import Trajectory, rollout
from swift.trainers.completion_logps import reshuffle, tensorize, token_logps
from swift.trainers.rlhf import RLHFTrainer
from swift.trainers.rollout_metrics import eval_metrics, rollout_metrics, write_completions
from swift.trainers.rollout_queue import RepeatBatchSampler, RolloutQueue
from swift.trainers.zero3 import gathered_buckets, sharded
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)


@contextlib.contextmanager
def eval_mode(*modules):
    """The modules in eval mode within the block, each back in the mode it had after it."""
    was = [m.training for m in modules]
    try:
        for m in modules:
            m.eval()
        yield
    finally:
        for m, training in zip(modules, was):
            m.train(training)


class GRPOTrainer(RLHFTrainer):
    def __init__(self, *args, ref_model=None, reward_manager, scheduler=None, engine_factory, process_rewards=None,
                 **kwargs):
        super().__init__(*args, **kwargs)
        a = self.rlhf_args
        self.ref_model = self.frozen(ref_model)
        self.rewards = reward_manager
        self.process_rewards = process_rewards  # swift.rewards.process.ProcessRewardModel, or None
        self.scheduler = scheduler
        # the engine starts with the trainer (vLLM takes a while), and generates with the policy's weights
        self.engine = engine_factory(self.accelerator.unwrap_model(self.model))
        self._remote = hasattr(self.engine, "rollout")  # a rollout server: generation leaves this process
        self._synced_step: int | None = None
        self.num_generations = a.num_generations
        self.steps_per_generation = self._steps_per_generation()
        # micro-batches from one generation to the next: every pass over the generation batch
        self.cycle = self.steps_per_generation * a.num_iterations
        # the batches fetched ahead, so that a generation batch's prompts are known at its first
        # micro-batch (and, with --async_generate, the next one's, generated while this one trains)
        self._queue = RolloutQueue(self.steps_per_generation, self.cycle, a.async_generate)
        self._buffer: list[dict[str, torch.Tensor]] = []  # the generation batch's micro-batches
        self._uses = 0  # micro-batches trained on since the start of training (a resumed run's included)
        self._resume_dir: str | None = None
        self._completions_path = os.path.join(self.args.output_dir, "completions.jsonl")
        self._check_prompts()

    # -- data --------------------------------------------------------------------------------------
    def _steps_per_generation(self) -> int:
        a, ga = self.rlhf_args, self.args.gradient_accumulation_steps
        steps = a.steps_per_generation
        if a.num_mini_batches:  # PPO's name: optimizer steps per pass over the rollout batch
            steps = a.num_mini_batches * ga
        if a.generation_batch_size is not None:
            per_step = self.args.per_device_train_batch_size * self.args.world_size
            if a.generation_batch_size % per_step:
                raise SwiftError(f"--generation_batch_size ({a.generation_batch_size}) must be a multiple of "
                                 f"--per_device_train_batch_size × world size ({per_step})")
            steps = a.generation_batch_size // per_step
        steps = steps or ga
        if steps < 1 or steps % ga:
            raise SwiftError(f"--steps_per_generation ({steps}) must be a positive multiple of "
                             f"--gradient_accumulation_steps ({ga}): each pass over a generation batch is an "
                             "optimizer step of its own")
        return steps

    def _check_prompts(self) -> None:
        """One generation batch needs `block` prompts; fewer would train 0 steps. An epoch's last
        partial block is not trained on: say so."""
        if self.train_dataset is None or not hasattr(self.train_dataset, "__len__"):
            return
        per_rank = self.args.per_device_train_batch_size // self.num_generations
        block = per_rank * self.args.world_size * self.steps_per_generation
        n = len(self.train_dataset)
        if n < block:
            raise SwiftError(f"--dataset has {n} prompt(s); one generation batch needs {block} "
                             f"(--per_device_train_batch_size {self.args.per_device_train_batch_size} / "
                             f"--num_generations {self.num_generations} × {self.args.world_size} rank(s) × "
                             f"{self.steps_per_generation} micro-batch(es) per generation): give more prompts or a "
                             "smaller batch")
        if n % block:
            logger.warning(f"each epoch trains on {n - n % block} of the {n} prompts (whole generation batches of "
                           f"{block}); the other {n % block}, drawn at random each epoch, wait for the next epoch")

    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        self._sampler = RepeatBatchSampler(len(dataset), self.args.per_device_train_batch_size,
                                           self.rlhf_args.num_iterations, self.args.world_size, self.args.seed,
                                           block=self.steps_per_generation)
        return self._sampler

    def get_train_dataloader(self):
        # a "sample" is a prompt; the configured batch size counts completions
        size, total = self.args.per_device_train_batch_size, self._train_batch_size
        self.args.per_device_train_batch_size = size // self.num_generations
        self._train_batch_size = total // self.num_generations
        try:
            return super().get_train_dataloader()
        finally:
            self.args.per_device_train_batch_size, self._train_batch_size = size, total

    # -- checkpoints -----------------------------------------------------------------------------
    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        if resume_from_checkpoint is True:
            from transformers.trainer_utils import get_last_checkpoint

            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
        self._resume_dir = resume_from_checkpoint
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _state_path(self, checkpoint: str) -> str:
        return os.path.join(checkpoint, f"rollout_state_rank{self.args.process_index}.pt")

    def _save_checkpoint(self, model, trial):
        """Besides what the HF Trainer saves (weights, optimizer, RNG states): where the loop is in
        its generation batch, the rest of that batch (when the checkpoint falls inside it) and a
        rollout generated ahead (--async_generate), so a resumed run trains on the same samples."""
        super()._save_checkpoint(model, trial)
        checkpoint = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        torch.save({"uses": self._uses, "buffer": self._buffer if self._uses % self.cycle else [],
                    "pending": self._queue.state(), **self._loop_state()}, self._state_path(checkpoint))

    def _loop_state(self) -> dict:
        """More of the loop's state for checkpoints (PPO: its KL controller)."""
        return {}

    def _load_loop_state(self, state: dict, checkpoint: str) -> None:
        pass

    def _restore(self) -> None:
        path = self._state_path(self._resume_dir) if self._resume_dir else None
        if path is None or not os.path.exists(path):
            raise SwiftError(f"--resume_from_checkpoint {self._resume_dir}: no {os.path.basename(str(path))} (the "
                             "GRPO loop's state); it was not saved by swift rlhf --rlhf_type grpo")
        state = torch.load(path, weights_only=False)  # written by _save_checkpoint above
        self._uses = state["uses"]
        # the HF loop's set_epoch does not reach the sampler through accelerate's shard-and-skip
        # wrappers on several ranks; the sampler draws its order on this first read, so set it here
        self._sampler.epoch = int(self.state.epoch or 0)
        self._buffer = state["buffer"]
        if self._buffer:  # counted again: a checkpoint may predate the counts it would carry
            self._set_step_counts(self._buffer)
        self._queue.restore(state["uses"], state["pending"])
        self._load_loop_state(state, self._resume_dir)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """Read ahead to the end of the generation batch being started (and with --async_generate to
        the end of the next one's first pass) and number the batches as training_step will see them."""
        if self._queue.fetched == 0 and self.state.global_step > 0:  # the first batch of a resumed run
            self._restore()
        return self._queue.read(epoch_iterator, num_batches), None

    # -- rollout -----------------------------------------------------------------------------------
    def _sync_engine(self) -> None:
        """Push the policy's weights to the engine (checked) unless it already has these."""
        if self._synced_step == self.state.global_step:
            return
        model = self.accelerator.unwrap_model(self.model)
        if sharded(self):  # every rank gathers each bucket; the engine loads it (rank 0 for a server)
            buckets = gathered_buckets(model, self.rlhf_args.weight_sync_bucket_mb)
            if self._remote and not self.accelerator.is_main_process:
                for _ in buckets:
                    pass
            else:
                self.engine.sync_weights(model, buckets)
            self.accelerator.wait_for_everyone()
        elif not self._remote:
            self.engine.sync_weights(model)
        else:  # one trainer process feeds the server; the others wait for it
            if self.accelerator.is_main_process:
                self.engine.sync_weights(model)
            self.accelerator.wait_for_everyone()
        self._synced_step = self.state.global_step

    def close(self) -> None:
        """Stop the inference engine (vLLM's processes) or leave the rollout server's communicator."""
        self._queue.close()
        self.engine.close()

    def _request_config(self, seed: int | None = None) -> RequestConfig:
        a = self.rlhf_args
        return RequestConfig(max_tokens=a.max_completion_length, temperature=a.temperature, top_p=a.top_p,
                             top_k=a.top_k, repetition_penalty=a.repetition_penalty, seed=seed,
                             logprobs=a.async_generate)  # the sampler's log-probs weight off-policy tokens

    def _generate(self, prompts: list[dict], n: int, seed: int | None = None) -> list[Trajectory]:
        self._sync_engine()
        return self._rollout_with_current_engine(prompts, n, seed)

    def _rollout_with_current_engine(self, prompts: list[dict], n: int, seed: int | None = None) -> list[Trajectory]:
        requests = [RolloutInferRequest(messages=list(p["messages"]), data_dict=p["columns"]) for p in prompts]

        def run():
            return rollout(self.engine, self.template, requests, self._request_config(seed), n,
                           scheduler=self.scheduler,
                           max_completion_length=self.rlhf_args.max_completion_length)

        if self._remote:  # the policy module is not touched (this may run beside training)
            return run()
        model = self.accelerator.unwrap_model(self.model)
        was_training = model.training
        model.eval()  # the engine generates with this very module
        try:
            return run()
        finally:
            model.train(was_training)

    def _next_trajectories(self, prompts: list[dict]) -> list[Trajectory]:
        """This generation batch's trajectories: generated while the previous one trained
        (--async_generate, from the weights before that step's update) or now. Then start generating
        the next one."""
        n = self.num_generations
        trajectories = self._queue.take(self._uses)
        if trajectories is None:
            trajectories = self._generate(prompts, n)
        if self._queue.pool is not None:
            following = self._queue.prompts_from(self._uses + self.cycle)
            if following is not None:
                self._sync_engine()
                self._queue.start(self._uses + self.cycle, self._rollout_with_current_engine, following, n)
        return trajectories

    def _score(self, prompts: list[dict], trajectories: list[Trajectory], n: int):
        rows = [p for p in prompts for _ in range(n)]
        columns: dict[str, list] = {}
        for key in rows[0]["columns"]:
            columns[key] = [r["columns"].get(key) for r in rows]
        columns["messages"] = [r["messages"] for r in rows]
        for key in {k for t in trajectories for k in t.rollout_infos}:
            columns[key] = [t.rollout_infos.get(key) for t in trajectories]
        columns["response_token_ids"] = [[t for t, m in zip(x.completion_ids, x.loss_mask) if m] for x in trajectories]
        columns["prompt_texts"] = [self.processing_class.decode(t.prompt_ids) for t in trajectories]
        totals, per_func = self.rewards([t.text for t in trajectories], columns)
        return torch.tensor(totals, dtype=torch.float32), per_func  # NaN: no function scored the row

    def _generate_and_score(self, prompts: list[dict]) -> list[dict[str, torch.Tensor]]:
        """Sample, score and compute advantages for the whole generation batch, then cut it into
        its micro-batches, each with the log-probs it needs computed before any update."""
        trajectories, rewards, per_func = self._sample_and_score(prompts)
        steps = self._score_steps(trajectories)
        if steps is not None and not self.rewards.names:  # process rewards alone: every row is scored
            rewards = torch.zeros_like(rewards)
        scored = ~rewards.isnan()
        if not scored.all():
            logger.warning(f"{int((~scored).sum())} of {len(trajectories)} completions got no reward (every reward "
                           "function returned None); they are left out of the loss")
        micro = self._micro_batches(trajectories, scored)
        advantages = self._assign_advantages(micro, rewards, trajectories, steps)
        self._set_step_counts(micro)
        self._log_rollout(prompts, trajectories, rewards, per_func, advantages)
        return micro

    def _set_step_counts(self, micro: list[dict]) -> None:
        """Each micro-batch's optimizer step (`gradient_accumulation_steps` consecutive ones) counted
        over its micro-batches and ranks, for `swift.rlhf.reduce`."""
        set_step_counts(micro, self.accelerator, per_step=self.args.gradient_accumulation_steps)

    # PPO (as TRL's) deals the generation batch's rows into new mini-batches on every pass over it;
    # GRPO (as TRL's) keeps one split for all its iterations
    reshuffle_passes = False

    def _reshuffled(self, micro: list[dict]) -> list[dict]:
        """This rank's rows of the generation batch dealt into new micro-batches (`reshuffle`), in an
        order drawn from (seed, micro-batches trained so far), so a resumed run deals the same."""
        g = torch.Generator().manual_seed((self.args.seed * 1_000_003 + self._uses) % 2 ** 63)
        out = reshuffle(micro, self.processing_class.pad_token_id, g)
        self._set_step_counts(out)
        return out

    def _sample_and_score(self, prompts: list[dict]) -> tuple[list[Trajectory], torch.Tensor, list]:
        a, n = self.rlhf_args, self.num_generations
        trajectories = self._next_trajectories(prompts)
        rewards, per_func = self._score(prompts, trajectories, n)
        if a.dynamic_sample:  # DAPO: groups whose rewards are all equal teach nothing; sample them again
            for _ in range(a.max_resample_times):
                flat = rewards.view(-1, n).std(dim=1) if n > 1 else torch.zeros(len(prompts))
                again = [i for i, s in enumerate(flat.tolist()) if s == 0]
                if not again:
                    break
                redo = self._generate([prompts[i] for i in again], n)
                redo_rewards, redo_per_func = self._score([prompts[i] for i in again], redo, n)
                for j, i in enumerate(again):
                    trajectories[i * n:(i + 1) * n] = redo[j * n:(j + 1) * n]
                    rewards[i * n:(i + 1) * n] = redo_rewards[j * n:(j + 1) * n]
                    for f in range(len(per_func)):
                        per_func[f][i * n:(i + 1) * n] = redo_per_func[f][j * n:(j + 1) * n]
        return trajectories, rewards, per_func

    # the log-probs at sampling are needed even when each batch is trained on once (PPO's KL reward)
    always_old_logps = False

    def _micro_batches(self, trajectories: list[Trajectory], scored: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        a = self.rlhf_args
        # completions trained on after an update need the log-probs they were sampled with
        stale = self.always_old_logps or a.num_iterations > 1 \
            or self.steps_per_generation > self.args.gradient_accumulation_steps
        rows = self.args.per_device_train_batch_size
        micro = []
        for start in range(0, len(trajectories), rows):
            batch = tensorize(trajectories[start:start + rows], self.processing_class.pad_token_id,
                              a.overlong_filter)
            batch["loss_mask"][~scored[start:start + rows]] = 0
            with torch.no_grad(), eval_mode(*self._sampling_modules()):
                device_batch = self._prepare_inputs(dict(batch))
                if stale:
                    self._sampling_forward(batch, device_batch)
                if a.beta:
                    batch["ref_logps"] = self._reference_logps(device_batch).detach()
            micro.append(batch)
        return micro

    def _sampling_modules(self) -> list:
        """What runs in eval mode while the batch's log-probs at sampling (and reference log-probs)
        are taken: with `--disable_dropout false` dropout would otherwise perturb them, and the
        engine sampled without it."""
        return [self.model]

    def _sampling_forward(self, batch: dict, device_batch: dict) -> None:
        """The log-probs the completions have under the weights that sampled them."""
        batch["old_logps"] = self._token_logps(self.model, device_batch)[0].detach()

    def _score_steps(self, trajectories: list[Trajectory]):
        """Each completion's steps and their process rewards (None without --prm_model)."""
        if self.process_rewards is None:
            return None
        steps = self.process_rewards.score([t.prompt_ids for t in trajectories],
                                           [t.completion_ids for t in trajectories])
        values = [r for row in steps for _, r in row]
        m = self._metrics["train"]
        m["rewards/prm/mean"].append(sum(values) / len(values) if values else float("nan"))
        m["rewards/prm/steps"].append(len(values) / len(steps))
        return steps

    def _assign_advantages(self, micro: list[dict], rewards: torch.Tensor, trajectories, steps=None) -> torch.Tensor:
        """Each completion's advantage from the group's rewards (plus, with process rewards, each
        token's process advantage: the advantages become [B, T]); returns the sequence advantages
        (for the logs)."""
        advantages = self._advantages(rewards).nan_to_num(0.0)
        rows = self.args.per_device_train_batch_size
        process = None
        if steps is not None:
            process = process_advantages(steps, self.num_generations, max(b["completion_ids"].size(1) for b in micro))
        for i, batch in enumerate(micro):
            batch["advantages"] = advantages[i * rows:(i + 1) * rows]
            if process is not None:
                width = batch["completion_ids"].size(1)
                batch["advantages"] = batch["advantages"][:, None] + process[i * rows:(i + 1) * rows, :width]
        return advantages

    def _advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        """Advantages from every rank's rewards (batch statistics are the global batch's, as in TRL);
        this rank's share of them."""
        a = self.rlhf_args
        if self.accelerator.num_processes == 1:
            return compute_advantages(rewards, self.num_generations, a.advantage_estimator, a.scale_rewards)
        everyone = self.accelerator.gather(rewards.to(self.args.device)).cpu()
        mine = self.accelerator.process_index * rewards.numel()
        return compute_advantages(everyone, self.num_generations, a.advantage_estimator,
                                  a.scale_rewards)[mine:mine + rewards.numel()]

    # -- log-probs ---------------------------------------------------------------------------------
    def _token_logps(self, model, batch, with_entropy: bool = False, with_hidden: bool = False):
        return token_logps(model, batch, self.rlhf_args.temperature, with_entropy, self._prompt_group(model),
                           with_hidden)

    def _prompt_group(self, model) -> int:
        """How many rows share each prompt forward: num_generations, unless the model is wrapped
        (DDP/DeepSpeed expect one forward per backward) or recomputes activations."""
        unwrapped = self.accelerator.unwrap_model(model)
        # several ranks: the training pass runs the wrapped model, so the old and reference log-probs
        # (computed on the module itself) take the same plain path and round the same way
        if self.accelerator.num_processes > 1 or unwrapped is not model \
                or getattr(unwrapped, "is_gradient_checkpointing", False):
            return 1
        return self.num_generations

    def _reference_logps(self, batch) -> torch.Tensor:
        if self.ref_model is not None:
            return self._token_logps(self.ref_model, batch)[0]
        unwrapped = self.accelerator.unwrap_model(self.model)
        with unwrapped.disable_adapter():  # LoRA: the reference is the base weights
            return self._token_logps(self.model, batch)[0]

    # -- training ----------------------------------------------------------------------------------
    def training_step(self, model, inputs, num_items_in_batch=None):
        position = self._uses % self.cycle
        if position == 0:  # `inputs` is this generation batch's first micro-batch of prompts
            self._queue.forget_before(self._uses)
            self._buffer = self._generate_and_score(self._queue.prompts_from(self._uses))
        elif self.reshuffle_passes and position % self.steps_per_generation == 0 and len(self._buffer) > 1:
            # a new pass over the generation batch, in new mini-batches
            self._buffer = self._reshuffled(self._buffer)
        self._uses += 1
        return super().training_step(model, dict(self._buffer[position % self.steps_per_generation]),
                                     num_items_in_batch)

    def loss_and_metrics(self, model, inputs):
        terms, info, entropies, metrics = self._policy_objective(model, inputs, self.rlhf_args.beta)
        mask = inputs["loss_mask"]
        tokens = mask.sum().clamp(min=1)

        def masked_mean(x):
            return ((x.float() * mask).sum() / tokens).item()

        metrics.update({"entropy": masked_mean(entropies), "clip_ratio/low_mean": masked_mean(info["low_clipped"]),
                        "clip_ratio/high_mean": masked_mean(info["high_clipped"]),
                        "clip_ratio/region_mean": masked_mean(info["low_clipped"] | info["high_clipped"])})
        if info["kl"] is not None:
            metrics["kl"] = masked_mean(info["kl"].detach())
        return terms, metrics

    def _policy_objective(self, model, inputs, beta: float, with_hidden: bool = False):
        """The policy loss's terms of a micro-batch (`swift.rlhf.reduce`), its per-token diagnostics
        (ratio, clipped flags, kl; with_hidden: the forward's last hidden states), the tokens'
        entropies and the off-policy metrics."""
        a = self.rlhf_args
        logps, entropies, *hidden = self._token_logps(model, inputs, with_entropy=True, with_hidden=with_hidden)
        mask = inputs["loss_mask"]
        old = inputs.get("old_logps")
        old = logps.detach() if old is None else old
        weights = high_entropy_mask(entropies, mask, a.top_entropy_quantile) if a.top_entropy_quantile < 1 else None
        sampling_metrics = {}
        if inputs.get("sampling_logps") is not None:
            is_weights, sampling_metrics = rollout_importance_weights(
                old, inputs["sampling_logps"], mask, a.rollout_importance_sampling_mode,
                a.rollout_importance_sampling_threshold)
            if is_weights is not None:
                weights = is_weights if weights is None else weights * is_weights
        loss, info = self.algorithm.loss(
            logps, old, inputs["advantages"], mask, epsilon=a.epsilon, epsilon_high=a.epsilon_high, delta=a.delta,
            tau_pos=a.tau_pos, tau_neg=a.tau_neg, beta=beta,
            ref_logps=inputs.get("ref_logps"), kl_type=a.kl_estimator,
            importance_sampling_level=a.importance_sampling_level, loss_type=a.loss_type[0],
            max_completion_length=a.max_completion_length, token_weights=weights)
        info["logps"] = logps
        if hidden:
            info["hidden"] = hidden[0]
        return loss, info, entropies, sampling_metrics

    # -- metrics and evaluation --------------------------------------------------------------------
    def _log_rollout(self, prompts, trajectories, rewards, per_func, advantages) -> None:
        # over every rank's rows (as TRL gathers them), not a mean of each rank's own means
        mine = (rewards.tolist(), [list(v) for v in per_func], [float(sum(t.loss_mask)) for t in trajectories],
                [bool(t.truncated) for t in trajectories], [t.turns for t in trajectories])
        parts = [mine]
        if self.accelerator.num_processes > 1:
            parts = [None] * self.accelerator.num_processes
            dist.all_gather_object(parts, mine)
        everyone = [sum((p[i] for p in parts), []) for i in (0, 2, 3, 4)]
        per_func_all = [sum((p[1][f] for p in parts), []) for f in range(len(per_func))]
        for key, value in rollout_metrics(torch.tensor(everyone[0]), per_func_all, self.rewards.names, everyone[1],
                                          everyone[2], everyone[3] if self.scheduler is not None else None,
                                          self.num_generations).items():
            self._metrics["train"][key].append(value)
        if self.rlhf_args.log_completions and (not dist.is_initialized() or dist.get_rank() == 0):
            write_completions(self._completions_path, self.state.global_step, prompts, trajectories, rewards,
                              advantages, self.rewards.names, per_func, self.num_generations)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        """One answer per eval prompt, sampled as in training (as TRL does) from a fixed seed so that
        evaluations are comparable, scored by the reward functions."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            return {}
        prompts = [dataset[i] for i in range(len(dataset))]
        # independent draws per prompt from a fixed seed, without touching the training RNG stream
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.args.seed)
            trajectories = self._generate(prompts, 1)
        rewards, per_func = self._score(prompts, trajectories, 1)
        metrics = eval_metrics(rewards, per_func, self.rewards.names, trajectories, metric_key_prefix)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics
