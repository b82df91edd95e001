"""An Ollama `Modelfile` for an exported GGUF: FROM the file, a TEMPLATE (Ollama's Go template over
`.Messages`) that renders what the model's chat template renders (with the block the template puts
first when a conversation has no system message), and its end-of-turn strings as stop parameters.

The TEMPLATE is read off the chat template by rendering conversations whose contents are markers:
each role's text before and after its content. Templates that are not such per-message wrappers
(ones that reorder messages or change a turn's text by its position) are refused, since a TEMPLATE
read off them would render something else. Tool messages get a branch when the template wraps each in
fixed text too (ChatML's); what the TEMPLATE cannot render as the chat template does (tool definitions,
tool calls, tool messages merged into user turns, earlier turns rewritten, later system messages) is
named in one warning at export (`differences`).
"""
from __future__ import annotations

import os

from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)
# a tool result's marker is plain text: templates may write it as JSON (Llama 3.2's), which escapes control bytes
MARK = {"system": "\x00SYS\x00", "user": "\x00USR\x00", "assistant": "\x00AST\x00", "tool": "swift_probe_result"}
TOOL_NAME = "swift_probe_tool"


def _render(tokenizer, messages, generation: bool, **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation, **kwargs)


def _rendered(tokenizer, messages: list[dict], bos: str, **kwargs) -> str | None:
    """The chat template's prompt for `messages` without the BOS the runtime adds; None when the template
    refuses them."""
    try:
        text = _render(tokenizer, messages, True, **kwargs)
    except Exception:  # a template's own raise_exception (jinja's TemplateError) or a missing field
        return None
    return text[len(bos):] if bos and text.startswith(bos) else text


def _between(text: str, left: str, right: str) -> str:
    start = text.index(left) + len(left)
    return text[start:text.index(right, start)]


def _strip_prefix(text: str, prefix: str) -> str:
    if not text.startswith(prefix):
        raise ValueError
    return text[len(prefix):]


def _strip_suffix(text: str, suffix: str) -> str:
    if suffix and not text.endswith(suffix):
        raise ValueError
    return text[:len(text) - len(suffix)]


def read_wrappers(tokenizer, keep_bos: bool = False) -> tuple[dict[str, tuple[str, str]], str, str | None]:
    """({role: (before, after)}, generation prompt, the text the template puts first when a conversation has
    no system message, or None when it puts nothing). A leading BOS is left to the runtime (the GGUF says
    it adds one) unless `keep_bos`."""
    s, u, a = MARK["system"], MARK["user"], MARK["assistant"]
    full = [{"role": "system", "content": s}, {"role": "user", "content": u},
            {"role": "assistant", "content": a}, {"role": "user", "content": u}]
    bos = "" if keep_bos else (tokenizer.bos_token or "")
    try:
        text = _render(tokenizer, full, False)
        gen = _strip_prefix(_render(tokenizer, full, True), text)
        user_after = text[text.rindex(u) + len(u):]
        assistant_after = _render(tokenizer, full[1:3], False).split(a, 1)[1]
        user_before = _strip_prefix(_between(text, a, u), assistant_after)
        assistant_before = _strip_prefix(_between(text, u, a), user_after)
        system_after = _strip_suffix(_between(text, s, u), user_before)
        system_before = text[:text.index(s)]
        if bos and system_before.startswith(bos):
            system_before = system_before[len(bos):]
    except ValueError:
        raise SwiftError("--to_ollama: the chat template does not wrap each message in fixed text, so no Ollama "
                         "TEMPLATE can be read off it; write the Modelfile's TEMPLATE by hand") from None
    wrappers = {"system": (system_before, system_after), "user": (user_before, user_after),
                "assistant": (assistant_before, assistant_after)}
    default = None
    wrappers["tool"] = _tool_wrapper(tokenizer, full[1:3])
    alone = _render(tokenizer, [{"role": "user", "content": u}], True)
    alone = alone[len(bos):] if bos and alone.startswith(bos) else alone
    plain = user_before + u + user_after + gen
    if alone != plain:  # a template that puts a system block first when no system message is given
        if not alone.endswith(plain):
            raise SwiftError("--to_ollama: the chat template's text for a conversation without a system message is "
                             "not its wrappers' text; write the Modelfile's TEMPLATE by hand")
        default = alone[:len(alone) - len(plain)]
    if wrappers["tool"] is None or not all(
            compose(wrappers, gen, default, m) == _rendered(tokenizer, m, bos) for m in _tool_conversations()):
        del wrappers["tool"]  # tool messages the template does not wrap each in fixed text
    return wrappers, gen, default


def _tool_wrapper(tokenizer, exchange: list[dict]) -> tuple[str, str] | None:
    """The text a tool message after `exchange` (a user and an assistant turn) adds around its content."""
    t = MARK["tool"]
    try:
        before = _render(tokenizer, exchange, False)
        text = _render(tokenizer, [*exchange, {"role": "tool", "content": t}], False)
    except Exception:  # a template that refuses tool messages
        return None
    if not text.startswith(before) or text.count(t) != 1:
        return None
    head, tail = text[len(before):].split(t)
    return head, tail


def _tool_conversations() -> list[list[dict]]:
    """Tool messages alone, two in a row, and followed by an answer and a new question: a tool branch read off
    one message must render all of these as the chat template does."""
    user, answer = {"role": "user", "content": "weather in Paris?"}, {"role": "assistant", "content": "sunny"}
    call, tool = {"role": "assistant", "content": "let me look"}, {"role": "tool", "content": '22 C,\n"sun"'}
    return [[user, call, tool], [{"role": "system", "content": "be brief"}, user, call, tool, tool, answer, user]]


