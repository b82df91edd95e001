from swift.arguments.base import ComposedArguments
from swift.arguments.data import DataArguments
from swift.arguments.model import ModelArguments
from swift.arguments.template import TemplateArguments
from swift.arguments.train import PtArguments, SftArguments, TrainArguments, TrainingArguments
from swift.arguments.tuner import TunerArguments

__all__ = [
    "ComposedArguments", "DataArguments", "ModelArguments", "TemplateArguments", "TunerArguments",
    "TrainingArguments", "SftArguments", "PtArguments", "TrainArguments",
]
