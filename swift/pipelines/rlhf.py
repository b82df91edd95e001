"""`swift rlhf`: offline preference alignment (DPO and its loss variants) on the shared trainer path."""
from __future__ import annotations

import copy
from typing import Any

import torch

from swift.arguments.rlhf import RLHFArguments
from swift.dataset.loader import RowSet
from swift.model import load_model
from swift.pipelines.base import resolve_args
from swift.pipelines.train import TrainPipeline
from swift.template.base import IGNORE_INDEX, RowError, Template
from swift.trainers.preference import PreferenceTrainer


def encode_pair(template: Template, row: dict) -> dict:
    """Chosen (the row's last assistant turn) and rejected (`rejected_response`), loss on the answer only."""
    if "rejected_response" not in row:
        raise RowError("no rejected response (preference data needs chosen and rejected)")
    messages = row["messages"]
    if messages[-1]["role"] != "assistant":
        raise RowError("the last message must be the chosen assistant answer")
    chosen = template.encode(row)
    rejected = template.encode({**row, "messages": [*messages[:-1],
                                                    {"role": "assistant", "content": row["rejected_response"]}]})
    return {"chosen_input_ids": chosen.input_ids, "chosen_labels": chosen.labels,
            "rejected_input_ids": rejected.input_ids, "rejected_labels": rejected.labels}


class PairCollator:
    """Pads a batch of pairs into one tensor: [chosen_1..chosen_B, rejected_1..rejected_B]."""

    def __init__(self, pad_token_id: int):
        self.pad = pad_token_id

    def __call__(self, batch: list[dict]) -> dict[str, torch.Tensor]:
        seqs = [(b[f"{side}_input_ids"], b[f"{side}_labels"]) for side in ("chosen", "rejected") for b in batch]
        width = max(len(ids) for ids, _ in seqs)
        ids = torch.full((len(seqs), width), self.pad, dtype=torch.long)
        labels = torch.full((len(seqs), width), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, (x, y) in enumerate(seqs):
            ids[i, :len(x)], labels[i, :len(y)], mask[i, :len(x)] = torch.tensor(x), torch.tensor(y), 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}


class RLHFPipeline(TrainPipeline):
    trainer_cls = PreferenceTrainer

    def encode(self, rowset: RowSet, template: Template, desc: str) -> list[dict]:
        samples = []
        for row, origin in zip(rowset.rows, rowset.origins):
            try:
                samples.append(encode_pair(template, row))
            except RowError as e:
                rowset.reject(origin, e, self.args.strict)
        return samples

    def collator(self, tokenizer, model):
        return PairCollator(tokenizer.pad_token_id)

    def trainer_kwargs(self, model) -> dict[str, Any]:
        a = self.args
        if a.ref_model:
            ref = load_model(a.ref_model, use_hf=a.use_hf, torch_dtype=a.torch_dtype)[0]
        elif a.tuner_type == "lora" and not a.adapters:
            ref = None  # the policy with its adapters disabled
        else:
            ref = copy.deepcopy(model)  # full tuning: freeze the starting weights
        return {"ref_model": ref, "rlhf_args": a.rlhf_args}


def rlhf_main(args: RLHFArguments | list[str] | None = None) -> dict[str, Any]:
    """Run `swift rlhf`; returns output dir, checkpoints and final metrics like `sft_main`."""
    return RLHFPipeline(resolve_args(RLHFArguments, args, "swift rlhf")).run()
