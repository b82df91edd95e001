"""API keys kept off the command line (where `ps` shows them): `--api_key_file` and the
SWIFT_API_KEY environment variable, for `swift deploy`, `swift rollout` and the trainer that talks to
a rollout server; and the warning for a server bound beyond loopback without a key."""
import os
import subprocess
import time

import openai
import pytest

from swift.arguments.parser import parse_args
from swift.pipelines.deploy import DeployArguments
from swift.utils.registry import SwiftError
from tests.deploy.serving import start, stop

KEY = "sk-from-elsewhere"


def test_the_key_comes_from_a_file_or_the_environment(tmp_path, monkeypatch):
    key_file = tmp_path / "key"
    key_file.write_text(f"{KEY}\nignored second line\n")
    argv = ["--model", "builtin:tiny-chat"]
    monkeypatch.delenv("SWIFT_API_KEY", raising=False)
    assert parse_args(DeployArguments, argv).api_key is None
    assert parse_args(DeployArguments, [*argv, "--api_key_file", str(key_file)]).api_key == KEY
    monkeypatch.setenv("SWIFT_API_KEY", "from-env")
    assert parse_args(DeployArguments, argv).api_key == "from-env"
    assert parse_args(DeployArguments, [*argv, "--api_key", "flag"]).api_key == "flag"  # a flag wins
    assert parse_args(DeployArguments, [*argv, "--api_key_file", str(key_file)]).api_key == KEY
    with pytest.raises(SwiftError, match="give --api_key or --api_key_file, not both"):
        parse_args(DeployArguments, [*argv, "--api_key", "x", "--api_key_file", str(key_file)])
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SwiftError, match="its first line is empty"):
        parse_args(DeployArguments, [*argv, "--api_key_file", str(tmp_path / "empty")])
    with pytest.raises(SwiftError, match=f"--api_key_file {tmp_path / 'missing'}: No such file"):
        parse_args(DeployArguments, [*argv, "--api_key_file", str(tmp_path / "missing")])


def test_a_server_keyed_from_the_environment_refuses_other_keys():
    base, proc = start("deploy", "--model", "builtin:tiny-chat", "--served_model_name", "tiny",
                       env={**os.environ, "SWIFT_API_KEY": KEY})
    try:
        assert [m.id for m in openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0).models.list().data] \
            == ["tiny"]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base + "/v1", api_key="sk-wrong", max_retries=0).models.list()
    finally:
        stop(proc)


def test_the_trainer_takes_the_rollout_servers_key_from_the_environment(tmp_path, monkeypatch):
    """A rollout server with --api_key_file; a GRPO step in server mode reaches it with the key from
    SWIFT_API_KEY, and without it stops with the server's 401."""
    from swift.pipelines.rlhf import rlhf_main
    from tests.rollout.test_server import grpo_server_argv

    key_file = tmp_path / "key"
    key_file.write_text(KEY)
    base, proc = start("rollout", "--model", "builtin:tiny-chat", "--api_key_file", str(key_file),
                       health="/health/")
    port = int(base.rsplit(":", 1)[1])
    try:
        monkeypatch.delenv("SWIFT_API_KEY", raising=False)
        with pytest.raises(Exception, match="401"):
            rlhf_main(grpo_server_argv(tmp_path / "without", port, "--max_steps", "1", "--rollout_mode", "server",
                                       "--vllm_server_timeout", "20"))
        monkeypatch.setenv("SWIFT_API_KEY", KEY)
        rlhf_main(grpo_server_argv(tmp_path / "with", port, "--max_steps", "1", "--rollout_mode", "server"))
        assert (tmp_path / "with" / "logging.jsonl").exists()
    finally:
        stop(proc)


def test_binding_beyond_loopback_without_a_key_is_warned_about(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SWIFT_API_KEY"}
    log = open(tmp_path / "stderr.txt", "w+")
    base, proc = start("deploy", "--model", "builtin:tiny-chat", "--host", "0.0.0.0", env=env, stderr=log)
    stop(proc)
    deadline = time.time() + 10
    while "no API key is set" not in (tmp_path / "stderr.txt").read_text() and time.time() < deadline:
        time.sleep(0.2)
    text = (tmp_path / "stderr.txt").read_text()
    assert "--host 0.0.0.0 is reachable from other machines and no API key is set" in text
    assert "--api_key_file or SWIFT_API_KEY" in text
    base, proc = start("deploy", "--model", "builtin:tiny-chat", "--host", "0.0.0.0", env={**env, "SWIFT_API_KEY": KEY},
                       stderr=subprocess.PIPE)
    stop(proc)
    assert "no API key is set" not in proc.stderr.read().decode()
