"""The plugin contract: every example in examples/plugins/ registers through swift.plugin.register
and is used by name in a real run; installed packages' entry points load too."""
import contextlib
import json
import math
import os
import re

import pytest

from swift.pipelines.rlhf import rlhf_main
from swift.pipelines.train import sft_main
from tests.conftest import ROOT, train_argv

PLUGINS = os.path.join(ROOT, "examples", "plugins")


def plugin(name):
    return os.path.join(PLUGINS, f"{name}.py")


def read(path):
    return [json.loads(line) for line in open(path)]


def test_dataset_template_and_callback_plugins_in_one_sft_run(tmp_path, monkeypatch, tokenizer):
    from swift.template import get_template

    monkeypatch.setenv("STOP_AT_LOSS", "1000")  # the first logged loss is below it: the run stops there
    sft_main(train_argv(tmp_path, "--dataset", "builtin:subtraction#16", "--template", "chatml_terse",
                        "--callbacks", "stop_at_loss", "--max_steps", "4", "--external_plugins",
                        plugin("dataset"), plugin("template"), plugin("callback")))
    steps = [r["global_step"] for r in read(tmp_path / "logging.jsonl") if "loss" in r]
    assert steps == [1]  # stopped by the callback, not by --max_steps 4
    args = json.load(open(tmp_path / "args.json"))
    assert args["template"] == "chatml_terse" and args["dataset"] == ["builtin:subtraction#16"]
    text = tokenizer.decode(get_template("chatml_terse", tokenizer).encode_prompt(
        [{"role": "user", "content": "50-8="}]))
    assert "Answer with the result only." in text


def test_an_unregistered_callback_or_plugin_kind_is_refused_in_one_line(tmp_path):
    from swift.plugin import register
    from swift.utils.registry import SwiftError

    with pytest.raises(SwiftError, match="unknown callback 'stop_at_los'.*stop_at_loss"):
        sft_main(train_argv(tmp_path, "--callbacks", "stop_at_los", "--external_plugins", plugin("callback")))
    with pytest.raises(SwiftError, match="unknown plugin kind 'rewards'. Did you mean 'reward'"):
        register("rewards", "x", object())
    with pytest.raises(SwiftError, match="importing it failed: ZeroDivisionError"):
        (tmp_path / "broken.py").write_text("1 / 0\n")
        sft_main(train_argv(tmp_path, "--external_plugins", str(tmp_path / "broken.py")))


def test_a_plugin_error_names_its_file_and_a_plugin_may_not_replace_a_module(tmp_path):
    """A SwiftError raised while a plugin file imports names the file and leaves no half-imported
    module behind; a file named like an importable module (`json.py`) is refused instead of
    replacing that module for every later import (before 2026-12-07: neither)."""
    import json
    import sys

    from swift.plugin import import_file
    from swift.utils.registry import SwiftError

    bad = tmp_path / "bad_kind_plugin.py"
    bad.write_text("from swift.plugin import register\nregister('rewards', 'x', object())\n")
    with pytest.raises(SwiftError, match=rf"--external_plugins {bad}: unknown plugin kind 'rewards'"):
        import_file(str(bad))
    assert "bad_kind_plugin" not in sys.modules
    shadow = tmp_path / "json.py"
    shadow.write_text("x = 1\n")
    with pytest.raises(SwiftError, match=r"json.py: its name 'json' is also the module .*json.*rename the file"):
        import_file(str(shadow))
    assert sys.modules["json"] is json
    (tmp_path / "folder_named_like_it").mkdir()  # a plain folder (a namespace package) on sys.path replaces nothing
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "folder_named_like_it.py").write_text("x = 2\n")
    sys.path.insert(0, str(tmp_path))
    try:
        assert import_file(str(tmp_path / "plugins" / "folder_named_like_it.py")).x == 2
    finally:
        sys.path.remove(str(tmp_path))


@pytest.mark.parametrize("scheduler", ["env", "multi_turn"])
def test_reward_env_and_scheduler_plugins_in_a_grpo_run(tmp_path, scheduler, quickstart):
    """From the quickstart's sft model (it answers sums and stops): the example reward and the
    TRL-style reward score what was generated (recomputed here from the logged completions); the
    scheduler asks every trajectory a second time (two turns each); the environment ends a trajectory
    at a right answer and retries a wrong one, its reward equal to the last answer's correctness."""
    turns = ["--multi_turn_scheduler", "gym", "--gym_env", "retry_sum"] if scheduler == "env" \
        else ["--multi_turn_scheduler", "are_you_sure"]
    rewards = ["last_number", f"{plugin('trl_reward')}:brevity"] + (["gym_reward"] if scheduler == "env" else [])
    rlhf_main(train_argv(tmp_path, "--rlhf_type", "grpo", "--model", os.path.join(quickstart[1], "sft"),
                         "--dataset", "builtin:arith-sft:eval#8", "--num_generations", "2",
                         "--per_device_train_batch_size", "8", "--max_completion_length", "48", "--temperature", "2.5",
                         "--max_steps", "1", "--log_completions", "true", "--max_turns", "2", *turns,
                         "--reward_funcs", *rewards, "--external_plugins", plugin("reward"), plugin(scheduler)))
    rows = read(tmp_path / "completions.jsonl")
    assert len(rows) == 8
    right = []
    for r in rows:
        answer = str(sum(map(int, r["prompt"][-1]["content"].rstrip("=").split("+"))))
        last = (re.findall(r"-?\d+", r["completion"]) or [None])[-1]
        assert r["rewards/last_number"] == float(last == answer)
        assert 0 < r["rewards/brevity"] <= 1 and math.isfinite(r["reward"])
        right.append(r["completion"].strip() == answer)  # the last answer (the environment's test)
        if scheduler == "env":  # a right answer ends the episode with reward 1; two wrong ones get 0
            assert r["rewards/gym_reward"] == float(right[-1])
    (log,) = [r for r in read(tmp_path / "logging.jsonl") if "loss" in r]
    if scheduler == "multi_turn":
        assert log["completions/mean_turns"] == 2
    else:  # one turn for a right first answer, two otherwise
        assert 1 < log["completions/mean_turns"] <= 2 or sum(right) == 8


