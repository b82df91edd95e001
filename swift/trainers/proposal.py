"""RePULSe's proposal q (`swift.trainers.harmless`): a second copy of the starting model, a second
LoRA adapter `proposal` on the policy's base, or a modulation of the policy (a head on its last
hidden state, or a second model's logits: `Modulated`), with its own trainable tensors, AdamW,
inference engine and checkpoint files."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os

import torch
import torch.distributed as dist
from transformers import DynamicCache

from swift.rlhf.harmless import MODULATION
from swift.rollout.multi_turn import RolloutInferRequest
from swift.rollout.runner import Trajectory, rollout
from swift.trainers.completion_logps import token_logps
from swift.trainers.rlhf import disable_dropout
from swift.trainers.rollout import eval_mode
from swift.utils.registry import SwiftError

PROPOSAL_ADAPTER = "proposal"
PROPOSAL_DIR = "proposal"  # the trained proposal at the end of training
PROPOSAL_STATE = "proposal.safetensors"  # its trained tensors, in every checkpoint
MODULATION_HEAD = "modulation_head.safetensors"  # a modulation head, under PROPOSAL_DIR at the end

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



class Proposal:
    """q: its module (a copy, or the policy itself with the `proposal` adapter), trainable tensors,
    optimizer and engine."""

    def __init__(self, trainer, module, engine_factory):
        t, a = trainer, trainer.rlhf_args
        policy = t.accelerator.unwrap_model(t.model)
        self.modulated = a.parameterization in MODULATION
        self.parameterization = a.parameterization
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

    def generate(self, rollout_, prompts: list[dict], n: int) -> list[Trajectory]:
        requests = [RolloutInferRequest(messages=list(p["messages"]), data_dict=p["columns"]) for p in prompts]
        modules = (self.module, self.module.policy) if self.modulated else (self.module,)
        with eval_mode(*modules):
            return rollout(self.engine, rollout_.trainer.template, requests, rollout_.request_config(), n,
                           scheduler=rollout_.scheduler, max_completion_length=rollout_.a.max_completion_length)

    def close(self) -> None:
        if self.adapter is None:
            self.engine.close()


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
