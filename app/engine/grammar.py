"""Structured output: a :class:`~app.engine.settings.Constraint` compiled to a grammar, and the state of
one reply's grammar over the target's vocabulary.

The grammar engine is llguidance (Rust, on PyPI without dependencies; the engine llama.cpp's
``LLAMA_LLGUIDANCE`` build links): which tokens of a 152k vocabulary keep the text within the grammar
takes it 35 us (median; 0.3 ms at most) on a 2-core AMD EPYC, where llama.cpp's own grammar sampler
takes 65 ms (see docs/benchmarks.md, "Structured output"). It compiles JSON schemas itself, GBNF through
its converter to Lark, and its matcher checks a draft's tokens without consuming them, copies its state
for a drafter to walk ahead, and rolls back.

How the loop uses it (:mod:`app.engine.speculative`): at each position the target's distribution is
masked by the grammar (greedy: the argmax among the allowed tokens; sampling: the sampling transform over
the allowed tokens, renormalised), a drafted token the grammar forbids has probability 0 and is
rejected, and the grammar consumes exactly the tokens the round adds, so after a round it is in the
state after the accepted text, as the KV cache is. The reply ends when the grammar is complete.

No ``llama_cpp`` import: the vocabulary's pieces come from :mod:`app.engine.grammar_llama`.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

import llguidance
import numpy as np
from llguidance import LLMatcher, LLTokenizer, TokenizerWrapper

from app.engine.errors import ConstraintError

if TYPE_CHECKING:
    from app.engine.settings import Constraint

# JSON as a model writes it: a space or a line break with indentation between items, never unbounded
# whitespace (a small model under a grammar can otherwise fill a reply with blank lines), as llama.cpp's
# schema converter bounds it
JSON_OPTIONS = {"whitespace_pattern": r"[ \t]{0,20}|(\r?\n){1,2}[ \t]{0,40}"}
_LIMIT = 300  # characters of a grammar engine's message kept in an error


def _one_line(message: object) -> str:
    text = " ".join(str(message).split())
    return text if len(text) <= _LIMIT else text[: _LIMIT - 3] + "..."


def compile_constraint(constraint: Constraint) -> str:
    """The llguidance grammar for ``constraint`` (cached), checked; :class:`ConstraintError` if unusable."""
    return _compile(constraint.kind, constraint.schema, constraint.gbnf, constraint.strict)


@lru_cache(maxsize=32)
def _compile(kind: str, schema: str | None, gbnf: str | None, strict: bool) -> str:
    if kind == "json_object":
        grammar = LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=JSON_OPTIONS)
    elif kind == "json_schema":
        try:
            parsed = json.loads(schema or "")
        except ValueError as e:
            raise ConstraintError(f"the JSON schema is not valid JSON: {_one_line(e)}") from None
        if parsed is False:
            raise ConstraintError("the JSON schema false allows no value")
        if parsed is True:
            schema = "{}"  # any value
        elif not isinstance(parsed, dict):
            raise ConstraintError("the JSON schema must be a JSON object")
        options = {**JSON_OPTIONS, "lenient": not strict}
        try:
            grammar = LLMatcher.grammar_from_json_schema(schema or "", defaults=options)
        except ValueError as e:
            raise ConstraintError(f"the JSON schema cannot be used: {_one_line(e)}") from None
    elif kind == "gbnf":
        try:
            grammar = llguidance.grammar_from("gbnf", gbnf or "")
        except ValueError as e:
            raise ConstraintError(f"the GBNF grammar cannot be used: {_one_line(e)}") from None
    else:
        raise ConstraintError(f"unknown constraint kind {kind!r}")
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        what = "JSON schema" if kind == "json_schema" else "GBNF grammar" if kind == "gbnf" else "grammar"
        raise ConstraintError(f"the {what} cannot be used: {_one_line('; '.join(messages))}")
    return grammar


@dataclass(frozen=True, eq=False)
class Vocabulary:
    """The target's vocabulary as the grammar engine sees it (built once per loaded model: ~1 s for
    152k tokens)."""

    tokenizer: LLTokenizer
    n_vocab: int
    eog: np.ndarray  # bool per token: ends a turn (allowed where the grammar is complete)
    # matchers in their start state, by grammar: a request copies one (microseconds) instead of
    # building its lexer again (milliseconds)
    _fresh: OrderedDict[str, LLMatcher] = field(default_factory=OrderedDict, repr=False)
    FRESH_KEPT = 16

    def matcher(self, grammar: str) -> LLMatcher:
        """A matcher for ``grammar`` in its start state."""
        fresh = self._fresh.get(grammar)
        if fresh is None:
            fresh = LLMatcher(self.tokenizer, grammar, log_level=0)
            if fresh.is_error():
                raise ConstraintError(f"the grammar cannot be used: {_one_line(fresh.get_error())}")
            self._fresh[grammar] = fresh
            while len(self._fresh) > self.FRESH_KEPT:
                self._fresh.popitem(last=False)
        else:
            self._fresh.move_to_end(grammar)
        return fresh.deep_copy()

    @classmethod
    def build(
        cls,
        pieces: Sequence[bytes],
        special: Sequence[int],
        eog: Sequence[int],
        tokenize: Callable[[str], list[int]],
    ) -> Vocabulary:
        """``pieces``: each token's bytes (a special token's marked with a leading 0xFF, as
        llguidance expects: text never spells it); ``eog``: the end-of-generation tokens;
        ``tokenize``: text to token ids."""
        ends = sorted(int(t) for t in eog)
        if not ends:
            raise ConstraintError("the model has no end-of-generation token: a grammar cannot end")
        source = _Source(list(pieces), list(special), ends[0], tokenize)
        tokenizer = LLTokenizer(TokenizerWrapper(source), eos_token=ends)
        mask = np.zeros(len(pieces), dtype=bool)
        mask[ends] = True
        return cls(tokenizer, len(pieces), mask)


class _Source:
    """What llguidance's ``TokenizerWrapper`` reads."""

    def __init__(
        self, tokens: list[bytes], special: list[int], eos: int, tokenize: Callable[[str], list[int]]
    ):
        self.tokens = tokens
        self.special_token_ids = special
        self.eos_token_id = eos
        self.bos_token_id = None
        self._tokenize = tokenize

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tokenize(text)