def differences(tokenizer, wrappers: dict[str, tuple[str, str]], gen: str, default: str | None,
                keep_bos: bool = False) -> list[str]:
    """What the chat template renders that the TEMPLATE read off it (`read_wrappers`) does not: probed by
    rendering conversations with tool definitions, tool calls and tool messages (found by marker names),
    an earlier assistant turn with `<think>` reasoning, and a second system message."""
    bos = "" if keep_bos else (tokenizer.bos_token or "")
    user = {"role": "user", "content": "weather in Paris?"}
    function = {"name": TOOL_NAME, "description": "d", "parameters": {"type": "object", "properties": {}}}
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "c1",
                                                                "function": {"name": TOOL_NAME, "arguments": {}}}]}
    found = []
    if TOOL_NAME in (_rendered(tokenizer, [user], bos, tools=[{"type": "function", "function": function}]) or ""):
        found.append("tool definitions (Ollama's .Tools)")
    if TOOL_NAME in (_rendered(tokenizer, [user, call], bos) or ""):
        found.append("assistant tool calls")
    tool = [user, {"role": "assistant", "content": "let me look"}, {"role": "tool", "content": MARK["tool"]}]
    if "tool" not in wrappers and MARK["tool"] in (_rendered(tokenizer, tool, bos) or ""):
        found.append("tool messages")
    probes = {"earlier assistant turns (it rewrites them, e.g. drops their <think> reasoning)":
              [user, {"role": "assistant", "content": "<think>\nlook it up\n</think>\n\nsunny"}, user],
              "a system message after the first": [{"role": "system", "content": "be brief"}, user,
                                                   {"role": "system", "content": "answer in French"}, user]}
    for what, messages in probes.items():
        expected = _rendered(tokenizer, messages, bos)
        if expected is not None and compose(wrappers, gen, default, messages) != expected:
            found.append(what)
    return found


def compose(wrappers: dict[str, tuple[str, str]], gen: str, default: str | None, messages: list[dict]) -> str:
    """What the Modelfile's TEMPLATE renders for `messages` (the same steps, in Python)."""
    head = default if default is not None and (not messages or messages[0]["role"] != "system") else ""
    # as Ollama runs it: a message of a role with no branch renders nothing
    return head + "".join(wrappers[m["role"]][0] + (m.get("content") or "") + wrappers[m["role"]][1]
                          for m in messages if m["role"] in wrappers) + gen


def _go_literal(text: str) -> str:
    """Text for a Go template: `{{` cannot appear raw."""
    return text.replace("{{", '{{ "{{" }}')


def _quoted(text: str) -> str:
    if '"""' in text:
        raise SwiftError('--to_ollama: the chat template contains """, which a Modelfile cannot quote')
    return '"""' + text + '"""'


def modelfile(tokenizer, gguf_name: str, stop: list[str], keep_bos: bool = False) -> str:
    wrappers, gen, default = read_wrappers(tokenizer, keep_bos)
    template = ""
    if default is not None:  # Go's `or` stops at the first true argument: index is not reached on no messages
        template = ('{{ if or (not .Messages) (ne (index .Messages 0).Role "system") }}'
                    f"{_go_literal(default)}{{{{ end }}}}")
    branches = []
    for i, (role, (before, after)) in enumerate(wrappers.items()):
        keyword = "if" if i == 0 else "else if"
        branches.append(f'{{{{ {keyword} eq .Role "{role}" }}}}{_go_literal(before)}{{{{ .Content }}}}'
                        f'{_go_literal(after)}')
    template += "{{ range .Messages }}" + "".join(branches) + "{{ end }}{{ end }}" + _go_literal(gen)
    lines = [f"FROM ./{gguf_name}", f"TEMPLATE {_quoted(template)}"]
    for word in dict.fromkeys(w for w in stop if w):
        if '"' in word or "\n" in word or "\\" in word:
            raise SwiftError(f"--to_ollama: the stop string {word!r} cannot be written as a Modelfile parameter")
        lines.append(f'PARAMETER stop "{word}"')
    return "\n".join(lines) + "\n"


def write_modelfile(hf_dir: str, folder: str, gguf_name: str, metadata: dict[str, str]) -> None:
    """`folder/Modelfile` for the GGUF `gguf_name` beside it, made from the HF folder's tokenizer and
    generation config; `metadata`: the GGUF's (llama.cpp adds a BOS itself when it says so)."""
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    stop = [tokenizer.eos_token] if tokenizer.eos_token else []
    try:
        eos = GenerationConfig.from_pretrained(hf_dir).eos_token_id
        ids = eos if isinstance(eos, list) else [eos] if eos is not None else []
        stop += [tokenizer.convert_ids_to_tokens(i) for i in ids]
    except OSError:  # no generation_config.json
        pass
    adds_bos = metadata.get("tokenizer.ggml.add_bos_token", "false").lower() == "true"
    with open(os.path.join(folder, "Modelfile"), "w", encoding="utf-8") as f:
        f.write(modelfile(tokenizer, gguf_name, stop, keep_bos=not adds_bos))
    found = differences(tokenizer, *read_wrappers(tokenizer, not adds_bos), keep_bos=not adds_bos)
    if found:
        logger.warning(f"--to_ollama: the Modelfile's TEMPLATE does not render {'; '.join(found)} as the chat "
                       "template does (edit its TEMPLATE for conversations that have them)")
