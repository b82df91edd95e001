"""The online loop's rollout: sample a generation batch from the engine, score it, compute its
advantages and cut it into the micro-batches the loss trains on, returned as one `RolloutBatch`.

`Rollout` is GRPO's (group-relative advantages from the rewards, `swift.rlhf.grpo`); `PPORollout`
(`swift.trainers.ppo`) swaps the advantage step for GAE over the critic's values. The trainer
supplies the policy (the module the engine is synced from and the forward that takes log-probs),
the step counter the weight pushes are keyed by, and the metrics the rollout logs into."""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from swift.infer.protocol import RequestConfig
from swift.rewards.manager import whole_conversations
from swift.rewards.process import process_advantages
from swift.rlhf.grpo import compute_advantages, nanstd
from swift.rollout.multi_turn import RolloutInferRequest
from swift.rollout.runner import Trajectory, rollout
from swift.rollout.trl_rollout_func import RolloutFunc
from swift.rollout.verifiers_env import VerifiersRollout, uses_verifiers
from swift.trainers.completion_logps import tensorize
from swift.trainers.rollout_metrics import eval_metrics, rollout_metrics, write_completions
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


@dataclass
class RolloutBatch:
    """One generation batch, ready to train on."""
    prompts: list[dict]
    trajectories: list[Trajectory]  # num_generations per prompt, in prompt order
    rewards: torch.Tensor  # [rows]; NaN where no reward function scored the row (left out of the loss)
    per_func: list[list]  # each reward function's scores
    advantages: torch.Tensor  # each completion's advantage (PPO: its first token's), for the logs
    micro: list[dict[str, torch.Tensor]]  # this rank's micro-batches, with what the loss reads


