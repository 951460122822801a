"""Anthropic's Messages API (``POST /v1/messages``) on a tiny real model with Qwen 2.5's template, driven
by the official ``anthropic`` client: plain text and streamed text equal to the OpenAI route's greedy
reply, system prompts and content blocks, a tool round trip (``tool_use`` / ``tool_result``), a forced
call, the key as ``x-api-key``, the Host check, and a 400 naming the field for what is not supported."""

# Model replies and chats are kept on one line each, long lines included.
# ruff: noqa: E501

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import anthropic
import jsonschema
import openai
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent
from pydantic import TypeAdapter
from test_server_tools import NAMES, QWEN_CALL, replies
from tool_server import SEARCH, WEATHER, n_prompt, prompt_text, serving, write_variant

from api_server import Running, wait_idle
from app.server import anthropic_api, tools
from app.server.schemas import CONSTRAINED

pytestmark = pytest.mark.timeout(180)

MODEL = "tiny-qwen25"
GREEDY = {"temperature": 0}  # the client no longer takes sampling parameters: sent as extra fields
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER_TOOL = {
    "name": "get_weather",
    "description": WEATHER["function"]["description"],
    "input_schema": WEATHER["function"]["parameters"],
}
SEARCH_TOOL = {
    "name": "search_files",
    "description": SEARCH["function"]["description"],
    "input_schema": SEARCH["function"]["parameters"],
}


@pytest.fixture(scope="module")
def qwen(tiny_pair, tmp_path_factory) -> Iterator[Running]:
    target = write_variant(tmp_path_factory.mktemp("qwen"), "qwen25")
    with serving(target, tiny_pair.draft, api_key="s3cret") as running:
        yield running


def client(running: Running, key: str = "s3cret") -> anthropic.Anthropic:
    base = running.url.removesuffix("/v1")
    return anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=120)


def test_plain_and_streamed_text_equal_the_chat_completion(qwen) -> None:
    oa = openai.OpenAI(base_url=qwen.url, api_key="s3cret", max_retries=0, timeout=120)
    chat = oa.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=30)
    c = client(qwen)
    msg = c.messages.create(model=MODEL, messages=ASK, max_tokens=30, extra_body=GREEDY)
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert msg.content[0].type == "text" and msg.content[0].text == chat.choices[0].message.content
    assert msg.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[chat.choices[0].finish_reason]
    u = msg.usage
    assert u.input_tokens + u.cache_read_input_tokens == chat.usage.prompt_tokens
    assert u.output_tokens == chat.usage.completion_tokens
    with c.messages.stream(model=MODEL, messages=ASK, max_tokens=30, extra_body=GREEDY) as stream:
        kinds = [ev.type for ev in stream]
        final = stream.get_final_message()
    assert final.content[0].text == msg.content[0].text and final.usage.output_tokens == u.output_tokens
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(kinds)


def test_system_and_content_blocks_reach_the_template(qwen) -> None:
    c = client(qwen)
    msg = c.messages.create(
        model=MODEL,
        system=[{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": " there"}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "x"}, {"type": "text", "text": "Hi!"}]},
            {"role": "user", "content": "Tell me about the fox"},
        ],
        max_tokens=8,
        extra_body=GREEDY,
        thinking={"type": "disabled"},
        stop_sequences=["\u0000never"],
    )  # fmt: skip
    view = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": "Tell me about the fox"},
    ]
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == n_prompt(qwen, view)


