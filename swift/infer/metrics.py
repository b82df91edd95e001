"""Per-row scores for batch inference: exact match (`acc`) and ROUGE-L F1 (`rouge`)."""
from __future__ import annotations


def exact_match(prediction: str, reference: str) -> float:
    return float(prediction.strip() == reference.strip())


def _units(prediction: str, reference: str) -> tuple[list[str], list[str]]:
    """Both texts in one unit: words when either has more than one word, else characters (text
    without spaces, e.g. Chinese, or a single word on each side). Before 2026-11-29 each side chose
    its own unit, so `rouge_l("The answer is 42", "42")` compared words with characters: 0."""
    a, b = prediction.split(), reference.split()
    if len(a) > 1 or len(b) > 1:
        return a, b
    return list(prediction.strip()), list(reference.strip())


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F1 (Lin 2004): longest common subsequence of units (`_units`), harmonic mean of P and R."""
    a, b = _units(prediction, reference)
    if not a or not b:
        return float(a == b)
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    lcs = prev[-1]
    if lcs == 0:
        return 0.0
    p, r = lcs / len(a), lcs / len(b)
    return 2 * p * r / (p + r)


METRICS = {"acc": exact_match, "rouge": rouge_l}
