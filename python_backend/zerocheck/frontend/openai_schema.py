"""OpenAI's chat and text completion requests -> a `generate` request; results -> OpenAI's responses.

Pure functions over JSON values (no HTTP here). Every refusal is a 400 naming the field (`param`).
Fields: `model`, `messages` / `prompt`, `stream`, `stream_options.include_usage`, `n`, `seed`, `stop`,
`max_tokens` / `max_completion_tokens`, `temperature`, `top_p`, `presence_penalty`,
`frequency_penalty`, `logit_bias`, `logprobs` / `top_logprobs`, `user`, `response_format` (text,
json_object, json_schema); for chat also `tools`, `tool_choice`, `parallel_tool_calls`, and messages
with `tool_calls` or of role `tool` (tools.py); zerocheck's extras `top_k`, `min_p`,
`repetition_penalty`, `min_tokens`, `ignore_eos`, and vLLM's `structured_outputs` / `guided_json`,
`guided_regex`, `guided_choice`, `guided_grammar` (structured.py; the openai SDK sends extras with
`extra_body`). What zerocheck cannot honour (legacy `functions` / `function_call`, non-text content
parts, `echo`, `suffix`, `best_of` > 1, ...) is refused, never ignored.
"""
from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from zerocheck.clients.request import GenerateRequest
from zerocheck.frontend.errors import invalid
from zerocheck.frontend.fields import boolean, number, sampling_fields
from zerocheck.frontend.path import asks_zero_check
from zerocheck.frontend.stops import StopMatcher
from zerocheck.frontend.structured import (GUIDED_FIELDS, Constraint, check_guided_sampling, legacy_constraints,
                                           one_constraint, response_format_constraint,
                                           structured_outputs_constraint)
from zerocheck.frontend.tools import (AUTO, NAMED, ToolCallStream, Tools, assistant_calls, parse_tool_calls,
                                      parse_tools, tool_response, tools_grammar, with_tools)
from zerocheck.api.guide import GUIDE_INPUT, GUIDE_TYPE_INPUT

CHAT, TEXT = "chat", "text"
MAX_STOP = 4
MAX_N = 4  # the generate model's num_return_sequences limit
ROLE_OF = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# finish_reason of the server -> OpenAI's
FINISH_REASON = {"eos": "stop", "stop": "stop", "length": "length", "tool_calls": "tool_calls"}
# generate input named by a server error -> the request field, for `param`
PARAM_OF = {"max_tokens": "max_tokens", "min_tokens": "min_tokens", "temperature": "temperature", "top_k": "top_k",
            "top_p": "top_p", "min_p": "min_p", "repetition_penalty": "repetition_penalty",
            "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty", "seed": "seed",
            "stop_words": "stop", "num_return_sequences": "n", "logit_bias_ids": "logit_bias",
            "logit_bias_values": "logit_bias", "messages": "messages", "text_input": "prompt"}
IGNORED = {"user", "stream_options", "service_tier", "store", "metadata"}
NOT_SUPPORTED = {"functions": "legacy function calls (use tools)", "function_call": "legacy function calls (use tools)",
                 "audio": "audio output", "prediction": "predicted outputs", "web_search_options": "web search",
                 "suffix": "suffix", "reasoning_effort": "reasoning effort"}


@dataclass(frozen=True)
class Call:
    """One OpenAI request, validated: how to answer it and the generate request that serves it."""

    kind: str  # CHAT | TEXT
    model: str
    stream: bool
    include_usage: bool
    n: int
    logprobs: bool
    generate: GenerateRequest
    tools: Tools | None = None  # tools whose tool_choice constrains the answer: replies hold tool calls
    guide_param: str | None = None  # the request field that asked for the generate request's guide
    created: int = field(default_factory=lambda: int(time.time()))
    id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def response_id(self) -> str:
        return f"{'chatcmpl' if self.kind == CHAT else 'cmpl'}-{self.id}"

    @property
    def param_of(self) -> dict[str, str]:
        """PARAM_OF, with the guide's inputs naming the field that asked for the guide."""
        if self.guide_param is None:
            return PARAM_OF
        return {**PARAM_OF, GUIDE_TYPE_INPUT: self.guide_param, GUIDE_INPUT: self.guide_param}


