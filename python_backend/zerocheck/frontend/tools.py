"""OpenAI tool calling over a model without a tools template: the prompt, the grammar that constrains the
answer, and the calls read back from it.

The prompt follows Qwen2.5's Hermes-style chat template (SmolLM2's ChatML template has no tools section),
rendered here into the plain system / user / assistant messages the generate model takes:

- the tool definitions go at the end of the first message when it is a system message (after "\\n\\n"),
  else into a new first system message:

      # Tools

      You may call one or more functions to assist with the user query.

      You are provided with function signatures within <tools></tools> XML tags:
      <tools>
      {"type": "function", "function": {"name": ..., "description": ..., "parameters": ...}}
      </tools>

      For each function call, return a json object with function name and arguments within
      <tool_call></tool_call> XML tags:
      <tool_call>
      {"name": <function-name>, "arguments": <args-json-object>}
      </tool_call>

  (one JSON object per tool and line; the last paragraph is one line);
- an assistant message's `tool_calls` become its content, after its text and "\\n" when it has text:
  `<tool_call>\\n{"name": "<fn>", "arguments": <arguments>}\\n</tool_call>`, several joined by "\\n";
- `tool` messages become one user message per run of consecutive ones, each result as
  `<tool_response>\\n<content>\\n</tool_response>`, joined by "\\n".

The answer is constrained by a Lark grammar (llguidance's dialect) that `tool_choice` implies:
`required` (or a named function): one call, or with `parallel_tool_calls` one or more joined by "\\n",
each `<tool_call>\\n{"name": "<fn>", "arguments": ` + JSON matching the function's `parameters` (compact:
no whitespace between tokens) + `}\\n</tool_call>`; `auto`: the same calls, or any text that does not
begin with `<tool_call>`; `none`: no grammar (the tools are still in the prompt, as vLLM renders them).
Since the answer matches the grammar, calls are read back by its delimiters, not searched for.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

from zerocheck.frontend.errors import invalid
from zerocheck.api.guide import GuideError
from zerocheck.grammar.guide import LENIENT_JSON_OPTIONS, json_schema_grammar

NONE, AUTO, REQUIRED, NAMED = "none", "auto", "required", "named"
NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for function names
DEFAULT_PARAMETERS = {"type": "object", "properties": {}}
CALL_OPEN, CALL_CLOSE = "<tool_call>\n", "\n</tool_call>"
ARGUMENTS_KEY = '", "arguments": '
HEAD = CALL_OPEN + '{"name": "'  # a call, up to its function name
TAIL = "}" + CALL_CLOSE  # after a call's arguments
SEPARATOR = "\n"  # between parallel calls
TOOLS_PREAMBLE = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_INSTRUCTION = ("</tools>\n\nFor each function call, return a json object with function name and arguments "
                     "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                     "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>")
# any answer that does not begin with a call (llguidance's and-not of two regexes)
FREE_TEXT = "TEXT: /(?s:.*)/ & ~/<tool_call>(?s:.*)/"


@dataclass(frozen=True)
class Function:
    """One tool: its name, description and parameters' JSON schema (an object schema)."""

    name: str
    description: str | None
    parameters: dict

    def definition(self) -> dict:
        """The tool as the prompt lists it: {"type": "function", "function": {...}}."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class Tools:
    """A request's tools and how the answer may use them: `choice` NONE | AUTO | REQUIRED | NAMED (then
    `named` is the function), `parallel`: more than one call allowed."""

    functions: tuple[Function, ...]
    choice: str
    named: str | None = None
    parallel: bool = True

    @property
    def constrained(self) -> bool:
        return self.choice != NONE


@dataclass(frozen=True)
class ToolCall:
    """A call read from the answer: the function's name and its arguments (JSON text, as generated)."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def body(self) -> dict:
        """OpenAI's `tool_calls` entry."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


# -- request ---------------------------------------------------------------------------------------------


def parse_tools(body: Mapping[str, Any]) -> Tools | None:
    """`tools`, `tool_choice` and `parallel_tool_calls` -> Tools (None without tools); 400 naming the field."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid(f"parallel_tool_calls must be true or false, got {parallel!r}", "parallel_tool_calls")
    if tools in (None, []):
        if choice not in (None, NONE, AUTO):
            raise invalid("tool_choice needs tools: a function can only be called when tools lists it", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise invalid("tools must be a list of {type: \"function\", function: {name, description, parameters}}",
                      "tools")
    functions = tuple(_function(i, tool) for i, tool in enumerate(tools))
    names = [f.name for f in functions]
    if len(set(names)) != len(names):
        raise invalid(f"tools: function names must be unique, got {names}", "tools")
    kind, named = _tool_choice(choice, names)
    return Tools(functions, kind, named, parallel is not False)


def _function(index: int, tool: Any) -> Function:
    where = f"tools[{index}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise invalid(f"{where} must be {{type: \"function\", function: {{name, description, parameters}}}}", "tools")
    function = tool["function"]
    name = function.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise invalid(f"{where}.function.name must be 1 to 64 letters, digits, '_' or '-', got {name!r}", "tools")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise invalid(f"{where}.function.description must be a string", "tools")
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid(f"{where}.function.strict must be true or false", "tools")  # enforced either way
    parameters = function.get("parameters")
    if parameters is None:
        parameters = DEFAULT_PARAMETERS
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise invalid(f"{where}.function.parameters must be a JSON schema of an object", "tools")
    try:
        json_schema_grammar(json.dumps({**parameters, "type": "object"}))
    except GuideError as error:
        raise invalid(f"{where}.function.parameters: {str(error).split(': ', 1)[-1]}", "tools") from None
    return Function(name, description, parameters)


def _tool_choice(choice: Any, names: list[str]) -> tuple[str, str | None]:
    if choice is None:
        return AUTO, None
    if choice in (NONE, AUTO, REQUIRED):
        return choice, None
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise invalid(f"tool_choice names function {name!r}, which is not in tools ({', '.join(names)})",
                          "tool_choice")
        return NAMED, name
    raise invalid("tool_choice must be \"none\", \"auto\", \"required\" or {type: \"function\", function: {name}}",
                  "tool_choice")


# -- prompt ----------------------------------------------------------------------------------------------


def tools_prompt(functions: tuple[Function, ...]) -> str:
    """The tools section of the system message."""
    lines = [json.dumps(function.definition(), ensure_ascii=False) for function in functions]
    return "\n".join([TOOLS_PREAMBLE, *lines, TOOLS_INSTRUCTION])


def with_tools(messages: list[dict[str, str]], tools: Tools) -> list[dict[str, str]]:
    """`messages` with the tools section in the first system message (appended, or a new one)."""
    section = tools_prompt(tools.functions)
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + section}, *messages[1:]]
    return [{"role": "system", "content": section}, *messages]


