"""Chat templates (app.engine.chat): the real models' templates, the sandbox, message checks."""

# The real-world chat templates below are kept verbatim, long lines included.
# ruff: noqa: E501

from __future__ import annotations

import time
from datetime import datetime

import pytest

from app.engine.chat import (
    CHATML_TEMPLATE,
    ChatTemplate,
    ChatTemplateError,
    Message,
    strip_leading_bos,
)

# --------------------------------------------------------------------------- real templates
# Copied from the models' tokenizer_config.json "chat_template" fields.

# Qwen/Qwen2.5-*-Instruct (identical for 0.5B..72B), with its Hermes-style tools branch.
QWEN25_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# meta-llama/Llama-3.1-8B-Instruct (the original has trailing blanks on two lines; they sit
# before `{%-` / `{{-` and so never render, and are dropped here).
LLAMA31_TEMPLATE = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

# google/gemma-2-*-it: refuses a system message.
GEMMA2_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)

# google/gemma-3-*-it: folds a system message into the first user turn.
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

# The classic ChatML template (e.g. OpenHermes, Yi, transformers' old default).
CHATML_LITERAL = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CONVERSATION = [
    Message("system", "You are terse."),
    Message("user", "Hi"),
    Message("assistant", "Hello!"),
    Message("user", "How are you?"),
]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Météo d'une ville",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


# --------------------------------------------------------------------------- rendering


def test_chatml_fallback_multi_turn() -> None:
    expected = (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nHow are you?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert ChatTemplate.fallback().render(CONVERSATION) == expected
    assert ChatTemplate(CHATML_LITERAL).render(CONVERSATION) == expected
    assert (
        ChatTemplate(CHATML_TEMPLATE).render(CONVERSATION, add_generation_prompt=False)
        == expected[: -len("<|im_start|>assistant\n")]
    )


def test_qwen25_multi_turn_with_system() -> None:
    assert ChatTemplate(QWEN25_TEMPLATE, eos_token="<|im_end|>").render(CONVERSATION) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nHow are you?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_qwen25_default_system_prompt() -> None:
    assert ChatTemplate(QWEN25_TEMPLATE).render([{"role": "user", "content": "2+2?"}]) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_qwen25_tools_branch() -> None:
    messages = [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
            ],
        },
        {"role": "tool", "content": '{"temp_c": 21}'},
    ]
    rendered = ChatTemplate(QWEN25_TEMPLATE).render(messages, tools=[WEATHER_TOOL])
    tool_json = (
        '{"type": "function", "function": {"name": "get_weather", "description": "Météo d\'une ville", '
        '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}'
    )
    assert rendered == (
        "<|im_start|>system\nYou are a weather bot.\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + tool_json
        + "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>\n"
        '<|im_start|>user\n<tool_response>\n{"temp_c": 21}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n"
    )


