"""A reward plugin for tests: the completion's length in characters, which varies from completion
to completion even when every one runs to the token limit (so the advantages are not all zero)."""
from swift.rewards import ORM, orms


class TextLength(ORM):
    def __call__(self, completions, **kwargs):
        return [float(len(c)) for c in completions]


orms["text_length"] = TextLength


class TextLengthFirstUnscored(ORM):
    """As text_length, but the first completion of every call gets no reward (None): a row that
    carries no loss, in the first micro-batch only."""

    def __call__(self, completions, **kwargs):
        return [None if i == 0 else float(len(c)) for i, c in enumerate(completions)]


orms["text_length_first_unscored"] = TextLengthFirstUnscored


class TextLengthSevensUnscored(ORM):
    """As text_length, but a completion with a 7 in it gets no reward (None): which rows carry no
    loss depends on the text alone, so it is the same however the batch is split over ranks."""

    def __call__(self, completions, **kwargs):
        return [None if "7" in c else float(len(c)) for c in completions]


orms["text_length_sevens_unscored"] = TextLengthSevensUnscored
