"""Tool calls in a model's output, found as the text streams (:class:`CallParser`).

The formats of the families Tandem serves, whatever the template said:

* Qwen 2.5/3, Hermes: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, anywhere, several;
* Llama 3.x: a JSON call ``{"name": ..., "parameters": {...}}`` as the whole reply (after
  ``<|python_tag|>`` where that token is shown), several separated by ``;`` or new lines;
* Gemma (and the prompt :func:`app.engine.chat.tools_prompt` gives templates without tools): a JSON
  call as the whole reply or in a ```` ```json ```` block, or a Python call in a ```` ```tool_code ````
  block (``get_weather(city="Paris")``, keyword arguments with literal values);
* Mistral: a JSON list of calls (``[TOOL_CALLS]`` is a control token, so the list is the reply).

A call names one of the request's functions and its arguments are a JSON object; anything else the
model wrote, a call that does not parse included, is text. The parser holds back only what could still
become a call, so text streams as it comes, and a whole reply parses the same as the same text
streamed in any pieces.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

__all__ = ["CallParser", "ParsedCall", "TextOnly", "parse_calls"]


@dataclass(frozen=True)
class ParsedCall:
    """A call the model made: the function's name and its arguments as JSON text (an object)."""

    name: str
    arguments: str


#: a block's opening text and what closes it (None: the rest of the reply)
_BLOCKS: dict[str, str | None] = {
    "<tool_call>": "</tool_call>",
    "```tool_code": "```",
    "```json": "```",
    "<|python_tag|>": None,
    "[TOOL_CALLS]": None,
}
_OPENERS = tuple(_BLOCKS)
_PREFIXES = frozenset(o[:i] for o in _OPENERS for i in range(1, len(o)))
_CALL_KEYS = ("name", "type", "function", "tool_call", "tool_calls")
_FIRST_KEY = re.compile(r'\{\s*(?:"((?:[^"\\]|\\.)*)("?))?')

Piece = str | ParsedCall


class CallParser:
    """Text and calls out of a reply fed in pieces: :meth:`feed` each piece, then :meth:`finish`.

    ``names``: the functions the request offers (a call to another is text). ``first_only``: calls after
    the first are dropped (``parallel_tool_calls: false``). White space between a call and the start or
    end of the reply is dropped; between two pieces of text it is kept.
    """

    def __init__(self, names: Collection[str], *, first_only: bool = False) -> None:
        self.names = frozenset(names)
        self.first_only = first_only
        self.n_calls = 0
        self._buf = ""  # text not given out yet
        self._block: str | None = None  # the opener of the block being read
        self._started = False  # text other than white space has been given out
        self._bare: bool | None = None  # None: the reply may still be bare JSON calls
        self._space = ""  # white space held back: given out before more text, dropped at the end

    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        self._buf += text
        while True:
            if self._block is not None:
                closer = _BLOCKS[self._block]
                end = self._buf.find(closer) if closer is not None else -1
                if end < 0:
                    return out
                inner, self._buf = self._buf[:end], self._buf[end + len(closer) :]
                self._close_block(inner, closer, out)
                continue
            if self._bare is None:
                head = self._buf.lstrip()
                if not head:
                    return out
                if not self._started and _may_be_bare(head):
                    return out  # decided when the reply ends
                self._bare = False
            at, opener = _find_opener(self._buf)
            if opener is None:
                keep = _held(self._buf)
                self._text(self._buf[: len(self._buf) - keep], out)
                self._buf = self._buf[len(self._buf) - keep :]
                return out
            self._text(self._buf[:at], out)
            self._buf = self._buf[at + len(opener) :]
            self._block = opener

    def finish(self) -> list[Piece]:
        """The reply has ended: what is still held, as calls or text."""
        out: list[Piece] = []
        if self._bare is None and self._block is None and self._buf.strip():
            self._bare = False
            calls, rest = _bare_calls(self._buf, self.names)
            if calls:
                self._calls(calls, out)
                self._buf = rest
            out += self.feed("")
        if self._block is not None:
            inner, self._buf = self._buf, ""
            self._close_block(inner, "", out)
        self._text(self._buf, out)
        self._buf = ""
        if self._space and not self.n_calls:
            out.append(self._space)
        self._space = ""
        return out

    def _close_block(self, inner: str, closer: str | None, out: list[Piece]) -> None:
        opener = self._block or ""
        self._block = None
        calls = _block_calls(opener, inner, self.names)
        if calls:
            self._calls(calls, out)
        else:
            self._text(opener + inner + (closer or ""), out)

    def _calls(self, calls: list[ParsedCall], out: list[Piece]) -> None:
        self._bare = False
        for call in calls:
            if self.first_only and self.n_calls:
                break
            out.append(call)
            self.n_calls += 1

    def _text(self, text: str, out: list[Piece]) -> None:
        if self.n_calls and not self._started:  # white space before the first text, after a call
            text = text.lstrip()
            self._space = ""
        body = text.rstrip()
        if body:
            out.append(self._space + body)
            self._space = text[len(body) :]
            self._started = True
        else:
            self._space += text