def test_llama31_multi_turn_with_system() -> None:
    template = ChatTemplate(LLAMA31_TEMPLATE, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    messages = [Message("system", "  You are terse.\n"), *CONVERSATION[1:]]
    expected = (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
        "You are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert template.render(messages) == expected
    dated = template.render(messages, extra_context={"date_string": "01 Jan 2030"})
    assert dated == expected.replace("26 Jul 2024", "01 Jan 2030")


def test_llama31_tools_in_first_user_message_use_indented_json() -> None:
    template = ChatTemplate(LLAMA31_TEMPLATE, bos_token="<|begin_of_text|>")
    tool = {"name": "now", "parameters": {}, "description": "heure courante ⏰"}
    rendered = template.render([Message("user", "What time is it?")], tools=[tool])
    assert rendered == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Environment: ipython\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n"
        "Given the following functions, please respond with a JSON for a function call "
        "with its proper arguments that best answers the given prompt.\n\n"
        'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
        "Do not use variables.\n\n"
        '{\n    "name": "now",\n    "parameters": {},\n    "description": "heure courante ⏰"\n}\n\n'
        "What time is it?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_gemma2_multi_turn_and_rejects_system_role() -> None:
    template = ChatTemplate(GEMMA2_TEMPLATE, bos_token="<bos>", eos_token="<eos>")
    assert template.render(CONVERSATION[1:]) == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nHow are you?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    with pytest.raises(ChatTemplateError, match="System role not supported"):
        template.render(CONVERSATION)
    with pytest.raises(ChatTemplateError, match="must alternate"):
        template.render([Message("user", "a"), Message("user", "b")])


def test_gemma3_folds_system_into_first_user_turn() -> None:
    template = ChatTemplate(GEMMA3_TEMPLATE, bos_token="<bos>")
    assert template.render(CONVERSATION) == (
        "<bos><start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nHow are you?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert template.render(CONVERSATION[1:2], add_generation_prompt=False) == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n"
    )


def test_tojson_matches_transformers() -> None:
    value = "{{ {'a': 'é<&>', 'b': [1, 2]} | tojson }}|{{ [1, {'k': none}] | tojson(indent=2) }}|"
    value += "{{ {'x': 1, 'y': 2} | tojson(separators=(',', ':')) }}"
    assert ChatTemplate(value).render([]) == (
        '{"a": "é<&>", "b": [1, 2]}|[\n  1,\n  {\n    "k": null\n  }\n]|{"x":1,"y":2}'
    )


def test_globals_and_variables() -> None:
    template = ChatTemplate(
        "{{ strftime_now('%Y') }}|{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools }}",
        bos_token="<s>",
        eos_token="</s>",
    )
    assert template.render([], add_generation_prompt=False) == f"{datetime.now():%Y}|<s>|</s>|False|None"


def test_loopcontrols_and_trim_blocks() -> None:
    source = (
        "{% for m in messages %}\n  {% if loop.index0 == 1 %}{% continue %}{% endif %}\n{{ m.content }},\n"
    )
    source += "  {% if loop.index0 == 2 %}{% break %}{% endif %}\n{% endfor %}"
    msgs = [Message("user", c) for c in "abcd"]
    assert ChatTemplate(source).render(msgs) == "a,\nc,\n"


def test_strip_leading_bos() -> None:
    rendered = ChatTemplate(LLAMA31_TEMPLATE, bos_token="<|begin_of_text|>").render([Message("user", "x")])
    stripped = strip_leading_bos(rendered, "<|begin_of_text|>")
    assert stripped.startswith("<|start_header_id|>system")
    assert strip_leading_bos(stripped, "<|begin_of_text|>") == stripped
    assert strip_leading_bos("<s><s>x", "<s>") == "<s>x"
    assert strip_leading_bos("<s>x", "") == "<s>x"


# --------------------------------------------------------------------------- template errors


def test_syntax_error_reports_line() -> None:
    with pytest.raises(ChatTemplateError, match="line 3") as info:
        ChatTemplate("{% for m in messages %}\n{{ m.content }}\n{% if %}\n{% endfor %}")
    assert info.value.lineno == 3
    with pytest.raises(ChatTemplateError, match="line 2"):
        ChatTemplate("ok\n{% for m in messages %}")


def test_raise_exception_message_and_line() -> None:
    template = ChatTemplate(
        "a\n{% if messages | length > 1 %}{{ raise_exception('Only one message!') }}{% endif %}"
    )
    assert template.render([Message("user", "x")]) == "a\n"
    with pytest.raises(ChatTemplateError, match="Only one message!") as info:
        template.render([Message("user", "x"), Message("user", "y")])
    assert info.value.lineno == 2


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__ }}",
        "{{ messages.__class__.__base__.__subclasses__() }}",
        "{{ raise_exception.__globals__ }}",
        "{% set x = messages.append(1) %}",
    ],
)
def test_sandbox_violations(source: str) -> None:
    with pytest.raises(ChatTemplateError, match="sandbox"):
        ChatTemplate(source).render([Message("user", "x")])


@pytest.mark.parametrize(
    "source",
    [
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% set r = range(100000) | list %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}",
        "{% for i in range(100000) %}{{ range(100000) | join }}{% endfor %}",
        "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
        "{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}",
        "{{ 'x' * 10 ** 9 }}",
        "{{ 7 ** 100000000 }}",
        "{{ range(10 ** 9) | length }}",
    ],
)
def test_runaway_templates_are_stopped(source: str) -> None:
    start = time.monotonic()
    with pytest.raises(ChatTemplateError):
        ChatTemplate(source, timeout=0.2).render([Message("user", "x")])
    assert time.monotonic() - start < 1.5


def test_undefined_misuse_is_a_template_error() -> None:
    with pytest.raises(ChatTemplateError, match="template line 1"):
        ChatTemplate("{{ messages[3]['content'] }}").render([Message("user", "x")])


def test_message_validation() -> None:
    with pytest.raises(ValueError, match="role"):
        Message("robot", "hi")
    with pytest.raises(TypeError, match="content"):
        Message("user", None)  # type: ignore[arg-type]
    template = ChatTemplate.fallback()
    with pytest.raises(ValueError, match=r"messages\[1\].*role"):
        template.render([Message("user", "a"), {"role": "narrator", "content": "b"}])
    with pytest.raises(ValueError, match=r"messages\[0\] lacks content"):
        template.render([{"role": "user"}])
    with pytest.raises(TypeError, match=r"messages\[0\].*content"):
        template.render([{"role": "user", "content": 3}])
    with pytest.raises(TypeError):
        template.render("hello")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="extra_context"):
        template.render([Message("user", "a")], extra_context={"messages": []})


def test_messages_are_not_mutated_and_render_is_repeatable() -> None:
    msgs = [{"role": "user", "content": "hi", "name": "bob"}]
    template = ChatTemplate("{{ messages[0].name }}:{{ messages | length }}")
    assert template.render(msgs) == "bob:1"
    assert template.render(msgs) == "bob:1"
    assert msgs == [{"role": "user", "content": "hi", "name": "bob"}]
