"""`swift rollout`: serve generation to RL trainers (ours, or any client of the protocol), with
checked weight sync over torch.distributed. See docs/rollout.md."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from swift.arguments.base import ComposedArguments
from swift.arguments.infer import EngineArguments, refuse_vllm_flags
from swift.arguments.model import ModelArguments
from swift.arguments.template import PromptTemplateArguments, refuse_prompt_limit
from swift.serving.guard import ServingLimits, warn_if_open
from swift.pipelines.base import resolve_args
from swift.utils.registry import SwiftError


@dataclass
class RolloutServerArguments:
    host: str = field(default="127.0.0.1", metadata={"help": "Address to bind (loopback unless told otherwise)."})
    port: int = field(default=8000, metadata={"help": "Port to listen on."})
    data_parallel_size: int = field(default=1, metadata={
        "help": "Engine worker processes; each request list is split between them (one GPU each on GPU)."})
    multi_turn_scheduler: str | None = field(default=None, metadata={
        "help": "Run multi-turn rollouts on the server with this scheduler (a registered name, module:Class, "
                "or an OpenRLHF AgentInstance .py file)."})
    max_turns: int | None = field(default=None, metadata={"help": "Most turns of a multi-turn rollout."})
    gym_env: str | None = field(default=None, metadata={"help": "Environment of the gym scheduler."})
    weight_sync_timeout: float = field(default=240.0, metadata={
        "help": "Seconds a worker waits for the trainer in a weight-sync collective before giving up."})
    allow_any_store_host: bool = field(default=False, metadata={
        "help": "Let /init_communicator/ name a store host other than the address the request came from."})
    log_level: str = field(default="warning", metadata={"help": "uvicorn log level."})

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise SwiftError(f"--port must be in 1..65535, got {self.port}")
        if self.data_parallel_size < 1:
            raise SwiftError(f"--data_parallel_size must be at least 1, got {self.data_parallel_size}")
        if self.weight_sync_timeout <= 0:
            raise SwiftError("--weight_sync_timeout must be positive")
        # before 2026-12-07 these were accepted and the server ran single-turn, or without the environment
        if not self.multi_turn_scheduler:
            flag = "--max_turns" if self.max_turns is not None else "--gym_env" if self.gym_env else None
            if flag:
                raise SwiftError(f"{flag} does nothing without --multi_turn_scheduler (the server would run "
                                 "single-turn rollouts)")
        elif self.gym_env:
            from swift.rollout.multi_turn import refuse_unread_env

            refuse_unread_env(self.multi_turn_scheduler, self.gym_env)


class RolloutArguments(ComposedArguments):
    """`swift rollout`: a generation server for RL trainers with weight sync."""

    parts: ClassVar[dict[str, type]] = {
        "model_args": ModelArguments,
        "template_args": PromptTemplateArguments,
        "engine_args": EngineArguments,
        "server_args": RolloutServerArguments,
        "serving_limits": ServingLimits,
    }

    def __post_init__(self) -> None:
        """Refuse what a generation server does not read."""
        if self.task_type != "causal_lm":
            raise SwiftError(f"--task_type {self.task_type}: swift rollout generates text (causal_lm)")
        if self.num_labels is not None:
            raise SwiftError("--num_labels applies to --task_type seq_cls / token_cls; swift rollout generates text")
        refuse_vllm_flags(self, self.infer_backend)
        refuse_prompt_limit(self, "swift rollout does not cap prompts: single-turn prompts come cut by the trainer, "
                                  "and a multi-turn context is bounded by the model's (--vllm_max_model_len)")


def rollout_main(args: RolloutArguments | list[str] | None = None) -> None:
    import uvicorn

    from swift.rollout.server import RolloutServer, create_app

    a = resolve_args(RolloutArguments, args, "swift rollout")
    warn_if_open(a.host, a.serving_limits)
    if not a.model:
        raise SwiftError("--model is required")
    server = RolloutServer(a)
    try:
        server.wait_ready()
        uvicorn.run(create_app(server), host=a.host, port=a.port, log_level=a.log_level)
    finally:
        server.stop()
