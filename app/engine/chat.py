"""Chat prompts and streamed output text: chat templates, incremental UTF-8, stop strings.

* :class:`ChatTemplate` renders a GGUF's ``tokenizer.chat_template`` (a Hugging Face Jinja
  chat template) the way ``transformers`` does, inside a sandboxed Jinja environment that
  also bounds render time, loop iterations and the size of repeated strings. Tools, assistant
  tool calls and tool results reach the template as llama.cpp's ``--jinja`` passes them; where a
  template cannot show one of them (Gemma's), it is written into the messages instead
  (:class:`TemplateCaps`).
  The sandbox is `app.engine.template_sandbox`.
* :class:`Utf8Stream` turns token byte pieces into text without ever emitting a broken
  character, and :class:`StopMatcher` cuts generated text at the first completed stop string,
  holding back only what could still become one (both in `app.engine.textstream`).

Pure Python: no llama.cpp import.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.exceptions import SecurityError

from app.engine.template_sandbox import (
    _BUDGET,
    _CANCEL_EVERY,
    _ITER_FILTER,
    Cancelled,
    _BudgetedIterable,
    _ChatSandbox,
    _raise_exception,
    _RenderBudget,
    _strftime_now,
    _template_lineno,
    _tojson,
    _with_line,
)
from app.engine.textstream import StopMatcher, Utf8Stream

__all__ = [
    "CHATML_TEMPLATE",
    "ROLES",
    "TOOLS_ROLE",
    "Cancelled",
    "ChatTemplate",
    "ChatTemplateError",
    "Message",
    "StopMatcher",
    "TemplateCaps",
    "Utf8Stream",
    "strip_leading_bos",
]

ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})

#: the role of a leading pseudo-message ``{"role": TOOLS_ROLE, "tools": [...]}`` that carries a
#: request's tools with its messages (through the engine process, whose chat takes messages only);
#: :meth:`ChatTemplate.render` gives them to the template as ``tools``. No API role can name it.
TOOLS_ROLE = "tandem.tools"

#: ChatML, the fallback for models whose GGUF carries no chat template (the same text as
#: transformers' old ``default_chat_template``). It uses ``<|im_start|>`` / ``<|im_end|>``
#: markers, which a model not trained on ChatML will see as plain text.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """A chat template failed to compile or render; ``lineno`` is the template line if known."""

    def __init__(self, message: str, lineno: int | None = None) -> None:
        super().__init__(message)
        self.lineno = lineno


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class Message:
    """One chat turn. ``role`` is one of system/user/assistant/tool; ``content`` is text."""

    role: str
    content: str

    def __post_init__(self) -> None:
        if not isinstance(self.role, str) or self.role not in ROLES:
            raise ValueError(f"message role must be one of {sorted(ROLES)}, got {self.role!r}")
        if not isinstance(self.content, str):
            raise TypeError(f"message content must be a str, got {type(self.content).__name__}")


def _message_dict(message: Message | Mapping[str, Any], index: int) -> dict[str, Any]:
    """Validate one message and return the plain dict a template sees.

    Mappings may carry extra keys (``tool_calls``, ``name``, ...); they are passed through.
    """
    if isinstance(message, Message):
        return {"role": message.role, "content": message.content}
    if not isinstance(message, Mapping):
        raise TypeError(f"messages[{index}] must be a Message or a mapping, got {type(message).__name__}")
    missing = [key for key in ("role", "content") if key not in message]
    if missing:
        raise ValueError(f"messages[{index}] lacks {' and '.join(missing)}")
    try:
        Message(message["role"], message["content"])
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"messages[{index}]: {exc}") from None
    return dict(message)


# --------------------------------------------------------------------------- templates


class ChatTemplate:
    """A compiled Hugging Face chat template (e.g. a GGUF's ``tokenizer.chat_template``).

    Rendering matches ``transformers``' ``apply_chat_template(tokenize=False)``: the same
    sandboxed Jinja settings (``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``), globals
    ``raise_exception`` / ``strftime_now``, ``tojson`` filter and variables ``messages``,
    ``add_generation_prompt``, ``tools``, ``bos_token``, ``eos_token``.
    Every failure (syntax, ``raise_exception``, sandbox violation, runaway loop, undefined
    value misuse) is raised as :class:`ChatTemplateError`.
    """

    def __init__(
        self,
        template: str,
        *,
        bos_token: str = "",
        eos_token: str = "",
        timeout: float = 5.0,
        max_iterations: int = 1_000_000,
    ) -> None:
        if not isinstance(template, str):
            raise TypeError(f"chat template must be a str, got {type(template).__name__}")
        self.source = template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.timeout = timeout
        self.max_iterations = max_iterations

        env = _ChatSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.filters[_ITER_FILTER] = _BudgetedIterable
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            tree = env.parse(template)
            for loop in tree.find_all(nodes.For):
                loop.iter = nodes.Filter(loop.iter, _ITER_FILTER, [], [], None, None, lineno=loop.lineno)
            self._template = env.from_string(tree)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(
                f"chat template syntax error at line {exc.lineno}: {exc.message}", exc.lineno
            ) from exc
        except jinja2.TemplateError as exc:  # e.g. an unknown filter or test
            raise ChatTemplateError(
                f"chat template does not compile: {exc}", getattr(exc, "lineno", None)
            ) from exc

    @classmethod
    def fallback(cls, *, bos_token: str = "", eos_token: str = "") -> ChatTemplate:
        """The ChatML template (:data:`CHATML_TEMPLATE`), for GGUFs without a chat template."""
        return cls(CHATML_TEMPLATE, bos_token=bos_token, eos_token=eos_token)

    def render(
        self,
        messages: Sequence[Message | Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra_context: Mapping[str, Any] | None = None,
        cancel: Callable[[], bool] | None = None,
    ) -> str:
        """Render a conversation to prompt text (:class:`Cancelled` once ``cancel()`` says so).

        ``tools`` are JSON-schema tool descriptions for templates that support them;
        ``extra_context`` adds template-specific variables (e.g. Llama's ``date_string``).
        Invalid messages raise ``ValueError`` / ``TypeError``; template failures raise
        :class:`ChatTemplateError`.
        """
        if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
            raise TypeError("messages must be a sequence of Message or mappings")
        context: dict[str, Any] = dict(extra_context or {})
        checked = []
        with_tools = False  # the chat has tool calls or tool results
        for i, message in enumerate(messages):
            if cancel is not None and i % _CANCEL_EVERY == _CANCEL_EVERY - 1 and cancel():
                raise Cancelled("the request was cancelled while its chat was rendered")
            if i == 0 and isinstance(message, Mapping) and message.get("role") == TOOLS_ROLE:
                if tools is None:
                    tools = message.get("tools") or None  # none offered: as a chat without tools
                continue
            m = _message_dict(message, i)
            with_tools = with_tools or m["role"] == "tool" or bool(m.get("tool_calls"))
            checked.append(m)
        if tools is not None and (
            isinstance(tools, (str, bytes, Mapping))
            or not isinstance(tools, Sequence)
            or not all(isinstance(t, Mapping) for t in tools)
        ):
            raise TypeError("tools must be a sequence of mappings (JSON-schema tool descriptions)")
        tool_list = [dict(tool) for tool in tools] if tools is not None else None
        if tool_list or with_tools:
            checked, tool_list = self._adapt(checked, tool_list)
        core = {
            "messages": checked,
            "add_generation_prompt": bool(add_generation_prompt),
            "tools": tool_list,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }
        clashes = sorted(set(context) & set(core))
        if clashes:
            raise ValueError(f"extra_context may not set {', '.join(clashes)}")
        context.update(core)
        return self._render(context, cancel)

    def _render(self, context: dict[str, Any], cancel: Callable[[], bool] | None = None) -> str:
        token = _BUDGET.set(_RenderBudget(self.timeout, self.max_iterations, cancel))
        try:
            return self._template.render(context)
        except SecurityError as exc:
            lineno = _template_lineno(exc.__traceback__)
            raise ChatTemplateError(
                _with_line(f"chat template blocked by the sandbox: {exc}", lineno), lineno
            ) from exc
        except jinja2.TemplateError as exc:  # raise_exception(), undefined misuse, ...
            lineno = _template_lineno(exc.__traceback__)
            raise ChatTemplateError(_with_line(f"chat template error: {exc}", lineno), lineno) from exc
        except RecursionError as exc:
            raise ChatTemplateError("chat template recursed too deeply") from exc
        except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError, MemoryError) as exc:
            lineno = _template_lineno(exc.__traceback__)
            message = f"chat template failed: {type(exc).__name__}: {exc}"
            raise ChatTemplateError(_with_line(message, lineno), lineno) from exc
        finally:
            _BUDGET.reset(token)

    # -- tools -------------------------------------------------------------------------------------
    @property
    def caps(self) -> TemplateCaps:
        """What the template shows of a chat with tools (found once, by rendering small probe chats)."""
        caps: TemplateCaps | None = getattr(self, "_caps", None)
        if caps is None:
            caps = self._caps = _probe_caps(self)
        return caps

    def _adapt(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """A chat with tools as this template can show it (llama.cpp's polyfills): tool calls' arguments
        as objects where the template wants them; tools, calls and results the template would drop or
        refuse written into the messages as text; a system message it refuses folded into the first
        user turn."""
        caps = self.caps
        out: list[dict[str, Any]] = []
        names: dict[str, str] = {}  # call id -> function name, for results that do not say it
        if tools and not caps.tools:
            text = tools_prompt(tools)
            if messages and messages[0]["role"] == "system":
                messages = [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
            else:
                messages = [{"role": "system", "content": text}, *messages]
            tools = None
        merged_result = False  # the last message out is tool results written as a user turn
        for m in messages:
            role = m["role"]
            if role == "assistant" and m.get("tool_calls"):
                calls = [_call_dict(c, caps.object_arguments) for c in m["tool_calls"]]
                for c in calls:
                    if c.get("id"):
                        names[str(c["id"])] = c["function"]["name"]
                if caps.tool_calls:
                    m = {**m, "tool_calls": calls}
                else:
                    written = "\n".join(
                        _json({"name": c["function"]["name"], "arguments": _arguments(c["function"])})
                        for c in calls
                    )
                    m = {k: v for k, v in m.items() if k != "tool_calls"}
                    m["content"] = f"{m['content']}\n{written}" if m["content"] else written
            elif role == "tool":
                name = m.get("name") or names.get(str(m.get("tool_call_id") or ""), "")
                if caps.tool_responses:
                    m = {**m, "name": name} if name else m
                else:
                    result = {"name": name, "content": m["content"]} if name else {"content": m["content"]}
                    text = _json({"tool_response": result})
                    if merged_result:
                        out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + text}
                        continue
                    m = {"role": "user", "content": text}
                    merged_result = True
                    out.append(m)
                    continue
            merged_result = False
            out.append(m)
        if not caps.system and any(m["role"] == "system" for m in out):
            out = _fold_system(out)
        return out, tools


@dataclass(frozen=True)
class TemplateCaps:
    """What a chat template shows (as llama.cpp's minja finds it: by rendering probe chats)."""

    system: bool = True  # a system message
    tools: bool = False  # the ``tools`` it is given
    tool_calls: bool = False  # an assistant message's ``tool_calls``
    tool_responses: bool = False  # a ``tool`` message
    object_arguments: bool = False  # a call's arguments must be an object (not JSON text) to show


_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "tandem_probe_tool",
        "description": "probe",
        "parameters": {"type": "object", "properties": {"tandem_arg": {"type": "string"}}},
    },
}
_PROBE_ARGS = {"tandem_arg": "tandem_value"}


def _probe_caps(template: ChatTemplate) -> TemplateCaps:
    def shows(needle: str, messages: list[dict[str, Any]], tools: list[Any] | None = None) -> bool:
        context = {
            "messages": messages,
            "add_generation_prompt": True,
            "tools": tools,
            "bos_token": template.bos_token,
            "eos_token": template.eos_token,
        }
        try:
            return needle in template._render(context)
        except (ChatTemplateError, Cancelled):
            return False

    user = {"role": "user", "content": "tandem_user"}
    system = shows("tandem_system", [{"role": "system", "content": "tandem_system"}, user])
    tools = shows("tandem_probe_tool", [user], [_PROBE_TOOL])

    def call_chat(arguments: Any) -> list[dict[str, Any]]:
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "tandem_probe_call", "arguments": arguments},
        }
        return [user, {"role": "assistant", "content": "", "tool_calls": [call]}]

    probe_tools = [_PROBE_TOOL] if tools else None
    as_text = call_chat(json.dumps(_PROBE_ARGS))
    as_object = call_chat(dict(_PROBE_ARGS))
    needle = '"tandem_arg": "tandem_value"'
    text_ok = shows("tandem_probe_call", as_text, probe_tools) and shows(needle, as_text, probe_tools)
    object_ok = shows("tandem_probe_call", as_object, probe_tools) and shows(needle, as_object, probe_tools)
    tool_calls = text_ok or object_ok
    chat = as_object if object_ok and not text_ok else as_text
    result = {
        "role": "tool",
        "content": "tandem_result",
        "tool_call_id": "call_1",
        "name": "tandem_probe_call",
    }
    responses = shows("tandem_result", [*chat, result], probe_tools) if tool_calls else False
    return TemplateCaps(system, tools, tool_calls, responses, object_ok and not text_ok)