def _content(index: int, content: Any) -> str:
    """A message's content: a string, or a list of text parts (joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise invalid(f"messages[{index}].content: only text parts are supported, got {kind!r}", "messages")
            texts.append(part["text"])
        return "".join(texts)
    raise invalid(f"messages[{index}].content must be a string or a list of text parts", "messages")


def _messages(body: Mapping[str, Any], tools: Tools | None) -> tuple[dict[str, str], ...]:
    """The chat as the generate model takes it (system / user / assistant, string content): tool calls and
    tool results rendered as text, the tools in the system message (tools.py)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise invalid("messages is required: a list of {role, content} objects", "messages")
    if not messages:
        raise invalid("messages must hold at least one message", "messages")
    out: list[dict[str, str]] = []
    after_tool = False  # consecutive tool results share one user message
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid(f"messages[{i}] must be an object with role and content", "messages")
        role = message.get("role")
        if role not in ROLE_OF and role != "tool":
            raise invalid(f"messages[{i}].role must be one of {', '.join(ROLE_OF)}, tool; got {role!r}",
                          "messages")
        if role == "tool":
            result = _tool_result(i, message)
            if after_tool:
                out[-1] = {"role": "user", "content": out[-1]["content"] + "\n" + result}
            else:
                out.append({"role": "user", "content": result})
        elif role == "assistant" and message.get("tool_calls"):
            text = _content(i, message["content"]) if message.get("content") is not None else ""
            calls = assistant_calls(i, message["tool_calls"])
            out.append({"role": "assistant", "content": f"{text}\n{calls}" if text else calls})
        else:
            if message.get("tool_calls") is not None and role != "assistant":
                raise invalid(f"messages[{i}]: only assistant messages hold tool_calls", "messages")
            out.append({"role": ROLE_OF[role], "content": _content(i, message.get("content"))})
        after_tool = role == "tool"
    return tuple(with_tools(out, tools) if tools is not None else out)


def _tool_result(index: int, message: Mapping[str, Any]) -> str:
    """A `tool` message's content as the user message holds it."""
    if not isinstance(message.get("tool_call_id"), str):
        raise invalid(f"messages[{index}].tool_call_id is required: the id of the call this answers", "messages")
    return tool_response(_content(index, message.get("content")))


