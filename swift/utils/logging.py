"""Project logger: one format, rank-0 only for info by default."""
from __future__ import annotations

import logging
import os

_FORMAT = "[%(levelname)s:swift] %(message)s"


def get_logger(name: str = "swift") -> logging.Logger:
    logger = logging.getLogger(name)
    if not logging.getLogger("swift").handlers:
        root = logging.getLogger("swift")
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_FORMAT))
        root.addHandler(handler)
        # Only rank 0 talks at INFO; other ranks only warn. RANK is set by torchrun.
        root.setLevel(logging.INFO if os.environ.get("RANK", "0") == "0" else logging.WARNING)
        root.propagate = False
    return logger
