from typing import TYPE_CHECKING

from swift.arguments.base import ComposedArguments
from swift.arguments.data import DataArguments
from swift.arguments.model import ModelArguments
from swift.arguments.template import TemplateArguments
from swift.arguments.tuner import TunerArguments

__all__ = [
    "ComposedArguments", "DataArguments", "ModelArguments", "TemplateArguments", "TunerArguments",
    "TrainingArguments", "SftArguments", "PtArguments", "TrainArguments",
]
if TYPE_CHECKING:  # pragma: no cover
    from swift.arguments.train import PtArguments, SftArguments, TrainArguments, TrainingArguments  # noqa: F401
_TRAIN = {"TrainingArguments", "SftArguments", "PtArguments", "TrainArguments"}


def __getattr__(name: str):
    """The training argument classes on first use: they import transformers' TrainingArguments, which
    imports peft (seconds), so `swift infer/deploy/eval` without adapters start without either."""
    if name in _TRAIN:
        from swift.arguments import train

        return getattr(train, name)
    raise AttributeError(f"module 'swift.arguments' has no attribute {name!r}")
