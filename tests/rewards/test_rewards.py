"""Built-in rewards on hand-made cases; combining, async, errors, and user plugin files."""
import asyncio
import math
import textwrap
from types import SimpleNamespace

import pytest

from swift.rewards import AsyncORM, ORM, orms
from swift.rewards.manager import RewardManager, build_reward_funcs
from swift.plugin import import_file
from swift.utils.registry import SwiftError


def call(name, completions, args=None, **columns):
    return orms[name](args)(completions, **columns)


def test_accuracy():
    completions = ["52", "<think>5+4</think><answer>9</answer>", "so \\boxed{\\frac{1}{2}}", "51", "<answer>x</answer>"]
    assert call("accuracy", completions, solution=["52", "9", "0.5", "52", "3"]) == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert call("accuracy", ["52"], solution=["not math"]) == [0.0]  # unparseable gold


def test_format_and_react_format():
    assert call("format", ["<think>a</think><answer>b</answer>", "<think>a</think>\n<answer>b</answer> extra",
                           "<answer>b</answer>"]) == [1.0, 0.0, 0.0]
    assert call("react_format", ["<think>plan</think>\nAction: search\nAction Input: {\"q\": 1}",
                                 "Action: search\nAction Input: x"]) == [1.0, 0.0]


def test_cosine_by_length():
    args = SimpleNamespace(max_completion_length=10)
    ids = [[0] * 0, [0] * 5, [0] * 10, [0] * 0, [0] * 10, [0] * 20]
    values = call("cosine", ["7", "7", "7", "8", "8", "7"], args, solution=["7"] * 6, response_token_ids=ids)
    assert values == pytest.approx([1.0, 0.75, 0.5, -0.5, 0.0, 0.5])


def test_repetition():
    values = call("repetition", ["a b c a b c a b c", "a b c d e", "a b"])
    assert values[0] == pytest.approx(-(1 - 3 / 7)) and values[1] == 0.0 and values[2] == 0.0


def test_soft_overlong():
    args = SimpleNamespace(max_completion_length=100, soft_max_length=None, soft_cache_length=20)
    ids = [[0] * 50, [0] * 80, [0] * 90, [0] * 100]
    assert call("soft_overlong", ["x"] * 4, args, response_token_ids=ids) == pytest.approx([0.0, 0.0, -0.5, -1.0])


@pytest.mark.parametrize("args,message", [
    (SimpleNamespace(max_completion_length=100, soft_max_length=None, soft_cache_length=None),
     "^the soft_overlong reward needs --soft_cache_length: L_cache"),
    (SimpleNamespace(max_completion_length=100), r"^the soft_overlong reward needs --soft_cache_length \(a flag of "
                                                 r"`swift rlhf`; this command has none\)"),  # swift sample's
    (None, "^the soft_overlong reward needs --soft_cache_length"),
    (SimpleNamespace(max_completion_length=100, soft_max_length=None, soft_cache_length=100),
     r"^--soft_cache_length 100 must be in 1\.\.99"),
])
def test_soft_overlong_needs_a_cache_length_below_the_max(args, message):
    """As ms-swift asserts (before 2026-12-07 a missing one became L_max // 4 and one of L_max passed)."""
    with pytest.raises(SwiftError, match=message):
        orms["soft_overlong"](args)


def test_toolbench():
    gold = 'Action: get_weather\nAction Input: {"city": "Paris", "unit": "C"}'
    completions = ['Thought: x\nAction: get_weather\nAction Input: {"unit": "C", "city": "Paris"}',
                   'Action: get_weather\nAction Input: {"city": "Rome", "unit": "C"}',
                   'Action: get_time\nAction Input: {"city": "Paris", "unit": "C"}', "no action"]
    assert call("toolbench", completions, solution=[gold] * 4) == [1.0, 0.0, 0.0, 0.0]


def test_weights_none_and_async():
    class Half(ORM):
        def __call__(self, completions, **kwargs):
            return [0.5 if c else None for c in completions]

    class Slow(AsyncORM):
        async def __call__(self, completions, **kwargs):
            await asyncio.sleep(0.01)
            return [1.0] * len(completions)

    manager = RewardManager([("half", Half()), ("slow", Slow()), ("slow2", Slow())], [2.0, 1.0, 0.5])
    totals, per_func = manager(["a", ""], {})
    assert totals == [2 * 0.5 + 1.0 + 0.5, 1.0 + 0.5] and math.isnan(per_func[0][1])


