"""Harmlessness training (RePULSe, `swift.rlhf.harmless`) on the online loop of `swift.trainers.grpo`.

Each generation batch (P prompts): `--num_episodes` − 1 proposal-only updates, each on fresh
samples from q; then N samples per prompt from pθ (the ordinary rollout: reward, KL, checkpoint
machinery as GRPO's) and N from q, the negatives. q takes one step on its negatives (before pθ's
step, or after it with `--sampling_target_updated_base`); pθ's micro-batches hold its B samples and
the B negatives of the same prompts, [pθ's | q's], so the step's loss divides by the P·N pairs.

The proposal (`swift.trainers.proposal`) is a second copy of the starting model (`--proposal copy`,
as the fork), a second LoRA adapter `proposal` on the policy's own base (`--proposal adapter`: no
second copy of the weights) or a modulation of the policy (`--parameterization modulation_*`). Its parameters are trained only inside its own step, by its own AdamW at
`--actor_learning_rate`: they are frozen while the policy's optimizer and DDP are set up, and their
gradients are averaged over ranks here (sums over each rank's rows, divided by every rank's rows).
Checkpoints hold its tensors (`proposal.safetensors`), its optimizer and a pending update; the
final model directory holds it under `proposal/`."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil

import torch
import torch.distributed as dist

from swift.arguments.rlhf_harmless import read_neg_data
from swift.rlhf.harmless import (log_phi, negative_weights, policy_terms, proposal_terms, returns_and_advantages,
                                 transform_rewards)
from swift.rlhf.reduce import logged
from swift.rollout.runner import Trajectory
from swift.trainers.completion_logps import tensorize, token_logps
from swift.trainers.grpo import GRPOTrainer
from swift.trainers.proposal import PROPOSAL_DIR, Proposal
from swift.trainers.rollout import Rollout, eval_mode
from swift.utils.registry import SwiftError

NEGDATA = "negdata.jsonl"


@dataclasses.dataclass
class Negatives:
    """q's samples for a generation batch: trajectories (prompt-major), raw rewards, log φ, and the
    tensorized chunks (whole prompt groups) with q's log-probs at sampling."""
    prompts: list[dict]
    trajectories: list[Trajectory]
    rewards: torch.Tensor
    phi: torch.Tensor
    chunks: list[dict]


class HarmlessRollout(Rollout):
    always_old_logps = True  # log pθ at sampling: the KL in the return and the negatives' weights

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._neg: Negatives | None = None

    # -- sampling ----------------------------------------------------------------------------------
    def _sample_and_score(self, prompts, uses, queue, cycle):
        t = self.trainer
        if t.proposal is not None:
            for _ in range(self.a.num_episodes - 1):  # proposal-only updates on fresh samples
                t.proposal_step(self.negatives(prompts))
        prompts, trajectories, rewards, per_func = super()._sample_and_score(prompts, uses, queue, cycle)
        t.negdata.add(prompts, trajectories, rewards, self.n, "policy", t.state.global_step)
        self._neg = self.negatives(prompts) if t.proposal is not None else None
        return prompts, trajectories, rewards, per_func

    def negatives(self, prompts: list[dict]) -> Negatives:
        """N samples per prompt from q, scored, with log φ and q's log-probs at sampling."""
        t, a = self.trainer, self.a
        trajectories = t.proposal.generate(self, prompts, self.n)
        rewards, _ = self.score(prompts, trajectories, self.n)
        for i, tr in enumerate(trajectories):
            if tr.rollout_infos.get("rollout_error"):
                rewards[i] = float("nan")
        t.negdata.add(prompts, trajectories, rewards, self.n, "proposal", t.state.global_step)
        phi = log_phi(rewards, a.target_dist_beta, a.rm_type, a.threshold)
        rows, chunks = self.args.per_device_train_batch_size, []
        for start in range(0, len(trajectories), rows):
            batch = tensorize(trajectories[start:start + rows], t.processing_class.pad_token_id)
            with torch.no_grad(), eval_mode(t.proposal.module):
                batch["proposal_logps"] = t.proposal.logps(t, t._prepare_inputs(dict(batch))).detach().cpu()
            batch["phi"] = phi[start:start + rows]
            chunks.append(batch)
        return Negatives(prompts, trajectories, rewards, phi, chunks)

    def __call__(self, prompts, uses, queue, cycle, stale):
        batch = super().__call__(prompts, uses, queue, cycle, stale)
        neg, self._neg = self._neg, None
        if neg is not None:
            if self.a.sampling_target_updated_base:  # after pθ's step, against the updated pθ
                self.trainer._pending = neg
            else:
                self.trainer.proposal_step(neg)
        return batch

    # -- the micro-batches -------------------------------------------------------------------------
    def _micro_batches(self, trajectories, scored, stale):
        """[pθ's B samples | the B negatives of the same prompts] (pθ's alone without a proposal),
        with pθ's log-probs at sampling for both halves and the reference's with a KL."""
        t, rows = self.trainer, self.args.per_device_train_batch_size
        micro = []
        for start in range(0, len(trajectories), rows):
            own = trajectories[start:start + rows]
            negatives = self._neg.trajectories[start:start + rows] if self._neg is not None else []
            batch = tensorize(own + negatives, t.processing_class.pad_token_id)
            unscored = torch.zeros(batch["loss_mask"].size(0), dtype=torch.bool)
            unscored[:len(own)] = ~scored[start:start + rows]
            batch["loss_mask"][unscored] = 0
            with torch.no_grad(), eval_mode(t.model):
                device_batch = t._prepare_inputs(dict(batch))
                batch["old_logps"] = t._token_logps(t.model, device_batch)[0].detach()
                if self.a.beta:
                    batch["ref_logps"] = t._reference_logps(device_batch).detach()
            micro.append(batch)
        return micro

    def assign_advantages(self, micro, rewards, trajectories, steps=None):
        """R − b for pθ's samples (r' with the KL in the return) and w̄ for the negatives."""
        a, n, t = self.a, self.n, self.trainer
        rows = self.args.per_device_train_batch_size
        kl_sums = None
        if a.beta:
            kl_sums = torch.cat([((b["old_logps"] - b["ref_logps"]) * b["loss_mask"].to(b["old_logps"]))[:rows]
                                 .sum(-1).cpu() for b in micro])
        shaped = transform_rewards(rewards, a.reward_transform,
                                   a.alpha if a.rew_trans_alpha is None else a.rew_trans_alpha,
                                   a.target_dist_beta if a.rew_trans_beta is None else a.rew_trans_beta, a.threshold)
        returns, advantages = returns_and_advantages(shaped, kl_sums, a.beta, n, a.reinforce_baseline_type)
        negatives = a.harmlessness_training_loss_type != "reinforce"
        reinforce = a.harmlessness_training_loss_type == "neg_reinforce"
        # the fork's neg_reinforce leaves the indicator's weights as the softmax gives them
        indicator = a.rm_type == "indicator_below_threshold" and not reinforce
        if reinforce:  # other_expectation: the mean return of the prompt's policy samples, per negative
            means = returns.view(-1, n).nanmean(1).nan_to_num(0.0).repeat_interleave(n)
        for i, batch in enumerate(micro):
            batch["advantages"] = advantages[i * rows:(i + 1) * rows]
            if not negatives:
                continue
            if t.proposal is None:  # --use_base_as_proposal: pθ's samples, q_old = pθ_old
                own = slice(i * rows, (i + 1) * rows)
                target = log_phi(rewards[own], a.target_dist_beta, a.rm_type, a.threshold)
                sums = (batch["old_logps"] * batch["loss_mask"].to(batch["old_logps"])).sum(-1).cpu()
                policy_sums, proposal_sums = sums, sums
            else:
                chunk = self._neg.chunks[i]
                target = chunk["phi"]
                old, mask = batch["old_logps"][rows:], batch["loss_mask"][rows:].to(batch["old_logps"])
                policy_sums = (old * mask).sum(-1).cpu()
                proposal_sums = (chunk["proposal_logps"] * chunk["loss_mask"]).sum(-1)
            weighting = target
            if a.separate_reweighting_beta is not None:
                raw = rewards[i * rows:(i + 1) * rows] if t.proposal is None else \
                    self._neg.rewards[i * rows:(i + 1) * rows]
                weighting = a.separate_reweighting_beta * raw
            batch["neg_weights"] = negative_weights(policy_sums, weighting, proposal_sums, n,
                                                    indicator_phi=target if indicator else None,
                                                    uniform=a.uniform_reweight)
            if reinforce:
                batch["neg_phi"] = target
                batch["neg_other_returns"] = means[i * rows:(i + 1) * rows]
        self._log_harmless(rewards)
        return advantages

    def _log_harmless(self, rewards: torch.Tensor) -> None:
        """The bad rate (reward < --threshold) of pθ's samples and of q's, over every rank's rows."""
        m = self.trainer._metrics["train"]
        parts = [rewards] + ([self._neg.rewards] if self._neg is not None else [])
        for name, r in zip(("harmless/bad_rate", "harmless/proposal_bad_rate"), parts):
            stats = self.global_sum(torch.tensor([float((r < self.a.threshold).sum()), float((~r.isnan()).sum())],
                                                 dtype=torch.float64))
            m[name].append(stats[0].item() / max(stats[1].item(), 1.0))


