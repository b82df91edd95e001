import pytest

from swift.infer.metrics import exact_match, rouge_l


def test_exact_match():
    assert exact_match(" 42\n", "42") == 1.0 and exact_match("41", "42") == 0.0


def test_rouge_l():
    assert rouge_l("the cat sat on the mat", "the cat sat on the mat") == 1.0
    # LCS "the cat the mat" = 4 of 6 predicted and 4 of 6 reference words
    assert rouge_l("the cat was under the mat", "the cat sat on the mat") == pytest.approx(4 / 6)
    assert rouge_l("", "x") == 0.0
    assert rouge_l("今天天气好", "今天天气很好") == pytest.approx(2 * 1.0 * (5 / 6) / (1 + 5 / 6))


def test_rouge_l_compares_both_sides_in_one_unit():
    """Words on both sides when either side has several (before 2026-11-29 a one-word side was split
    into characters and matched nothing of the other's words)."""
    assert rouge_l("The answer is 42", "42") == pytest.approx(2 * 0.25 * 1 / 1.25)
    assert rouge_l("Paris", "Paris is the capital") == pytest.approx(2 * 1 * 0.25 / 1.25)
    assert rouge_l("42", "43") == pytest.approx(0.5)  # a single word each: characters
