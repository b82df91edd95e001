"""Built-in demo datasets: two-digit addition, learnable by the built-in tiny model in minutes.

Every pair (a, b) with 0 <= a, b < 100 appears once; a fixed hash of the unordered pair {a, b} puts
about 5% of them in the eval split, so a + b and b + a always land in the same split (an eval sum is
never answered by its swapped twin in training) and the split is the same on every machine and run.
Operands are written with two digits ("07+45=") so every digit sits at a fixed position, which a
1M-parameter model learns in minutes.
"""
from __future__ import annotations

import hashlib

from swift.utils.registry import Registry
from swift.plugin import register

BUILTIN_DATASETS: Registry = Registry("built-in dataset")
SPLITS = ("train", "eval")


def _pairs(split: str) -> list[tuple[int, int]]:
    def is_eval(a: int, b: int) -> bool:
        low, high = min(a, b), max(a, b)
        return hashlib.md5(f"{low}+{high}".encode()).digest()[0] < 13  # ~5% of 256

    return [(a, b) for a in range(100) for b in range(100) if is_eval(a, b) == (split == "eval")]


@register("dataset", "arith-sft")
def arith_sft(split: str = "train") -> list[dict]:
    """Chat rows: user 'aa+bb=' → assistant 'c'; the `solution` column holds the answer."""
    return [{"messages": [{"role": "user", "content": f"{a:02d}+{b:02d}="}, {"role": "assistant", "content": str(a + b)}],
             "solution": str(a + b)} for a, b in _pairs(split)]


@register("dataset", "arith-pt")
def arith_pt(split: str = "train") -> list[dict]:
    """Raw text rows 'aa+bb=c' for pre-training."""
    return [{"text": f"{a:02d}+{b:02d}={a + b}"} for a, b in _pairs(split)]


@register("dataset", "arith-dpo")
def arith_dpo(split: str = "train") -> list[dict]:
    """Preference rows: the true sum is chosen, a different number in 0..198 is rejected.

    The rule is learnable from surface features long before full addition is (the units digit of
    the sum alone tells most pairs apart), so DPO's held-out preference accuracy rises quickly.
    """
    rows = []
    for a, b in _pairs(split):
        h = hashlib.md5(f"dpo:{a}+{b}".encode()).digest()
        wrong = (a + b + 1 + int.from_bytes(h[:2], "big") % 198) % 199  # never equals a + b
        rows.append({"messages": [{"role": "user", "content": f"{a:02d}+{b:02d}="},
                                  {"role": "assistant", "content": str(a + b)}],
                     "rejected_response": str(wrong)})
    return rows


@register("dataset", "arith-kto")
def arith_kto(split: str = "train") -> list[dict]:
    """Unpaired rows for KTO: each sum once, with the true answer (label true) or the arith-dpo
    wrong answer (label false), chosen by a fixed hash (about half each)."""
    rows = []
    for row in arith_dpo(split):
        prompt = row["messages"][0]["content"]
        desirable = hashlib.md5(f"kto:{prompt}".encode()).digest()[0] % 2 == 0
        answer = row["messages"][1]["content"] if desirable else row["rejected_response"]
        rows.append({"messages": [row["messages"][0], {"role": "assistant", "content": answer}], "label": desirable})
    return rows


@register("dataset", "arith-prm")
def arith_prm(split: str = "train") -> list[dict]:
    """Step-labelled rows for process reward models: 'aa+bb+cc=' solved in two steps
    ('aa+bb=s', 's+cc=t'). A fixed hash corrupts the first step, the second, or neither; a step is
    labelled correct when it and every step before it are right (TRL's stepwise format:
    `prompt`, `completions`, `labels`)."""
    rows = []
    for a, b in _pairs(split):
        h = hashlib.md5(f"prm:{a}+{b}".encode()).digest()
        c = h[0] % 100
        first, second = a + b, a + b + c
        wrong = h[1] % 3  # 0: none, 1: the first step, 2: the second step
        shown_first = first + 1 + h[2] % 9 if wrong == 1 else first
        shown_second = shown_first + c + (1 + h[3] % 9 if wrong == 2 else 0)
        rows.append({"prompt": f"{a:02d}+{b:02d}+{c:02d}=",
                     "completions": [f"{a:02d}+{b:02d}={shown_first}", f"{shown_first}+{c:02d}={shown_second}"],
                     "labels": [wrong != 1, wrong == 0]})
    return rows


@register("dataset", "arith-steps")
def arith_steps(split: str = "train") -> list[dict]:
    """Chat rows for the two-step sums of arith-prm, solved correctly: user 'aa+bb+cc=' → assistant
    'aa+bb=s' newline 's+cc=t'; `solution` holds t (a policy task for process rewards)."""
    rows = []
    for row in arith_prm(split):
        a, b, c = row["prompt"][:-1].split("+")
        first = int(a) + int(b)
        total = first + int(c)
        rows.append({"messages": [{"role": "user", "content": row["prompt"]},
                                  {"role": "assistant", "content": f"{a}+{b}={first}\n{first}+{c}={total}"}],
                     "solution": str(total)})
    return rows
