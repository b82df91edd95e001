"""`swift app` (a chat page) and `swift web-ui` (the training console): gradio pages (the [app] extra)."""
from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass, field
from typing import ClassVar

from swift.app.i18n import LANGS
from swift.arguments.base import ComposedArguments
from swift.arguments.infer import EngineArguments, refuse_vllm_flags
from swift.arguments.model import ModelArguments
from swift.arguments.template import PromptTemplateArguments
from swift.pipelines.base import resolve_args
from swift.utils.registry import SwiftError

SHARE_SERVER = ("api.gradio.app", 443)  # where gradio asks for a share link
GENERATED_USER = "swift"  # swift web-ui's user when no --auth is given (with a password made at start)


@dataclass
class PageArguments:
    server_name: str = field(default="127.0.0.1", metadata={"help": "Address the page binds (loopback unless told otherwise)."})
    server_port: int = field(default=7860, metadata={"help": "Port of the page."})
    share: bool = field(default=False, metadata={"help": "A public gradio.live link (needs gradio's share server on the internet)."})
    lang: str = field(default="en", metadata={"help": "Language of every label: en or zh."})
    studio_title: str | None = field(default=None, metadata={"help": "Title of the page."})

    def __post_init__(self) -> None:
        if self.lang not in LANGS:
            raise SwiftError(f"--lang {self.lang!r} is not one of {', '.join(LANGS)}")
        if not 0 < self.server_port < 65536:
            raise SwiftError(f"--server_port must be in 1..65535, got {self.server_port}")


@dataclass
class ChatArguments:
    base_url: str | None = field(default=None, metadata={
        "help": "Chat with an OpenAI-compatible server (e.g. http://127.0.0.1:8000/v1) instead of loading --model."})
    api_key: str | None = field(default=None, metadata={"help": "Key of --base_url (default: $SWIFT_API_KEY)."})
    stream: bool = field(default=True, metadata={"help": "Show the answer as it is generated."})
    max_new_tokens: int = field(default=512, metadata={"help": "The page's default most tokens per answer."})
    temperature: float = field(default=0.0, metadata={"help": "The page's default sampling temperature (0: greedy)."})
    top_p: float = field(default=1.0, metadata={"help": "The page's default nucleus mass."})

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise SwiftError("--max_new_tokens must be at least 1")
        if not 0 <= self.temperature <= 2 or not 0 < self.top_p <= 1:
            raise SwiftError("--temperature must be in [0, 2] and --top_p in (0, 1]")


class AppArguments(ComposedArguments):
    """`swift app`: a chat page over a model (the engines of swift deploy) or an OpenAI-compatible server."""

    parts: ClassVar[dict[str, type]] = {
        "model_args": ModelArguments,
        "template_args": PromptTemplateArguments,
        "engine_args": EngineArguments,
        "chat_args": ChatArguments,
        "page_args": PageArguments,
    }

    def __post_init__(self) -> None:
        """Refuse what this mode does not read: with --base_url the server loads, templates and
        batches (only --model, picking one of its models, and --system, the page's first system
        prompt, are read); in process --api_key is unread."""
        if self.base_url:
            read = {"model", "system"}
            parts = ("model_args", "template_args", "engine_args")
        else:
            read = set()
            parts = ()
            if self.api_key:
                raise SwiftError("--api_key is the key of --base_url; without --base_url the model runs here")
            if self.task_type != "causal_lm":
                raise SwiftError(f"--task_type {self.task_type}: the chat page generates text (causal_lm)")
            if not self.model and not self.adapters:
                raise SwiftError("swift app needs --model (or --adapters), or --base_url")
            refuse_vllm_flags(self, self.infer_backend)
        self.refuse_unread(parts, read, f"does nothing with --base_url: the server at {self.base_url} loads and "
                                        "runs the model")


@dataclass
class ConsoleArguments:
    runs_dir: str = field(default="swift_runs", metadata={
        "help": "Where launched runs go: one directory per run (its command, process id, log and outputs)."})
    auth: str | None = field(default=None, metadata={
        "help": "user:password the page asks for (default: user swift, with a password made at each start and "
                "printed once)."})
    auth_file: str | None = field(default=None, metadata={"help": "A file holding user:password (kept off the command line)."})

    def credentials(self) -> tuple[str, str] | None:
        text, where = self.auth, "--auth"
        if self.auth_file:
            try:
                with open(self.auth_file, encoding="utf-8") as f:
                    text, where = f.read().strip(), f"--auth_file {self.auth_file}"
            except OSError as e:
                raise SwiftError(f"--auth_file {self.auth_file}: {e.strerror}") from None
        if text is None:
            return None
        user, sep, password = text.partition(":")
        if not sep or not user or not password:
            raise SwiftError(f"{where}: expected user:password")
        return user, password


