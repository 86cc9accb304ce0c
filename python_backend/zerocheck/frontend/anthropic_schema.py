"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) -> a `generate` request;
results -> Anthropic's message, its server-sent events and its errors.

Pure functions over JSON values (no HTTP here). Fields: `model`, `max_tokens` (required), `messages`
(user / assistant turns; content a string or text blocks; a final assistant turn is a prefill the
answer continues), `system` (a string or text blocks), `temperature`, `top_p`, `top_k`,
`stop_sequences`, `stream`, `metadata`; zerocheck's extras `seed`, `min_p`, `min_tokens`,
`repetition_penalty`, `presence_penalty`, `frequency_penalty`, `ignore_eos` (the anthropic SDK sends
them with `extra_body`). What zerocheck
cannot honour (tools, extended thinking, images, documents, ...) is refused, never ignored; so is a
field the API does not know.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from zerocheck.clients.request import GenerateRequest
from zerocheck.frontend.errors import FrontendError, invalid
from zerocheck.frontend.fields import boolean, number, sampling_fields
from zerocheck.frontend.path import asks_zero_check

# Anthropic's error types by status (its SDK picks the exception class by status)
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
               500: "api_error", 503: "api_error", 504: "timeout_error", 529: "overloaded_error"}
# finish_reason of the server -> Anthropic's stop_reason
STOP_REASON = {"eos": "end_turn", "stop": "stop_sequence", "length": "max_tokens"}
# generate input named by a server error -> the request field
PARAM_OF = {"max_tokens": "max_tokens", "min_tokens": "min_tokens", "temperature": "temperature", "top_k": "top_k",
            "top_p": "top_p", "min_p": "min_p", "repetition_penalty": "repetition_penalty", "seed": "seed",
            "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
            "stop_words": "stop_sequences", "messages": "messages", "text_input": "messages"}
ROLES = ("user", "assistant")
BLOCK_KEYS = {"type", "text", "cache_control", "citations"}  # a text block's keys (cache hints are accepted)
NOT_SUPPORTED = {"tools": "tool use", "tool_choice": "tool use", "thinking": "extended thinking",
                 "mcp_servers": "MCP servers", "container": "containers", "context_management": "context management",
                 "output_format": "structured outputs", "output_config": "output configuration"}
IGNORED = {"metadata", "service_tier"}
EXTRAS = {"seed", "min_p", "min_tokens", "repetition_penalty", "presence_penalty", "frequency_penalty", "ignore_eos"}
KNOWN = {"model", "max_tokens", "messages", "system", "temperature", "top_p", "top_k", "stop_sequences", "stream"}
COUNT_KNOWN = {"model", "messages", "system"}


@dataclass(frozen=True)
class Conversation:
    """The turns of a request as the chat template reads them (system first), and the text of a final
    assistant turn the answer continues (None: the answer opens a new assistant turn)."""

    messages: tuple[dict[str, str], ...]
    prefill: str | None = None


@dataclass(frozen=True)
class MessagesCall:
    """One Messages request, validated: how to answer it and the generate request that serves it (for a
    prefill, the conversation without its final assistant turn until `with_prompt`)."""

    model: str
    stream: bool
    conversation: Conversation
    generate: GenerateRequest
    id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")


def _blocks_text(where: str, content: Any, param: str) -> str:
    """A string, or text blocks joined; any other block is refused naming its place."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"{where}: must be a string or a list of content blocks", param)
    texts = []
    for j, block in enumerate(content):
        if not isinstance(block, dict):
            raise invalid(f"{where}.{j}: a content block must be an object", param)
        kind = block.get("type")
        if kind != "text":
            raise invalid(f"{where}.{j}.type: only text blocks are supported by this server, got {kind!r}", param)
        if not isinstance(block.get("text"), str):
            raise invalid(f"{where}.{j}.text: must be a string", param)
        extra = sorted(set(block) - BLOCK_KEYS)
        if extra:
            raise invalid(f"{where}.{j}.{extra[0]}: Extra inputs are not permitted", param)
        texts.append(block["text"])
    return "".join(texts)


def conversation(body: Mapping[str, Any]) -> Conversation:
    """`system` and `messages` -> the turns (a final assistant turn becomes the prefill)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise invalid("messages: Field required (a list of {role, content} objects)", "messages")
    if not messages:
        raise invalid("messages: at least one message is required", "messages")
    turns = []
    system = body.get("system")
    if system is not None:
        text = _blocks_text("system", system, "system")
        if text:
            turns.append({"role": "system", "content": text})
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid(f"messages.{i}: must be an object with role and content", "messages")
        role = message.get("role")
        if role == "system":
            raise invalid(f"messages.{i}.role: unexpected role \"system\"; the Messages API takes the system prompt "
                          "as the top-level `system` field", "messages")
        if role not in ROLES:
            raise invalid(f"messages.{i}.role: must be 'user' or 'assistant', got {role!r}", "messages")
        if "content" not in message:
            raise invalid(f"messages.{i}.content: Field required", "messages")
        extra = sorted(set(message) - {"role", "content"})
        if extra:
            raise invalid(f"messages.{i}.{extra[0]}: Extra inputs are not permitted", "messages")
        turns.append({"role": role, "content": _blocks_text(f"messages.{i}.content", message["content"], "messages")})
    if turns[-1]["role"] == "assistant":
        prefill = turns.pop()["content"]
        if prefill != prefill.rstrip():
            raise invalid(f"messages.{len(messages) - 1}: final assistant content cannot end with trailing whitespace",
                          "messages")
        if not any(turn["role"] == "user" for turn in turns):
            raise invalid("messages: the conversation needs a user turn before the final assistant turn", "messages")
        return Conversation(tuple(turns), prefill)
    return Conversation(tuple(turns))