def test_a_tool_round_trip(qwen) -> None:
    c = client(qwen)
    history = [
        *ASK,
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris", "unit": "celsius"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "22 degrees and sunny"}]},
            {"type": "text", "text": "And tomorrow?"},
        ]},
    ]  # fmt: skip
    msg = c.messages.create(
        model=MODEL, messages=history, tools=[WEATHER_TOOL], max_tokens=12, extra_body=GREEDY
    )
    assert msg.stop_reason in ("end_turn", "max_tokens", "tool_use")
    call = {
        "id": "toolu_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
    }
    view = [
        *ASK,
        {"role": "assistant", "content": "Let me look.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "22 degrees and sunny"},
        {"role": "user", "content": "And tomorrow?"},
    ]  # fmt: skip
    text = prompt_text(qwen, view, [WEATHER])
    assert (
        "Let me look.\n<tool_call>\n" in text
        and "<tool_response>\n22 degrees and sunny\n</tool_response>" in text
    )
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == n_prompt(qwen, view, [WEATHER])


@pytest.mark.skipif(not CONSTRAINED, reason="the engine has no constrained sampling yet")
@pytest.mark.parametrize("stream", [False, True])
def test_tool_choice_any_and_tool_give_a_valid_tool_use(qwen, stream: bool) -> None:
    c = client(qwen)
    for choice, names in (
        ({"type": "any"}, {"get_weather", "search_files"}),
        ({"type": "tool", "name": "get_weather"}, {"get_weather"}),
    ):
        kw = dict(
            model=MODEL, messages=ASK, tools=[WEATHER_TOOL, SEARCH_TOOL], max_tokens=120, extra_body=GREEDY,
            tool_choice={**choice, "disable_parallel_tool_use": True},
        )  # fmt: skip
        if stream:
            with c.messages.stream(**kw) as s:
                msg = s.get_final_message()
        else:
            msg = c.messages.create(**kw)
        uses = [b for b in msg.content if b.type == "tool_use"]
        assert msg.stop_reason == "tool_use" and len(uses) == 1, msg
        assert uses[0].name in names and uses[0].id.startswith("toolu_")
        schema = {"get_weather": WEATHER_TOOL, "search_files": SEARCH_TOOL}[uses[0].name]["input_schema"]
        jsonschema.validate(uses[0].input, schema)


def test_the_stream_of_a_tool_use_assembles_in_the_official_client() -> None:
    """Anthropic's events for text then a call: a text block, then a tool_use block whose input arrives
    as input_json_delta; the anthropic package's own accumulator builds the message from them."""
    items = replies("Let me look.\n" + QWEN_CALL)

    async def run() -> list[dict]:
        parsed = tools.Tools(tuple(tools.Function(n) for n in NAMES))

        async def events():
            for item in items:
                yield item

        class Gen:
            def cancel(self) -> None:
                pass

        return [e async for e in anthropic_api._stream(Gen(), events(), "msg_1", "m", parsed, ())]

    sent = asyncio.run(run())
    adapter = TypeAdapter(RawMessageStreamEvent)
    snapshot, bufs = None, {}
    for e in sent:
        data = json.loads(e["data"])
        assert e["event"] == data["type"]
        snapshot = accumulate_event(
            event=adapter.validate_python(data), current_snapshot=snapshot, json_bufs=bufs
        )
    assert [b.type for b in snapshot.content] == ["text", "tool_use"]
    assert snapshot.content[0].text == "Let me look."
    assert snapshot.content[1].name == "get_weather" and snapshot.content[1].input == {
        "city": "Paris",
        "unit": "celsius",
    }
    assert snapshot.stop_reason == "tool_use"


def test_the_key_may_be_x_api_key_and_errors_are_anthropic_s(qwen) -> None:
    with pytest.raises(anthropic.AuthenticationError) as e:
        client(qwen, "wrong").messages.create(model=MODEL, messages=ASK, max_tokens=4)
    assert e.value.status_code == 401 and e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "authentication_error"
    bearer = anthropic.Anthropic(
        base_url=qwen.url.removesuffix("/v1"), auth_token="s3cret", max_retries=0, timeout=60
    )  # Authorization: Bearer, as ANTHROPIC_AUTH_TOKEN sends it
    assert bearer.messages.create(model=MODEL, messages=ASK, max_tokens=2).type == "message"
    with pytest.raises(anthropic.NotFoundError):
        client(qwen).messages.create(model="claude-opus-4-1", messages=ASK, max_tokens=4)
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", qwen.port, timeout=30)
    conn.request(
        "POST",
        "/v1/messages",
        body=json.dumps({"messages": ASK, "max_tokens": 4}),
        headers={"Host": "evil.example", "Content-Type": "application/json", "x-api-key": "s3cret"},
    )
    resp = conn.getresponse()
    assert resp.status == 403 and json.loads(resp.read())["error"]["type"] == "permission_error"


def test_what_is_not_supported_is_a_400_naming_the_field(qwen) -> None:
    c = client(qwen)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    cases = [
        (dict(messages=[{"role": "user", "content": [image]}]), "messages[0].content[0].type"),
        (dict(messages=ASK, tools=[{"type": "web_search_20250305", "name": "web_search"}]), "tools[0].type"),
        (dict(messages=[*ASK, {"role": "assistant", "content": "The weather is"}]), "messages[1]"),
        (
            dict(messages=ASK, tool_choice={"type": "tool", "name": "nope"}, tools=[WEATHER_TOOL]),
            "tool_choice",
        ),
        (dict(messages=ASK, extra_body={"temperature": 1.5}), "temperature"),
        (
            dict(messages=ASK, extra_body={"mcp_servers": [{"type": "url", "url": "https://x.example"}]}),
            "mcp_servers",
        ),
        (
            dict(messages=ASK, output_config={"format": {"type": "regex", "pattern": "x"}}),
            "output_config.format",
        ),
    ]
    for kw, field in cases:
        with pytest.raises(anthropic.BadRequestError) as e:
            c.messages.create(model=MODEL, max_tokens=4, **kw)
        assert e.value.body["error"]["type"] == "invalid_request_error"
        assert e.value.body["error"]["message"].startswith(field), e.value.body
    with pytest.raises(anthropic.BadRequestError) as e:  # Anthropic's max_tokens is required
        c.post("/v1/messages", body={"model": MODEL, "messages": ASK}, cast_to=object)
    assert e.value.body["error"]["message"].startswith("max_tokens")
    wait_idle(qwen.served)


def test_count_tokens_counts_the_prompt_the_engine_makes(qwen) -> None:
    r = client(qwen).messages.count_tokens(
        model=MODEL, system="You are terse.", messages=ASK, tools=[WEATHER_TOOL]
    )
    assert r.input_tokens == n_prompt(
        qwen, [{"role": "system", "content": "You are terse."}, *ASK], [WEATHER]
    )


@pytest.mark.skipif(not CONSTRAINED, reason="the engine has no constrained sampling yet")
def test_output_config_format_gives_json_that_validates(qwen) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    msg = client(qwen).messages.create(
        model=MODEL, messages=ASK, max_tokens=120, extra_body=GREEDY,
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )  # fmt: skip
    jsonschema.validate(json.loads(msg.content[0].text), schema)