class WebUIArguments(ComposedArguments):
    """`swift web-ui`: launch, watch, stop and chat with training and evaluation runs from a browser."""

    parts: ClassVar[dict[str, type]] = {"page_args": PageArguments, "console_args": ConsoleArguments}

    def __post_init__(self) -> None:
        if self.auth and self.auth_file:
            raise SwiftError("--auth and --auth_file: give one")


def check_share(share: bool) -> None:
    if not share:
        return
    try:
        socket.create_connection(SHARE_SERVER, timeout=5).close()
    except OSError:
        raise SwiftError(f"--share: gradio's share server {SHARE_SERVER[0]} cannot be reached from this machine "
                         "(no internet); open the page on --server_name instead") from None


def _warn_if_open(server_name: str, guarded: bool, what: str, can: str = "use it", share: bool = False) -> None:
    import logging

    from swift.serving.guard import is_loopback

    if guarded:
        return
    if share:  # (before 2026-12-07 no warning: only the address was looked at)
        logging.getLogger("swift").warning(
            f"{what} --share publishes a gradio.live link with no password: anyone who has the link can {can}")
    elif not is_loopback(server_name):
        logging.getLogger("swift").warning(
            f"{what} binds {server_name} without --auth: anyone who reaches this address can {can}")


def app_main(args: AppArguments | list[str] | None = None) -> None:
    from swift.app.chat import ChatBackend, build_app, require_gradio

    a = resolve_args(AppArguments, args, "swift app")
    require_gradio()
    check_share(a.share)
    _warn_if_open(a.server_name, False, "swift app", "chat with the model", a.share)  # the page has no password
    if a.base_url:
        from swift.infer.client import api_base

        backend = ChatBackend(base_url=api_base(a.base_url), api_key=a.api_key, model=a.model, name=a.base_url)
    else:
        from swift.infer.factory import build_engine

        system, a.system = a.system, None  # the page's system box holds it (emptied there, it is gone)
        engine, adapters = build_engine(a)
        a.system = system
        backend = ChatBackend(engine, adapters, name=a.model or ", ".join(adapters.values()))
    demo = build_app(backend, title=a.studio_title, lang=a.lang, system=a.system, stream=a.stream,
                     temperature=a.temperature, top_p=a.top_p, max_new_tokens=a.max_new_tokens)
    try:
        demo.queue(default_concurrency_limit=None).launch(server_name=a.server_name, server_port=a.server_port,
                                                          share=a.share, show_error=False, quiet=False)
    finally:
        backend.close()


def web_ui_main(args: WebUIArguments | list[str] | None = None) -> None:
    from swift.app.chat import require_gradio
    from swift.app.console import build_console

    a = resolve_args(WebUIArguments, args, "swift web-ui")
    require_gradio()
    auth = a.console_args.credentials()
    if a.share and auth is None:  # a public link to a page that runs commands as this user
        raise SwiftError("--share publishes the console, which runs commands as this user: give --auth or --auth_file")
    check_share(a.share)
    from swift.serving.guard import is_loopback

    if auth is None and not is_loopback(a.server_name):  # (before 2026-11-29 a warning only)
        raise SwiftError(f"--server_name {a.server_name} opens the console, which runs commands (and plugin code) as "
                         "this user, to other machines: give --auth or --auth_file")
    if auth is None:  # a password of this start's own (before 2026-12-07 any local user could launch commands)
        auth = (GENERATED_USER, secrets.token_urlsafe(16))
        print(f"swift web-ui: log in as user {auth[0]} with password {auth[1]} (made for this start; --auth or "
              "--auth_file sets your own)", flush=True)
    os.makedirs(a.runs_dir, exist_ok=True)
    demo, engines = build_console(os.path.abspath(a.runs_dir), lang=a.lang, title=a.studio_title)
    try:
        demo.queue(default_concurrency_limit=None).launch(server_name=a.server_name, server_port=a.server_port,
                                                          share=a.share, auth=auth, show_error=False, quiet=False)
    finally:
        engines.close()