def _refuse_unknown(body: Mapping[str, Any], known: set[str]) -> None:
    for name, what in NOT_SUPPORTED.items():
        if body.get(name) not in (None, []):
            raise invalid(f"{name}: {what} is not supported by this server", name)
    unknown = sorted(set(body) - known - IGNORED - set(NOT_SUPPORTED))
    if unknown:
        raise invalid(f"{unknown[0]}: Extra inputs are not permitted", unknown[0])
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise invalid("metadata: must be an object", "metadata")


def _model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model: Field required", "model")
    return model


def _stop_sequences(body: Mapping[str, Any]) -> tuple[str, ...]:
    stops = body.get("stop_sequences")
    if stops is None:
        return ()
    if not isinstance(stops, list) or not all(isinstance(stop, str) for stop in stops):
        raise invalid("stop_sequences: must be a list of strings", "stop_sequences")
    return tuple(stop for stop in stops if stop)


def parse_messages(body: Any, headers: Mapping[str, str]) -> MessagesCall:
    """The body (parsed JSON) and headers of `/v1/messages` -> MessagesCall; raises FrontendError (400)
    naming the field. The zero-check path is asked for by the `anthropic-beta` list (or `zerocheck`)."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    _refuse_unknown(body, KNOWN | EXTRAS)
    model = _model(body)
    if body.get("max_tokens") is None:
        raise invalid("max_tokens: Field required", "max_tokens")
    max_tokens = number(body, "max_tokens", 1, 2**31 - 1, integer=True)
    turns = conversation(body)
    generate = GenerateRequest.build(None, messages=turns.messages, max_tokens=max_tokens, stop=_stop_sequences(body),
                                     zerocheck=asks_zero_check(headers, default=False),
                                     request_id=headers.get("x-request-id"), **sampling_fields(body, max_temperature=1))
    return MessagesCall(model, boolean(body, "stream"), turns, generate)


def with_prompt(call: MessagesCall, prompt: str) -> MessagesCall:
    """A prefilled call sent as text: `prompt` is the conversation rendered by the chat template, then the
    prefill (the generate model renders messages itself, but cannot continue an assistant turn)."""
    return replace(call, generate=replace(call.generate, prompt=prompt, messages=None))


def up_to_server_limit(call: MessagesCall) -> MessagesCall:
    """The call with no max_tokens for the server: as many tokens as it gives one answer (max_tokens was
    at or above that limit)."""
    return replace(call, generate=replace(call.generate, max_tokens=None))


def parse_count_tokens(body: Any) -> tuple[str, Conversation]:
    """The body of `/v1/messages/count_tokens` -> (model, conversation)."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    _refuse_unknown(body, COUNT_KNOWN)
    return _model(body), conversation(body)


# -- answers -------------------------------------------------------------------------------------------------


def usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens}


def message_body(call: MessagesCall, text: str, stop_reason: str | None, stop_sequence: str | None,
                 input_tokens: int, output_tokens: int) -> dict:
    """The whole answer (also the `message` of `message_start`, with no text and no stop reason yet)."""
    return {"id": call.id, "type": "message", "role": "assistant", "model": call.model,
            "content": [{"type": "text", "text": text}] if stop_reason is not None else [],
            "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage(input_tokens, output_tokens)}


def event(name: str, data: dict) -> bytes:
    """One server-sent event as Anthropic's API sends it."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def error_body(error: FrontendError) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(error.status, "api_error"), "message": error.message}}


def error_event(error: FrontendError) -> bytes:
    """An error inside a stream already answered 200 (Anthropic's `event: error`)."""
    return event("error", error_body(error))


__all__ = ["Conversation", "ERROR_TYPES", "MessagesCall", "PARAM_OF", "STOP_REASON", "conversation", "error_body",
           "error_event", "event", "message_body", "parse_count_tokens", "parse_messages", "up_to_server_limit", "usage",
           "with_prompt"]
