"""OpenAI's chat and text completion requests -> a `generate` request; results -> OpenAI's responses.

Pure functions over JSON values (no HTTP here). Every refusal is a 400 naming the field (`param`).
Fields: `model`, `messages` / `prompt`, `stream`, `stream_options.include_usage`, `n`, `seed`, `stop`,
`max_tokens` / `max_completion_tokens`, `temperature`, `top_p`, `presence_penalty`,
`frequency_penalty`, `logit_bias`, `logprobs` / `top_logprobs`, `user`; zerocheck's extras `top_k`,
`min_p`, `repetition_penalty`, `min_tokens`, `ignore_eos` (the openai SDK sends them with
`extra_body`). What zerocheck cannot honour (tools, non-text response formats or content parts,
`echo`, `suffix`, `best_of` > 1, top log-probabilities) is refused, never ignored.
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

CHAT, TEXT = "chat", "text"
MAX_STOP = 4
MAX_N = 4  # the generate model's num_return_sequences limit
ROLE_OF = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# finish_reason of the server -> OpenAI's
FINISH_REASON = {"eos": "stop", "stop": "stop", "length": "length"}
# generate input named by a server error -> the request field, for `param`
PARAM_OF = {"max_tokens": "max_tokens", "min_tokens": "min_tokens", "temperature": "temperature", "top_k": "top_k",
            "top_p": "top_p", "min_p": "min_p", "repetition_penalty": "repetition_penalty",
            "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty", "seed": "seed",
            "stop_words": "stop", "num_return_sequences": "n", "logit_bias_ids": "logit_bias",
            "logit_bias_values": "logit_bias", "messages": "messages", "text_input": "prompt"}
IGNORED = {"user", "stream_options", "service_tier", "store", "metadata", "parallel_tool_calls"}
NOT_SUPPORTED = {"tools": "tool calls", "tool_choice": "tool calls", "functions": "function calls",
                 "function_call": "function calls", "audio": "audio output", "prediction": "predicted outputs",
                 "web_search_options": "web search", "suffix": "suffix", "reasoning_effort": "reasoning effort"}


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
    created: int = field(default_factory=lambda: int(time.time()))
    id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def response_id(self) -> str:
        return f"{'chatcmpl' if self.kind == CHAT else 'cmpl'}-{self.id}"


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


def _messages(body: Mapping[str, Any]) -> tuple[dict[str, str], ...]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise invalid("messages is required: a list of {role, content} objects", "messages")
    if not messages:
        raise invalid("messages must hold at least one message", "messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid(f"messages[{i}] must be an object with role and content", "messages")
        role = message.get("role")
        if role not in ROLE_OF:
            raise invalid(f"messages[{i}].role must be one of {', '.join(ROLE_OF)}, got {role!r}", "messages")
        if message.get("tool_calls") or role == "tool":
            raise invalid(f"messages[{i}]: tool calls are not supported", "messages")
        out.append({"role": ROLE_OF[role], "content": _content(i, message.get("content"))})
    return tuple(out)


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


def _refuse_unsupported(body: Mapping[str, Any], known: set[str]) -> None:
    for name, what in NOT_SUPPORTED.items():
        if body.get(name) not in (None, [], "none", "") and not (name == "tool_choice" and body.get(name) == "auto"
                                                                  and not body.get("tools")):
            raise invalid(f"{name}: {what} are not supported by this server", name)
    response_format = body.get("response_format")
    if response_format not in (None, {"type": "text"}):
        raise invalid("response_format: only {\"type\": \"text\"} is supported", "response_format")
    if body.get("modalities") not in (None, ["text"]):
        raise invalid("modalities: only [\"text\"] is supported", "modalities")
    if body.get("echo"):
        raise invalid("echo is not supported", "echo")
    if body.get("best_of") not in (None, 1):
        raise invalid("best_of must be 1", "best_of")
    unknown = sorted(set(body) - known - IGNORED - set(NOT_SUPPORTED) - {"response_format", "modalities", "echo",
                                                                         "best_of"})
    if unknown:
        raise invalid(f"unrecognized request argument(s): {', '.join(unknown)}", unknown[0])


_COMMON = {"model", "stream", "n", "seed", "stop", "max_tokens", "temperature", "top_p", "presence_penalty",
           "frequency_penalty", "logit_bias", "logprobs", "top_k", "min_p", "repetition_penalty", "min_tokens",
           "ignore_eos"}
_KNOWN = {CHAT: _COMMON | {"messages", "max_completion_tokens", "top_logprobs"}, TEXT: _COMMON | {"prompt"}}


def parse_call(kind: str, body: Any, headers: Mapping[str, str]) -> Call:
    """The request body (parsed JSON) and headers of `/v1/chat/completions` (CHAT) or `/v1/completions`
    (TEXT) -> Call; raises FrontendError (400) naming the field."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    _refuse_unsupported(body, _KNOWN[kind])
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
    generate = GenerateRequest.build(
        _prompt(body) if kind == TEXT else None,
        messages=_messages(body) if kind == CHAT else None,
        max_tokens=max_tokens, stop=_stop(body), zerocheck=asks_zero_check(headers, default=True),
        request_id=headers.get("x-request-id"), num_return_sequences=n if n > 1 else None,
        return_log_probs=logprobs, top_log_probs=top, logit_bias=_logit_bias(body), **sampling)
    return Call(kind, model, stream, include_usage, n, logprobs, generate)


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
    """What one sequence produced so far (its text with the stop strings applied)."""

    index: int
    stop: StopMatcher
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    top_log_probs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int = 0

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


def new_choices(call: Call) -> list[Choice]:
    return [Choice(index, StopMatcher(call.generate.stop)) for index in range(call.n)]


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
        items = [{"index": c.index, "message": {"role": "assistant", "content": "".join(c.text)},
                  "logprobs": logprobs(c), "finish_reason": FINISH_REASON.get(c.finish_reason or "", "stop")}
                 for c in choices]
        kind = "chat.completion"
    else:
        items = [{"index": c.index, "text": "".join(c.text), "logprobs": logprobs(c),
                  "finish_reason": FINISH_REASON.get(c.finish_reason or "", "stop")}
                 for c in choices]
        kind = "text_completion"
    return {"id": call.response_id, "object": kind, "created": call.created, "model": call.model,
            "system_fingerprint": fingerprint, "choices": items, "usage": usage(prompt_tokens, choices)}


def chunk_body(call: Call, fingerprint: str, index: int, text: str | None = None, finish_reason: str | None = None,
               role: bool = False, logprobs: dict | None = None) -> dict:
    """One streamed chunk of choice `index`: its role (first), new text, or its finish reason."""
    if call.kind == CHAT:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
        if text:
            delta["content"] = text
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
           "completion_body", "logprobs_of", "parse_call", "usage", "usage_chunk"]
