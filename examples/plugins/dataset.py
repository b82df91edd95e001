"""A dataset: two-digit subtraction, as `builtin:subtraction` (also `#N` rows, `:eval` split).

    swift sft --external_plugins examples/plugins/dataset.py --dataset builtin:subtraction#200 ...

A dataset is a function of the split ("train" or "eval") returning rows in any format the loader
reads (here messages, with a `solution` column for reward functions).
"""
from swift.plugin import register


@register("dataset", "subtraction")
def subtraction(split: str = "train") -> list[dict]:
    pairs = [(a, b) for a in range(10, 100) for b in range(10, a + 1)]
    pairs = [p for i, p in enumerate(pairs) if (i % 20 == 0) == (split == "eval")]
    return [{"messages": [{"role": "user", "content": f"{a}-{b}="}, {"role": "assistant", "content": str(a - b)}],
             "solution": str(a - b)} for a, b in pairs]
