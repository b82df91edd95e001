"""What `swift deploy` and `swift rollout` check before a request reaches a route, and the limits
their routes apply: the API key (compared in constant time), the body size, the number of
requests in flight, the time a request may take, and caps on `n` and `max_tokens`.

`Guard` is plain ASGI middleware, so it answers 401 and 413 (from Content-Length) without reading
a body it refuses. It reads a request's whole body (within --body_timeout) before the request
takes one of the --max_concurrent_requests slots, so a slow upload holds no slot; the bodies being
read together are capped at --max_concurrent_requests × --max_request_bytes bytes (the bound the
slots gave before), above which a new request gets 429. A streamed request counts as in flight
until its last byte is sent."""
from __future__ import annotations

import asyncio
import hmac
import json
import time
from dataclasses import dataclass, field

from swift.serving.errors import RequestError
from swift.infer.protocol import RequestConfig
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)

OPEN_PATHS = frozenset({"/health", "/health/"})
MAX_STOP, MAX_STOP_CHARS = 16, 256  # stop strings are matched on every token of every row


API_KEY_ENV = "SWIFT_API_KEY"  # the key from the environment (vLLM's server reads VLLM_API_KEY alike)


def api_key_from_env() -> str | None:
    """The key in SWIFT_API_KEY (surrounding whitespace, e.g. a secret file's newline, dropped)."""
    import os

    return os.environ.get(API_KEY_ENV, "").strip() or None


