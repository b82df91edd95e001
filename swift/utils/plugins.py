"""Import user files (`--external_plugins`, plugin reward and scheduler files) by path."""
from __future__ import annotations

import importlib.util
import os
import sys

from swift.utils.registry import SwiftError


def import_plugin(path: str):
    """Import a user file by path; its folder goes first on sys.path; its top-level code registers entries."""
    if not os.path.isfile(path):
        raise SwiftError(f"--external_plugins: no such file {path}")
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
