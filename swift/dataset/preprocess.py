"""Raw rows in any supported format → standard rows.

Standard row: `{"messages": [{"role", "content"}, ...]}` plus, where present, `rejected_response`
(preference), `label` (KTO), `tools`, and every other column kept by name (GRPO passes them to
reward functions). Raw pre-training text becomes `{"text": ...}`.
"""
from __future__ import annotations

import json
from typing import Any

from swift.template.base import ROLES, RowError

QUERY_KEYS = ("query", "prompt", "input", "instruction", "question", "problem")
RESPONSE_KEYS = ("response", "answer", "output", "solution", "completion")
SYSTEM_KEYS = ("system", "system_prompt")
CHOSEN_KEYS = ("chosen", "response_chosen")
REJECTED_KEYS = ("rejected", "rejected_response", "response_rejected", "negative")
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "bot": "assistant", "assistant": "assistant",
                  "system": "system", "observation": "tool", "tool": "tool", "function_call": "tool_call",
                  "function": "tool"}
# the columns ms-swift reads a conversation from (its MessagesPreprocessor), in that order
CONVERSATION_KEYS = ("messages", "conversation", "conversations")


def _first(row: dict, keys: tuple[str, ...]) -> tuple[str | None, Any]:
    for k in keys:
        if k in row and row[k] is not None:
            return k, row[k]
    return None, None


def _as_text(value: Any, what: str) -> str:
    if isinstance(value, dict):  # ShareGPT single message {"from", "value"} or {"role", "content"}
        value = value.get("value", value.get("content"))
    if isinstance(value, list) and value and isinstance(value[-1], dict):  # conversational TRL column
        value = value[-1].get("content")
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise RowError(f"{what} is {type(value).__name__}, expected text")
    return str(value)


def _message_list(value: Any, what: str) -> list[dict]:
    """`value` if it is a list of objects (a conversation), or a RowError naming the column."""
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise RowError(f"{what} must be a list of message objects, got {str(value)[:80]!r}")
    return value


def _messages_from_turns(turns: list) -> list[dict]:
    """A conversation column's turns as messages: a ShareGPT turn (`from`/`value`, its roles
    human/gpt/bot/observation/...) is converted, a message (`role`/`content`) kept as it is, in any
    of ms-swift's conversation columns (before 2026-12-07 `conversations` read only ShareGPT turns)."""
    out = []
    for t in turns:
        if "from" not in t:
            out.append(t)
            continue
        role = SHAREGPT_ROLES.get(t["from"])
        if role is None:
            raise RowError(f"unknown ShareGPT role '{t['from']}'")
        out.append({"role": role, "content": t.get("value")})
    return out


def _messages_from_transcript(text: str) -> list[dict]:
    """hh-rlhf style '\\n\\nHuman: ...\\n\\nAssistant: ...' transcripts."""
    messages = []
    for chunk in text.split("\n\n"):
        for prefix, role in (("Human:", "user"), ("Assistant:", "assistant")):
            if chunk.startswith(prefix):
                messages.append({"role": role, "content": chunk[len(prefix):].strip()})
                break
        else:
            if messages:
                messages[-1]["content"] += "\n\n" + chunk
    return messages


def _messages_from_query(row: dict, used: set[str]) -> list[dict] | None:
    # Alpaca: `instruction` is the query and `input` extends it; an empty instruction leaves `input`
    # alone as the query, as in ms-swift (before 2026-12-07 it was "\n" + input)
    qk, query = ("instruction", row["instruction"]) if row.get("instruction") else _first(row, QUERY_KEYS)
    rk, response = _first(row, tuple(k for k in RESPONSE_KEYS if k != qk))
    if qk is None and rk is None:
        return None
    messages = []
    sk, system = _first(row, SYSTEM_KEYS)
    if sk:
        used.add(sk)
        messages.append({"role": "system", "content": system})
    for pair in row.get("history") or []:  # alpaca/oaast multi-turn history: [[query, response], ...]
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise RowError(f"history entry {pair!r} is not a [query, response] pair")
        messages += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    used.add("history")
    if qk is not None:
        used.add(qk)
        if isinstance(query, list):  # conversational prompt (TRL)
            messages += [dict(m) for m in _message_list(query, qk)]
        else:
            query = _as_text(query, qk)
            if qk == "instruction" and row.get("input"):  # alpaca: instruction + input
                query = f"{query}\n{row['input']}"
                used.add("input")
            messages.append({"role": "user", "content": query})
    if rk is not None:
        used.add(rk)
        messages.append({"role": "assistant", "content": _as_text(response, rk)})
    return messages


