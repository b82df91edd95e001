"""TRL's environment_factory environments in `swift rlhf --rlhf_type grpo --environment_factory`:
the tiny model, trained to call tools as tests/deploy/test_tools.py's but with the signatures the
environment's methods give (transformers' get_json_schema: the prompt it will see), calls the
environment's methods, their results come back as tool messages, and the environment's get_reward
is a reward."""
import json

import pytest

from swift.pipelines.rlhf import rlhf_main
from swift.utils.registry import SwiftError
from tests.built import built, key_of
from tests.conftest import build_cache, train_argv
from tests.deploy.test_tools import TRAIN

ENV = '''
import json, os


class ToolEnv:
    """Records every call (in $ENV_LOG) and rewards one point per call."""

    def reset(self, prompt=None, **row):
        self.calls = []
        self.question = prompt[-1]["content"]
        return None

    def get_weather(self, city: str) -> str:
        """Weather of a city.

        Args:
            city: The city.
        """
        return self._record("get_weather", {"city": city}, f"Sunny in {city}")

    def add(self, a: int, b: int) -> int:
        """Sum of two integers.

        Args:
            a: The first number.
            b: The second number.
        """
        return self._record("add", {"a": a, "b": b}, a + b)

    def _record(self, name, arguments, result):
        self.calls.append(name)
        with open(os.environ["ENV_LOG"], "a") as f:
            f.write(json.dumps({"question": self.question, "name": name, "arguments": arguments}) + "\\n")
        return result

    def get_reward(self):
        return float(len(self.calls))


class Undocumented:
    def reset(self, **row):
        return "!"

    def lookup(self, key):
        return key
'''

QUESTIONS = ["What is the weather in Paris?", "Add 4 and 9.", "What is the weather in Oslo?", "Add 12 and 30."]


@pytest.fixture(scope="module")
def tool_model(request, tmp_path_factory):
    import importlib.util

    from swift import sft_main
    from swift.dataset.tool_calls import tool_calls
    from swift.rollout.trl_env import schemas

    def build(out):
        source = tmp_path_factory.mktemp("env") / "tool_env.py"
        source.write_text(ENV)
        spec = importlib.util.spec_from_file_location("tool_env_for_training", source)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        tools = schemas(module.ToolEnv())
        data = out / "train.jsonl"
        data.write_text("".join(json.dumps({**row, "tools": tools}) + "\n" for row in tool_calls("train")))
        train = [str(data) if a == "builtin:tool-calls" else a for a in TRAIN]
        sft_main([*train, "--output_dir", str(out / "model")])

    return str(built(build_cache(request.config), "env-tool-calls", key_of(*TRAIN, ENV), build) / "model")


@pytest.fixture
def env_file(tmp_path, monkeypatch):
    (tmp_path / "tool_env.py").write_text(ENV)
    monkeypatch.setenv("ENV_LOG", str(tmp_path / "calls.jsonl"))
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q}]}) + "\n" for q in QUESTIONS))
    return tmp_path / "tool_env.py", data


def run(tmp_path, tool_model, data, *extra):
    rlhf_main(train_argv(tmp_path / "out", "--rlhf_type", "grpo", "--model", tool_model, "--template", "chatml",
                         "--dataset", str(data), "--num_generations", "2", "--per_device_train_batch_size", "8",
                         "--max_completion_length", "160", "--temperature", "0", "--max_steps", "1", "--max_turns", "2",
                         "--log_completions", "true", *extra))
    return [json.loads(line) for line in open(tmp_path / "out" / "completions.jsonl")], \
        [r for r in map(json.loads, open(tmp_path / "out" / "logging.jsonl")) if "loss" in r]


def test_the_model_calls_the_environments_methods_and_its_reward_is_scored(tmp_path, tool_model, env_file):
    path, data = env_file
    rows, (log,) = run(tmp_path, tool_model, data, "--environment_factory", f"{path}:ToolEnv")
    calls = [json.loads(line) for line in open(tmp_path / "calls.jsonl")]
    # the trained model asks for the tool each question needs, with that tool's arguments
    for call in calls:
        assert call["name"] == ("get_weather" if "weather" in call["question"] else "add")
        assert set(call["arguments"]) == ({"city"} if call["name"] == "get_weather" else {"a", "b"})
    assert {c["question"] for c in calls} == set(QUESTIONS)
    # get_reward (one point per call) is the ToolEnv reward of each trajectory: the calls it made
    per_question = {q: sum(c["question"] == q for c in calls) for q in QUESTIONS}
    for r in rows:
        assert r["rewards/ToolEnv"] == per_question[r["prompt"][-1]["content"]] / 2  # two trajectories a question
    assert log["completions/mean_turns"] == 2  # a call, then the answer after the tool's result (--max_turns 2)


