"""`builtin:tool-calls`: requests that need one of two tools, answered with an OpenAI-shaped tool
call (weather of a city, the sum of two numbers), and greetings answered in words. Every row
carries the two tool signatures in its `tools` column, as ms-swift's agent data does; the chat
template renders them (the Hermes layout for the ChatML family). The built-in tiny model learns
the calls in a few hundred steps, so `swift deploy` returns real `tool_calls` to an OpenAI client."""
from __future__ import annotations

from swift.plugin import register

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "add", "description": "Sum of two integers",
                                      "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                                                      "b": {"type": "integer"}}}}},
]
CITIES = {"train": ["Paris", "Oslo", "Lima", "Cairo", "Tokyo", "Rome"], "eval": ["Madrid", "Seoul"]}
SUMS = {"train": [(4, 9), (12, 30), (7, 7), (25, 1), (3, 18), (40, 2)], "eval": [(5, 6), (10, 20)]}
GREETINGS = [("Hello!", "Hello! How can I help you?"), ("Thanks!", "You are welcome."),
             ("Good morning.", "Good morning! How can I help you?")]


def _call(name: str, arguments: dict) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": name, "arguments": arguments}}]}


@register("dataset", "tool-calls")
def tool_calls(split: str = "train") -> list[dict]:
    """Weather questions about 6 cities and 6 sums (2 of each held out in `eval`), and 3 greetings
    answered in words (train only)."""
    rows = [[{"role": "user", "content": f"What is the weather in {city}?"}, _call("get_weather", {"city": city})]
            for city in CITIES[split]]
    rows += [[{"role": "user", "content": f"Add {a} and {b}."}, _call("add", {"a": a, "b": b})] for a, b in SUMS[split]]
    if split == "train":
        rows += [[{"role": "user", "content": q}, {"role": "assistant", "content": a}] for q, a in GREETINGS]
    return [{"messages": m, "tools": TOOLS} for m in rows]
