"""PPO with a learned critic on the online loop of `swift.trainers.grpo` (sampling, scoring, the
generation batch trained on `--num_ppo_epochs` times in `--num_mini_batches` optimizer steps,
weight pushes, checkpoints). What differs is the advantage (GAE from per-token rewards and the
critic's values, `swift.rlhf.ppo`) and the loss (the clipped policy loss plus `--vf_coef` × the
clipped value loss).

The critic is a part chosen by `--critic_backbone` (`swift.trainers.critic`): a separate value
model, or a value head on the policy's own last hidden state. Its parameters are more groups of
the trainer's optimizer (so one optimizer state and one schedule, as TRL's PPO), at
`--critic_learning_rate`; before each optimizer step its gradients are averaged over ranks and
clipped at `--max_grad_norm` on their own. Checkpoints hold its trained tensors, its optimizer
state with the policy's, and the KL controller with the loop's state."""
from __future__ import annotations

import torch

from swift.rlhf.grpo import LOSS_TYPES, kl_estimate
from swift.rlhf.ppo import KLController, gae, mean_and_var, moments, token_rewards, value_loss, whiten
from swift.rlhf.reduce import logged
from swift.trainers.critic import Critic
from swift.trainers.grpo import GRPOTrainer
from swift.trainers.rollout import Rollout


class PPORollout(Rollout):
    """GRPO's rollout with PPO's advantages: per-token rewards, the critic's values and GAE; its KL
    controller sets the reward's KL coefficient."""
    always_old_logps = True  # the KL penalty of the reward compares them with the reference's

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kl_ctl = KLController(self.a.beta, self.a.kl_target, self.a.kl_horizon)

    def sampling_modules(self) -> list:
        return [self.trainer.model, self.trainer.critic.module]

    def sampling_forward(self, batch: dict, device_batch: dict) -> None:
        """The log-probs at sampling and the critic's values (a shared critic reads them off the same
        forward's hidden states)."""
        t = self.trainer
        logps, _, *hidden = t._token_logps(t.model, device_batch, with_hidden=t.critic.needs_hidden)
        batch["old_logps"] = logps.detach()
        batch["values"] = t.critic.values(device_batch, hidden[0] if hidden else None).detach()

    def assign_advantages(self, micro: list[dict], rewards: torch.Tensor, trajectories, steps=None) -> torch.Tensor:
        """Per-token rewards (the score on the last token, −β KL on each, each step's process reward
        on its last token), the critic's values, GAE advantages whitened over the generation batch
        (all ranks) and the returns the critic learns."""
        a = self.a
        scores = rewards.nan_to_num(0.0)
        truncated = torch.tensor([t.truncated for t in trajectories], dtype=scores.dtype)
        if a.missing_eos_penalty is not None:
            scores = scores - a.missing_eos_penalty * truncated
        if a.reward_clip_range:
            scores = scores.clamp(*a.reward_clip_range)
        rows = self.args.per_device_train_batch_size
        per_token, masks, kl_sums = [], [], []
        for i, batch in enumerate(micro):
            device_batch = self.trainer._prepare_inputs(dict(batch))
            mask = device_batch["completion_mask"].float()
            batch["values"] = batch["values"] * mask
            kl = torch.zeros_like(mask)
            if batch.get("ref_logps") is not None:  # on the tokens the policy sampled (not a tool's output)
                sampled = device_batch["loss_mask"].float() * mask
                kl = kl_estimate(batch["old_logps"].float(), batch["ref_logps"].float(), a.kl_estimator) * sampled
            r = token_rewards(scores[i * rows:(i + 1) * rows].to(mask.device), kl, mask, self.kl_ctl.value)
            for j, row in enumerate(steps[i * rows:(i + 1) * rows] if steps is not None else []):
                for end, value in row:
                    if end < r.size(1):
                        r[j, end] += value
            per_token.append(r)
            masks.append(mask)
            kl_sums.append(kl.sum(-1))
        if a.whiten_rewards:
            stats = self.global_sum(moments(per_token, masks))
            per_token = [whiten(r, m, stats, shift_mean=False) for r, m in zip(per_token, masks)]
        advantages, returns = [], []
        for batch, r, m in zip(micro, per_token, masks):
            adv, ret = gae(r, batch["values"], m, a.gamma, a.lam)
            advantages.append(adv)
            returns.append(ret)
        loss_masks = [batch["loss_mask"].to(m.device) for batch, m in zip(micro, masks)]
        stats = self.global_sum(moments(advantages, loss_masks))
        for batch, adv, ret, m in zip(micro, advantages, returns, loss_masks):
            batch["advantages"] = whiten(adv, m, stats)
            batch["returns"] = ret
        self._log_ppo_rollout(micro, scores, torch.cat(kl_sums).cpu(), loss_masks)
        return torch.cat([b["advantages"][:, 0].cpu() for b in micro])  # each completion's first-token advantage

    def _log_ppo_rollout(self, micro, scores, kl_sums, loss_masks) -> None:
        """The rollout's metrics under TRL's PPO names, over every rank's completions; then the KL
        controller steps towards its target with the batch's mean sequence KL."""
        local = torch.stack([kl_sums.sum(), scores.sum(), torch.tensor(float(len(scores))),
                             sum(-(b["old_logps"].float() * m).sum() for b, m in zip(micro, loss_masks)).cpu(),
                             torch.tensor(float(sum(int((~b["truncated"]).sum()) for b in micro)))]).double()
        kl_total, score_total, n, neg_logp_total, eos = self.global_sum(local).tolist()
        # how much of the returns' variance the critic's values explain
        _, var_returns = mean_and_var(self.global_sum(moments([b["returns"] for b in micro], loss_masks)))
        _, var_errors = mean_and_var(self.global_sum(moments([b["returns"] - b["values"] for b in micro], loss_masks)))
        kl, score = kl_total / n, score_total / n
        beta = self.kl_ctl.value
        m = self.trainer._metrics["train"]
        m["objective/kl"].append(kl)
        m["objective/entropy"].append(neg_logp_total / n)
        m["objective/non_score_reward"].append(-beta * kl)
        m["objective/rlhf_reward"].append(score - beta * kl)
        m["objective/scores"].append(score)
        m["objective/kl_coef"].append(beta)
        m["val/num_eos_tokens"].append(eos)
        m["val/var_explained"].append(1 - var_errors / var_returns if var_returns > 0 else 0.0)
        self.kl_ctl.update(kl, int(n))


