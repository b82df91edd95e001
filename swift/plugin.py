"""One way to extend swift: `register(kind, name)`.

Every extension point is a named registry, and every built-in entry is registered through this same
call, so a plugin's entry is looked up exactly like a built-in one (`--loss_type my_loss`,
`--reward_funcs my_reward`, `--template my_template`, ...):

    from swift.plugin import register

    @register("reward", "my_reward")
    class MyReward(ORM): ...

Plugins are Python files named by `--external_plugins` (every command that loads a model has the
flag) and installed packages that declare an entry point in the `swift.plugins` group (the entry
point's module is imported; its top-level code registers). Both are imported once per process,
before any other flag is checked.

Kinds and what an entry is (examples/plugins/ has one file per kind):
  reward               an ORM subclass, `__call__(completions, **columns) -> list[float | None]`
  multi_turn           a MultiTurnScheduler subclass (`--multi_turn_scheduler`)
  env                  an Env subclass (the gym scheduler's `--gym_env` / `env` column)
  advantage_estimator  f(rewards [P, G]) -> advantages [P, G]  (`--advantage_estimator`)
  loss_type            a swift.rlhf.grpo.LossType(surrogate, aggregate)  (grpo/ppo `--loss_type`)
  dpo_loss             f(chosen_ratio, rejected_ratio, beta, **kw) -> per-pair loss  (dpo `--loss_type`)
  template             a Template subclass (`--template`)
  dataset              f(split) -> list of rows  (`--dataset builtin:NAME`)
  callback             a transformers.TrainerCallback subclass (`--callbacks NAME`)
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import os
import sys
from typing import Any

from swift.utils.registry import Registry, SwiftError, closest

# kind -> (module, attribute) of its registry; imported on first use, so a plugin may register into
# a registry whose module nothing has imported yet
KINDS: dict[str, tuple[str, str]] = {
    "reward": ("swift.rewards.base", "orms"),
    "multi_turn": ("swift.rollout.multi_turn", "multi_turns"),
    "env": ("swift.rollout.multi_turn", "envs"),
    "advantage_estimator": ("swift.rlhf.grpo", "ADVANTAGE_ESTIMATORS"),
    "loss_type": ("swift.rlhf.grpo", "LOSS_TYPES"),
    "dpo_loss": ("swift.rlhf.dpo", "DPO_LOSSES"),
    "template": ("swift.template.base", "TEMPLATES"),
    "dataset": ("swift.dataset.arith", "BUILTIN_DATASETS"),
    "callback": ("swift.trainers.callbacks", "CALLBACKS"),
}
ENTRY_POINT_GROUP = "swift.plugins"


def registry(kind: str) -> Registry:
    if kind not in KINDS:
        raise SwiftError(f"unknown plugin kind '{kind}'.{closest(kind, KINDS)} Valid: {', '.join(KINDS)}")
    module, attr = KINDS[kind]
    return getattr(importlib.import_module(module), attr)


def register(kind: str, name: str, obj: Any = None):
    """Register `obj` as `name` of `kind`; without `obj`, a decorator. A later registration of the
    same name replaces the earlier one (a plugin may override a built-in)."""
    return registry(kind).register(name, obj)


_loaded: dict[str, Any] = {}  # a file's real path, or an entry point's value -> its module


# ms-swift plugin files import these from `swift.plugin` (ms-swift's module of the same name)
_MS_SWIFT_NAMES = {"ORM": "swift.rewards.base", "AsyncORM": "swift.rewards.base", "orms": "swift.rewards.base",
                   "MultiTurnScheduler": "swift.rollout.multi_turn", "multi_turns": "swift.rollout.multi_turn"}


def __getattr__(name: str):
    if name in _MS_SWIFT_NAMES:
        return getattr(importlib.import_module(_MS_SWIFT_NAMES[name]), name)
    raise AttributeError(f"module 'swift.plugin' has no attribute '{name}'")


@contextlib.contextmanager
def isolated():
    """Plugins loaded inside leave nothing behind: the registries, sys.path, and the plugin files'
    own modules are as before (a console checks a command line without running it). Libraries the
    check imported stay imported."""
    saved = {kind: dict(registry(kind)._items) for kind in KINDS}
    path, loaded = list(sys.path), dict(_loaded)
    try:
        yield
    finally:
        for kind, items in saved.items():
            registry(kind)._items = items
        sys.path[:] = path
        for key, module in list(_loaded.items()):
            if key not in loaded:
                if sys.modules.get(module.__name__) is module:
                    del sys.modules[module.__name__]
                del _loaded[key]


_plugin_folders: set[str] = set()  # the folders plugin files were imported from (real paths)


def _refuse_shadowing(name: str, key: str, path: str, flag: str) -> None:
    """A plugin is imported under its file's name: one named like a module that exists elsewhere
    (`datasets.py`) would take that module's place for every later import in this process."""
    loaded = sys.modules.get(name)
    if loaded is not None and any(loaded is m for m in _loaded.values()):  # another plugin file of that name
        return
    try:
        found = loaded.__spec__ if loaded is not None else importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):  # a dotted name whose parent is no package: nothing to shadow
        return
    origin = getattr(found, "origin", None) if found is not None else None
    if origin is None:  # nothing importable, or a namespace package (a plain folder): nothing replaced
        return
    if os.path.realpath(origin) == key or os.path.dirname(os.path.realpath(origin)) in _plugin_folders:
        return  # this file, or another plugin file of that name (the later one is the module from then on)
    raise SwiftError(f"{flag} {path}: its name {name!r} is also the module {origin} here, which "
                     "importing it would replace; rename the file")


