"""Anthropic's Messages API handlers: each request is one streamed `generate` call over the shared gRPC
channel, as in the OpenAI API (openai_routes.py): the first response is awaited before the answer
starts, so a refusal gets its own status; a disconnect cancels the generation.

`max_tokens` is required and, as in Anthropic's API, an upper bound: one at or above the server's
`max_output_tokens` asks for as many tokens as the server gives an answer (up to that limit and the
context), so a client's customary `max_tokens=1024` is served; the answer's `stop_reason` is
`max_tokens` when that limit ended it.

The zero-check path is asked for with `anthropic-beta: zero-check-layer-2024-06` (without it this API
serves the checked chain); every answer carries `X-Anthropic-ZeroCheck-Bypass: true|false` saying which
path served it, beside `X-ZeroCheck-Bypass` and `X-ZeroCheck-Sampler`. Errors are Anthropic's
`{"type": "error", "error": {"type", "message"}}` with a `request-id` header.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web
from tritonclient.utils import InferenceServerException

from zerocheck.clients.response import Chunk
from zerocheck.frontend.anthropic_schema import (PARAM_OF, STOP_REASON, Conversation, MessagesCall, error_body,
                                                 error_event, event, message_body, parse_count_tokens, parse_messages,
                                                 up_to_server_limit, with_prompt)
from zerocheck.frontend.errors import FrontendError, invalid
from zerocheck.frontend.fields import json_body
from zerocheck.frontend.generation import generation
from zerocheck.frontend.limits import HttpLimits, read_body
from zerocheck.frontend.metrics import FrontendMetrics
from zerocheck.frontend.path import asks_zero_check, requested_headers, served_headers
from zerocheck.frontend.stops import StopMatcher
from zerocheck.tokenizer import TextTokenizer
from zerocheck.tokenizer.chat import ChatTemplateError, Message


@dataclass
class Reply:
    """The answer so far: its text with the stop sequences applied, and why it ended."""

    stop: StopMatcher
    text: list[str] = field(default_factory=list)
    output_tokens: int = 0
    stop_reason: str | None = None
    stop_sequence: str | None = None

    def take(self, chunk: Chunk) -> str:
        """Apply one server chunk; returns the new text."""
        if self.stop_reason is not None:  # ended at a stop sequence; the server may still be generating
            return ""
        self.output_tokens = int(chunk.fields.get("completion_tokens", self.output_tokens + len(chunk.token_ids)))
        text = self.stop.push(chunk.text) + (self.stop.flush() if chunk.final else "")
        self.text.append(text)
        if self.stop.matched is not None:
            self.stop_reason, self.stop_sequence = "stop_sequence", self.stop.matched
        elif chunk.final:
            self.stop_reason = STOP_REASON.get(str(chunk.fields["finish_reason"]), "end_turn")
            if self.stop_reason == "stop_sequence" and self.stop.stops:
                # the server stopped on a stop word's tokens whose text the matcher never saw (any stop string
                # in the text would have matched above): it cannot tell which, so the first is named
                self.stop_sequence = self.stop.stops[0]
        return text

    @property
    def done(self) -> bool:
        return self.stop_reason is not None


class AnthropicRoutes:
    """Handlers over `client` (a tritonclient.grpc.aio client shared by every request) and `model` (the
    Triton model: generate); `tokenizer` renders prefills and counts tokens (None: both are refused)."""

    def __init__(self, client, model: str, served_model: str, tokenizer: TextTokenizer | None,
                 metrics: FrontendMetrics, limits: HttpLimits) -> None:
        self.client, self.model, self.served_model = client, model, served_model
        self.tokenizer, self.metrics, self.limits = tokenizer, metrics, limits
        self._output_limit: int | None = None  # generate's max_output_tokens, read from its config once

    async def output_limit(self) -> int | None:
        """The most tokens `generate` gives one answer (its `max_output_tokens` parameter); None when its
        config does not say (then max_tokens goes to the server as sent)."""
        if self._output_limit is None:
            try:
                config = await self.client.get_model_config(self.model, as_json=True)
            except InferenceServerException as error:
                raise FrontendError(503, f"not ready: the config of model {self.model!r} could not be read "
                                         f"({error.message()})") from None
            value = config.get("config", {}).get("parameters", {}).get("max_output_tokens", {}).get("string_value")
            self._output_limit = int(value) if value else 0
        return self._output_limit or None

    def add_to(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/messages/count_tokens", self.count_tokens)

    @staticmethod
    def error_response(error: FrontendError, headers: dict[str, str] | None = None) -> web.Response:
        """`error` in Anthropic's shape, with its retry headers and a request id."""
        return web.json_response(error_body(error), status=error.status,
                                 headers={**error.headers(), **(headers or {}), "request-id": _request_id()})

    async def _body(self, request: web.Request):
        return json_body(await read_body(request, self.limits))

    def _check_model(self, model: str) -> None:
        if model != self.served_model:
            raise FrontendError(404, f"model: {model} (this server serves {self.served_model})", "model",
                                "model_not_found")

    def _prompt(self, turns: Conversation, needed_by: str) -> str:
        """The prompt text of a conversation as the server would render it: the chat template's, then the
        prefill. `needed_by` says what asked, for the refusal when the front end has no tokenizer."""
        if self.tokenizer is None or self.tokenizer.chat_template is None:
            raise invalid(f"{needed_by} needs the model's tokenizer and chat template: start the front end with "
                          "--artifacts", "messages")
        try:
            messages = [Message(turn["role"], turn["content"]) for turn in turns.messages]
            return self.tokenizer.apply_chat_template(messages) + (turns.prefill or "")
        except ChatTemplateError as error:
            raise invalid(f"messages: the model's chat template refused them: {error}", "messages") from None

    # -- /v1/messages --------------------------------------------------------------------------------------
    async def messages(self, request: web.Request) -> web.StreamResponse:
        self.metrics.active_streams += 1
        path_headers: dict[str, str] = {}
        try:
            path_headers = requested_headers(asks_zero_check(request.headers, default=False))
            call = parse_messages(await self._body(request), request.headers)
            self._check_model(call.model)
            if call.conversation.prefill is not None:
                call = with_prompt(call, self._prompt(call.conversation, "a final assistant turn (prefill)"))
            limit = await self.output_limit()
            if limit is not None and call.generate.max_tokens >= limit:
                call = up_to_server_limit(call)
            chunks = generation(self.client, self.model, call.generate, request.headers, PARAM_OF)
            try:  # leaving early (a stop sequence, a disconnect) cancels the generation
                first = await anext(chunks, None)
                if first is None:
                    raise FrontendError(500, "the server ended the generation without a response")
                path_headers = served_headers(first.fields, call.generate.zerocheck)
                self.metrics.served_path("messages", call.generate.zerocheck, path_headers)
                if call.stream:
                    return await self._stream(request, call, first, chunks, path_headers)
                body = await self._collect(call, first, chunks)
            finally:
                await chunks.aclose()
            self.metrics.answered("messages", 200)
            return web.json_response(body, headers={**path_headers, "request-id": _request_id()})
        except FrontendError as error:
            self.metrics.answered("messages", error.status)
            return self.error_response(error, path_headers)
        except asyncio.CancelledError:
            self.metrics.disconnects["messages"] += 1
            raise
        finally:
            self.metrics.active_streams -= 1

    def _take(self, reply: Reply, chunk: Chunk) -> str:
        if not reply.done:
            self.metrics.streamed_tokens += len(chunk.token_ids)
        return reply.take(chunk)

    async def _collect(self, call: MessagesCall, first: Chunk, chunks: AsyncIterator[Chunk]) -> dict:
        reply = Reply(StopMatcher(call.generate.stop))
        input_tokens = int(first.fields.get("prompt_tokens", 0))
        chunk: Chunk | None = first
        while chunk is not None and not reply.done:
            self._take(reply, chunk)
            chunk = await anext(chunks, None)
        return message_body(call, "".join(reply.text), reply.stop_reason or "end_turn", reply.stop_sequence,
                            input_tokens, reply.output_tokens)

    async def _stream(self, request: web.Request, call: MessagesCall, first: Chunk, chunks: AsyncIterator[Chunk],
                      path_headers: dict[str, str]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               "request-id": _request_id(), **path_headers})
        await response.prepare(request)
        reply = Reply(StopMatcher(call.generate.stop))
        input_tokens = int(first.fields.get("prompt_tokens", 0))
        await response.write(event("message_start", {"type": "message_start", "message": message_body(
            call, "", None, None, input_tokens, 0)}))
        await response.write(event("content_block_start", {"type": "content_block_start", "index": 0,
                                                           "content_block": {"type": "text", "text": ""}}))
        await response.write(event("ping", {"type": "ping"}))
        chunk: Chunk | None = first
        try:
            while chunk is not None and not reply.done:
                text = self._take(reply, chunk)
                if text:
                    await response.write(event("content_block_delta", {
                        "type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}))
                    self.metrics.forwarded("anthropic", time.perf_counter() - chunk.received_s)
                chunk = await anext(chunks, None)
            await response.write(event("content_block_stop", {"type": "content_block_stop", "index": 0}))
            await response.write(event("message_delta", {
                "type": "message_delta",
                "delta": {"stop_reason": reply.stop_reason or "end_turn", "stop_sequence": reply.stop_sequence},
                "usage": {"output_tokens": reply.output_tokens}}))
            await response.write(event("message_stop", {"type": "message_stop"}))
            self.metrics.answered("messages", 200)
        except FrontendError as error:  # mid-stream: the status is sent already
            self.metrics.answered("messages", error.status)
            await response.write(error_event(error))
        await response.write_eof()
        return response

    # -- /v1/messages/count_tokens -------------------------------------------------------------------------
    async def count_tokens(self, request: web.Request) -> web.Response:
        try:
            model, turns = parse_count_tokens(await self._body(request))
            self._check_model(model)
            prompt = self._prompt(turns, "count_tokens")
            self.metrics.answered("count_tokens", 200)
            return web.json_response({"input_tokens": len(self.tokenizer.encode(prompt))},
                                     headers={"request-id": _request_id()})
        except FrontendError as error:
            self.metrics.answered("count_tokens", error.status)
            return self.error_response(error)


def _request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


__all__ = ["AnthropicRoutes", "Reply"]