class TextOnly:
    """A reply read for no calls (a request without tools): its text as it comes, as it is."""

    n_calls = 0

    def feed(self, text: str) -> list[Piece]:
        return [text] if text else []

    def finish(self) -> list[Piece]:
        return []


def parse_calls(
    text: str, names: Collection[str], *, first_only: bool = False
) -> tuple[str, list[ParsedCall]]:
    """A whole reply's text (calls taken out) and its calls."""
    parser = CallParser(names, first_only=first_only)
    pieces = parser.feed(text) + parser.finish()
    return "".join(p for p in pieces if isinstance(p, str)), [p for p in pieces if isinstance(p, ParsedCall)]


# -- finding blocks ----------------------------------------------------------------------------------
def _find_opener(text: str) -> tuple[int, str | None]:
    best, which = -1, None
    for opener in _OPENERS:
        at = text.find(opener)
        if at >= 0 and (best < 0 or at < best):
            best, which = at, opener
    return best, which


def _held(text: str) -> int:
    """Characters at the end of ``text`` that may begin a block's opener."""
    for n in range(min(len(text), max(map(len, _OPENERS)) - 1), 0, -1):
        if text[-n:] in _PREFIXES:
            return n
    return 0


def _may_be_bare(head: str) -> bool:
    """Whether a reply that begins with ``head`` (no leading white space) may still be a bare JSON call
    (or a list of them)."""
    if head[0] == "[":
        rest = head[1:].lstrip()
        return not rest or (rest[0] == "{" and _may_be_bare(rest))
    if head[0] != "{":
        return False
    m = _FIRST_KEY.match(head)
    if m is None:
        return False
    if m.end() == len(head):  # the first key is not complete yet
        key = m.group(1) or ""
        return any(k.startswith(key) for k in _CALL_KEYS)
    return m.group(1) in _CALL_KEYS and bool(m.group(2))


# -- parsing calls -----------------------------------------------------------------------------------
def _block_calls(opener: str, inner: str, names: Collection[str]) -> list[ParsedCall]:
    if opener == "```tool_code":
        return _python_calls(inner, names)
    calls, rest = _bare_calls(inner, names)
    if calls and not rest.strip():
        return calls
    if opener == "<|python_tag|>":  # Llama's built-in tools are Python: brave_search.call(query=...)
        return _python_calls(inner, names)
    return []


def _bare_calls(text: str, names: Collection[str]) -> tuple[list[ParsedCall], str]:
    """JSON calls at the start of ``text`` (objects or lists of them, separated by white space or ``;``)
    and the text after them; no calls if any value there is not a call."""
    decoder = json.JSONDecoder()
    calls: list[ParsedCall] = []
    pos = 0
    while True:
        while pos < len(text) and (text[pos].isspace() or (calls and text[pos] == ";")):
            pos += 1
        if pos >= len(text) or text[pos] not in "{[":
            break
        try:
            value, end = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):
            break
        got = _json_calls(value, names)
        if got is None:
            break
        calls += got
        pos = end
    return (calls, text[pos:]) if calls else ([], text)


def _json_calls(value: Any, names: Collection[str]) -> list[ParsedCall] | None:
    if isinstance(value, list):
        calls = [_json_call(v, names) for v in value]
        return calls if calls and all(c is not None for c in calls) else None  # type: ignore[return-value]
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list) and len(value) == 1:
        return _json_calls(value["tool_calls"], names)
    call = _json_call(value, names)
    return [call] if call is not None else None


def _json_call(value: Any, names: Collection[str]) -> ParsedCall | None:
    if not isinstance(value, dict):
        return None
    for wrapper in ("tool_call", "function"):
        inner = value.get(wrapper)
        if isinstance(inner, dict) and "name" in inner:
            value = inner
            break
    name = value.get("name")
    args = value.get("arguments", value.get("parameters", {}))
    return _call(name, args, names)


def _call(name: Any, args: Any, names: Collection[str]) -> ParsedCall | None:
    if not isinstance(name, str) or name not in names:
        return None
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return None
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return None
    try:
        return ParsedCall(name, json.dumps(args, ensure_ascii=False))
    except (TypeError, ValueError, RecursionError):  # a Python literal JSON cannot hold (a set, bytes)
        return None


def _python_calls(code: str, names: Collection[str]) -> list[ParsedCall]:
    """Calls written as Python (Gemma's ``tool_code``): ``name(key=literal, ...)``, one per line or in a
    list; nothing is run, the values are read as literals."""
    try:
        tree = ast.parse(code.strip(), mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    nodes: list[ast.expr] = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Expr):
            return []
        nodes += stmt.value.elts if isinstance(stmt.value, (ast.List, ast.Tuple)) else [stmt.value]
    calls = []
    for node in nodes:
        if not isinstance(node, ast.Call) or node.args:
            return []
        name = _dotted(node.func)
        if name is not None and name not in names and name.endswith(".call"):
            name = name[: -len(".call")]  # Llama's built-in tools: brave_search.call(query=...)
        args: dict[str, Any] = {}
        for kw in node.keywords:
            if kw.arg is None:
                return []
            try:
                args[kw.arg] = ast.literal_eval(kw.value)
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                return []
        call = _call(name, args, names)
        if call is None:
            return []
        calls.append(call)
    return calls


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None