def standardize(raw: dict, column_map: dict[str, str] | None = None) -> dict:
    """Convert one raw row to the standard row, or raise RowError saying what is wrong."""
    row = {column_map.get(k, k): v for k, v in raw.items()} if column_map else dict(raw)
    used: set[str] = set()
    messages = None
    conversation = next((k for k in CONVERSATION_KEYS if k in row), None)
    if conversation:
        used.add(conversation)
        messages = _messages_from_turns(_message_list(row[conversation], conversation))
    elif "text" in row and not any(k in row for k in QUERY_KEYS + CHOSEN_KEYS):
        text = row["text"]
        if not isinstance(text, str) or not text:
            raise RowError("'text' is empty")
        return {"text": text, **{k: v for k, v in row.items() if k != "text"}}
    out: dict[str, Any] = {}
    ck, chosen = _first(row, CHOSEN_KEYS)
    jk, rejected = _first(row, REJECTED_KEYS)
    if messages is None and ck == "chosen" and isinstance(chosen, str) and "\n\nHuman:" in chosen:
        messages = _messages_from_transcript(chosen)  # hh-rlhf: prompt is the shared prefix
        used.add(ck)
        if isinstance(rejected, str) and "\n\nHuman:" in rejected:
            rejected = (_messages_from_transcript(rejected) or [{"content": ""}])[-1]["content"]
    if messages is None:
        messages = _messages_from_query(row, used)
    if messages is None:
        raise RowError(f"no conversation found: expected 'messages', 'conversation(s)', 'text', or query/response "
                       f"columns ({'|'.join(QUERY_KEYS)} / {'|'.join(RESPONSE_KEYS)}); got {sorted(raw)}")
    messages = _tool_roles([dict(m) for m in _message_list(messages, "messages")])
    if ck is not None and ck not in used:  # preference row: chosen is the final assistant turn
        used.add(ck)
        messages.append({"role": "assistant", "content": _as_text(chosen, ck)})
    if jk is not None:
        used.add(jk)
        out["rejected_response"] = _as_text(rejected, jk)
    _check_messages(messages)
    if "rejected_response" in out and messages[-1]["role"] == "assistant" \
            and out["rejected_response"] == messages[-1]["content"]:
        raise RowError("rejected response equals the chosen response")
    out["messages"] = messages
    if row.get("tools") is not None:
        used.add("tools")
        out["tools"] = _tools(row["tools"])
    for k in used & {"solution", "answer"}:  # also a column, as in ms-swift: reward functions read it
        out[k] = row[k]
    if "prompt" in used and isinstance(row["prompt"], str):  # TRL's standard (text) format: its reward
        out["prompt"] = row["prompt"]  # functions get text prompts and completions
    for k, v in row.items():  # keep every other column (GRPO passes them to reward functions)
        if k not in used and k not in out:
            out[k] = v
    return out


def _tools(tools: Any) -> list[dict]:
    """The `tools` column: a list of tool signatures (objects), or ms-swift's JSON string of one.
    Another shape is the row's error here (before 2026-12-07 it passed and the template stopped the
    run with a traceback, --strict false too)."""
    if isinstance(tools, str):  # ms-swift's rows carry the tool list as a JSON string
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError:
            raise RowError(f"tools is not a JSON list: {tools[:80]!r}") from None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise RowError(f"tools must be a list of tool objects, got {repr(tools)[:80]}")
    return tools


