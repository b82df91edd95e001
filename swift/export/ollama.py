"""An Ollama `Modelfile` for an exported GGUF: FROM the file, a TEMPLATE (Ollama's Go template over
`.Messages`) that renders what the model's chat template renders, its default system prompt as
SYSTEM, and its end-of-turn strings as stop parameters.

The TEMPLATE is read off the chat template by rendering conversations whose contents are markers:
each role's text before and after its content. Templates that are not such per-message wrappers
(ones that reorder messages or change a turn's text by its position) are refused, since a TEMPLATE
read off them would render something else.
"""
from __future__ import annotations

import json

from swift.utils.registry import SwiftError

MARK = {"system": "\x00SYS\x00", "user": "\x00USR\x00", "assistant": "\x00AST\x00"}


def _render(tokenizer, messages, generation: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)


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


def read_wrappers(tokenizer) -> tuple[dict[str, tuple[str, str]], str, str | None]:
    """({role: (before, after)}, generation prompt, default system prompt or None)."""
    s, u, a = MARK["system"], MARK["user"], MARK["assistant"]
    full = [{"role": "system", "content": s}, {"role": "user", "content": u},
            {"role": "assistant", "content": a}, {"role": "user", "content": u}]
    try:
        text = _render(tokenizer, full, False)
        gen = _strip_prefix(_render(tokenizer, full, True), text)
        bos = tokenizer.bos_token or ""
        user_after = text[text.rindex(u) + len(u):]
        assistant_after = _render(tokenizer, full[1:3], False).split(a, 1)[1]
        user_before = _strip_prefix(_between(text, a, u), assistant_after)
        assistant_before = _strip_prefix(_between(text, u, a), user_after)
        system_after = _strip_suffix(_between(text, s, u), user_before)
        system_before = text[:text.index(s)]
        if bos and system_before.startswith(bos):  # the runtime adds BOS itself, as the GGUF says
            system_before = system_before[len(bos):]
    except ValueError:
        raise SwiftError("--to_ollama: the chat template does not wrap each message in fixed text, so no Ollama "
                         "TEMPLATE can be read off it; write the Modelfile's TEMPLATE by hand") from None
    wrappers = {"system": (system_before, system_after), "user": (user_before, user_after),
                "assistant": (assistant_before, assistant_after)}
    default_system = None
    alone = _render(tokenizer, [{"role": "user", "content": u}], True).removeprefix(bos)
    plain = user_before + u + user_after + gen
    if alone != plain:  # a template that adds a system prompt when none is given
        if not (alone.startswith(system_before) and alone.endswith(system_after + plain)):
            raise SwiftError("--to_ollama: the chat template's text for a conversation without a system message is "
                             "not its wrappers' text; write the Modelfile's TEMPLATE by hand")
        default_system = alone[len(system_before):len(alone) - len(system_after + plain)]
    return wrappers, gen, default_system


def compose(wrappers: dict[str, tuple[str, str]], gen: str, messages: list[dict]) -> str:
    """What the Modelfile's TEMPLATE renders for `messages` (the same loop, in Python)."""
    return "".join(wrappers[m["role"]][0] + m["content"] + wrappers[m["role"]][1] for m in messages) + gen


def _go_literal(text: str) -> str:
    """Text for a Go template: `{{` cannot appear raw."""
    return text.replace("{{", '{{ "{{" }}')


def _quoted(text: str) -> str:
    if '"""' in text:
        raise SwiftError('--to_ollama: the chat template contains """, which a Modelfile cannot quote')
    return '"""' + text + '"""'


def modelfile(tokenizer, gguf_name: str, stop: list[str]) -> str:
    wrappers, gen, default_system = read_wrappers(tokenizer)
    branches = []
    for i, (role, (before, after)) in enumerate(wrappers.items()):
        keyword = "if" if i == 0 else "else if"
        branches.append(f'{{{{ {keyword} eq .Role "{role}" }}}}{_go_literal(before)}{{{{ .Content }}}}'
                        f'{_go_literal(after)}')
    template = "{{ range .Messages }}" + "".join(branches) + "{{ end }}{{ end }}" + _go_literal(gen)
    lines = [f"FROM ./{gguf_name}", f"TEMPLATE {_quoted(template)}"]
    if default_system is not None:
        lines.append(f"SYSTEM {_quoted(default_system)}")
    lines += [f"PARAMETER stop {json.dumps(s)}" for s in dict.fromkeys(stop) if s]
    return "\n".join(lines) + "\n"