def test_async_reward_functions_run_concurrently():
    """Each of the two waits until the other has started: run one after the other, the first would
    wait forever (the timeout turns that into a failure)."""
    started = {}

    class Meet(AsyncORM):
        def __init__(self, me, other):
            self.me, self.other = me, other

        async def __call__(self, completions, **kwargs):
            started.setdefault(self.me, asyncio.Event()).set()
            await asyncio.wait_for(started.setdefault(self.other, asyncio.Event()).wait(), timeout=5)
            return [1.0] * len(completions)

    manager = RewardManager([("a", Meet("a", "b")), ("b", Meet("b", "a"))])
    assert manager(["x"], {})[0] == [2.0]


def test_every_reward_function_gets_the_trainer_state():
    """ms-swift hands `trainer_state` to every reward function (its docs' curriculum example reads
    `trainer_state.global_step`); before 2026-12-07 only TRL-style functions got it, so such an ORM
    stopped the run with a TypeError."""
    class Curriculum(ORM):
        def __call__(self, completions, trainer_state, **kwargs):
            return [float(trainer_state.global_step)] * len(completions)

    manager = RewardManager([("curriculum", Curriculum())])
    manager.context = {"trainer_state": SimpleNamespace(global_step=7), "log_metric": lambda *a: None}
    assert manager(["a", "b"], {})[0] == [7.0, 7.0]
    manager.context = {}  # outside a trainer (swift sample): None
    with pytest.raises(SwiftError, match="AttributeError"):
        manager(["a"], {})


def test_an_infinite_reward_is_refused_with_the_function_and_row():
    """None (or NaN) means no reward; ±inf would become ±3e38 advantages (and invalid JSON in
    completions.jsonl): refused (before 2026-12-07 it passed)."""
    manager = RewardManager([("wild", lambda completions, **kw: [1.0, float("-inf")])])
    with pytest.raises(SwiftError, match=r"reward function 'wild' returned -inf for row 1 of the batch \(completion 'b'\)"):
        manager(["a", "b"], {})


def test_user_error_names_function_and_row():
    def picky(completions, solution, **kwargs):
        return [1.0 / int(s) for s in solution]

    manager = RewardManager([("picky", picky)])
    with pytest.raises(SwiftError, match=r"reward function 'picky' failed on row 2 of the batch \(solution='0'.*ZeroDivisionError"):
        manager(["a", "b", "c"], {"solution": ["1", "2", "0"]})
    with pytest.raises(SwiftError, match="--reward_weights has 2 values for 1"):
        RewardManager([("picky", picky)], [1.0, 2.0])


def test_ms_swift_plugin_file_registers_an_orm(tmp_path):
    plugin = tmp_path / "my_plugin.py"
    plugin.write_text(textwrap.dedent("""
        from swift.rewards import ORM, orms

        class LengthReward(ORM):
            def __call__(self, completions, solution, **kwargs):
                return [float(len(c) == len(s)) for c, s in zip(completions, solution)]

        orms['same_length'] = LengthReward
    """))
    import_file(str(plugin))
    (name, func), = build_reward_funcs(["same_length"])
    assert func(["12", "123"], solution=["99", "99"]) == [1.0, 0.0]


def test_openrlhf_reward_file(tmp_path):
    plugin = tmp_path / "openrlhf_reward.py"
    plugin.write_text(textwrap.dedent("""
        import torch

        def reward_func(queries, prompts, labels, **kwargs):
            rewards = torch.tensor([float(q.endswith(l)) for q, l in zip(queries, labels)])
            return {"rewards": rewards, "scores": rewards, "extra_logs": {}}
    """))
    (name, func), = build_reward_funcs([str(plugin)])
    assert name == "openrlhf_reward"
    assert func(["52", "51"], prompt_texts=["1+51=", "1+51="], solution=["52", "52"]) == [1.0, 0.0]


def test_unknown_reward_lists_valid_names():
    with pytest.raises(SwiftError, match="Did you mean 'accuracy'"):
        build_reward_funcs(["acuracy"])
