"""Chat prompts to token ids in time linear in their length, cancellable, each message's content kept as
text (:class:`PromptTokenizer`). Pure Python: llama.cpp tokenizes the plain text between special tokens
through the function it is given.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.engine.chat import Cancelled, ChatTemplate, Message

__all__ = ["PromptTokenizer", "SpecialToken", "TokenizeCancelled", "TooManyTokens"]


#: what C's isspace() calls white space: what llama.cpp strips beside a token marked lstrip/rstrip
_C_SPACE = " \t\n\v\f\r"
#: starts a placeholder for special-token text found in a message's content (see PromptTokenizer)
_ESC = "\ue000"
_INDEX_FIRST = 0xF0000  # placeholders index literals with one private-use character from here on
_INDEX_LAST = 0x10FFFD


TokenizeCancelled = Cancelled  # rendering or tokenizing a prompt stopped: its request was cancelled


@dataclass(frozen=True)
class SpecialToken:
    """A token llama.cpp matches by its text before tokenizing the rest.

    ``always``: a user-defined token, matched in any text; the others (control and unknown tokens)
    only where special tokens are parsed (a chat template's own text).
    """

    id: int
    text: str
    always: bool = False


def _trie_pattern(texts: Iterable[str]) -> str:
    """A regular expression matching any of ``texts``, the longest where several start at one place,
    as a trie (one alternation per character), so a scan costs the text's length times the depth."""
    trie: dict[str, Any] = {}
    for text in texts:
        if not text:
            continue
        node = trie
        for ch in text:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        branches = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        if "" in node:  # a token ends here: a longer one is tried first
            return f"(?:{body})?"
        return body

    return emit(trie)


class PromptTokenizer:
    """Chat prompts and text to token ids in time linear in the text, each message's content kept as
    text.

    llama.cpp splits a text at special tokens before tokenizing the rest, and its split costs the
    square of the number of special tokens found (16,000 chat messages: 15 s; 100,000: many minutes).
    This splits the text here in one regular-expression scan and has llama.cpp tokenize only the text
    between special tokens (``tokenize_plain``: no special tokens parsed), each distinct piece once, so
    ``cancel`` is checked between pieces and a prompt past ``limit`` tokens stops early.

    Special-token text inside a message's content (``<|im_end|>`` typed or pasted by a user) is
    tokenized as the plain text it is, as OpenAI's API does, so content cannot fake a turn of the chat;
    user-defined tokens, which llama.cpp matches in any text, stay tokens. The template's own markers
    are special tokens as before. Where special tokens lie as llama.cpp sees them (``lstrip``/
    ``rstrip`` attributes: white space beside them dropped) comes from ``strip(token_id)``.
    """

    def __init__(
        self,
        specials: Iterable[SpecialToken],
        tokenize_plain: Callable[[str], list[int]],
        strip: Callable[[int], tuple[bool, bool]] | None = None,
    ) -> None:
        by_text: dict[str, SpecialToken] = {}
        for tok in specials:
            if tok.text and _ESC not in tok.text:
                by_text.setdefault(tok.text, tok)
        self._by_text = by_text
        self._tokenize_plain = tokenize_plain
        self._strip = strip
        self._strips: dict[int, tuple[bool, bool]] = {}
        parsed_only = [t for t in by_text.values() if not t.always][: _INDEX_LAST - _INDEX_FIRST]
        #: literals a placeholder stands for: index 0 is the escape character itself
        self._literals: list[str] = [_ESC, *(t.text for t in parsed_only)]
        self._index = {text: i for i, text in enumerate(self._literals)}
        escape = re.escape(_ESC)
        masked = _trie_pattern(t.text for t in parsed_only)
        self._mask_re = re.compile(f"{escape}|{masked}" if masked else escape)
        always = _trie_pattern(t.text for t in by_text.values() if t.always)
        self._always_re = re.compile(always) if always else None
        every = _trie_pattern(by_text)
        index = f"[{chr(_INDEX_FIRST)}-{chr(_INDEX_LAST)}]"
        self._scan_re = re.compile(f"{escape}({index})?" + (f"|({every})" if every else ""))

    # -- chat --------------------------------------------------------------------------------------
    def mask(
        self, messages: Sequence[Message | Mapping[str, Any]], cancel: Callable[[], bool] | None = None
    ) -> list[Any]:
        """The messages with special-token text in their content replaced by placeholders."""
        out: list[Any] = []
        for i, m in enumerate(messages):
            if cancel is not None and i % 256 == 255 and cancel():
                raise TokenizeCancelled("the request was cancelled while its chat was rendered")
            if isinstance(m, Message):
                m = {"role": m.role, "content": m.content}
            content = m.get("content") if isinstance(m, Mapping) else None
            if isinstance(content, str) and self._mask_re.search(content):
                m = {**m, "content": self._mask_re.sub(self._placeholder, content)}
            out.append(m)
        return out

    def _placeholder(self, match: re.Match[str]) -> str:
        return _ESC + chr(_INDEX_FIRST + self._index[match.group(0)])

    def _literal(self, ch: str) -> str:
        i = ord(ch) - _INDEX_FIRST
        return self._literals[i] if 0 <= i < len(self._literals) else _ESC + ch

    def segments(self, text: str) -> list[int | str]:
        """Rendered (masked) text as special-token ids and the plain text between them."""
        out: list[int | str] = []
        pieces: list[str] = []
        pos = 0
        strip_left = False  # the token before the current piece eats white space after it
        for m in self._scan_re.finditer(text):
            pieces.append(text[pos : m.start()])
            pos = m.end()
            if m.group(0).startswith(_ESC):
                pieces.append(self._literal(m.group(1)) if m.group(1) else _ESC)
                continue
            tok = self._by_text[m.group(0)]
            lstrip, rstrip = self.strips(tok.id)
            self._add_piece(out, "".join(pieces), strip_left, lstrip)
            pieces.clear()
            out.append(tok.id)
            strip_left = rstrip
        pieces.append(text[pos:])
        self._add_piece(out, "".join(pieces), strip_left, False)
        return out

    @staticmethod
    def _add_piece(out: list[int | str], piece: str, strip_left: bool, strip_right: bool) -> None:
        if strip_left:
            piece = piece.lstrip(_C_SPACE)
        if strip_right:
            piece = piece.rstrip(_C_SPACE)
        if piece:
            out.append(piece)

    def strips(self, token: int) -> tuple[bool, bool]:
        """Whether llama.cpp drops white space before and after ``token`` (probed once each)."""
        got = self._strips.get(token)
        if got is None:
            got = self._strip(token) if self._strip is not None else (False, False)
            self._strips[token] = got
        return got

    def tokens(
        self,
        segments: Sequence[int | str],
        *,
        prefix: Sequence[int] = (),
        cancel: Callable[[], bool] | None = None,
        limit: int | None = None,
    ) -> list[int]:
        """Token ids of ``segments``, each distinct piece tokenized once; ``cancel`` is checked before
        each piece (:class:`TokenizeCancelled`), and more than ``limit`` ids raise
        :class:`TooManyTokens`."""
        ids = list(prefix)
        seen: dict[str, list[int]] = {}
        for seg in segments:
            if isinstance(seg, int):
                ids.append(seg)
            else:
                if cancel is not None and cancel():
                    raise TokenizeCancelled("the request was cancelled while its prompt was tokenized")
                got = seen.get(seg)
                if got is None:
                    got = seen[seg] = self._tokenize_plain(seg)
                ids.extend(got)
            if limit is not None and len(ids) > limit:
                raise TooManyTokens(limit)
        return ids

    def chat(
        self,
        template: ChatTemplate,
        messages: Sequence[Message | Mapping[str, Any]],
        *,
        prefix: Sequence[int] = (),
        cancel: Callable[[], bool] | None = None,
        limit: int | None = None,
    ) -> tuple[str, list[int]]:
        """The rendered chat (content masked) and its token ids after ``prefix``."""
        text = template.render(self.mask(messages, cancel), add_generation_prompt=True, cancel=cancel)
        return text, self.tokens(self.segments(text), prefix=prefix, cancel=cancel, limit=limit)

    # -- plain text --------------------------------------------------------------------------------
    def text_segments(self, text: str) -> list[int | str]:
        """Raw text (no special tokens parsed) as the user-defined tokens llama.cpp matches in any text
        and the plain text between them."""
        if self._always_re is None:
            return [text]
        out: list[int | str] = []
        pos = 0
        strip_left = False
        for m in self._always_re.finditer(text):
            tok = self._by_text[m.group(0)]
            lstrip, rstrip = self.strips(tok.id)
            self._add_piece(out, text[pos : m.start()], strip_left, lstrip)
            out.append(tok.id)
            pos, strip_left = m.end(), rstrip
        self._add_piece(out, text[pos:], strip_left, False)
        return out


class TooManyTokens(ValueError):
    """A prompt has more tokens than its limit (found before all of it was tokenized)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the prompt has more than {limit} tokens")
        self.limit = limit