def rendered_call(name: str, arguments: str) -> str:
    """One call as the answer holds it."""
    return f"{HEAD}{name}{ARGUMENTS_KEY}{arguments}{TAIL}"


def assistant_calls(index: int, tool_calls: Any) -> str:
    """An assistant message's `tool_calls` as its text; 400 (messages) for a malformed call."""
    where = f"messages[{index}].tool_calls"
    if not isinstance(tool_calls, list):
        raise invalid(f"{where} must be a list of {{id, type: \"function\", function: {{name, arguments}}}}",
                      "messages")
    calls = []
    for j, call in enumerate(tool_calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise invalid(f"{where}[{j}] must be {{id, type: \"function\", function: {{name, arguments}}}}",
                          "messages")
        name, arguments = function.get("name"), function.get("arguments")
        if not isinstance(name, str) or not name:
            raise invalid(f"{where}[{j}].function.name must be a string", "messages")
        if not isinstance(arguments, str):
            raise invalid(f"{where}[{j}].function.arguments must be a string holding a JSON object", "messages")
        try:
            parsed = json.loads(arguments)
        except (ValueError, RecursionError):
            parsed = None
        if not isinstance(parsed, dict):
            raise invalid(f"{where}[{j}].function.arguments must be a string holding a JSON object", "messages")
        calls.append(rendered_call(name, arguments.strip()))
    return SEPARATOR.join(calls)


def tool_response(content: str) -> str:
    """One `tool` message's content as the user message holds it."""
    return f"<tool_response>\n{content}\n</tool_response>"


# -- grammar ---------------------------------------------------------------------------------------------


def tools_grammar(tools: Tools) -> str | None:
    """The Lark grammar (llguidance's dialect) the answer must match; None for tool_choice none."""
    if not tools.constrained:
        return None
    indices = [i for i, f in enumerate(tools.functions) if tools.choice != NAMED or f.name == tools.named]
    call = " | ".join(f"call_{i}" for i in indices)
    rules = ["start: TEXT | calls" if tools.choice == AUTO else "start: calls",
             f"calls: call ({json.dumps(SEPARATOR)} call)*" if tools.parallel else "calls: call",
             f"call: {call}"]
    for i in indices:
        function = tools.functions[i]
        head = json.dumps(HEAD + function.name + ARGUMENTS_KEY)
        # the server's lenient JSON options: keywords llguidance cannot enforce were refused before
        # (json_schema_grammar), so they only accept unknown formats and compile oneOf as anyOf
        schema = {**function.parameters, "type": "object", "x-guidance": LENIENT_JSON_OPTIONS}
        rules.append(f"call_{i}: {head} args_{i} {json.dumps(TAIL)}")
        rules.append(f"args_{i}: %json {json.dumps(schema, ensure_ascii=False)}")
    if tools.choice == AUTO:
        rules.append(FREE_TEXT)
    return "\n".join(rules) + "\n"


# -- answer ----------------------------------------------------------------------------------------------


def parse_tool_calls(text: str) -> list[ToolCall] | None:
    """The calls of an answer made of calls (`<tool_call>\\n{...}\\n</tool_call>`, joined by "\\n"); None when
    the answer is not calls (plain text) or was cut before its last call closed."""
    if not text.startswith(CALL_OPEN) or not text.endswith(CALL_CLOSE):
        return None
    calls = []
    for part in text[:-len(CALL_CLOSE)].split(CALL_CLOSE + SEPARATOR):
        if not part.startswith(CALL_OPEN):
            return None
        body = part[len(CALL_OPEN):]
        try:
            call = json.loads(body)
        except (ValueError, RecursionError):
            return None
        name = call.get("name") if isinstance(call, dict) else None
        head = '{"name": ' + json.dumps(name) + ARGUMENTS_KEY[1:]
        if not isinstance(name, str) or not isinstance(call.get("arguments"), dict) or not body.startswith(head):
            return None
        calls.append(ToolCall(name, body[len(head):-1]))  # the arguments' text, as generated
    return calls


class ToolCallStream:
    """One choice's streamed text -> content and OpenAI `tool_calls` deltas, as it arrives.

    With `detect` (tool_choice auto) the text is held while it may still begin with `<tool_call>`; then it
    is content, or calls. Calls are streamed as they are generated: the first delta of a call carries its
    index, id, type, name and the arguments so far (maybe empty), the next ones fragments of the arguments
    (text that may be the start of the call's closing `}\\n</tool_call>` is held back until it is known not
    to be); one delta per call in each push.
    """

    def __init__(self, detect: bool) -> None:
        self.mode = "undecided" if detect else "calls"
        self.held = ""  # text not yet sent
        self.state = "head"  # in calls mode: head | arguments
        self.calls: list[ToolCall] = []  # calls begun (arguments as sent so far)

    @property
    def called(self) -> bool:
        return bool(self.calls)

    def push(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        """(content, tool_calls deltas) to send for `text`; `final`: the choice has ended."""
        self.held += text
        if self.mode == "undecided":
            if self.held.startswith(CALL_OPEN):
                self.mode = "calls"
            elif not final and CALL_OPEN.startswith(self.held):
                return "", []
            else:
                self.mode = "content"
        if self.mode == "content":
            content, self.held = self.held, ""
            return content, []
        return "", self._calls(final)

    def _calls(self, final: bool) -> list[dict]:
        deltas: list[dict] = []
        while True:
            if self.state == "head":
                start = len(SEPARATOR) if self.calls and self.held.startswith(SEPARATOR) else 0
                end = self.held.find(ARGUMENTS_KEY, start)
                if not self.held.startswith(HEAD, start) or end < 0:
                    return deltas
                call = ToolCall(self.held[start + len(HEAD):end], "")
                self.calls.append(call)
                self.held, self.state = self.held[end + len(ARGUMENTS_KEY):], "arguments"
                deltas.append({"index": len(self.calls) - 1, "id": call.id, "type": "function",
                               "function": {"name": call.name, "arguments": ""}})
                continue
            end = self.held.find(TAIL)
            if end >= 0:
                fragment, self.held, self.state = self.held[:end], self.held[end + len(TAIL):], "head"
            else:
                keep = 0 if final else max((n for n in range(1, len(TAIL)) if self.held.endswith(TAIL[:n])),
                                           default=0)
                fragment, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
            if fragment:
                call = self.calls[-1]
                self.calls[-1] = ToolCall(call.name, call.arguments + fragment, call.id)
                if deltas and deltas[-1]["index"] == len(self.calls) - 1:  # one delta per call and chunk
                    deltas[-1]["function"]["arguments"] += fragment
                else:
                    deltas.append({"index": len(self.calls) - 1, "function": {"arguments": fragment}})
            if end < 0:
                return deltas


__all__ = ["AUTO", "Function", "NAMED", "NONE", "REQUIRED", "ToolCall", "ToolCallStream", "Tools",
           "assistant_calls", "parse_tool_calls", "parse_tools", "rendered_call", "tool_response", "tools_grammar",
           "tools_prompt", "with_tools"]