def tools_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    """How a model whose template shows no tools is told of them (its reply is parsed as calls)."""
    listed = "\n".join(_json(tool) for tool in tools)
    return (
        "You can call the following functions (JSON schemas):\n"
        f"{listed}\n\n"
        "To call a function, answer with only a JSON object, one per line for several calls: "
        '{"name": <function name>, "arguments": <arguments object>}'
    )


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _call_dict(call: Any, object_arguments: bool) -> dict[str, Any]:
    """A call as templates read it (``{"id", "type", "function": {"name", "arguments"}}``), its arguments
    an object where the template wants one."""
    if not isinstance(call, Mapping):
        raise TypeError(f"a tool call must be a mapping, got {type(call).__name__}")
    fn = call.get("function") if isinstance(call.get("function"), Mapping) else call
    out = {**call, "type": call.get("type", "function"), "function": dict(fn)}
    if "name" not in out["function"] or not isinstance(out["function"]["name"], str):
        raise ValueError("a tool call needs a function name")
    if object_arguments:
        out["function"]["arguments"] = _arguments(out["function"])
    return out


def _arguments(fn: Mapping[str, Any]) -> Any:
    """A call's arguments as an object (JSON text parsed; text that is not JSON kept as it is)."""
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            return json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return args
    return {} if args is None else args


def _fold_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """System messages joined into the first user message (for templates that refuse a system role)."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system" and m["content"])
    rest = [m for m in messages if m["role"] != "system"]
    for i, m in enumerate(rest):
        if m["role"] == "user":
            rest[i] = {**m, "content": f"{system}\n\n{m['content']}" if system else m["content"]}
            return rest
    return [{"role": "user", "content": system}, *rest] if system else rest


def strip_leading_bos(text: str, bos_token: str) -> str:
    """Drop one leading ``bos_token`` from rendered ``text``.

    Many templates render ``{{ bos_token }}`` themselves; tokenizing that text with
    "add BOS" on would give a double BOS (llama.cpp warns about it). Strip it here and let
    the tokenizer add the real BOS token instead.
    """
    if bos_token and text.startswith(bos_token):
        return text[len(bos_token) :]
    return text


# --------------------------------------------------------------------------- UTF-8
