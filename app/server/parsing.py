"""A request's body as the request it is: JSON sent as JSON, an object, a message count within the
limit (counted before the rest is validated), then the fields (:mod:`app.server.schemas`), each failure
an OpenAI error naming what is wrong."""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from app.server.errors import ApiError
from app.server.limits import Limits, check_messages

RequestModel = TypeVar("RequestModel", bound=BaseModel)

BIG_BODY = 256 * 1024  # bytes beyond which a body is parsed on a thread, not the event loop's


async def parse(
    request: Request, model: type[RequestModel], limits: Limits, items: str = "messages"
) -> RequestModel:
    """The request's body as ``model``: JSON, an object, no more messages than the limit (the list
    ``items``: ``messages``, or the Responses API's ``input``; counted before the rest is validated),
    then the fields; each failure a 400 naming it. The body must say it
    is JSON: a web page can send another type (``text/plain``) or none without the browser asking
    this server first (CORS), so those are refused unread."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        raise ApiError(
            415,
            f"the request body must be JSON sent as Content-Type: application/json, not {media or 'none'!r}",
            code="unsupported_media_type",
        )
    body = await request.body()
    if len(body) > BIG_BODY:
        return await asyncio.to_thread(_validate, body, model, limits, items)
    return _validate(body, model, limits, items)


def _validate(body: bytes, model: type[RequestModel], limits: Limits, items: str) -> RequestModel:
    try:
        data = json.loads(body)
    except json.JSONDecodeError as e:
        raise ApiError(400, f"the request body is not valid JSON: {e.msg} (at character {e.pos})") from None
    except (RecursionError, ValueError):  # nested too deep, not UTF-8
        raise ApiError(400, "the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object with the request's fields")
    messages = data.get(items)
    if isinstance(messages, list) and len(messages) > limits.max_messages:
        try:
            check_messages(len(messages), 0, limits, 1)
        except ApiError as e:
            e.param = items
            raise
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e.errors()) from None


def validation_error(errors: list[Any]) -> ApiError:
    """A request pydantic refused, named plainly: the field and why, or what is wrong with the JSON."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        where = first.get("loc", ("body", 0))[-1]
        why = (first.get("ctx") or {}).get("error", "JSON decode error")
        return ApiError(400, f"the request body is not valid JSON: {why} (at character {where})")
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    param = _param(loc)
    if not param:
        return ApiError(400, "the request body must be a JSON object with the request's fields")
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if first.get("type") == "missing":
        msg = "this field is required"
    return ApiError(400, f"{param}: {msg}", param=param)


def _param(loc: list[str]) -> str:
    out = ""
    for part in loc:
        if not part.isdigit() and not part.isidentifier():
            continue  # a branch of a union ("str", "list[int]", "function-after[...]")
        if part in ("str", "int", "float", "bool", "list"):
            continue
        out += f"[{part}]" if part.isdigit() else (f".{part}" if out else part)
    return out