class PPOTrainer(GRPOTrainer):
    rollout_class = PPORollout
    reshuffle_passes = True  # new mini-batches on every PPO epoch, as TRL

    def __init__(self, *args, critic: Critic, **kwargs):
        super().__init__(*args, **kwargs)
        self.critic = critic
        if self.accelerator.num_processes > 1:
            self.critic.broadcast()

    # -- optimizer ---------------------------------------------------------------------------------
    def create_optimizer(self, model=None):
        optimizer = super().create_optimizer(model)
        named = self.critic.named_trainable()
        known = {id(p) for group in optimizer.param_groups for p in group["params"]}
        if named and id(named[0][1]) not in known:
            lr = self.rlhf_args.critic_learning_rate
            lr = self.args.learning_rate if lr is None else lr
            decay = set(self.get_decay_parameter_names(self.critic.module))  # biases and norms without, as the policy's
            for with_decay in (True, False):
                params = [p for n, p in named if (n in decay) == with_decay]
                if params:
                    optimizer.add_param_group({"params": params, "lr": lr,
                                               "weight_decay": self.args.weight_decay if with_decay else 0.0})
        return optimizer

    def training_step(self, model, inputs, num_items_in_batch=None):
        ga = self.args.gradient_accumulation_steps
        if self._uses % ga == 0:  # the first micro-batch of an optimizer step
            self.critic.zero_grad()
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self._uses % ga == 0:  # the last one: the optimizer steps next
            norm = self.critic.reduce_and_clip(self.accelerator.num_processes, self.args.max_grad_norm)
            if norm is not None:
                self._metrics["train"]["val/grad_norm"].append(norm)
        return loss

    # -- checkpoints -------------------------------------------------------------------------------
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        """The policy as the HF Trainer saves it, and the critic: at the end as `--critic_backbone`
        says (`critic/` or `value_head.safetensors`), in a checkpoint as the tensors it trains in
        `critic.safetensors` (not a folder: the HF Trainer's resume would take a folder holding an
        adapter for one of the policy's adapters)."""
        super().save_model(output_dir, _internal_call)
        if not self.args.should_save:
            return
        output_dir = output_dir or self.args.output_dir
        if _internal_call:
            self.critic.save_checkpoint(output_dir)
        else:
            self.critic.save_final(output_dir, self.processing_class)

    def _loop_state(self) -> dict:
        return {"kl_controller": self.rollout.kl_ctl.state_dict()}

    def _load_loop_state(self, state: dict, checkpoint: str) -> None:
        self.rollout.kl_ctl.load_state_dict(state["kl_controller"])
        self.critic.load_checkpoint(checkpoint)

    # -- loss --------------------------------------------------------------------------------------
    def loss_and_metrics(self, model, inputs):
        a = self.rlhf_args
        policy, info, entropies, metrics = self._policy_objective(model, inputs, beta=0.0,
                                                                  with_hidden=self.critic.needs_hidden)
        mask = inputs["loss_mask"]
        values = self.critic.values(inputs, info.get("hidden"))
        critic, value_clipped = value_loss(values, inputs["values"], inputs["returns"], mask,
                                           cliprange_value=a.cliprange_value,
                                           aggregate=LOSS_TYPES.get(a.loss_type[0]).aggregate,
                                           max_completion_length=a.max_completion_length)
        terms = dict(policy)
        for kind, value in critic.items():
            terms[kind] = terms[kind] + a.vf_coef * value if kind in terms else a.vf_coef * value
        tokens = mask.sum().clamp(min=1)

        def masked_mean(x):
            return ((x.float() * mask).sum() / tokens).item()

        log_ratio = (info["logps"] - inputs["old_logps"]).detach()
        ratio = info["ratio"].detach()
        mean_ratio = masked_mean(ratio)
        metrics.update({
            "policy/approxkl_avg": masked_mean(0.5 * log_ratio ** 2),
            "policy/clipfrac_avg": masked_mean(info["low_clipped"] | info["high_clipped"]),
            # as logged (averaged over micro-batches and ranks): the step's losses
            "loss/policy_avg": logged(policy, inputs), "loss/value_avg": logged(critic, inputs),
            "val/clipfrac_avg": masked_mean(value_clipped), "policy/entropy_avg": masked_mean(entropies),
            "val/ratio": mean_ratio, "val/ratio_var": masked_mean((ratio - mean_ratio) ** 2)})
        return terms, metrics
