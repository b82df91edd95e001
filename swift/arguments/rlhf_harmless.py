"""`--rlhf_type harmless`: the negdata.jsonl reader (`--evaluate_on_neg_data`, checked whole before
training, and again against the model's vocabulary once it is loaded) and the sampling flags a
trained proposal cannot honour."""
from __future__ import annotations

import json

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
