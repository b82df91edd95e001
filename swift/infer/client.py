"""ClientEngine: any OpenAI-compatible server (`swift deploy`, vLLM's server, a hosted API) as an
engine, for `swift eval --eval_url`, `swift sample --sampler_engine client` and `swift app --base_url`. Conversations go to
`/chat/completions`, raw prompts to `/completions`; at most `concurrency` requests are in flight."""
from __future__ import annotations

import asyncio
import http.client
import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

from swift.infer.protocol import Choice, InferEngine, InferRequest, InferResponse, RequestConfig, StreamDelta
from swift.utils.registry import SwiftError


# HTTP statuses that refuse one request (its prompt, its settings): other requests may still pass.
# Any other status, an unreachable server or an answer that is not OpenAI's is the server failing.
REFUSALS = frozenset({400, 413, 422})


class ServerFailure(SwiftError):
    """The server could not be reached or failed (not a refusal of this one request)."""


def _http_error(flag: str, where: str, e: urllib.error.HTTPError) -> SwiftError:
    kind = SwiftError if e.code in REFUSALS else ServerFailure
    return kind(f"{flag} {where}: HTTP {e.code}: {_error_message(e)}")


def api_base(url: str) -> str:
    """`http://host:port`, `.../v1` or `.../v1/chat/completions` → the `.../v1` base."""
    url = url.rstrip("/")
    for suffix in ("/chat/completions", "/completions"):
        if url.endswith(suffix):
            url = url[:-len(suffix)]
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise SwiftError(f"{url!r} is not an http(s) URL")
    return url if parsed.path not in ("", "/") else url + "/v1"