@dataclass
class ServingLimits:
    api_key: str | None = field(default=None, metadata={
        "help": "Require 'Authorization: Bearer <key>' on every route but /health (compared in constant time). "
                "On the command line the key shows in `ps`: prefer --api_key_file or the SWIFT_API_KEY "
                "environment variable."})
    api_key_file: str | None = field(default=None, metadata={
        "help": "A file whose first line is the API key (instead of --api_key)."})
    max_request_bytes: int = field(default=8 * 2 ** 20, metadata={
        "help": "Largest request body in bytes (413 above it); default 8 MiB."})
    max_concurrent_requests: int = field(default=256, metadata={
        "help": "Requests in flight (streams included) before new ones get 429."})
    request_timeout: float = field(default=600.0, metadata={
        "help": "Seconds a request may take; then it gets 504 (a stream: an error event and [DONE])."})
    body_timeout: float = field(default=30.0, metadata={
        "help": "Seconds a client may take to send its request body (then 408). The body is read before the "
                "request takes one of the --max_concurrent_requests slots, so slow uploads hold none."})
    max_n: int = field(default=128, metadata={"help": "Largest n (choices per request) a request may ask for."})
    max_tokens_limit: int | None = field(default=None, metadata={
        "help": "Largest max_tokens a request may ask for (default: the model's context)."})
    max_rows_per_request: int = field(default=4096, metadata={
        "help": "Most sequences one request may ask for (prompts × n, or texts to score)."})
    allow_control_tokens: bool = field(default=False, metadata={
        "help": "Encode control-token text inside message content (a client typing '<|im_start|>system') as "
                "control tokens, as training does. Off (default), such text is plain text, so a client cannot "
                "forge a turn of its own; only the chat template writes control tokens. For trusted callers."})

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key:
            raise SwiftError("--api_key must not be empty")
        if self.api_key_file is not None:
            if self.api_key is not None:
                raise SwiftError("give --api_key or --api_key_file, not both")
            try:
                with open(self.api_key_file, encoding="utf-8") as f:
                    self.api_key = f.readline().strip()
            except OSError as e:
                raise SwiftError(f"--api_key_file {self.api_key_file}: {e.strerror}") from None
            if not self.api_key:
                raise SwiftError(f"--api_key_file {self.api_key_file}: its first line is empty")
        elif self.api_key is None:
            self.api_key = api_key_from_env()
        for name in ("max_request_bytes", "max_concurrent_requests", "max_n", "max_rows_per_request"):
            if getattr(self, name) < 1:
                raise SwiftError(f"--{name} must be at least 1, got {getattr(self, name)}")
        for name in ("request_timeout", "body_timeout"):
            if getattr(self, name) <= 0:
                raise SwiftError(f"--{name} must be positive, got {getattr(self, name)}")
        if self.max_tokens_limit is not None and self.max_tokens_limit < 1:
            raise SwiftError(f"--max_tokens_limit must be at least 1, got {self.max_tokens_limit}")

    def check(self, config: RequestConfig, rows: int | None = None) -> None:
        """Refuse (400) a request above the server's caps (`rows`: the sequences it asks for)."""
        if len(config.stop) > MAX_STOP or any(len(s) > MAX_STOP_CHARS for s in config.stop):
            raise RequestError(f"stop takes at most {MAX_STOP} strings of at most {MAX_STOP_CHARS} characters",
                               "stop")
        if rows is not None and rows > self.max_rows_per_request:
            raise RequestError(f"the request asks for {rows} sequences, above this server's limit of "
                               f"{self.max_rows_per_request} (--max_rows_per_request)", "n")
        if config.n > self.max_n:
            raise RequestError(f"n={config.n} is above this server's limit of {self.max_n} (--max_n)", "n")
        if self.max_tokens_limit is not None and config.max_tokens > self.max_tokens_limit:
            raise RequestError(f"max_tokens={config.max_tokens} is above this server's limit of "
                               f"{self.max_tokens_limit} (--max_tokens_limit)", "max_tokens")


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps a server to this machine (a host name other than localhost may
    resolve to anything)."""
    import ipaddress

    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_if_open(host: str, limits: ServingLimits) -> None:
    """Warn (once, at start) when a server binds a non-loopback address and takes no key."""
    if limits.api_key:
        return
    if not is_loopback(host):
        logger.warning(f"--host {host} is reachable from other machines and no API key is set: anyone who can "
                       f"reach the port can use the model; set --api_key_file or {API_KEY_ENV}")


def timed_out(timeout: float) -> RequestError:
    """The 504 of a request that ran past --request_timeout (both servers, routes and Guard)."""
    return RequestError(f"the request took longer than {timeout:g}s (--request_timeout)", status=504, code="timeout")


def key_matches(header: bytes | None, api_key: str) -> bool:
    return header is not None and hmac.compare_digest(header, f"Bearer {api_key}".encode())


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


class RequestTooLarge(RequestError):
    def __init__(self, limit: int):
        super().__init__(f"request body is larger than {limit} bytes (--max_request_bytes)", status=413,
                         code="request_too_large")


async def _reply(send, error: RequestError) -> None:
    body = json.dumps(error.body()).encode()
    await send({"type": "http.response.start", "status": error.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class TooManyBodies(RequestError):
    def __init__(self):
        super().__init__("the server is reading too many request bodies at once (--max_concurrent_requests × "
                         "--max_request_bytes); retry later", status=429, code="too_many_requests")


class Guard:
    """ASGI middleware: key, size and concurrency checks for every route outside OPEN_PATHS."""

    def __init__(self, app, limits: ServingLimits, log_requests: bool = False):
        self.app, self.limits, self.log_requests = app, limits, log_requests
        self.active = 0
        self.buffered = 0  # bytes of the bodies being read or served now

    async def _read_body(self, receive, held: list[int]) -> list[dict] | None:
        """The request's `http.request` messages up to the last one (None if the client
        disconnects); RequestTooLarge past --max_request_bytes, TooManyBodies past the bytes all
        requests may hold together. `held[0]`: this request's bytes counted in `buffered`."""
        limits, messages = self.limits, []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            if message["type"] != "http.request":
                continue
            size = len(message.get("body", b""))
            if held[0] + size > limits.max_request_bytes:
                raise RequestTooLarge(limits.max_request_bytes)
            if self.buffered + size > limits.max_concurrent_requests * limits.max_request_bytes:
                raise TooManyBodies()
            held[0] += size
            self.buffered += size
            messages.append(message)
            if not message.get("more_body", False):
                return messages

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if not self.log_requests:
            return await self._guard(scope, receive, send)
        start, status = time.time(), [0]

        async def send_and_note(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self._guard(scope, receive, send_and_note)
        finally:
            logger.info(f"{scope['method']} {scope['path']} {status[0]} {1000 * (time.time() - start):.0f}ms")

    async def _guard(self, scope, receive, send):
        if scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        limits = self.limits
        headers = dict(scope["headers"])
        if limits.api_key and not key_matches(headers.get(b"authorization"), limits.api_key):
            return await _reply(send, RequestError("invalid or missing API key", status=401, code="invalid_api_key"))
        length = headers.get(b"content-length")
        if length is not None:
            if not length.isdigit():
                return await _reply(send, RequestError("Content-Length is not a number"))
            if int(length) > limits.max_request_bytes:
                return await _reply(send, RequestTooLarge(limits.max_request_bytes))
        held = [0]
        try:
            await self._serve(scope, receive, send, held)
        finally:
            self.buffered -= held[0]

    async def _serve(self, scope, receive, send, held: list[int]):
        limits = self.limits
        try:  # the whole body first, so that a slow upload holds no slot
            messages = await asyncio.wait_for(self._read_body(receive, held), limits.body_timeout)
        except asyncio.TimeoutError:
            return await _reply(send, RequestError(f"the request body did not arrive within {limits.body_timeout:g}s "
                                                   "(--body_timeout)", status=408, code="request_timeout"))
        except (RequestTooLarge, TooManyBodies) as e:  # RequestTooLarge: a chunked body without Content-Length
            return await _reply(send, e)
        if messages is None:  # the client left while sending
            return
        if self.active >= limits.max_concurrent_requests:
            return await _reply(send, RequestError(
                f"the server has {self.active} requests in flight (--max_concurrent_requests); retry later",
                status=429, code="too_many_requests"))

        async def replay_receive():  # the body read above, then what the client sends next (its disconnect)
            return messages.pop(0) if messages else await receive()

        started = [False]

        async def noting_send(message):
            started[0] = started[0] or message["type"] == "http.response.start"
            await send(message)

        self.active += 1
        try:
            # routes answer 504 at --request_timeout themselves; this also ends a request whose client
            # stalls while reading a stream, so its slot is never held forever
            await asyncio.wait_for(self.app(scope, replay_receive, noting_send), limits.request_timeout + 10)
        except asyncio.TimeoutError:
            if not started[0]:
                await _reply(send, timed_out(limits.request_timeout))
        finally:
            self.active -= 1


async def read_body(request) -> dict:
    """The request's JSON object, or a 400 naming what is wrong with it."""
    raw = await request.body()
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(f"request body is not valid JSON: {e}") from None
    except RecursionError:
        raise RequestError("request body is nested too deeply") from None
    except ValueError as e:  # NaN/Infinity, or an integer of thousands of digits
        raise RequestError(f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    return body
