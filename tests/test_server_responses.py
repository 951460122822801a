"""OpenAI's Responses API (``POST /v1/responses``) on a tiny real model with Qwen 2.5's template, driven by
the official ``openai`` client: plain text and streamed text equal to the chat route's greedy reply,
instructions and input items, a tool round trip (``function_call`` / ``function_call_output``), a forced
call, structured output (``text.format``), and a 400 naming the field for what is not supported."""

# Model replies and chats are kept on one line each, long lines included.
# ruff: noqa: E501

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import jsonschema
import openai
import pytest
from openai.lib.streaming.responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter
from test_server_tools import NAMES, QWEN_CALL, replies
from tool_server import SEARCH, WEATHER, n_prompt, prompt_text, serving, write_variant

from api_server import Running, wait_idle
from app.server import responses_api, tools
from app.server.schemas import CONSTRAINED

pytestmark = pytest.mark.timeout(180)

MODEL = "tiny-qwen25"
ASK = "What is the weather in Paris?"
WEATHER_FN = {"type": "function", **WEATHER["function"], "strict": True}
SEARCH_FN = {"type": "function", **SEARCH["function"], "strict": True}


@pytest.fixture(scope="module")
def qwen(tiny_pair, tmp_path_factory) -> Iterator[Running]:
    target = write_variant(tmp_path_factory.mktemp("qwen"), "qwen25")
    with serving(target, tiny_pair.draft) as running:
        yield running


def api_of(running: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=running.url, api_key="none", max_retries=0, timeout=120)


def test_plain_and_streamed_text_equal_the_chat_completion(qwen) -> None:
    api = api_of(qwen)
    chat = api.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": ASK}], temperature=0, max_tokens=30
    )
    r = api.responses.create(model=MODEL, input=ASK, temperature=0, max_output_tokens=30)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    assert r.output_text == chat.choices[0].message.content
    assert r.status == ("completed" if chat.choices[0].finish_reason == "stop" else "incomplete")
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    kinds = []
    with api.responses.stream(model=MODEL, input=ASK, temperature=0, max_output_tokens=30) as stream:
        for ev in stream:
            kinds.append(ev.type)
        if r.status == "completed":
            final = stream.get_final_response()
            assert final.output_text == r.output_text and final.usage.output_tokens == r.usage.output_tokens
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == ("response.completed" if r.status == "completed" else "response.incomplete")
    assert "response.output_text.delta" in kinds and "response.output_item.done" in kinds
    assert "".join(str(k) for k in kinds).count("response.output_text.done") == 1


def test_instructions_and_input_items_reach_the_template(qwen) -> None:
    api = api_of(qwen)
    r = api.responses.create(
        model=MODEL,
        instructions="You are terse.",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Hello"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi!"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"role": "developer", "content": "Answer in English."},
            {"role": "user", "content": "Tell me about the fox"},
        ],
        temperature=0,
        max_output_tokens=8,
        store=False,
        reasoning={"effort": "low"},
    )
    view = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi!"},
        {"role": "system", "content": "Answer in English."},
        {"role": "user", "content": "Tell me about the fox"},
    ]
    assert r.usage.input_tokens == n_prompt(qwen, view)


def test_a_tool_round_trip(qwen) -> None:
    api = api_of(qwen)
    items = [
        {"role": "user", "content": ASK},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "22 degrees and sunny"},
    ]  # fmt: skip
    r = api.responses.create(
        model=MODEL, input=items, tools=[WEATHER_FN], temperature=0, max_output_tokens=12
    )
    assert r.status in ("completed", "incomplete")
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": items[1]["arguments"]},
    }
    view = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22 degrees and sunny"},
    ]  # fmt: skip
    text = prompt_text(qwen, view, [WEATHER])
    assert "<tool_call>\n" in text and "<tool_response>\n22 degrees and sunny\n</tool_response>" in text
    assert r.usage.input_tokens == n_prompt(qwen, view, [WEATHER])