def test_an_installed_packages_entry_point_registers_its_names(tmp_path, monkeypatch):
    """A package declaring `[swift.plugins]` in its entry points is imported by every command."""
    from swift.plugin import load_plugins, registry

    site = tmp_path / "site"
    (site / "swift_demo_plugin-0.1.dist-info").mkdir(parents=True)
    (site / "swift_demo_plugin-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: swift-demo-plugin\nVersion: 0.1\n")
    (site / "swift_demo_plugin-0.1.dist-info" / "entry_points.txt").write_text(
        "[swift.plugins]\ndemo = swift_demo_plugin\n")
    (site / "swift_demo_plugin.py").write_text(
        "from swift.plugin import register\nregister('reward', 'demo_constant', lambda completions, **kw: "
        "[2.0] * len(completions))\n")
    monkeypatch.syspath_prepend(str(site))
    assert "demo_constant" not in registry("reward")
    load_plugins()
    assert registry("reward").get("demo_constant")(["a", "b"]) == [2.0, 2.0]


def test_an_ms_swift_plugin_file_imports_from_swift_plugin_as_in_ms_swift(tmp_path):
    from swift.plugin import import_file, registry

    (tmp_path / "ms_plugin.py").write_text(
        "from swift.plugin import ORM, orms, MultiTurnScheduler, multi_turns\n"
        "class Constant(ORM):\n    def __call__(self, completions, **kwargs):\n        return [3.0] * len(completions)\n"
        "orms['ms_constant'] = Constant\n"
        "class Once(MultiTurnScheduler):\n    pass\n"
        "multi_turns['ms_once'] = Once\n")
    import_file(str(tmp_path / "ms_plugin.py"))
    assert registry("reward").get("ms_constant")()(["a"]) == [3.0] and "ms_once" in registry("multi_turn")


def test_the_consoles_check_of_a_command_line_leaves_no_plugin_behind(tmp_path):
    import sys

    from swift.app.console import check
    from swift.arguments.rlhf import RLHFArguments
    from swift.plugin import registry
    from swift.utils.registry import SwiftError

    with never_loaded(plugin("loss_type"), "loss_type", "vanilla_pg"):
        path = list(sys.path)
        check("rlhf", RLHFArguments, ["--model", "builtin:tiny-chat", "--dataset", "builtin:arith-sft", "--rlhf_type", "grpo",
                                      "--loss_type", "vanilla_pg", "--reward_funcs", "accuracy", "--external_plugins",
                                      plugin("loss_type")])
        assert "vanilla_pg" not in registry("loss_type") and sys.path == path and "loss_type" not in sys.modules
        with pytest.raises(SwiftError, match="unknown GRPO loss type 'vanilla_pg'"):
            check("rlhf", RLHFArguments, ["--model", "builtin:tiny-chat", "--dataset", "builtin:arith-sft", "--rlhf_type", "grpo",
                                          "--loss_type", "vanilla_pg", "--reward_funcs", "accuracy"])


@contextlib.contextmanager
def never_loaded(path, kind, name):
    """As if this process had never imported the plugin file `path` (registering `name` of `kind`):
    another test on this worker may have run it in-process. Everything is as before afterwards."""
    import sys

    from swift import plugin as P

    key = os.path.realpath(path)
    module = P._loaded.pop(key, None)
    if module is not None and sys.modules.get(module.__name__) is module:
        del sys.modules[module.__name__]
    try:
        with P.isolated():
            P.registry(kind)._items.pop(name, None)
            yield
    finally:
        if module is not None:
            P._loaded[key] = module
            sys.modules.setdefault(module.__name__, module)


def test_two_plugin_files_of_one_name_in_different_folders_are_two_plugins(tmp_path):
    from swift.rewards.manager import build_reward_funcs

    for value in ("1", "2"):
        (tmp_path / value).mkdir()
        (tmp_path / value / "reward.py").write_text(
            f"def reward_func(queries, prompts, labels, **kw):\n    return [{value}.0] * len(queries)\n")
    funcs = build_reward_funcs([str(tmp_path / "1" / "reward.py"), str(tmp_path / "2" / "reward.py"),
                                str(tmp_path / "1" / "reward.py")])
    assert [f(["a"], prompt_texts=["p"]) for _, f in funcs] == [[1.0], [2.0], [1.0]]
