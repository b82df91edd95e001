"""`swift deploy`: serve a model behind an OpenAI-compatible API."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from swift.arguments.base import ComposedArguments
from swift.arguments.infer import EngineArguments, refuse_vllm_flags
from swift.arguments.model import ModelArguments
from swift.arguments.template import PromptTemplateArguments
from swift.serving.guard import ServingLimits, warn_if_open
from swift.pipelines.base import resolve_args
from swift.utils.registry import SwiftError


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's


@dataclass
class ServerArguments:
    host: str = field(default="127.0.0.1", metadata={"help": "Address to bind (loopback unless told otherwise)."})
    port: int = field(default=8000, metadata={"help": "Port to listen on."})
    served_model_name: str | None = field(default=None, metadata={"help": "Model name clients use (default: --model)."})
    log_level: str = field(default="info", metadata={
        "help": "Log level of the server (uvicorn's): critical, error, warning, info, debug or trace; at info "
                "or below, also one line per request."})

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise SwiftError(f"--port must be in 1..65535, got {self.port}")
        if self.log_level.lower() not in LOG_LEVELS:
            raise SwiftError(f"--log_level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")


class DeployArguments(ComposedArguments):
    """`swift deploy`: an OpenAI-compatible server for a model and its LoRA adapters."""

    parts: ClassVar[dict[str, type]] = {
        "model_args": ModelArguments,
        "template_args": PromptTemplateArguments,
        "engine_args": EngineArguments,
        "server_args": ServerArguments,
        "serving_limits": ServingLimits,
    }

    def __post_init__(self) -> None:
        if self.task_type == "seq_cls" and self.infer_backend != "transformers":
            raise SwiftError(f"--infer_backend {self.infer_backend}: a reward model (--task_type seq_cls) is served "
                             "by the transformers engine")
        refuse_vllm_flags(self, self.infer_backend)


def deploy_main(args: DeployArguments | list[str] | None = None) -> None:
    import uvicorn

    from swift.deploy.server import create_app
    from swift.infer.factory import build_engine, build_scorer

    a = resolve_args(DeployArguments, args, "swift deploy")
    warn_if_open(a.host, a.serving_limits)
    name = a.served_model_name or (a.model or "model").rstrip("/").split("/")[-1]
    log_requests = LOG_LEVELS.index(a.log_level.lower()) >= LOG_LEVELS.index("info")  # info lines pass
    if a.task_type == "seq_cls":
        if a.allow_control_tokens:  # the reward routes read texts as given (OpenRLHF sends formatted text)
            raise SwiftError("--allow_control_tokens applies to generation; a reward model (--task_type seq_cls) "
                             "reads the texts it scores as they are")
        app = create_app(name, scorer=build_scorer(a), limits=a.serving_limits, log_requests=log_requests)
        uvicorn.run(app, host=a.host, port=a.port, log_level=a.log_level)
        return
    engine, adapters = build_engine(a)
    try:
        uvicorn.run(create_app(name, engine=engine, adapters=adapters, limits=a.serving_limits,
                               log_requests=log_requests),
                    host=a.host, port=a.port, log_level=a.log_level)
    finally:
        engine.close()