@pytest.mark.skipif(not CONSTRAINED, reason="the engine has no constrained sampling yet")
@pytest.mark.parametrize("stream", [False, True])
def test_tool_choice_required_and_named_give_a_function_call(qwen, stream: bool) -> None:
    api = api_of(qwen)
    for choice, names in (
        ("required", {"get_weather", "search_files"}),
        ({"type": "function", "name": "search_files"}, {"search_files"}),
    ):
        kw = dict(
            model=MODEL, input=ASK, tools=[WEATHER_FN, SEARCH_FN], tool_choice=choice, temperature=0,
            max_output_tokens=120, parallel_tool_calls=False,
        )  # fmt: skip
        if stream:
            with api.responses.stream(**kw) as s:
                r = s.get_final_response()
        else:
            r = api.responses.create(**kw)
        calls = [o for o in r.output if o.type == "function_call"]
        assert r.status == "completed" and len(calls) == 1, r
        assert calls[0].name in names and calls[0].call_id.startswith("call_")
        schema = {"get_weather": WEATHER_FN, "search_files": SEARCH_FN}[calls[0].name]["parameters"]
        jsonschema.validate(json.loads(calls[0].arguments), schema)


@pytest.mark.skipif(not CONSTRAINED, reason="the engine has no constrained sampling yet")
def test_text_format_json_schema(qwen) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    fmt = {"format": {"type": "json_schema", "name": "weather", "schema": schema, "strict": True}}
    r = api_of(qwen).responses.create(model=MODEL, input=ASK, text=fmt, temperature=0, max_output_tokens=120)
    jsonschema.validate(json.loads(r.output_text), schema)


def test_the_stream_of_a_function_call_assembles_in_the_official_client() -> None:
    """The API's events for text then a call: a message item (its text in deltas), then a function_call
    item (its arguments in a delta); the openai package's own stream state builds the response."""
    items = replies("Let me look.\n" + QWEN_CALL)
    req = responses_api.ResponsesRequest(model="m", input="hi")

    async def run() -> list[dict]:
        parsed = tools.Tools(tuple(tools.Function(n) for n in NAMES))

        async def events():
            for item in items:
                yield item

        class Gen:
            def cancel(self) -> None:
                pass

        base = responses_api._base(req, "m")
        return [e async for e in responses_api._stream(Gen(), events(), base, parsed)]

    sent = asyncio.run(run())
    adapter = TypeAdapter(ResponseStreamEvent)
    state = ResponseStreamState(input_tools=[], text_format=openai.omit)
    seqs = []
    for e in sent:
        data = json.loads(e["data"])
        assert e["event"] == data["type"]
        seqs.append(data["sequence_number"])
        state.handle_event(adapter.validate_python(data))
    assert seqs == list(range(len(sent)))
    final = state._completed_response
    assert [o.type for o in final.output] == ["message", "function_call"]
    assert final.output_text == "Let me look."
    assert final.output[1].name == "get_weather" and json.loads(final.output[1].arguments) == {
        "city": "Paris",
        "unit": "celsius",
    }


def test_what_is_not_supported_is_a_400_naming_the_field(qwen) -> None:
    api = api_of(qwen)
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    cases = [
        (dict(input=ASK, previous_response_id="resp_1"), "previous_response_id"),
        (dict(input=[{"role": "user", "content": [image]}]), "input[0].content[0].type"),
        (dict(input=ASK, tools=[{"type": "web_search"}]), "tools[0].type"),
        (dict(input=[{"type": "item_reference", "id": "x"}]), "input[0].type"),
        (
            dict(input=ASK, tools=[WEATHER_FN], tool_choice={"type": "function", "name": "nope"}),
            "tool_choice",
        ),
        (dict(input=ASK, text={"format": {"type": "regex"}}), "text.format"),
        (dict(input=ASK, background=True), "background"),
        (dict(input=[]), "input"),
    ]
    for kw, field in cases:
        with pytest.raises(openai.BadRequestError) as e:
            api.responses.create(model=MODEL, max_output_tokens=4, **kw)
        assert e.value.body["param"] == field, e.value.body
    wait_idle(qwen.served)