class Rollout:
    # the log-probs at sampling are needed even when each batch is trained on once (PPO's KL reward)
    always_old_logps = False

    def __init__(self, trainer, engine, rewards, process_rewards=None, scheduler=None):
        self.trainer = trainer
        self.args, self.a = trainer.args, trainer.rlhf_args
        self.engine = engine
        self.remote = hasattr(engine, "rollout")  # a rollout server: generation leaves this process
        self.rewards = rewards
        self.process_rewards = process_rewards  # swift.rewards.process.ProcessRewardModel, or None
        self.scheduler = scheduler
        self.n = self.a.num_generations
        self.rollout_func = RolloutFunc(self.a.rollout_func, trainer) if getattr(self.a, "rollout_func", None) else None
        self._synced_step: int | None = None
        self._all_failed = 0  # generation batches in a row whose every trajectory failed
        self._completions_path = os.path.join(self.args.output_dir, "completions.jsonl")

    # -- sampling ----------------------------------------------------------------------------------
    def sync(self) -> None:
        """Push the policy's weights to the engine (checked) unless it already has these."""
        t = self.trainer
        if self._synced_step == t.state.global_step:
            return
        model = t.accelerator.unwrap_model(t.model)
        if sharded(t):  # every rank gathers each bucket; the engine loads it (rank 0 for a server)
            buckets = gathered_buckets(model, self.a.weight_sync_bucket_mb)
            if self.remote and not t.accelerator.is_main_process:
                for _ in buckets:
                    pass
            else:
                self.engine.sync_weights(model, buckets)
            t.accelerator.wait_for_everyone()
        elif not self.remote:
            self.engine.sync_weights(model)
        else:  # one trainer process feeds the server; the others wait for it
            if t.accelerator.is_main_process:
                self.engine.sync_weights(model)
            t.accelerator.wait_for_everyone()
        self._synced_step = t.state.global_step

    def close(self) -> None:
        """Stop the inference engine (vLLM's processes) or leave the rollout server's communicator."""
        self.engine.close()

    def request_config(self, seed: int | None = None) -> RequestConfig:
        a = self.a
        return RequestConfig(max_tokens=a.max_completion_length, temperature=a.temperature, top_p=a.top_p,
                             top_k=a.top_k, repetition_penalty=a.repetition_penalty, seed=seed,
                             logprobs=a.async_generate)  # the sampler's log-probs weight off-policy tokens

    def generate(self, prompts: list[dict], n: int, seed: int | None = None) -> list[Trajectory]:
        self.sync()
        return self.generate_with_current_weights(prompts, n, seed)

    def generate_with_current_weights(self, prompts: list[dict], n: int, seed: int | None = None) -> list[Trajectory]:
        requests = [RolloutInferRequest(messages=list(p["messages"]), data_dict=p["columns"]) for p in prompts]

        def run():
            if self.rollout_func is not None:  # TRL's rollout_func in place of the engine
                return self.rollout_func(requests, n)
            if uses_verifiers(requests):  # the rows' verifiers environment runs its own rollout loop
                return VerifiersRollout(self.engine, self.trainer.template, self.request_config(seed),
                                        self.a.max_completion_length)(requests, n)
            return rollout(self.engine, self.trainer.template, requests, self.request_config(seed), n,
                           scheduler=self.scheduler, max_completion_length=self.a.max_completion_length)

        if self.remote:  # the policy module is not touched (this may run beside training)
            return run()
        with eval_mode(self.trainer.accelerator.unwrap_model(self.trainer.model)):  # the engine generates with it
            return run()

    def _trajectories(self, prompts: list[dict], uses: int, queue, cycle: int) -> list[Trajectory]:
        """This generation batch's trajectories: generated while the previous one trained
        (--async_generate, from the weights before that step's update) or now. Then start generating
        the next one."""
        trajectories = queue.take(uses)
        if trajectories is None:
            trajectories = self.generate(prompts, self.n)
        if queue.pool is not None:
            following = queue.prompts_from(uses + cycle)
            if following is not None:
                self.sync()
                queue.start(uses + cycle, self.generate_with_current_weights, following, self.n)
        return trajectories

    # -- scoring -----------------------------------------------------------------------------------
    def score(self, prompts: list[dict], trajectories: list[Trajectory], n: int):
        rows = [p for p in prompts for _ in range(n)]
        columns: dict[str, list] = {}
        # every row's columns, None where a row has none (a mix of datasets; before 2026-12-07 the
        # first row's keys alone, so a column reached the reward functions only if that row had it)
        for key in dict.fromkeys(k for r in rows for k in r["columns"]):
            columns[key] = [r["columns"].get(key) for r in rows]
        for key in {k for t in trajectories for k in t.rollout_infos}:
            columns[key] = [t.rollout_infos.get(key) for t in trajectories]
        columns["messages"] = [r["messages"] for r in rows]
        columns["trajectory_messages"] = [t.messages for t in trajectories]  # the whole conversation, every turn
        columns = whole_conversations([t.text for t in trajectories], columns)  # `messages`: as ms-swift's
        columns["rollout_infos"] = [dict(t.rollout_infos) for t in trajectories]  # ms-swift's: one dict per row
        columns["response_token_ids"] = [[t for t, m in zip(x.completion_ids, x.loss_mask) if m] for x in trajectories]
        columns["prompt_texts"] = [self.trainer.processing_class.decode(t.prompt_ids) for t in trajectories]
        metrics = self.trainer._metrics["train"]
        self.rewards.context = {"trainer_state": self.trainer.state,
                                "log_metric": lambda name, value: metrics[name].append(float(value))}
        totals, per_func = self.rewards([t.text for t in trajectories], columns)
        return torch.tensor(totals, dtype=torch.float32), per_func  # NaN: no function scored the row

    def _sample_and_score(self, prompts: list[dict], uses: int, queue, cycle: int):
        a, n = self.a, self.n
        trajectories = self._trajectories(prompts, uses, queue, cycle)
        rewards, per_func = self.score(prompts, trajectories, n)
        if a.dynamic_sample:  # DAPO: groups whose rewards are all equal teach nothing; replace them
            prompts = list(prompts)
            for round_ in range(a.max_resample_times):
                # a group with an unscored (NaN) row counts by its scored rows (before 2026-11-30: never)
                flat = nanstd(rewards.view(-1, n), dim=1).squeeze(1)
                again = [i for i, s in enumerate(flat.tolist()) if s == 0]
                if not again:
                    break
                fresh = self.fresh_prompts(len(again), uses, round_)
                redo = self.generate(fresh, n)
                redo_rewards, redo_per_func = self.score(fresh, redo, n)
                for j, i in enumerate(again):
                    prompts[i] = fresh[j]
                    trajectories[i * n:(i + 1) * n] = redo[j * n:(j + 1) * n]
                    rewards[i * n:(i + 1) * n] = redo_rewards[j * n:(j + 1) * n]
                    for f in range(len(per_func)):
                        per_func[f][i * n:(i + 1) * n] = redo_per_func[f][j * n:(j + 1) * n]
        return prompts, trajectories, rewards, per_func

    def fresh_prompts(self, k: int, uses: int, round_: int) -> list[dict]:
        """--dynamic_sample: `k` prompts drawn at random from the training set to replace groups that
        teach nothing (new prompts, as ms-swift and DAPO; before 2026-12-07 the same prompts were
        sampled again). The draw depends only on --seed, the generation batch, the round and the
        rank, so a resumed run draws what the uninterrupted one did."""
        data = self.trainer.train_dataset
        rng = np.random.default_rng([self.args.seed, uses, round_, self.args.process_index])
        return [data[int(i)] for i in rng.choice(len(data), size=k, replace=len(data) < k)]

    def _score_steps(self, trajectories: list[Trajectory]):
        """Each completion's steps and their process rewards (None without --prm_model)."""
        if self.process_rewards is None:
            return None
        steps = self.process_rewards.score([t.prompt_ids for t in trajectories],
                                           [t.completion_ids for t in trajectories])
        values = [r for row in steps for _, r in row]
        m = self.trainer._metrics["train"]
        m["rewards/prm/mean"].append(sum(values) / len(values) if values else float("nan"))
        m["rewards/prm/steps"].append(len(values) / len(steps))
        return steps

    # -- the generation batch ----------------------------------------------------------------------
    def __call__(self, prompts: list[dict], uses: int, queue, cycle: int, stale: bool) -> RolloutBatch:
        """Sample, score and compute advantages for the generation batch starting at micro-batch
        `uses`, cut into its micro-batches, each with the log-probs it needs computed before any
        update (`stale`: trained on after an update, so the log-probs at sampling too)."""
        prompts, trajectories, rewards, per_func = self._sample_and_score(prompts, uses, queue, cycle)
        steps = self._score_steps(trajectories)
        if steps is not None and not self.rewards.names:  # process rewards alone: every row is scored
            rewards = torch.zeros_like(rewards)
        failed = [i for i, t in enumerate(trajectories) if t.rollout_infos.get("rollout_error")]
        self._refuse_all_failed(trajectories, failed)
        if failed:  # its environment failed mid-rollout: the trajectory is cut, not judged
            rewards[failed] = float("nan")
            logger.warning(f"{len(failed)} of {len(trajectories)} trajectories ended with an environment error "
                           "({}); they get no reward".format(", ".join(sorted({trajectories[i].rollout_infos[
                               "rollout_error"] for i in failed}))))
        scored = ~rewards.isnan()
        if not scored.all():
            logger.warning(f"{int((~scored).sum())} of {len(trajectories)} completions got no reward (every reward "
                           "function returned None); they are left out of the loss")
        kl_in_reward = bool(self.a.kl_in_reward and self.a.beta)
        micro = self._micro_batches(trajectories, scored, stale or self.always_old_logps or kl_in_reward)
        shaped = self._minus_kl(micro, rewards) if kl_in_reward else rewards
        advantages = self.assign_advantages(micro, shaped, trajectories, steps)
        self._log(prompts, trajectories, rewards, per_func, advantages)
        return RolloutBatch(prompts, trajectories, rewards, per_func, advantages, micro)

    ALL_FAILED_LIMIT = 3

    def _refuse_all_failed(self, trajectories: list[Trajectory], failed: list[int]) -> None:
        """A failed trajectory costs its row; when every trajectory of 3 generation batches in a row
        (on every rank) failed, the environment is broken, and training on nothing would go on
        silently until the last step (before 2026-12-07 it did): stop, on every rank. (A flaky
        environment may fail a whole small batch now and then.)"""
        counts = self.global_sum(torch.tensor([len(failed), len(trajectories)], dtype=torch.float64))
        everything = bool(counts[1] > 0 and counts[0] == counts[1])
        self._all_failed = self._all_failed + 1 if everything else 0
        if self._all_failed >= self.ALL_FAILED_LIMIT:
            names = sorted({trajectories[i].rollout_infos["rollout_error"] for i in failed})
            raise SwiftError(f"every trajectory of the last {self.ALL_FAILED_LIMIT} generation batches ended with an "
                             f"environment error ({', '.join(names) or 'on another rank'}; the log above has each "
                             "traceback): fix the scheduler or environment")

    def _minus_kl(self, micro: list[dict], rewards: torch.Tensor) -> torch.Tensor:
        """--kl_in_reward (ms-swift's default for rloo and reinforce_plus_plus): each completion's
        reward less β × its KL to the reference, the sum over its tokens of log π_old − log π_ref
        (the loss then has no KL term); logs `kl`, the per-token mean over every rank's tokens."""
        kl = torch.cat([((b["old_logps"] - b["ref_logps"]).float() * b["loss_mask"].to(b["old_logps"].device))
                        .sum(-1).cpu() for b in micro])
        tokens = sum(b["loss_mask"].sum().item() for b in micro)
        total = self.global_sum(torch.tensor([kl.sum().item(), tokens], dtype=torch.float64))
        self.trainer._metrics["train"]["kl"].append((total[0] / total[1].clamp(min=1)).item())
        return rewards - self.a.beta * kl

    def _micro_batches(self, trajectories: list[Trajectory], scored: torch.Tensor, stale: bool):
        t, rows = self.trainer, self.args.per_device_train_batch_size
        micro = []
        for start in range(0, len(trajectories), rows):
            batch = tensorize(trajectories[start:start + rows], t.processing_class.pad_token_id,
                              self.a.overlong_filter)
            batch["loss_mask"][~scored[start:start + rows]] = 0
            with torch.no_grad(), eval_mode(*self.sampling_modules()):
                device_batch = t._prepare_inputs(dict(batch))
                if stale:
                    self.sampling_forward(batch, device_batch)
                if self.a.beta:
                    batch["ref_logps"] = t._reference_logps(device_batch).detach()
            micro.append(batch)
        return micro

    def sampling_modules(self) -> list:
        """What runs in eval mode while the batch's log-probs at sampling (and reference log-probs)
        are taken: with `--disable_dropout false` dropout would otherwise perturb them, and the
        engine sampled without it."""
        return [self.trainer.model]

    def sampling_forward(self, batch: dict, device_batch: dict) -> None:
        """The log-probs the completions have under the weights that sampled them."""
        batch["old_logps"] = self.trainer._token_logps(self.trainer.model, device_batch)[0].detach()

    # -- advantages --------------------------------------------------------------------------------
    def assign_advantages(self, micro: list[dict], rewards: torch.Tensor, trajectories, steps=None) -> torch.Tensor:
        """Each completion's advantage from the group's rewards (plus, with process rewards, each
        token's process advantage: the advantages become [B, T]); returns the sequence advantages."""
        advantages = self._advantages(rewards).nan_to_num(0.0)
        rows = self.args.per_device_train_batch_size
        process = None
        if steps is not None:
            process = process_advantages(steps, self.n, max(b["completion_ids"].size(1) for b in micro))
        for i, batch in enumerate(micro):
            batch["advantages"] = advantages[i * rows:(i + 1) * rows]
            if process is not None:
                width = batch["completion_ids"].size(1)
                batch["advantages"] = batch["advantages"][:, None] + process[i * rows:(i + 1) * rows, :width]
        return advantages

    def _advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        """Advantages from every rank's rewards (batch statistics are the global batch's, as in TRL);
        this rank's share of them."""
        a, accelerator = self.a, self.trainer.accelerator
        if accelerator.num_processes == 1:
            return compute_advantages(rewards, self.n, a.advantage_estimator, a.scale_rewards)
        everyone = accelerator.gather(rewards.to(self.args.device)).cpu()
        mine = accelerator.process_index * rewards.numel()
        return compute_advantages(everyone, self.n, a.advantage_estimator, a.scale_rewards)[mine:mine + rewards.numel()]

    def global_sum(self, stats: torch.Tensor) -> torch.Tensor:
        """A sum over every rank."""
        if self.trainer.accelerator.num_processes > 1:
            stats = self.trainer.accelerator.reduce(stats.to(self.args.device), reduction="sum")
        return stats.cpu()

    # -- metrics -----------------------------------------------------------------------------------
    def _log(self, prompts, trajectories, rewards, per_func, advantages) -> None:
        # over every rank's rows (as TRL gathers them), not a mean of each rank's own means
        mine = (rewards.tolist(), [list(v) for v in per_func], [float(sum(t.loss_mask)) for t in trajectories],
                [bool(t.truncated) for t in trajectories], [t.turns for t in trajectories])
        parts = [mine]
        if self.trainer.accelerator.num_processes > 1:
            parts = [None] * self.trainer.accelerator.num_processes
            dist.all_gather_object(parts, mine)
        everyone = [sum((p[i] for p in parts), []) for i in (0, 2, 3, 4)]
        per_func_all = [sum((p[1][f] for p in parts), []) for f in range(len(per_func))]
        for key, value in rollout_metrics(torch.tensor(everyone[0]), per_func_all, self.rewards.names, everyone[1],
                                          everyone[2], everyone[3] if self.scheduler is not None else None,
                                          self.n).items():
            self.trainer._metrics["train"][key].append(value)
        if self.a.log_completions and (not dist.is_initialized() or dist.get_rank() == 0):
            write_completions(self._completions_path, self.trainer.state.global_step, prompts, trajectories, rewards,
                              advantages, self.rewards.names, per_func, self.n)

    def evaluate(self, prompts: list[dict], seed: int, prefix: str) -> dict[str, float]:
        """One answer per prompt, sampled as in training (as TRL does) from a fixed seed so that
        evaluations are comparable, scored by the reward functions."""
        with torch.random.fork_rng(devices=[]):  # independent draws, the training RNG stream untouched
            torch.manual_seed(seed)
            trajectories = self.generate(prompts, 1)
        rewards, per_func = self.score(prompts, trajectories, 1)
        return eval_metrics(rewards, per_func, self.rewards.names, trajectories, prefix)
