"""Per-row scores for batch inference: exact match (`acc`) and ROUGE-L F1 (`rouge`)."""
from __future__ import annotations


def exact_match(prediction: str, reference: str) -> float:
    return float(prediction.strip() == reference.strip())


def _units(text: str) -> list[str]:
    words = text.split()
    # text without spaces (e.g. Chinese) is compared character by character
    return words if len(words) > 1 or not text.strip() else list(text.strip())


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F1 (Lin 2004): longest common subsequence of words, harmonic mean of P and R."""
    a, b = _units(prediction), _units(reference)
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
