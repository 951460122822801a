"""Response bodies as OpenAI's API shapes them, with the ``timings`` object llama.cpp's server adds
(Anthropic's and the Responses API's are in :mod:`app.server.anthropic_api` and
:mod:`app.server.responses_api`)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from app.engine import Finished, FinishReason, Stats

FINISH_REASONS = {
    FinishReason.EOG: "stop",
    FinishReason.STOP: "stop",
    FinishReason.CANCELLED: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.CONTEXT: "length",
}
# the reply ran out of tokens (its budget or the context)
CUT_SHORT = frozenset({FinishReason.LENGTH, FinishReason.CONTEXT})


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(stats: Stats) -> dict[str, int]:
    return {
        "prompt_tokens": stats.n_prompt_tokens,
        "completion_tokens": stats.n_generated,
        "total_tokens": stats.n_prompt_tokens + stats.n_generated,
    }


#: why a reply decoded plainly although drafting was asked for, in one line (``timings.drafting_off``)
DRAFTING_OFF = {"no_rollback": "the model's memory cannot undo a rejected draft: plain decoding"}


def timings(stats: Stats) -> dict[str, Any]:
    """Named as llama.cpp's server names them, so tools that read its statistics read ours (plus
    ``draft_sources``, the drafted and accepted tokens per source, and ``drafting_off``, where a reply
    could not draft at all)."""
    prompt_n = max(0, stats.n_prompt_tokens - stats.n_prompt_cached)
    prompt_ms = stats.t_prompt_s * 1000
    predicted_ms = stats.t_decode_s * 1000
    n = stats.n_generated
    return {
        "cache_n": stats.n_prompt_cached,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n / stats.t_prompt_s if stats.t_prompt_s > 0 else 0.0,
        "predicted_n": n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / n if n else 0.0,
        "predicted_per_second": n / stats.t_decode_s if stats.t_decode_s > 0 else 0.0,
        # the draft model's own work on the prompt where it evaluated it up front (not in predicted_ms)
        "draft_prompt_ms": stats.t_draft_prompt_s * 1000,
        "draft_n": stats.n_drafted,
        "draft_n_accepted": stats.n_accepted,
        # which sources drafted (prompt lookup, the history, the draft model, the MTP head, ...)
        "draft_sources": {
            src.value: {"rounds": rounds, "draft_n": n, "draft_n_accepted": acc}
            for src, rounds, n, acc in stats.drafted_by
        },
    } | ({"drafting_off": DRAFTING_OFF[stats.drafting_off.value]} if stats.drafting_off else {})


def chat_completion(
    rid: str,
    model: str,
    fin: Finished,
    text: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A chat reply: ``fin``'s text, or ``text`` and ``tool_calls`` where the reply was read for calls
    (content null when the reply is calls only, finish reason ``tool_calls``)."""
    message: dict[str, Any] = {"role": "assistant", "content": fin.text if text is None else text}
    finish = FINISH_REASONS.get(fin.reason, "stop")
    if tool_calls:
        message["content"] = message["content"] or None
        message["tool_calls"] = tool_calls
        finish = "tool_calls"
    return {
        "id": rid,
        "object": "chat.completion",
        "created": now(),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
        "usage": usage(fin.stats),
        "timings": timings(fin.stats),
    }


def chat_chunk(
    rid: str, model: str, delta: dict[str, Any], finish: str | None = None, created: int | None = None
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created or now(),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def completion(rid: str, model: str, fin: Finished) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": now(),
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": fin.text,
                "logprobs": None,
                "finish_reason": FINISH_REASONS.get(fin.reason, "stop"),
            }
        ],
        "usage": usage(fin.stats),
        "timings": timings(fin.stats),
    }


def completion_chunk(
    rid: str, model: str, text: str, finish: str | None = None, created: int | None = None
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created or now(),
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
    }


def usage_chunk(rid: str, model: str, obj: str, fin: Finished, created: int) -> dict[str, Any]:
    """The last chunk of a stream with ``stream_options.include_usage``: no choices, the usage."""
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(fin.stats),
        "timings": timings(fin.stats),
    }


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error body."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
