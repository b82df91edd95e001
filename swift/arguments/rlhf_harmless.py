"""`--rlhf_type harmless`: RePULSe's values and combinations (`HarmlessChecks`, mixed into
`RlhfArguments`), the negdata.jsonl reader (`--evaluate_on_neg_data`, checked whole before training,
and again against the model's vocabulary once it is loaded) and the sampling flags a trained proposal
cannot honour."""
from __future__ import annotations

import json
import os

from swift.utils.registry import SwiftError

NEG_DATA_KEYS = ("prompt_ids", "completion_ids", "loss_mask")  # what the evaluation reads of a row


def _ids(value, vocab_size: int | None) -> bool:
    return isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 and (vocab_size is None or i < vocab_size)
        for i in value)


def read_neg_data(path: str, vocab_size: int | None = None) -> list[dict]:
    """The rows of a negdata.jsonl (blank lines skipped), each checked: a JSON object whose prompt_ids
    (not empty) and completion_ids are token ids (below `vocab_size` when given) and whose loss_mask
    has one 0/1 per completion token. A bad row is refused in one line naming the file and line."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"--evaluate_on_neg_data {path} line {number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise SwiftError(f"{where}: not JSON ({e.msg})") from None
            missing = [k for k in NEG_DATA_KEYS if not isinstance(row, dict) or k not in row]
            if missing:
                raise SwiftError(f"{where}: no {', '.join(missing)} (a row of a --save_negdata negdata.jsonl has "
                                 f"{', '.join(NEG_DATA_KEYS)})")
            for key in ("prompt_ids", "completion_ids"):
                if not _ids(row[key], vocab_size):
                    bound = f" below the model's vocabulary size {vocab_size}" if vocab_size is not None else ""
                    raise SwiftError(f"{where}: {key} must be a list of token ids (integers >= 0{bound})")
            if not row["prompt_ids"]:
                raise SwiftError(f"{where}: prompt_ids is empty")
            mask = row["loss_mask"]
            if not isinstance(mask, list) or len(mask) != len(row["completion_ids"]) or any(
                    m not in (0, 1) or isinstance(m, bool) for m in mask):
                raise SwiftError(f"{where}: loss_mask must hold one 0 or 1 per completion token "
                                 f"({len(row['completion_ids'])})")
            rows.append(row)
    if not rows:
        raise SwiftError(f"--evaluate_on_neg_data {path}: no samples")
    return rows


def refuse_proposal_sampling(a) -> None:
    """A trained proposal's importance weights and CTL loss use q's (and pθ's) whole, unpenalised
    distribution: a sampler that truncates or penalises it would sample another one."""
    given = ("--top_k" if a.top_k else "--top_p" if a.top_p < 1.0 else
             "--repetition_penalty" if a.repetition_penalty != 1.0 else None)
    if given:
        raise SwiftError(f"{given} with a proposal: its importance weights and CTL use q's whole distribution, not "
                         "the truncated or penalised one the engine would sample (leave it off)")


class HarmlessChecks:
    """`RlhfArguments`' checks of the harmless flags (`swift.arguments.rlhf_flags.HarmlessFlags`)."""

    def _check_harmless(self) -> None:
        """RePULSe's values and combinations (`swift.rlhf.harmless`): what the fork refuses or cannot
        mean, then the flags this configuration would not read."""
        choices = {"harmlessness_training_loss_type": ("neg_training", "neg_reinforce", "reinforce"),
                   "neg_baseline_type": (None, "none", "expectation", "hardcoded", "other_expectation"),
                   "rm_type": ("rlhf", "indicator_below_threshold"),
                   "reward_transform": (None, "minus_alpha_exp_beta_r", "minus_alpha_ind"),
                   "reinforce_baseline_type": ("expectation", "none"),
                   "actor_loss_type": ("ctl", "ctl_nosecondterm", "dpg"),
                   "parameterization": ("policy_psi_q_p_s_t", "policy_psi_q_p_s_1_to_t", "policy",
                                        "modulation_linear_head", "modulation_nn_head", "modulation_model"),
                   "proposal": (None, "copy", "adapter")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise SwiftError(f"--{name} {getattr(self, name)!r} is not one of {', '.join(a for a in allowed if a)}")
        if self.num_generations < 2:
            raise SwiftError(f"--num_generations (the fork's --duplicate_rollout_batch_by) must be at least 2 for "
                             f"--rlhf_type harmless, got {self.num_generations}: the baseline and the importance "
                             "weights compare the samples of one prompt")
        if self.num_episodes < 1:
            raise SwiftError(f"--num_episodes must be >= 1, got {self.num_episodes}")
        if self.actor_learning_rate < 0:
            raise SwiftError(f"--actor_learning_rate must be >= 0, got {self.actor_learning_rate}")
        if self.evaluate_on_neg_data and not os.path.isfile(self.evaluate_on_neg_data):
            raise SwiftError(f"--evaluate_on_neg_data {self.evaluate_on_neg_data}: no such file")
        if self.evaluate_on_neg_data:  # read whole now: a bad row must not stop the run after training
            read_neg_data(self.evaluate_on_neg_data)
        loss_type = self.harmlessness_training_loss_type
        negatives = loss_type != "reinforce"
        if negatives and self.target_dist_beta is None:
            raise SwiftError(f"--harmlessness_training_loss_type {loss_type} needs --target_dist_beta (β < 0, e.g. "
                             "-10; 1 with --rm_type indicator_below_threshold)")
        if negatives and not self.use_base_as_proposal:
            refuse_proposal_sampling(self)
        if loss_type == "neg_reinforce":
            self._check_neg_reinforce()
        elif self.neg_baseline_type is not None or self.neg_hardcoded_baseline is not None:
            name = "neg_baseline_type" if self.neg_baseline_type is not None else "neg_hardcoded_baseline"
            raise SwiftError(f"--{name} does nothing with --harmlessness_training_loss_type {loss_type} (it is "
                             "neg_reinforce's)")
        if self.rm_type == "indicator_below_threshold" and self.target_dist_beta not in (None, 1.0):
            raise SwiftError(f"--rm_type indicator_below_threshold takes --target_dist_beta 1 (the indicator is the "
                             f"target's weight), got {self.target_dist_beta}")
        if self.reward_transform == "minus_alpha_exp_beta_r" and self.rew_trans_beta is None \
                and self.target_dist_beta is None:
            raise SwiftError("--reward_transform minus_alpha_exp_beta_r needs --rew_trans_beta (or --target_dist_beta)")
        twist = self.actor_loss_type in ("ctl", "ctl_nosecondterm")
        if twist and self.parameterization == "policy":
            raise SwiftError(f"--actor_loss_type {self.actor_loss_type} learns a twist: give --parameterization "
                             "policy_psi_q_p_s_t or policy_psi_q_p_s_1_to_t (policy goes with dpg)")
        if not twist and self.parameterization != "policy":
            raise SwiftError("--actor_loss_type dpg trains the proposal as a policy: give --parameterization policy")
        self._check_modulation()
        self._refuse_harmless_unread(negatives)

    def _check_modulation(self) -> None:
        modulated = self.parameterization.startswith("modulation_")
        if modulated and self.actor_loss_type != "ctl":
            raise SwiftError(f"--parameterization {self.parameterization} takes --actor_loss_type ctl (as the fork: "
                             "its twist is the head's output)")
        if modulated and self.proposal is not None:
            raise SwiftError(f"--proposal {self.proposal} does nothing with --parameterization {self.parameterization}: "
                             "the proposal is the modulation (a head on the policy, or a second model's logits)")
        linear = self.parameterization in ("modulation_linear_head", "modulation_model")
        if self.init_head_from_base and not linear:
            raise SwiftError("--init_head_from_base starts a linear modulation layer from the output layer: give "
                             "--parameterization modulation_linear_head or modulation_model")
        if self.additional_sd_divider != 1.0 and not linear:
            raise SwiftError("--additional_sd_divider scales a linear modulation layer's start: give --parameterization "
                             "modulation_linear_head or modulation_model")
        if self.additional_sd_divider <= 0:
            raise SwiftError(f"--additional_sd_divider must be > 0, got {self.additional_sd_divider}")

    def _check_neg_reinforce(self) -> None:
        """neg_reinforce: the fork's term raises log pθ where the return log φ − KL is above its baseline,
        which with β < 0 (or the indicator) is where the reward is low: only α < 0 pushes those down."""
        if self.alpha >= 0:
            raise SwiftError(f"--harmlessness_training_loss_type neg_reinforce with --alpha {self.alpha}: its term "
                             "raises the log-prob of proposal samples whose return log φ − KL is above the baseline, "
                             "the bad ones, so α ≥ 0 makes bad outputs likelier; give a negative --alpha (e.g. -0.5)")
        if self.use_base_as_proposal:
            raise SwiftError("--use_base_as_proposal with --harmlessness_training_loss_type neg_reinforce is not in "
                             "this version (the fork reuses the policy's samples with another reward scale there)")
        if self.reward_transform and self.rew_trans_alpha is None:
            raise SwiftError(f"--reward_transform {self.reward_transform} with neg_reinforce needs --rew_trans_alpha: "
                             f"its default, --alpha ({self.alpha}), is negative here and would reward bad answers")
        if (self.neg_baseline_type == "hardcoded") != (self.neg_hardcoded_baseline is not None):
            raise SwiftError("--neg_baseline_type hardcoded and --neg_hardcoded_baseline go together")

    def _refuse_harmless_unread(self, negatives: bool) -> None:
        """Harmless flags this configuration does not read (no proposal, no negative term, no transform)."""
        if not negatives or self.use_base_as_proposal:  # no proposal is trained
            defaults = {"actor_loss_type": "ctl", "parameterization": "policy_psi_q_p_s_t", "num_episodes": 1,
                        "actor_learning_rate": 1e-6, "proposal": None, "sampling_target_updated_base": False}
            given = [n for n, d in defaults.items() if getattr(self, n) != d]
            why = ("--use_base_as_proposal weights the policy's own samples" if negatives else
                   "--harmlessness_training_loss_type reinforce has no negative term")
            if given:
                raise SwiftError(f"--{given[0]} does nothing here: {why} (no proposal is trained)")
        if not negatives:
            for name in ("use_base_as_proposal", "uniform_reweight", "separate_reweighting_beta"):
                if getattr(self, name) not in (False, None):
                    raise SwiftError(f"--{name} does nothing with --harmlessness_training_loss_type reinforce")
            if self.rm_type != "rlhf":
                raise SwiftError("--rm_type sets the proposal's target; --harmlessness_training_loss_type reinforce "
                                 "has none (for a reward that penalises bad answers use --reward_transform "
                                 "minus_alpha_ind)")
            transform = self.reward_transform
            if self.alpha != 0.5 and not (transform and self.rew_trans_alpha is None):
                raise SwiftError("--alpha does nothing here: reinforce has no negative term (it is the default of "
                                 "--rew_trans_alpha, with --reward_transform)")
            if self.target_dist_beta is not None and not (transform == "minus_alpha_exp_beta_r"
                                                          and self.rew_trans_beta is None):
                raise SwiftError("--target_dist_beta does nothing here: reinforce has no target (it is the default "
                                 "of --rew_trans_beta, with --reward_transform minus_alpha_exp_beta_r)")
        if self.reward_transform is None:
            for name in ("rew_trans_alpha", "rew_trans_beta"):
                if getattr(self, name) is not None:
                    raise SwiftError(f"--{name} does nothing without --reward_transform")
        if self.reward_transform == "minus_alpha_ind" and self.rew_trans_beta is not None:
            raise SwiftError("--rew_trans_beta does nothing with --reward_transform minus_alpha_ind (r - a·1[r < "
                             "--threshold])")
        if self.uniform_reweight and self.separate_reweighting_beta is not None:
            raise SwiftError("--separate_reweighting_beta does nothing with --uniform_reweight (the weights are 1/N)")
        if self.save_negdata_threshold != -10000.0 and not self.save_negdata:
            raise SwiftError("--save_negdata_threshold does nothing without --save_negdata")
