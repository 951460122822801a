"""Markdown to the HTML subset Qt's rich-text labels render, split into segments for incremental updates.

A reply is cut into *segments*: fenced code blocks (shown as their own widget with a Copy button) and
chunks of prose between them. Prose is cut further at paragraph breaks once a chunk is long enough, so a
streaming reply re-renders only its last segment: earlier segments never change once the text has moved
past them, and their HTML is cached.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name, guess_lexer
from pygments.util import ClassNotFound

from app.ui.shared.richtext import escape

CHUNK_CHARS = 600  # a prose chunk may end at the first paragraph break after this many characters
CODE_STYLE = "friendly"
CODE_BACKGROUND = "#f6f8fa"
INLINE_CODE = "background-color:#eef0f3; font-family:monospace;"
DRAFT_TINT = "#cdeccf"  # background of text whose tokens the draft proposed and the target accepted

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\s]*)[^`]*$")


@dataclass(frozen=True)
class Segment:
    """A piece of a reply: ``kind`` "prose" (Markdown) or "code" (``text`` is the code itself)."""

    kind: str
    text: str
    lang: str = ""
    closed: bool = True  # a code fence that has been closed


def split_segments(text: str) -> list[Segment]:
    """Cut Markdown ``text`` into prose chunks and fenced code blocks (an unclosed fence runs to the end)."""
    segments: list[Segment] = []
    lines = text.split("\n")
    prose: list[str] = []
    prose_len = 0
    i = 0
    n = len(lines)

    def flush_prose() -> None:
        nonlocal prose, prose_len
        if prose and any(line.strip() for line in prose):
            segments.append(Segment("prose", "\n".join(prose).strip("\n")))
        prose, prose_len = [], 0

    while i < n:
        line = lines[i]
        complete = i < n - 1  # the last line may still be streaming: it cannot open a fence yet
        m = _FENCE.match(line) if complete else None
        if m:
            flush_prose()
            indent, fence, lang = len(m["indent"]), m["fence"], m["info"]
            body: list[str] = []
            i += 1
            closed = False
            while i < n:
                inner = lines[i]
                stripped = inner.strip()
                if (
                    stripped.startswith(fence[0] * len(fence))
                    and not stripped.strip(fence[0])
                    and (i < n - 1 or len(stripped) >= len(fence))
                ):
                    closed = True
                    i += 1
                    break
                body.append(_dedent(inner, indent))
                i += 1
            if not closed and body and body[-1].strip() and set(body[-1].strip()) <= {fence[0]}:
                body.pop()  # a closing fence still streaming in
            segments.append(Segment("code", "\n".join(body), lang.lower(), closed))
            continue
        if (
            not line.strip()
            and prose_len >= CHUNK_CHARS
            and i + 1 < n
            and lines[i + 1][:1] not in ("", " ", "\t")
        ):
            flush_prose()
        else:
            prose.append(line)
            prose_len += len(line) + 1
        i += 1
    flush_prose()
    return segments


def _dedent(line: str, indent: int) -> str:
    k = 0
    while k < indent and k < len(line) and line[k] in " \t":
        k += 1
    return line[k:]


# -- prose ------------------------------------------------------------------------------------------
_md = MarkdownIt("commonmark", {"html": False, "breaks": True}).enable(["table", "strikethrough"])

_REPLACEMENTS = (
    ("<table>", '<table border="1" cellspacing="0" cellpadding="5" style="border-color:#d0d7de;">'),
    ("<th>", '<th style="background-color:#f0f2f5;">'),
    ("<code>", f'<code style="{INLINE_CODE}">'),
    ("<blockquote>", '<blockquote style="color:#57606a; margin-left:12px;">'),
    ("<s>", "<s>"),
    ("<del>", "<s>"),
    ("</del>", "</s>"),
    ("<hr />", "<hr/>"),
)


@functools.lru_cache(maxsize=512)
def render_prose(markdown: str) -> str:
    """HTML for a prose chunk (raw HTML in the text is shown as text, never interpreted)."""
    out = _md.render(markdown)
    for old, new in _REPLACEMENTS:
        out = out.replace(old, new)
    return out


# -- code -------------------------------------------------------------------------------------------
_formatter = HtmlFormatter(noclasses=True, nowrap=True, style=CODE_STYLE)


@functools.lru_cache(maxsize=64)
def _lexer_for(lang: str):
    try:
        return get_lexer_by_name(lang, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None


@functools.lru_cache(maxsize=256)
def render_code(code: str, lang: str = "") -> str:
    """Syntax-highlighted HTML (inline styles) for a code block, wrapped in a ``<pre>``."""
    lexer = _lexer_for(lang) if lang else None
    if lexer is None and not lang and len(code) > 40:
        try:
            lexer = guess_lexer(code, stripnl=False, ensurenl=False)
        except ClassNotFound:
            lexer = None
    if lexer is None:
        body = escape(code)
    else:
        body = highlight(code, lexer, _formatter)
        if body.endswith("\n") and not code.endswith("\n"):
            body = body[:-1]
    return f'<pre style="margin:0; white-space:pre-wrap;">{body}</pre>'


# -- draft highlighting -----------------------------------------------------------------------------
def draft_html(text: str, spans: Sequence[tuple[int, int]]) -> str:
    """``text`` as plain pre-wrapped HTML with the character ``spans`` (start, end) tinted."""
    parts: list[str] = []
    pos = 0
    for start, end in spans:
        start, end = max(start, pos), min(end, len(text))
        if start >= end:
            continue
        parts.append(escape(text[pos:start]))
        parts.append(f'<span style="background-color:{DRAFT_TINT};">{escape(text[start:end])}</span>')
        pos = end
    parts.append(escape(text[pos:]))
    return '<p style="white-space:pre-wrap;">' + "".join(parts) + "</p>"


def plain_text_html(text: str) -> str:
    """``text`` escaped, whitespace kept (user messages are shown as typed)."""
    return '<p style="white-space:pre-wrap;">' + escape(text) + "</p>"
