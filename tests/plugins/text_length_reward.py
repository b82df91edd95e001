"""A reward plugin for tests: the completion's length in characters, which varies from completion
to completion even when every one runs to the token limit (so the advantages are not all zero)."""
from swift.rewards import ORM, orms


class TextLength(ORM):
    def __call__(self, completions, **kwargs):
        return [float(len(c)) for c in completions]


orms["text_length"] = TextLength
