"""Tiny real GGUFs whose ``tokenizer.chat_template`` is a real model's (Qwen2.5's with its tools, Llama
3.1's, Gemma 3's), and ``tandem serve`` over them in this process: for the tests of tool calls, Anthropic's
Messages API and OpenAI's Responses API."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from test_chat import GEMMA3_TEMPLATE, LLAMA31_TEMPLATE, QWEN25_TEMPLATE  # the models' own templates

from api_server import Running, start, wait_idle
from app.engine import EngineClient, LoadSettings
from app.server.served import Served
from app.tiny_gguf import build_tokenizer, write_tiny_llama

TEMPLATES = {"qwen25": QWEN25_TEMPLATE, "llama31": LLAMA31_TEMPLATE, "gemma3": GEMMA3_TEMPLATE}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_files",
        "description": "Files whose text matches a pattern",
        "parameters": {
            "type": "object",
            "properties": {"pattern": {"type": "string", "maxLength": 10}},
            "required": ["pattern"],
            "additionalProperties": False,
        },
    },
}


def write_variant(directory: Path, template: str) -> Path:
    """The tiny target (the same weights as ``tiny_pair``'s, so its draft fits) with a real template."""
    return write_tiny_llama(
        directory / f"tiny-{template}.gguf",
        seed=0,
        name=f"tiny-{template}",
        chat_template=TEMPLATES[template],
    )


@contextmanager
def serving(target: Path, draft: Path, mode: str = "speculative", **kw: Any) -> Iterator[Running]:
    """``tandem serve`` over ``target`` (and ``draft``) on 127.0.0.1 (``create_app`` keywords in ``kw``)."""
    with EngineClient(auto_restart=True) as client:
        client.load(LoadSettings(target=str(target), draft=str(draft), n_ctx=2048, n_threads=1))
        running = start(Served(client, mode=mode, model_path=str(target), n_ctx=2048), **kw)
        try:
            yield running
        finally:
            running.stop()


def prompt_text(running: Running, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> str:
    """The prompt the engine makes of ``messages`` (with ``tools``), as text (the tiny vocabulary)."""
    wait_idle(running.served)
    carried = [{"role": "tandem.tools", "tools": tools}] if tools else []
    ids = running.served.client.tokenize(messages=carried + messages)
    return build_tokenizer("a").decode(ids).decode("utf-8", errors="replace")


def n_prompt(running: Running, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> int:
    wait_idle(running.served)
    carried = [{"role": "tandem.tools", "tools": tools}] if tools else []
    return len(running.served.client.tokenize(messages=carried + messages))


def arguments(call: Any) -> dict[str, Any]:
    return json.loads(call.function.arguments if hasattr(call, "function") else call.arguments)
