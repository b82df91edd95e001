"""The online (GRPO-family) trainer: sample → score → advantages → `num_iterations` clipped
policy updates → push weights to the engine, on the HF Trainer loop.

Each dataloader batch holds `per_device_train_batch_size / num_generations` prompts (one
micro-batch of completions). A generation batch is `steps_per_generation` micro-batches (by
default the gradient-accumulation steps, so one optimizer step): their prompts are sampled and
scored together, and the batch is trained on `num_iterations` times, each pass its own optimizer
step(s) against the log-probs the completions had when they were sampled. The sampler repeats
each block of `steps_per_generation` batches `num_iterations` times, so that the HF loop counts
those passes as steps.

This module holds the loop (data, checkpoints, the training step) and the policy loss. Sampling,
scoring and advantages are the rollout's (`swift.trainers.rollout`, one `RolloutBatch` per
generation batch); the sampler and read-ahead queue are `rollout_queue`'s, the log-prob kernels
`completion_logps`'s, the estimators and losses `swift.rlhf.grpo`'s (by `--loss_type` and
`--advantage_estimator`). PPO (`swift.trainers.ppo`) is this loop with a critic: its rollout
computes GAE advantages and its loss adds the value loss."""
from __future__ import annotations

import os

import torch

from swift.rlhf.grpo import high_entropy_mask, rollout_importance_weights
from swift.rlhf.reduce import set_step_counts
from swift.trainers.completion_logps import reshuffle, token_logps
from swift.trainers.rlhf import RLHFTrainer
from swift.trainers.rollout import Rollout
from swift.trainers.rollout_queue import RepeatBatchSampler, RolloutQueue, check_prompts, steps_per_generation
from swift.utils.registry import SwiftError


class GRPOTrainer(RLHFTrainer):
    rollout_class = Rollout  # sampling, scoring and advantages; PPO's has the critic's advantages

    def __init__(self, *args, ref_model=None, reward_manager, scheduler=None, engine_factory, process_rewards=None,
                 **kwargs):
        super().__init__(*args, **kwargs)
        a = self.rlhf_args
        self.ref_model = self.frozen(ref_model)
        self.num_generations = a.num_generations
        self.steps_per_generation = steps_per_generation(self.args, a)
        check_prompts(self.train_dataset, self.args, self.num_generations, self.steps_per_generation)
        # micro-batches from one generation to the next: every pass over the generation batch
        self.cycle = self.steps_per_generation * a.num_iterations
        # the batches fetched ahead, so that a generation batch's prompts are known at its first
        # micro-batch (and, with --async_generate, the next one's, generated while this one trains)
        self._queue = RolloutQueue(self.steps_per_generation, self.cycle, a.async_generate)
        self._buffer: list[dict[str, torch.Tensor]] = []  # the generation batch's micro-batches
        self._uses = 0  # micro-batches trained on since the start of training (a resumed run's included)
        self._resume_dir: str | None = None
        # the engine starts with the trainer (vLLM takes a while), and generates with the policy's weights
        engine = engine_factory(self.accelerator.unwrap_model(self.model))
        self.rollout = self.rollout_class(self, engine, reward_manager, process_rewards, scheduler)

    # -- data --------------------------------------------------------------------------------------
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
    def close(self) -> None:
        """Stop the read-ahead, then the inference engine (vLLM's processes) or leave the rollout
        server's communicator."""
        self._queue.close()
        self.rollout.close()

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
            # trained on after an update (another iteration, or a later optimizer step of the batch)
            # needs the log-probs it was sampled with
            self._buffer = self.rollout(self._queue.prompts_from(self._uses), self._uses, self._queue, self.cycle,
                                        stale=self.cycle > self.args.gradient_accumulation_steps).micro
            self._set_step_counts(self._buffer)
        elif self.reshuffle_passes and position % self.steps_per_generation == 0 and len(self._buffer) > 1:
            # a new pass over the generation batch, in new mini-batches
            self._buffer = self._reshuffled(self._buffer)
        self._uses += 1
        return super().training_step(model, dict(self._buffer[position % self.steps_per_generation]),
                                     num_items_in_batch)

    def loss_and_metrics(self, model, inputs):
        a = self.rlhf_args
        # --kl_in_reward: β·KL was subtracted from the rewards (`Rollout.__call__`), not a loss term
        terms, info, entropies, metrics = self._policy_objective(model, inputs, 0.0 if a.kl_in_reward else a.beta)
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

    # -- evaluation ------------------------------------------------------------------------------
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            return {}
        metrics = self.rollout.evaluate([dataset[i] for i in range(len(dataset))], self.args.seed, metric_key_prefix)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics
