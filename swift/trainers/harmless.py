"""Harmlessness training (RePULSe, `swift.rlhf.harmless`) on the online loop of `swift.trainers.grpo`.

Each generation batch (P prompts): `--num_episodes` − 1 proposal-only updates, each on fresh
samples from q; then N samples per prompt from pθ (the ordinary rollout: reward, KL, checkpoint
machinery as GRPO's) and N from q, the negatives. q takes one step on its negatives (before pθ's
step, or after it with `--sampling_target_updated_base`); pθ's micro-batches hold its B samples and
the B negatives of the same prompts, [pθ's | q's], so the step's loss divides by the P·N pairs.

The proposal is a second copy of the starting model (`--proposal copy`, as the fork) or a second
LoRA adapter `proposal` on the policy's own base (`--proposal adapter`: no second copy of the
weights). Its parameters are trained only inside its own step, by its own AdamW at
`--actor_learning_rate`: they are frozen while the policy's optimizer and DDP are set up, and their
gradients are averaged over ranks here (sums over each rank's rows, divided by every rank's rows).
Checkpoints hold its tensors (`proposal.safetensors`), its optimizer and a pending update; the
final model directory holds it under `proposal/`."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import shutil

import torch
import torch.distributed as dist
from transformers import DynamicCache

from swift.rlhf.harmless import (MODULATION, log_phi, negative_weights, policy_terms, proposal_terms,
                                 returns_and_advantages, transform_rewards)
from swift.rlhf.reduce import logged
from swift.rollout.multi_turn import RolloutInferRequest
from swift.rollout.runner import Trajectory, rollout
from swift.trainers.completion_logps import tensorize, token_logps
from swift.trainers.grpo import GRPOTrainer
from swift.trainers.rlhf import disable_dropout
from swift.trainers.rollout import Rollout, eval_mode
from swift.utils.registry import SwiftError

PROPOSAL_ADAPTER = "proposal"
PROPOSAL_DIR = "proposal"  # the trained proposal at the end of training
PROPOSAL_STATE = "proposal.safetensors"  # its trained tensors, in every checkpoint
MODULATION_HEAD = "modulation_head.safetensors"  # a modulation head, under PROPOSAL_DIR at the end
NEGDATA = "negdata.jsonl"


class AdapterView:
    """The policy's engine sampling with another of its LoRA adapters; the policy's adapter is
    active again afterwards (the trainer's forwards run on the same module)."""

    def __init__(self, engine, adapter: str):
        self.engine, self.adapter = engine, adapter

    def infer(self, requests, config, **kwargs):
        try:
            return self.engine.infer([dataclasses.replace(r, adapter=self.adapter) for r in requests], config, **kwargs)
        finally:
            self.engine.activate_adapter(self.engine.default_adapter)


@contextlib.contextmanager
def active_adapter(model, name: str | None):
    """`name` active on a PEFT model within the block (PEFT's switch also sets requires_grad, which is
    put back as it was); None: no switch."""
    if name is None:
        yield
        return
    before = model.active_adapter
    flags = {p: p.requires_grad for p in model.parameters()}
    model.set_adapter(name)
    try:
        yield
    finally:
        model.set_adapter(before)
        for p, flag in flags.items():
            p.requires_grad_(flag)


class PairedCache(DynamicCache):
    """The policy's KV cache with the modulation model's beside it; the engine selects rows of both."""

    def __init__(self):
        super().__init__()
        self.modulation = DynamicCache()

    def batch_select_indices(self, indices):
        super().batch_select_indices(indices)
        self.modulation.batch_select_indices(indices)


class Modulated(torch.nn.Module):
    """q of the modulation parameterisations: logits log_softmax(pθ's logits) + m, with m a `head` on
    pθ's last hidden state or the logits of a second causal LM `model` (its own KV cache beside
    pθ's). pθ runs without gradient and is not a submodule, so q's parameters are the head's or the
    second model's alone."""

    def __init__(self, policy, head: torch.nn.Module | None = None, model: torch.nn.Module | None = None):
        super().__init__()
        self._policy = (policy,)
        self.head, self.model = head, model
        self.config = policy.config
        self.generation_config = getattr(policy, "generation_config", None)

    def new_cache(self) -> DynamicCache:
        return PairedCache() if self.model is not None else DynamicCache()

    @property
    def policy(self):
        return self._policy[0]

    def get_input_embeddings(self):
        return self.policy.get_input_embeddings()

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                logits_to_keep: int = 0, **_):
        with torch.no_grad(), eval_mode(self.policy):  # q's log-probs and samples: pθ without dropout
            out = self.policy(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              past_key_values=past_key_values, use_cache=use_cache, logits_to_keep=logits_to_keep,
                              output_hidden_states=self.head is not None)
        if self.model is not None:
            own = past_key_values.modulation if past_key_values is not None else None
            modulation = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                    past_key_values=own, use_cache=use_cache, logits_to_keep=logits_to_keep).logits.float()
        else:
            hidden = out.hidden_states[-1]
            if logits_to_keep:
                hidden = hidden[:, -logits_to_keep:]
            weight = next(self.head.parameters())
            modulation = self.head(hidden.detach().to(weight.dtype)).float()
        return ModulatedOutput(logits=out.logits.float().log_softmax(-1) + modulation, modulation=modulation)


@dataclasses.dataclass
class ModulatedOutput:
    logits: torch.Tensor
    modulation: torch.Tensor


def modulation_head(kind: str, policy, divider: float, from_base: bool) -> torch.nn.Module:
    """The fork's heads: a linear layer H → V (Xavier-normal weights / `divider`, zero bias; or the
    policy's output layer / `divider` with `from_base`), or an MLP H → H → H → V with ReLUs (PyTorch's
    default initialisation). Float32, on the policy's device (`policy`: any causal LM, also the
    modulation model whose output layer it replaces)."""
    hidden = policy.config.get_text_config().hidden_size
    output = policy.get_output_embeddings()
    vocab = output.weight.shape[0]
    device = output.weight.device
    if kind == "modulation_nn_head":
        return torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                                   torch.nn.ReLU(), torch.nn.Linear(hidden, vocab)).to(device)
    head = torch.nn.Linear(hidden, vocab).to(device)
    with torch.no_grad():
        head.bias.zero_()
        if from_base:
            head.weight.copy_(output.weight.float() / divider)
            if getattr(output, "bias", None) is not None:
                head.bias.copy_(output.bias.float() / divider)
        else:
            torch.nn.init.xavier_normal_(head.weight)
            head.weight.div_(divider)
    return head


@dataclasses.dataclass
class Negatives:
    """q's samples for a generation batch: trajectories (prompt-major), raw rewards, log φ, and the
    tensorized chunks (whole prompt groups) with q's log-probs at sampling."""
    prompts: list[dict]
    trajectories: list[Trajectory]
    rewards: torch.Tensor
    phi: torch.Tensor
    chunks: list[dict]


class Proposal:
    """q: its module (a copy, or the policy itself with the `proposal` adapter), trainable tensors,
    optimizer and engine."""

    def __init__(self, trainer, module, engine_factory):
        t, a = trainer, trainer.rlhf_args
        policy = t.accelerator.unwrap_model(t.model)
        self.modulated = a.parameterization in MODULATION
        self._parameterization = a.parameterization
        if self.modulated:  # a head on the policy's last hidden state, or a second model's logits
            from swift.infer.transformers_engine import TransformersEngine

            self.adapter = None
            if a.parameterization == "modulation_model":  # the copy, with a new output layer (as the fork)
                module = module.to(t.args.device)
                head = modulation_head("modulation_linear_head", module, a.additional_sd_divider,
                                       a.init_head_from_base)
                for config in (module.config, module.config.get_text_config()):
                    config.tie_word_embeddings = False  # the new layer is not the input embeddings
                module.set_output_embeddings(head.to(module.get_input_embeddings().weight.dtype))
                if a.disable_dropout:
                    disable_dropout(module)
                self.module = Modulated(policy, model=module)
                self.named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
            else:
                head = modulation_head(a.parameterization, policy, a.additional_sd_divider, a.init_head_from_base)
                self.module = Modulated(policy, head=head)
                self.named = [(f"head.{n}", p) for n, p in head.named_parameters()]
            # the policy's own adapter stays active (the engine sees no adapters: it never switches them)
            own = t.rollout.engine
            self.engine = TransformersEngine(self.module, own.tokenizer, own.template, fast_decode=False, inline=True,
                                             max_batch_size=max(t.args.per_device_train_batch_size, 8))
        elif module is None:  # a second adapter on the policy, starting from the policy's adapter weights
            self.adapter = PROPOSAL_ADAPTER
            own = policy.active_adapter
            flags = {p: p.requires_grad for p in policy.parameters()}
            policy.add_adapter(PROPOSAL_ADAPTER, copy.deepcopy(policy.peft_config[own]))
            for p, flag in flags.items():
                p.requires_grad_(flag)
            if a.disable_dropout:  # the trainer turned off the policy's dropout before this adapter existed
                disable_dropout(policy)
            params = dict(policy.named_parameters())
            self.named = [(n, p) for n, p in params.items() if f".{PROPOSAL_ADAPTER}." in n]
            with torch.no_grad():
                for name, p in self.named:
                    p.copy_(params[name.replace(f".{PROPOSAL_ADAPTER}.", f".{own}.")])
            self.module = policy
            self.engine = AdapterView(t.rollout.engine, PROPOSAL_ADAPTER)
        else:
            self.adapter = None
            self.module = module.to(t.args.device)
            if a.disable_dropout:
                disable_dropout(self.module)
            self.named = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
            self.engine = engine_factory(self.module)
        if not self.named:
            raise SwiftError("--rlhf_type harmless: the proposal has no trainable parameters")
        if dist.is_initialized() and dist.get_world_size() > 1:  # every rank starts from rank 0's proposal
            with torch.no_grad():
                for _, p in self.named:
                    dist.broadcast(p.data, 0)
        self.freeze()
        args = t.args
        self.optimizer = torch.optim.AdamW([p for _, p in self.named], lr=a.actor_learning_rate,
                                           betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon,
                                           weight_decay=args.weight_decay)

    def freeze(self, trainable: bool = False) -> None:
        for _, p in self.named:
            p.requires_grad_(trainable)

    def active(self):
        return active_adapter(self.module, self.adapter)

    def logps(self, trainer, batch: dict) -> torch.Tensor:
        if self.modulated:
            return self.logps_and_twists(trainer, batch)[0]
        with self.active():
            return token_logps(self.module, batch, trainer.rlhf_args.temperature, False,
                               trainer._prompt_group(trainer.model))[0]

    def logps_and_twists(self, trainer, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The modulated q's log-probs of the completion tokens and its twists, both [B, Lc] with the
        head's gradient. At temperature T the engine samples q_T ∝ pθ_T·e^{m/T} (its logits are divided
        by T), so the twist against pθ_T is m_t(s_t)/T (the fork samples at T = 1)."""
        completion = batch["completion_ids"]
        ids = torch.cat([batch["prompt_ids"], completion], dim=1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.module(input_ids=ids, attention_mask=mask, position_ids=positions,
                          logits_to_keep=completion.size(1) + 1)
        logits, modulation = out.logits[:, :-1], out.modulation[:, :-1]
        temperature = trainer.rlhf_args.temperature or 1.0
        index = completion[..., None]
        logps = (logits / temperature).log_softmax(-1).gather(-1, index)[..., 0]
        return logps, modulation.gather(-1, index)[..., 0] / temperature

    def generate(self, rollout_: "HarmlessRollout", prompts: list[dict], n: int) -> list[Trajectory]:
        requests = [RolloutInferRequest(messages=list(p["messages"]), data_dict=p["columns"]) for p in prompts]
        modules = (self.module, self.module.policy) if self.modulated else (self.module,)
        with eval_mode(*modules):
            return rollout(self.engine, rollout_.trainer.template, requests, rollout_.request_config(), n,
                           scheduler=rollout_.scheduler, max_completion_length=rollout_.a.max_completion_length)

    def close(self) -> None:
        if self.adapter is None:
            self.engine.close()

    @property
    def parameterization(self) -> str:
        return self._parameterization

    # -- checkpoints -------------------------------------------------------------------------------
    def save_checkpoint(self, directory: str) -> None:
        from safetensors.torch import save_file

        save_file({n: p.detach().contiguous() for n, p in self.named}, os.path.join(directory, PROPOSAL_STATE))

    def load_checkpoint(self, directory: str) -> None:
        from safetensors.torch import load_file

        path = os.path.join(directory, PROPOSAL_STATE)
        saved = load_file(path) if os.path.exists(path) else {}
        mine = dict(self.named)
        if set(saved) != set(mine):
            raise SwiftError(f"--resume_from_checkpoint {directory}: {PROPOSAL_STATE} does not hold this run's "
                             "proposal; resume with the --proposal and tuner settings it was saved with")
        with torch.no_grad():
            for name, tensor in saved.items():
                mine[name].copy_(tensor)

    def save_final(self, output_dir: str, tokenizer) -> None:
        """The copy under `proposal/` (a LoRA proposal adapter is saved there by PEFT with the policy; a
        modulation head as `proposal/modulation_head.safetensors`)."""
        if self.modulated:
            from safetensors.torch import save_file

            directory = os.path.join(output_dir, PROPOSAL_DIR)
            os.makedirs(directory, exist_ok=True)
            if self.module.model is not None:
                self.module.model.save_pretrained(directory)
                tokenizer.save_pretrained(directory)
                logits = "log_softmax(log_softmax(policy logits) + this model's logits)"
            else:
                save_file({n: p.detach().contiguous() for n, p in self.module.head.named_parameters()},
                          os.path.join(directory, MODULATION_HEAD))
                logits = "log_softmax(log_softmax(policy logits) + head(policy last hidden state))"
            with open(os.path.join(directory, "modulation.json"), "w") as f:
                json.dump({"parameterization": self.parameterization, "logits": logits}, f)
        elif self.adapter is None:
            self.module.save_pretrained(os.path.join(output_dir, PROPOSAL_DIR))
            tokenizer.save_pretrained(os.path.join(output_dir, PROPOSAL_DIR))


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
        trajectories, rewards, per_func = super()._sample_and_score(prompts, uses, queue, cycle)
        t.negdata.add(prompts, trajectories, rewards, self.n, "policy", t.state.global_step)
        self._neg = self.negatives(prompts) if t.proposal is not None else None
        return trajectories, rewards, per_func

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
            with open(path) as f:
                for line in f:
                    row = json.loads(line)
                    self.seen.add((tuple(row["prompt_ids"]), tuple(row["completion_ids"])))

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
        if self.rlhf_args.evaluate_on_neg_data:
            result.metrics.update(self.evaluate_on_neg_data(self.rlhf_args.evaluate_on_neg_data))
        return result

    def evaluate_on_neg_data(self, path: str) -> dict[str, float]:
        """The samples of a negdata.jsonl under the trained policy: their mean log-prob and the mean
        over prompts of the log-sum-exp of their prompt's samples (a lower bound on log P(bad))."""
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        if not rows:
            raise SwiftError(f"--evaluate_on_neg_data {path}: no samples")
        sums = []
        size = self.args.per_device_eval_batch_size
        with torch.no_grad(), eval_mode(self.model):
            for start in range(0, len(rows), size):
                part = [Trajectory(r["prompt_ids"], r["completion_ids"], r["loss_mask"], r["completion"], False, [])
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