class ClientEngine(InferEngine):
    def __init__(self, url: str, *, api_key: str | None = None, model: str | None = None, concurrency: int = 16,
                 timeout: float = 600.0, flag: str = "--eval_url"):
        from swift.serving.guard import api_key_from_env

        # without a key given, the one a swift server would read (SWIFT_API_KEY): off the command line
        self.base, self.api_key, self.timeout, self.flag = api_base(url), api_key or api_key_from_env(), timeout, flag
        self.tokenizer = self.template = None
        self.max_model_len = 1 << 30  # the server checks lengths
        self._limit = max(int(concurrency), 1)
        # its own threads: asyncio's default pool would cap requests in flight at min(32, cores + 4)
        self._pool = ThreadPoolExecutor(max_workers=self._limit, thread_name_prefix="swift-client")
        try:
            served = [m["id"] for m in self._call("GET", "/models")["data"]]
        except SwiftError:
            raise
        except Exception as e:
            raise SwiftError(f"{self.flag} {url}: not an OpenAI-compatible server ({type(e).__name__}: {e})") from None
        if model and model not in served:
            raise SwiftError(f"{self.flag} {url} serves {', '.join(served)}, not {model!r} (--model)")
        self.model = model or served[0]
        self.omit_max_tokens = False  # True: leave max_tokens out, so the server's default applies (the rest of the context)

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method, headers=self._headers())
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except json.JSONDecodeError as e:
            raise ServerFailure(f"{self.flag} {self.base}{path}: the answer is not JSON ({e})") from None
        except urllib.error.HTTPError as e:
            raise _http_error(self.flag, self.base + path, e) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ServerFailure(f"{self.flag} {self.base}: cannot reach the server ({reason})") from None

    def encode(self, request: InferRequest) -> list[int]:
        raise SwiftError(f"{self.flag}: the server tokenizes; there is no local tokenizer")

    def _body(self, request: InferRequest, config: RequestConfig) -> tuple[str, dict]:
        body = {"model": self.model, **config.openai_fields(max_tokens=not self.omit_max_tokens)}
        if request.messages is not None:
            if request.tools:
                body["tools"] = request.tools
            return "/chat/completions", {**body, "messages": request.messages}
        return "/completions", {**body, "prompt": request.prompt if request.prompt is not None else request.input_ids}

    async def infer_async(self, request: InferRequest, config: RequestConfig) -> InferResponse:
        path, body = self._body(request, config)
        out = await asyncio.get_running_loop().run_in_executor(self._pool, self._call, "POST", path, body)
        try:
            choices = []
            for c in out["choices"]:
                text = c["message"].get("content") or "" if "message" in c else c.get("text", "")
                choices.append(Choice(index=c.get("index", len(choices)), text=text,
                                      token_ids=c.get("token_ids") or [], finish_reason=c.get("finish_reason") or "stop"))
            usage = out.get("usage") or {}
            return InferResponse(choices=choices, prompt_tokens=usage.get("prompt_tokens", 0),
                                 completion_tokens=usage.get("completion_tokens", 0))
        except (KeyError, TypeError, AttributeError) as e:
            raise ServerFailure(f"{self.flag} {self.base}{path}: not an OpenAI completion ({type(e).__name__}: {e})") \
                from None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def stream_async(self, request: InferRequest, config: RequestConfig):
        """The server's server-sent events as StreamDeltas. Closing the generator closes the
        connection, so the server stops generating for a reader that has left."""
        path, body = self._body(request, config)
        loop = asyncio.get_running_loop()
        opening = loop.run_in_executor(self._pool, self._open, path, {**body, "stream": True})
        try:
            response = await asyncio.shield(opening)
        except asyncio.CancelledError:  # the reader left while the request was being sent
            opening.add_done_callback(lambda f: None if f.cancelled() or f.exception() else _close(f.result()))
            raise
        try:
            while True:
                line = await loop.run_in_executor(self._pool, _readline, response)
                if not line:
                    break
                line = line.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise SwiftError(f"{self.flag} {self.base}{path}: {chunk['error'].get('message', chunk['error'])}")
                    for c in chunk["choices"]:
                        text = (c.get("delta") or {}).get("content") or "" if "delta" in c else c.get("text") or ""
                        yield StreamDelta(index=c.get("index", 0), text=text, token_ids=[],
                                          finish_reason=c.get("finish_reason"))
                except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
                    raise ServerFailure(f"{self.flag} {self.base}{path}: not an OpenAI stream ({type(e).__name__}: {e})") \
                        from None
        finally:
            _close(response)

    def _open(self, path: str, body: dict):
        """The open HTTP response of a POST (errors as in `_call`)."""
        request = urllib.request.Request(self.base + path, data=json.dumps(body).encode(), method="POST",
                                         headers=self._headers())
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            raise _http_error(self.flag, self.base + path, e) from None
        except (urllib.error.URLError, OSError) as e:
            raise ServerFailure(f"{self.flag} {self.base}: cannot reach the server ({getattr(e, 'reason', e)})") from None

    def _headers(self) -> dict[str, str]:
        return {"Content-Type": "application/json",
                **({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {})}


def _readline(response) -> bytes:
    """The next line of a stream; b"" at its end, or once `_close` has cut it off (the error a read
    cut off by then raises has no reader left to hear it)."""
    try:
        return response.readline()
    except (OSError, ValueError, AttributeError, http.client.HTTPException):
        if response.isclosed() or response.fp is None:
            return b""
        raise


def _close(response) -> None:
    """Close a streamed response at once, even while a pool thread is blocked reading it: shutting
    the socket down first ends that read (a plain close would wait for it), and the server sees the
    client leave."""
    import socket

    try:
        response.fp.raw._sock.shutdown(socket.SHUT_RDWR)
    except (AttributeError, OSError):
        pass
    try:
        response.close()
    except OSError:
        pass


def _error_message(e: urllib.error.HTTPError) -> str:
    """An OpenAI error body's message, else the start of the body."""
    detail = e.read().decode(errors="replace")[:300]
    try:
        return json.loads(detail)["error"]["message"]
    except Exception:
        return detail