def test_tools_are_rendered_and_results_come_back_as_tool_messages(env_file):
    from swift.model import load_model
    from swift.rollout.multi_turn import RolloutInferRequest
    from swift.rollout.trl_env import EnvironmentScheduler
    from swift.template import get_template

    path, _ = env_file
    scheduler = EnvironmentScheduler(2, environment_factory=[f"{path}:ToolEnv"])
    request = RolloutInferRequest([{"role": "user", "content": QUESTIONS[1]}], {"solution": "13"})
    scheduler.start(request)
    assert [t["function"]["name"] for t in request.tools] == ["add", "get_weather"]
    assert request.tools[0]["function"]["parameters"]["required"] == ["a", "b"]
    _, tokenizer, _ = load_model("builtin:tiny-chat")
    text = tokenizer.decode(get_template("chatml", tokenizer).encode_prompt(request.messages, request.tools))
    assert '"name": "add"' in text and "Sum of two integers." in text
    request.messages.append({"role": "assistant", "content": '<tool_call>\n{"name": "add", "arguments": {"a": 4, "b": 9}}'
                                                            '\n</tool_call><tool_call>\n{"name": "nope", "arguments": {}}'
                                                            '\n</tool_call>'})

    class Choice:
        finish_reason = "stop"

    assert not scheduler.check_finished(request, Choice, 1)
    scheduler.step(request, Choice, 1)
    assert request.messages[-2:] == [{"role": "tool", "name": "add", "content": "13"},
                                     {"role": "tool", "name": "nope", "content": "{'error': 'Tool nope not found.'}"}]
    request.messages.append({"role": "assistant", "content": "It is 13."})
    assert scheduler.check_finished(request, Choice, 2)
    scheduler.finish(request)
    assert request.rollout_infos["environment_reward/ToolEnv"] == 1.0
    scheduler.release(request)


def test_environments_that_cannot_run_are_refused_in_one_line(tmp_path, env_file):
    from swift.rollout.trl_env import EnvironmentScheduler

    path, data = env_file
    with pytest.raises(SwiftError, match=r"Undocumented.lookup cannot be a tool \(it needs type hints"):
        EnvironmentScheduler(2, environment_factory=[f"{path}:Undocumented"])
    with pytest.raises(SwiftError, match="defines no Missing"):
        EnvironmentScheduler(2, environment_factory=[f"{path}:Missing"])
    with pytest.raises(SwiftError, match="several environments need names"):
        EnvironmentScheduler(2, environment_factory=[f"{path}:ToolEnv", f"{path}:ToolEnv"])
    with pytest.raises(SwiftError, match="--environment_factory runs its environments in the trainer"):
        rlhf_main(train_argv(tmp_path, "--rlhf_type", "grpo", "--environment_factory", f"{path}:ToolEnv",
                             "--rollout_mode", "server"))
    with pytest.raises(SwiftError, match="drop --multi_turn_scheduler gym"):
        rlhf_main(train_argv(tmp_path, "--rlhf_type", "grpo", "--environment_factory", f"{path}:ToolEnv",
                             "--multi_turn_scheduler", "gym"))


def test_named_environments_are_picked_by_the_rows_environment_column(tmp_path, env_file):
    from swift.rollout.multi_turn import RolloutInferRequest
    from swift.rollout.trl_env import EnvironmentScheduler

    path, _ = env_file
    scheduler = EnvironmentScheduler(2, environment_factory=[f"tools={path}:ToolEnv"])
    request = RolloutInferRequest([{"role": "user", "content": "Add 1 and 2."}], {"environment": "tools"})
    scheduler.start(request)
    assert type(request.rollout_infos["environments"]).__name__ == "ToolEnv"
    # a text-prompt row (TRL's standard format) passes its own prompt to reset, as TRL passes the example
    (tmp_path / "echo_env.py").write_text("class EchoEnv:\n    def reset(self, prompt, **row):\n"
                                          "        self.prompt, self.row = prompt, row\n")
    echo = EnvironmentScheduler(2, environment_factory=[f"{tmp_path}/echo_env.py:EchoEnv"])
    for data, prompt in (({"prompt": "Add 1 and 2.", "solution": "3"}, "Add 1 and 2."),
                         ({"solution": "3"}, [{"role": "user", "content": "Add 1 and 2."}])):
        request = RolloutInferRequest([{"role": "user", "content": "Add 1 and 2."}], data)
        echo.start(request)
        env = request.rollout_infos["environments"]
        assert env.prompt == prompt and env.row == {"solution": "3"}
    with pytest.raises(SwiftError, match="the row's environment 'games' is none of tools"):
        scheduler.check_request(RolloutInferRequest([{"role": "user", "content": "x"}], {"environment": "games"}))