class NegData:
    """`--save_negdata`: every distinct sample (prompt, completion tokens) with a raw reward below
    the threshold, appended to <output_dir>/negdata.jsonl (read back when a run resumes)."""

    def __init__(self, path: str | None, threshold: float, write: bool = True):
        self.path, self.threshold, self.write = path, threshold, write
        self.seen: set[tuple] = set()
        if path and write and os.path.exists(path):
            self._read_back(path)

    def _read_back(self, path: str) -> None:
        """The samples of a resumed run's file; its last line, cut short by a crash, is dropped."""
        keep = 0
        with open(path, "rb") as f:
            for number, raw in enumerate(f, 1):
                if not raw.endswith(b"\n"):
                    break  # the last line of an interrupted run may be cut short
                try:
                    row = json.loads(raw)
                    self.seen.add((tuple(row["prompt_ids"]), tuple(row["completion_ids"])))
                except (ValueError, KeyError, TypeError):
                    raise SwiftError(f"--save_negdata: {path} line {number} is not a sample this run wrote (a JSON "
                                     "object with prompt_ids and completion_ids); fix or delete the file") from None
                keep += len(raw)
        with open(path, "r+b") as f:
            f.truncate(keep)

    def add(self, prompts, trajectories, rewards, n: int, source: str, step: int) -> None:
        """Called by every rank at the same point; rank 0 writes every rank's samples."""
        if self.path is None:
            return
        rows = [{"prompt": prompts[i // n]["messages"], "completion": tr.text, "reward": r,
                 "prompt_ids": tr.prompt_ids, "completion_ids": tr.completion_ids, "loss_mask": tr.loss_mask,
                 "source": source, "step": step}
                for i, (tr, r) in enumerate(zip(trajectories, rewards.tolist())) if r < self.threshold]
        if dist.is_initialized() and dist.get_world_size() > 1:
            parts: list = [None] * dist.get_world_size()
            dist.all_gather_object(parts, rows)
            rows = [row for part in parts for row in part]
        if not self.write:
            return
        lines = []
        for row in rows:
            key = (tuple(row["prompt_ids"]), tuple(row["completion_ids"]))
            if key not in self.seen:
                self.seen.add(key)
                lines.append(json.dumps(row))
        if lines:
            with open(self.path, "a") as f:
                f.write("\n".join(lines) + "\n")


class HarmlessTrainer(GRPOTrainer):
    rollout_class = HarmlessRollout

    def __init__(self, *args, proposal_model=None, **kwargs):
        engine_factory = kwargs["engine_factory"]
        super().__init__(*args, **kwargs)
        a = self.rlhf_args
        self._pending: Negatives | None = None
        self.negdata = NegData(os.path.join(self.args.output_dir, NEGDATA) if a.save_negdata else None,
                               a.save_negdata_threshold, write=self.args.process_index == 0)
        # read and checked before training: a bad row must not cost the trained model
        self._neg_rows = read_neg_data(a.evaluate_on_neg_data, self.model.get_input_embeddings().weight.shape[0]) \
            if a.evaluate_on_neg_data else None
        self.proposal = None
        if a.harmlessness_training_loss_type != "reinforce" and not a.use_base_as_proposal:
            self.proposal = Proposal(self, proposal_model, engine_factory)

    # -- the proposal's step -----------------------------------------------------------------------
    def proposal_step(self, neg: Negatives) -> None:
        """One AdamW step of q on its negatives: the mean over every rank's P·N rows of its loss."""
        a, q = self.rlhf_args, self.proposal
        rows = self.rollout.global_sum(torch.tensor([float(len(neg.trajectories))]))[0].item()
        policy = []
        with torch.no_grad(), eval_mode(self.model):  # pθ now (the updated one after its step, if flipped)
            for chunk in neg.chunks:
                policy.append(self._token_logps(self.model, self._prepare_inputs(dict(chunk)))[0].detach())
        q.freeze(trainable=True)
        total = torch.zeros((), dtype=torch.float64)
        try:
            # the adapter stays switched through the backward (recomputed activations must be q's)
            with q.active():
                for chunk, policy_logps in zip(neg.chunks, policy):
                    batch = self._prepare_inputs(dict(chunk))
                    q_logps, twists = q.logps_and_twists(self, batch) if q.modulated else (q.logps(self, batch), None)
                    terms = proposal_terms(q_logps, policy_logps, batch["proposal_logps"], batch["phi"],
                                           batch["loss_mask"], self.num_generations, a.actor_loss_type,
                                           a.parameterization, twists=twists)
                    loss = terms["rows"] / rows
                    loss.backward()
                    total += loss.detach().double().cpu()
            params = [p for _, p in q.named if p.grad is not None]
            if self.accelerator.num_processes > 1:
                for p in params:
                    dist.all_reduce(p.grad)
            norm = None
            if self.args.max_grad_norm and params:
                norm = torch.nn.utils.clip_grad_norm_(params, self.args.max_grad_norm).item()
            q.optimizer.step()
            q.optimizer.zero_grad(set_to_none=True)
        finally:
            q.freeze()
        m = self._metrics["train"]
        m["loss/proposal"].append(self.rollout.global_sum(total.float().view(1))[0].item())
        if norm is not None:
            m["proposal/grad_norm"].append(norm)

    # -- the loop ----------------------------------------------------------------------------------
    def training_step(self, model, inputs, num_items_in_batch=None):
        if self._uses % self.cycle == 0 and self._pending is not None:  # the last batch's q step, flipped
            neg, self._pending = self._pending, None
            self.proposal_step(neg)
        return super().training_step(model, inputs, num_items_in_batch)

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        result = super().train(resume_from_checkpoint, *args, **kwargs)
        if self._pending is not None:
            neg, self._pending = self._pending, None
            self.proposal_step(neg)
        return result

    def evaluate_after_save(self) -> dict[str, float]:
        """What the pipeline evaluates once the model is saved: `--evaluate_on_neg_data`."""
        return self.evaluate_on_neg_data(self._neg_rows) if self._neg_rows else {}

    def evaluate_on_neg_data(self, rows: list[dict]) -> dict[str, float]:
        """The samples of a negdata.jsonl (`read_neg_data`) under the trained policy: their mean log-prob
        and the mean over prompts of the log-sum-exp of their prompt's samples (a lower bound on log P(bad))."""
        sums = []
        size = self.args.per_device_eval_batch_size
        with torch.no_grad(), eval_mode(self.model):
            for start in range(0, len(rows), size):
                part = [Trajectory(r["prompt_ids"], r["completion_ids"], r["loss_mask"], "", False, [])
                        for r in rows[start:start + size]]
                batch = self._prepare_inputs(tensorize(part, self.processing_class.pad_token_id))
                logps = token_logps(self.accelerator.unwrap_model(self.model), batch, self.rlhf_args.temperature,
                                    False)[0]
                sums += (logps * batch["loss_mask"]).sum(-1).tolist()
        by_prompt: dict[tuple, list[float]] = {}
        for r, s in zip(rows, sums):
            by_prompt.setdefault(tuple(r["prompt_ids"]), []).append(s)
        lse = [torch.logsumexp(torch.tensor(v, dtype=torch.float64), 0).item() for v in by_prompt.values()]
        metrics = {"neg_data/samples": float(len(rows)), "neg_data/mean_logp": sum(sums) / len(sums),
                   "neg_data/logsumexp": sum(lse) / len(lse)}
        self.log(dict(metrics))
        return metrics

    def close(self) -> None:
        super().close()
        if self.proposal is not None:
            self.proposal.close()

    # -- the policy's loss -------------------------------------------------------------------------
    def loss_and_metrics(self, model, inputs):
        a = self.rlhf_args
        logps = self._token_logps(model, inputs)[0]
        reinforce = None
        if "neg_phi" in inputs:  # neg_reinforce: the negatives' return keeps log pθ's gradient through its KL
            b = inputs["advantages"].numel()
            reinforce = {"phi": inputs["neg_phi"], "n": self.num_generations, "kl_coef": a.beta,
                         "ref_logps": inputs["ref_logps"][b:] if a.beta else None, "baseline": a.neg_baseline_type,
                         "hardcoded": a.neg_hardcoded_baseline, "other": inputs["neg_other_returns"]}
        terms, parts = policy_terms(logps, inputs["loss_mask"], inputs["advantages"], inputs.get("neg_weights"),
                                    a.alpha, separate_negatives=self.proposal is not None, reinforce=reinforce)
        kind = next(iter(terms))
        metrics = {"loss/rl": logged({kind: parts["rl"].sum()}, inputs)}
        if "neg" in parts:
            metrics["loss/neg"] = logged({kind: parts["neg"].sum()}, inputs)
        return terms, metrics

    # -- checkpoints -------------------------------------------------------------------------------
    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.proposal is not None and self.args.should_save:
            checkpoint = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
            self.proposal.save_checkpoint(checkpoint)
            if self.proposal.adapter is not None:
                # PEFT saved the proposal adapter in a subfolder too; the HF Trainer's resume would load
                # that subfolder *instead of* the policy's adapter. Its tensors are in PROPOSAL_STATE.
                shutil.rmtree(os.path.join(checkpoint, PROPOSAL_DIR), ignore_errors=True)

    def _loop_state(self) -> dict:
        state = {"proposal_pending": self._pending}
        if self.proposal is not None:
            state["proposal_optimizer"] = self.proposal.optimizer.state_dict()
        return state

    def _load_loop_state(self, state: dict, checkpoint: str) -> None:
        self._pending = state.get("proposal_pending")
        if self.proposal is not None:
            self.proposal.load_checkpoint(checkpoint)
            self.proposal.optimizer.load_state_dict(state["proposal_optimizer"])

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        super().save_model(output_dir, _internal_call)
        if self.proposal is not None and self.args.should_save and not _internal_call:
            self.proposal.save_final(output_dir or self.args.output_dir, self.processing_class)