def import_file(path: str, flag: str = "--external_plugins"):
    """Import a plugin file by path, once per process (its folder goes first on sys.path)."""
    if not os.path.isfile(path):
        raise SwiftError(f"{flag}: no such file {path}")
    key = os.path.realpath(path)
    name = os.path.splitext(os.path.basename(path))[0]
    if key in _loaded:  # this very file (two files of one name in different folders are two plugins)
        return _loaded[key]
    _refuse_shadowing(name, key, path, flag)
    folder = os.path.dirname(os.path.abspath(path))
    _plugin_folders.add(os.path.dirname(key))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # a SwiftError it raised too: named with the file (before 2026-12-07 without)
        del sys.modules[name]
        what = "" if isinstance(e, SwiftError) else "importing it failed: " + type(e).__name__ + ": "
        raise SwiftError(f"{flag} {path}: {what}{e}") from None
    _loaded[key] = module
    return module


def load_attr(spec: str, flag: str, what: str = "function"):
    """`file.py:NAME`, `module:NAME` or `package.module.NAME` -> that object (a flag's argument)."""
    target, colon, attr = spec.rpartition(":")
    if not colon:
        target, _, attr = spec.rpartition(".")
    if not target or not attr:
        raise SwiftError(f"{flag} {spec}: expected file.py:{what}, module:{what} or package.module.{what}")
    try:
        module = import_file(target, flag) if target.endswith(".py") else importlib.import_module(target)
    except ImportError as e:
        raise SwiftError(f"{flag} {spec}: cannot import it: {e}") from None
    if not callable(getattr(module, attr, None)):
        raise SwiftError(f"{flag} {spec}: {target} defines no {attr}")
    return getattr(module, attr)


def load_plugins(paths: list[str] | None = None) -> None:
    """Import the installed packages' `swift.plugins` entry points, then the given files."""
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.value in _loaded:
            continue
        try:
            module = entry.load()
        except Exception as e:
            raise SwiftError(f"plugin entry point '{entry.name}' ({entry.value}) failed to load: "
                             f"{type(e).__name__}: {e}") from None
        _loaded[entry.value] = module
    for path in paths or []:
        import_file(path)