# An OpenEnv environment (openenv-core, its documented server/client format) serving the same two
# tools, and an environment_factory class wrapping its async client, as TRL's OpenEnv examples wrap
# theirs. The server allows 8 sessions: the run's 8 trajectories fit only because instances are
# reused (TRL pools them), not made anew for each check and trajectory.
OPENENV = '''
import json, os
from typing import Any, Optional

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server import Action, Environment, Observation, State, create_app


class ToolAction(Action):
    tool: str
    arguments: dict


class ToolObservation(Observation):
    result: str = ""


class ToolServer(Environment[ToolAction, ToolObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state, self.question, self.calls = State(), "", 0

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, question: str = "", **kw: Any):
        self._state, self.question, self.calls = State(episode_id=episode_id), question, 0
        return ToolObservation(result="")

    def step(self, action: ToolAction, timeout_s: Optional[float] = None, **kw: Any):
        self.calls += 1
        with open(os.environ["ENV_LOG"], "a") as f:
            f.write(json.dumps({"question": self.question, "name": action.tool, "arguments": action.arguments}) + "\\n")
        a = action.arguments
        result = f"Sunny in {a['city']}" if action.tool == "get_weather" else str(a["a"] + a["b"])
        return ToolObservation(result=result, reward=float(self.calls))

    @property
    def state(self):
        return self._state


app = create_app(ToolServer, ToolAction, ToolObservation, env_name="tools", max_concurrent_envs=8)


class ToolClient(EnvClient[ToolAction, ToolObservation, State]):
    def _step_payload(self, action):
        return action.model_dump()

    def _parse_result(self, payload):
        obs = ToolObservation(**payload.get("observation", {}), reward=payload.get("reward"), done=payload["done"])
        return StepResult(observation=obs, reward=payload.get("reward"), done=payload["done"])

    def _parse_state(self, payload):
        return State(**payload)


class OpenEnvTools:
    """TRL's environment_factory class around the OpenEnv client (its methods are async)."""

    def __init__(self):
        self.client = ToolClient(base_url=os.environ["OPENENV_URL"])
        self.reward, self.connected = 0.0, False

    async def reset(self, prompt=None, **row):
        if not self.connected:
            await self.client.connect()
            self.connected = True
        await self.client.reset(question=prompt[-1]["content"])
        self.reward = 0.0

    async def get_weather(self, city: str) -> str:
        """Weather of a city.

        Args:
            city: The city.
        """
        return await self._call("get_weather", city=city)

    async def add(self, a: int, b: int) -> int:
        """Sum of two integers.

        Args:
            a: The first number.
            b: The second number.
        """
        return int(await self._call("add", a=a, b=b))

    async def _call(self, tool, **arguments):
        result = await self.client.step(ToolAction(tool=tool, arguments=arguments))
        self.reward = float(result.reward)
        return result.observation.result

    def get_reward(self):
        return self.reward
'''


@pytest.fixture
def openenv_server(tmp_path, monkeypatch):
    import importlib.util
    import socket
    import threading
    import time
    import urllib.request

    import uvicorn

    path = tmp_path / "openenv_tools.py"
    path.write_text(OPENENV)
    spec = importlib.util.spec_from_file_location("openenv_tools_server", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(module.app, host="127.0.0.1", port=port, log_level="warning",
                                           ws="websockets"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1)
            break
        except OSError:
            time.sleep(0.05)
    monkeypatch.setenv("OPENENV_URL", url)
    yield path
    server.should_exit = True
    thread.join(10)


def test_an_openenv_environment_drives_the_rollout_through_its_client(tmp_path, tool_model, env_file, openenv_server):
    _, data = env_file
    rows, (log,) = run(tmp_path, tool_model, data, "--environment_factory", f"{openenv_server}:OpenEnvTools")
    calls = [json.loads(line) for line in open(tmp_path / "calls.jsonl")]  # written by the OpenEnv server
    for call in calls:
        assert call["name"] == ("get_weather" if "weather" in call["question"] else "add")
    assert {c["question"] for c in calls} == set(QUESTIONS)
    per_question = {q: sum(c["question"] == q for c in calls) for q in QUESTIONS}
    for r in rows:  # the server's reward (its count of the episode's calls), through get_reward
        assert r["rewards/OpenEnvTools"] == per_question[r["prompt"][-1]["content"]] / 2
    assert log["completions/mean_turns"] == 2