def _prompt(body: Mapping[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise invalid("prompt must be a string (one prompt per request; token-id prompts are not supported)",
                      "prompt")
    return prompt


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    words = [stop] if isinstance(stop, str) else stop
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise invalid("stop must be a string or a list of strings", "stop")
    if len(words) > MAX_STOP:
        raise invalid(f"stop must hold at most {MAX_STOP} strings, got {len(words)}", "stop")
    return tuple(w for w in words if w)


def _logit_bias(body: Mapping[str, Any]) -> tuple[tuple[int, float], ...]:
    bias = body.get("logit_bias")
    if bias is None:
        return ()
    if not isinstance(bias, dict):
        raise invalid("logit_bias must be an object mapping token ids to biases in [-100, 100]", "logit_bias")
    pairs = []
    for key, value in bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise invalid(f"logit_bias keys must be token ids, got {key!r}", "logit_bias") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise invalid(f"logit_bias[{key}] must be a number in [-100, 100], got {value!r}", "logit_bias")
        pairs.append((token, float(value)))
    return tuple(pairs)


def _refuse_unsupported(kind: str, body: Mapping[str, Any], known: set[str]) -> None:
    for name, what in NOT_SUPPORTED.items():
        if body.get(name) not in (None, [], "none", ""):
            raise invalid(f"{name}: {what} are not supported by this server", name)
    if kind == TEXT:
        for name in ("tools", "tool_choice", "parallel_tool_calls"):
            if body.get(name) not in (None, []):
                raise invalid(f"{name}: tool calls are served by /v1/chat/completions, not /v1/completions", name)
    if body.get("modalities") not in (None, ["text"]):
        raise invalid("modalities: only [\"text\"] is supported", "modalities")
    if body.get("echo"):
        raise invalid("echo is not supported", "echo")
    if body.get("best_of") not in (None, 1):
        raise invalid("best_of must be 1", "best_of")
    unknown = sorted(set(body) - known - IGNORED - set(NOT_SUPPORTED) - {"modalities", "echo", "best_of", "tools",
                                                                         "tool_choice", "parallel_tool_calls"})
    if unknown:
        raise invalid(f"unrecognized request argument(s): {', '.join(unknown)}", unknown[0])


_COMMON = {"model", "stream", "n", "seed", "stop", "max_tokens", "temperature", "top_p", "presence_penalty",
           "frequency_penalty", "logit_bias", "logprobs", "top_k", "min_p", "repetition_penalty", "min_tokens",
           "ignore_eos", *GUIDED_FIELDS}
_KNOWN = {CHAT: _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                           "parallel_tool_calls"},
          TEXT: _COMMON | {"prompt"}}


def parse_call(kind: str, body: Any, headers: Mapping[str, str]) -> Call:
    """The request body (parsed JSON) and headers of `/v1/chat/completions` (CHAT) or `/v1/completions`
    (TEXT) -> Call; raises FrontendError (400) naming the field."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    _refuse_unsupported(kind, body, _KNOWN[kind])
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model is required", "model")
    stream = boolean(body, "stream")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):
        raise invalid("stream_options is only allowed with stream: true, as an object", "stream_options")
    include_usage = bool((options or {}).get("include_usage", False))
    n = number(body, "n", 1, MAX_N, integer=True) or 1
    logprobs, top = _logprobs(kind, body)
    limit = body.get("max_completion_tokens") if kind == CHAT and "max_completion_tokens" in body else None
    max_tokens = number({"max_completion_tokens": limit} if limit is not None else body,
                         "max_completion_tokens" if limit is not None else "max_tokens", 1, 2**31 - 1, integer=True)
    sampling = sampling_fields(body, max_temperature=2)
    tools = parse_tools(body) if kind == CHAT else None
    constraint = _constraint(body, tools)
    check_guided_sampling(body, constraint)
    generate = GenerateRequest.build(
        _prompt(body) if kind == TEXT else None,
        messages=_messages(body, tools) if kind == CHAT else None,
        max_tokens=max_tokens, stop=_stop(body), zerocheck=asks_zero_check(headers, default=True),
        request_id=headers.get("x-request-id"), num_return_sequences=n if n > 1 else None,
        return_log_probs=logprobs, top_log_probs=top, logit_bias=_logit_bias(body),
        guide_type=constraint.guide_type if constraint else None, guide=constraint.guide if constraint else None,
        **sampling)
    return Call(kind, model, stream, include_usage, n, logprobs, generate,
                tools=tools if tools is not None and tools.constrained else None,
                guide_param=constraint.param if constraint else None)


def _constraint(body: Mapping[str, Any], tools: Tools | None) -> Constraint | None:
    """The request's one guide: response_format, structured_outputs, a guided_* field, or the tools'."""
    constraints = [c for c in (response_format_constraint(body), structured_outputs_constraint(body)) if c]
    constraints += legacy_constraints(body)
    if tools is not None and tools.constrained:
        tool_choice = tools.choice if tools.choice != NAMED else tools.named
        constraints.append(Constraint("lark", tools_grammar(tools), "tools"))
        if len(constraints) > 1:
            raise invalid(f"{constraints[0].param} and tools with tool_choice {tool_choice!r} both constrain the "
                          f"answer; send one (or tool_choice \"none\")", constraints[0].param)
    return one_constraint(constraints)


def _logprobs(kind: str, body: Mapping[str, Any]) -> tuple[bool, int]:
    """(whether to return the sampled tokens' log-probabilities, how many alternatives per token)."""
    if kind == CHAT:
        wanted = boolean(body, "logprobs")
        top = number(body, "top_logprobs", 0, 20, integer=True) or 0
        if top and not wanted:
            raise invalid("top_logprobs needs logprobs: true", "top_logprobs")
        return wanted, top
    top = number(body, "logprobs", 0, 5, integer=True)
    return top is not None, top or 0


# -- responses -----------------------------------------------------------------------------------------------


@dataclass
class Choice:
    """What one sequence produced so far (its text with the stop strings applied); `tools` reads the tool
    calls of a streamed answer that may hold them."""

    index: int
    stop: StopMatcher
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    top_log_probs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int = 0
    tools: ToolCallStream | None = None

    def add_text(self, text: str, final: bool) -> str:
        """The new text to send; ends the choice with finish_reason "stop" at a stop string."""
        out = self.stop.push(text) + (self.stop.flush() if final else "")
        if self.stop.stopped and self.finish_reason is None:
            self.finish_reason = "stop"
        self.text.append(out)
        return out

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def deltas(self, text: str) -> tuple[str, list[dict]]:
        """(content, OpenAI `tool_calls` deltas) to stream for new text (what add_text returned)."""
        if self.tools is None:
            return text, []
        return self.tools.push(text, final=self.done)

    @property
    def streamed_finish_reason(self) -> str | None:
        """The finish reason of a streamed choice: "tool_calls" when it streamed calls and ended at a stop."""
        if self.tools is not None and self.tools.called and FINISH_REASON.get(self.finish_reason or "") == "stop":
            return "tool_calls"
        return self.finish_reason


def new_choices(call: Call) -> list[Choice]:
    return [Choice(index, StopMatcher(call.generate.stop),
                   tools=ToolCallStream(detect=call.tools.choice == AUTO) if call.tools is not None else None)
            for index in range(call.n)]


def message_of(call: Call, choice: Choice) -> tuple[dict, str]:
    """A non-streamed chat choice's (message, finish_reason): an answer made of tool calls becomes
    `tool_calls` (content null) and finish_reason "tool_calls"; any other answer is content."""
    text = "".join(choice.text)
    finish_reason = FINISH_REASON.get(choice.finish_reason or "", "stop")
    calls = parse_tool_calls(text) if call.tools is not None else None
    if not calls:
        return {"role": "assistant", "content": text}, finish_reason
    message = {"role": "assistant", "content": None, "tool_calls": [tool_call.body() for tool_call in calls]}
    return message, "tool_calls" if finish_reason == "stop" else finish_reason


def usage(prompt_tokens: int, choices: list[Choice]) -> dict[str, int]:
    completion = sum(choice.completion_tokens for choice in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def logprobs_of(call: Call, ids: list[int], log_probs: list[float], tops: list[list[tuple[int, float]]],
                text_of: Callable[[int], str]) -> dict | None:
    """OpenAI's `logprobs` object for the tokens `ids`, their log-probabilities and, per token, the most
    likely alternatives (`tops`: (id, log-probability), best first); `text_of` gives a token's text."""
    if not call.logprobs:
        return None
    tokens = [text_of(token) for token in ids]
    tops = tops or [[] for _ in ids]
    if call.kind == CHAT:
        def entry(token: str, lp: float) -> dict:
            return {"token": token, "logprob": lp, "bytes": list(token.encode())}

        return {"content": [{**entry(token, lp), "top_logprobs": [entry(text_of(t), alt) for t, alt in top
                                                                   if math.isfinite(alt)]}
                            for token, lp, top in zip(tokens, log_probs, tops)]}
    offsets, position = [], 0
    for token in tokens:
        offsets.append(position)
        position += len(token)
    return {"tokens": tokens, "token_logprobs": log_probs, "text_offset": offsets,
            "top_logprobs": [{text_of(t): alt for t, alt in top if math.isfinite(alt)} for top in tops]}


def completion_body(call: Call, fingerprint: str, choices: list[Choice], prompt_tokens: int,
                    text_of: Callable[[int], str]) -> dict:
    """The non-streamed answer."""
    def logprobs(c: Choice) -> dict | None:
        return logprobs_of(call, c.token_ids, c.log_probs, c.top_log_probs, text_of)

    if call.kind == CHAT:
        items = []
        for c in choices:
            message, finish_reason = message_of(call, c)
            items.append({"index": c.index, "message": message, "logprobs": logprobs(c),
                          "finish_reason": finish_reason})
        kind = "chat.completion"
    else:
        items = [{"index": c.index, "text": "".join(c.text), "logprobs": logprobs(c),
                  "finish_reason": FINISH_REASON.get(c.finish_reason or "", "stop")}
                 for c in choices]
        kind = "text_completion"
    return {"id": call.response_id, "object": kind, "created": call.created, "model": call.model,
            "system_fingerprint": fingerprint, "choices": items, "usage": usage(prompt_tokens, choices)}


def chunk_body(call: Call, fingerprint: str, index: int, text: str | None = None, finish_reason: str | None = None,
               role: bool = False, logprobs: dict | None = None, tool_calls: list[dict] | None = None) -> dict:
    """One streamed chunk of choice `index`: its role (first), new text or tool-call deltas, or its finish
    reason."""
    if call.kind == CHAT:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
        if text:
            delta["content"] = text
        if tool_calls:
            delta["tool_calls"] = tool_calls
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": logprobs,
                                  "finish_reason": FINISH_REASON.get(finish_reason) if finish_reason else None}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text or "", "logprobs": logprobs,
                  "finish_reason": FINISH_REASON.get(finish_reason) if finish_reason else None}
        kind = "text_completion"
    return {"id": call.response_id, "object": kind, "created": call.created, "model": call.model,
            "system_fingerprint": fingerprint, "choices": [choice]}


def usage_chunk(call: Call, fingerprint: str, prompt_tokens: int, choices: list[Choice]) -> dict:
    """The last chunk of a stream asked for with `stream_options.include_usage`: no choices, the usage."""
    return {"id": call.response_id, "object": "chat.completion.chunk" if call.kind == CHAT else "text_completion",
            "created": call.created, "model": call.model, "system_fingerprint": fingerprint, "choices": [],
            "usage": usage(prompt_tokens, choices)}


__all__ = ["CHAT", "Call", "Choice", "FINISH_REASON", "PARAM_OF", "TEXT", "chunk_body", "new_choices",
           "completion_body", "logprobs_of", "message_of", "parse_call", "usage", "usage_chunk"]