class Grammar:
    """One reply's grammar state: which tokens may come next, and the tokens accepted so far."""

    def __init__(self, vocab: Vocabulary, grammar: str, *, _matcher: LLMatcher | None = None):
        matcher = _matcher if _matcher is not None else vocab.matcher(grammar)
        self.vocab = vocab
        self._grammar = grammar
        self._m = matcher
        self._bits = np.empty((vocab.n_vocab + 31) // 32, dtype=np.int32)
        self._mask: np.ndarray | None = None

    def fork(self) -> Grammar:
        """An independent copy of this state (a drafter walks ahead in it)."""
        return Grammar(self.vocab, self._grammar, _matcher=self._m.deep_copy())

    @property
    def done(self) -> bool:
        """The grammar is complete and takes nothing more (but the end of the turn)."""
        return bool(self._m.is_stopped())

    def allows(self, token: int) -> bool:
        """Whether ``token`` may come next (a few microseconds; no mask is computed)."""
        if not 0 <= token < self.vocab.n_vocab:
            return False
        if self.vocab.eog[token]:
            return bool(self._m.is_accepting())
        return self._m.validate_tokens([token]) == 1

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` the grammar takes in a row from here (an end of turn not counted)."""
        n = self.vocab.n_vocab
        ids = [int(t) for t in tokens]
        cut = next((i for i, t in enumerate(ids) if not 0 <= t < n or self.vocab.eog[t]), len(ids))
        return int(self._m.validate_tokens(ids[:cut])) if cut else 0

    def mask(self) -> np.ndarray:
        """Bool per token of the vocabulary: allowed next (computed once per state)."""
        if self._mask is None:
            self._m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
            mask = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self.vocab.n_vocab]
            self._mask = mask.view(bool)
            if not self._mask.any():  # an error state takes nothing: only the end of the turn
                self._mask = self.vocab.eog.copy()
        return self._mask

    def consume(self, token: int) -> None:
        """Advance past ``token``, which must be allowed."""
        self._mask = None
        if not self._m.consume_token(int(token)):
            raise ConstraintError(f"the grammar took a token it forbids ({token}): {self._m.get_error()}")

    def advance(self, token: int) -> bool:
        """Advance past ``token`` if allowed; False (and the state is unusable) if not."""
        self._mask = None
        return bool(self._m.consume_token(int(token)))

    def rollback(self, n: int) -> None:
        """Forget the last ``n`` tokens consumed."""
        if n:
            self._mask = None
            if not self._m.rollback(n):
                raise ConstraintError(f"the grammar could not roll back {n} tokens")
