"""The chat page of `swift app` (and the Chat tab of `swift web-ui`).

It talks to an engine through `ChatBackend`: one built in this process from `--model`/`--adapters`
(the engines of `swift deploy`), or any OpenAI-compatible server (`--base_url`), reached anew on each
message while it cannot be reached. A failed answer shows one line on the page; the conversation
and the page go on.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from swift.app.i18n import label
from swift.utils.registry import SwiftError


def require_gradio():
    try:
        import gradio
    except ImportError:
        raise SwiftError('swift app / swift web-ui need gradio: pip install -e ".[app]"') from None
    return gradio


CLIENT_TIMEOUT = 120.0  # seconds a --base_url server may keep the page waiting for a reply or a piece


class ChatBackend:
    """What the page generates with. `engine`: an InferEngine in this process (its LoRA adapters in
    `adapters`); `base_url`: an OpenAI-compatible server instead."""

    def __init__(self, engine=None, adapters: dict[str, str] | None = None, base_url: str | None = None,
                 api_key: str | None = None, model: str | None = None, name: str = ""):
        self._engine, self.adapters, self.name = engine, dict(adapters or {}), name
        self.base_url, self.api_key, self.model = base_url, api_key, model
        self._lock = threading.Lock()
        self._streams = 0  # answers in flight
        self._retired = False

    def engine(self):
        with self._lock:
            if self._engine is None and self.base_url:
                from swift.infer.client import ClientEngine

                self._engine = ClientEngine(self.base_url, api_key=self.api_key, model=self.model, flag="--base_url",
                                            timeout=CLIENT_TIMEOUT)
            return self._engine

    def retire(self) -> None:
        """Close the engine now, or when the last answer in flight has ended (the console's chat: no
        browser tab holds this run's engine any more)."""
        with self._lock:
            self._retired = True
            idle = self._streams == 0
        if idle:
            self.close()

    def close(self) -> None:
        with self._lock:
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()

    async def stream(self, messages: list[dict], temperature: float, top_p: float, max_new_tokens: int,
                     adapter: str | None):
        """The answer's text, piece by piece."""
        from swift.infer.protocol import InferRequest, RequestConfig

        with self._lock:
            self._streams += 1
        try:
            engine = await asyncio.to_thread(self.engine)  # --base_url: the first call asks the server for its models
            if engine is None:
                raise SwiftError("no model is loaded")
            request = InferRequest(messages=messages, adapter=adapter)
            config = RequestConfig(max_tokens=max(int(max_new_tokens), 1), temperature=float(temperature),
                                   top_p=float(top_p))
            if engine.tokenizer is not None:  # in process: an answer may not run past the context
                prompt = engine.encode(request)
                request = InferRequest(input_ids=prompt, adapter=adapter)
                config = replace(config, max_tokens=max(min(config.max_tokens, engine.max_model_len - len(prompt)), 1))
            async for delta in engine.stream_async(request, config):
                if delta.text:
                    yield delta.text
        finally:
            with self._lock:
                self._streams -= 1
                last = self._retired and self._streams == 0
            if last:
                self.close()


def error_line(e: BaseException) -> str:
    """One line for the page: our errors as they are, others with their type."""
    text = str(e) if isinstance(e, SwiftError) else f"{type(e).__name__}: {e}"
    return " ".join(text.split())[:500]


def adapter_choices(backend: ChatBackend | None, lang: str) -> tuple[list[str], str]:
    """The adapter dropdown's choices and its value: as `swift infer`, the last adapter answers."""
    names = list(backend.adapters) if backend is not None else []
    base = label("base_model", lang)
    return [base, *names], (names[-1] if names else base)


def chat_panel(backend: ChatBackend | Callable[[Any], ChatBackend | None], lang: str, *, session=None,
               system: str | None = None, stream: bool = True, temperature: float = 0.0, top_p: float = 1.0,
               max_new_tokens: int = 512, prefix: str = ""):
    """The chat's components, built inside the caller's `gr.Blocks`. Returns the adapter dropdown
    (the console refreshes its choices when a tab loads another model). `session`: a gr.State of
    each browser tab (the console's: the run the tab chats with); `backend` is then a function of
    its value, giving the tab's backend (None before it has one)."""
    gr = require_gradio()

    def t(key: str) -> str:
        return label(key, lang)

    choices, chosen = adapter_choices(backend if session is None else None, lang)
    system_box = gr.Textbox(value=system or "", label=t("system"), lines=2, elem_id=f"{prefix}system")
    chatbot = gr.Chatbot(label=t("chatbot"), elem_id=f"{prefix}chatbot", height=360)
    error = gr.Markdown("", elem_id=f"{prefix}error")
    message = gr.Textbox(label=t("message"), placeholder=t("placeholder"), elem_id=f"{prefix}message", lines=1)
    with gr.Row():
        send = gr.Button(t("send"), variant="primary", elem_id=f"{prefix}send")
        stop = gr.Button(t("stop"), elem_id=f"{prefix}stop")
        regenerate = gr.Button(t("regenerate"), elem_id=f"{prefix}regenerate")
        clear = gr.Button(t("clear"), elem_id=f"{prefix}clear")
    temperature_box, top_p_box, max_tokens_box, adapter_box = _settings(
        gr, t, prefix, temperature, top_p, max_new_tokens, choices, chosen, len(choices) > 1)

    async def answer(history: list, system_text: str, temp, top, max_tokens, adapter, tab=None):
        """(history, error line) as the answer to the last user message grows."""
        messages = ([{"role": "system", "content": system_text}] if system_text.strip() else []) + [
            {"role": m["role"], "content": _text(m["content"])} for m in history]
        history = [*history, {"role": "assistant", "content": ""}]
        name = None if adapter in (None, t("base_model")) else adapter
        chosen = backend if session is None else backend(tab)
        try:
            if chosen is None:
                raise SwiftError(t("no_model"))
            async for piece in chosen.stream(messages, temp, top, max_tokens or 1, name):
                history[-1] = {"role": "assistant", "content": history[-1]["content"] + piece}
                if stream:
                    yield history, ""
        except Exception as e:  # noqa: BLE001 - this answer failed; the page goes on
            if not history[-1]["content"]:
                history = history[:-1]
            yield history, f"**{t('error')}:** {error_line(e)}"
            return
        yield history, ""

    # one event per message (the user's turn shown, then the answer streamed): a second event
    # would cost the page another round trip before the first token
    async def send_message(text: str, history: list, *settings):
        if not text.strip():
            yield text, history, gr.update()
            return
        history = [*history, {"role": "user", "content": text}]
        yield "", history, ""
        async for shown, err in answer(history, *settings):  # the box is left alone: the next question may be typed there
            yield gr.update(), shown, err

    async def regenerate_answer(history: list, *settings):
        while history and history[-1]["role"] == "assistant":
            history = history[:-1]
        if not history:
            yield history, ""
            return
        yield history, ""
        async for shown, err in answer(history, *settings):
            yield shown, err

    settings = [system_box, temperature_box, top_p_box, max_tokens_box, adapter_box,
                *([session] if session is not None else [])]
    # a message sent while the last answer is still finishing runs right after it (gradio's default,
    # "once", would drop it and leave the text in the box)
    events = [trigger(send_message, [message, chatbot, *settings], [message, chatbot, error],
                      trigger_mode="always_last")
              for trigger in (message.submit, send.click)]
    events.append(regenerate.click(regenerate_answer, [chatbot, *settings], [chatbot, error]))
    stop.click(None, cancels=events)
    clear.click(lambda: ([], ""), None, [chatbot, error], cancels=events, queue=False)
    return adapter_box


def _settings(gr, t, prefix: str, temperature: float, top_p: float, max_new_tokens: int, choices: list[str],
              chosen: str, adapters: bool):
    """The generation settings (closed at first): temperature, top-p, max new tokens, adapter."""
    with gr.Accordion(t("settings"), open=False, elem_id=f"{prefix}settings"):
        return (gr.Slider(0.0, 2.0, value=temperature, step=0.05, label=t("temperature"),
                          elem_id=f"{prefix}temperature"),
                gr.Slider(0.01, 1.0, value=top_p, step=0.01, label=t("top_p"), elem_id=f"{prefix}top_p"),
                gr.Number(value=max_new_tokens, precision=0, minimum=1, label=t("max_new_tokens"),
                          elem_id=f"{prefix}max_new_tokens"),
                gr.Dropdown(choices=choices, value=chosen, label=t("adapter"), elem_id=f"{prefix}adapter",
                            visible=adapters))


def _text(content) -> str:
    """A message's text (gradio may hand back a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    if isinstance(content, dict):
        return content.get("text", "")
    return str(content)


def build_app(backend: ChatBackend, *, title: str | None, lang: str, **panel):
    gr = require_gradio()
    with gr.Blocks(title=title or label("title", lang)) as demo:
        gr.Markdown(f"## {title or label('title', lang)}")
        if backend.name:
            gr.Markdown(f"`{backend.name}`", elem_id="model_name")
        chat_panel(backend, lang, **panel)
    return demo
