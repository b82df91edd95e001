"""pass@k and mean@k over n samples per question."""
from __future__ import annotations

from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate (Chen et al. 2021) that at least one of k of the n samples, c of them
    correct, is correct: 1 − C(n−c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"k={k} > n={n}")
    return 1.0 if n - c < k else 1.0 - comb(n - c, k) / comb(n, k)


def ks(n: int) -> list[int]:
    """The k reported for n samples: 1, the powers of two below n, and n."""
    out, k = [], 1
    while k < n:
        out.append(k)
        k *= 2
    return out + [n]


def summarize(scores: list[list[float]]) -> dict[str, float]:
    """Per-question lists of n sample scores (1 correct, 0 not) → acc (the mean score of all samples),
    pass@k for the k of `ks(n)`, and mean@n (the mean over questions of each one's mean score)."""
    n = len(scores[0]) if scores else 1
    metrics = {"acc": sum(map(sum, scores)) / max(sum(map(len, scores)), 1)}
    if n > 1:
        for k in ks(n):
            metrics[f"pass@{k}"] = sum(pass_at_k(n, sum(1 for v in s if v >= 1.0), k) for s in scores) / len(scores)
        metrics[f"mean@{n}"] = sum(sum(s) / n for s in scores) / len(scores)
    return metrics
