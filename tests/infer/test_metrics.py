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