def _check_calls(calls: Any, i: int) -> None:
    """An assistant message's `tool_calls`: objects with a `name`, at the top (ms-swift's form) or in
    OpenAI's `function` object (before 2026-12-07 another shape stopped encoding with a traceback)."""
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        raise RowError(f"message {i} has tool_calls {repr(calls)[:80]}; expected a list of call objects")
    for c in calls:
        call = c.get("function", c)
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
            raise RowError(f"message {i} has a tool call without a name: {repr(c)[:80]}")


def _tool_roles(messages: list[dict]) -> list[dict]:
    """ms-swift's agent roles in OpenAI's form: `tool_call` messages (JSON `{"name", "arguments"}`)
    become the `tool_calls` of one assistant message (consecutive calls together, after that turn's
    text if it has some); `tool_response` is `tool`. An assistant message with calls may have no text."""
    out: list[dict] = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role == "tool_call":
            try:
                call = json.loads(m["content"]) if isinstance(m.get("content"), str) else m.get("content")
            except json.JSONDecodeError:
                raise RowError(f"message {i} (tool_call) is not JSON: {str(m.get('content'))[:80]!r}") from None
            if not isinstance(call, dict) or "name" not in call:
                raise RowError(f"message {i} (tool_call) needs a JSON object with 'name' and 'arguments'")
            _check_calls([call], i)
            prev = out[-1] if out else None
            if prev is not None and prev["role"] == "assistant" and (prev.get("tool_calls") or i and
                                                                      messages[i - 1].get("role") == "assistant"):
                prev.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
            continue
        if role == "tool_response":
            m = {**m, "role": "tool"}
        if m.get("tool_calls") is not None:
            _check_calls(m["tool_calls"], i)
        if role == "assistant" and m.get("tool_calls") and m.get("content") is None:
            m = {**m, "content": ""}
        out.append(m)
    return out


def as_bool(value: Any, what: str = "label") -> bool:
    """true/false, 1/0 or yes/no (any case; 1.0/0.0 from pandas or parquet too); anything else (-1 for
    a thumbs-down, 2, None) is a row error, not a guess. KTO labels and PRM step labels both read this,
    where they are used: `label` stays as written in the row (before 2026-12-07 it was made a bool for
    every command, so sft rows labelled "positive" were dropped and GRPO's reward functions got True for 1)."""
    if isinstance(value, str):
        if value.lower() in ("true", "1", "yes"):
            return True
        if value.lower() in ("false", "0", "no"):
            return False
    elif isinstance(value, bool) or (isinstance(value, (int, float)) and value in (0, 1)):
        return bool(value)
    raise RowError(f"{what} {value!r} is not a boolean (true/false, 1/0, yes/no)")


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise RowError("messages is empty")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise RowError(f"message {i} has no role")
        if m["role"] not in ROLES:
            raise RowError(f"message {i} has role '{m['role']}', expected one of {', '.join(ROLES)}")
        if m.get("content") is None:
            raise RowError(f"message {i} ({m['role']}) has no content")
        m["content"] = _content_text(m["content"], i)


def _content_text(content: Any, i: int) -> str:
    """A message's content as the text the model reads: OpenAI's text parts joined (as the server
    reads them), an object (a tool's result) as JSON, a number as written; an image part or a
    boolean is a row error (before 2026-11-29 any of them was trained on as its Python repr)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and "type" in p for p in content):
        kinds = {p["type"] for p in content} - {"text"}
        if kinds or not all(isinstance(p.get("text"), str) for p in content):
            raise RowError(f"message {i} has a {sorted(kinds)[0] if kinds else 'malformed'!r} part; text parts only")
        return "".join(p["text"] for p in content)
    if isinstance(content, bool):
        raise RowError(f"message {i} has content {content!r}, expected text")
    if isinstance(content, (int, float)):
        return str(content)
    return json.dumps(content, ensure_ascii=False)
