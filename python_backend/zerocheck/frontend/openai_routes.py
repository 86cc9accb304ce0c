"""The OpenAI API's handlers: each request is one streamed `generate` call over the shared gRPC channel.

The first response of the call is awaited before the HTTP answer starts, so a refusal gets its own
status (400, 429, 503) and every answer carries the path that served it: `X-ZeroCheck-Bypass` and
`X-Anthropic-ZeroCheck-Bypass` (true when the check layer was skipped) and `X-ZeroCheck-Sampler`
(zero_check | checked); see path.py for how a request asks for a path. A client
that disconnects cancels its generation (aiohttp cancels the handler; the gRPC call is cancelled).
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

from aiohttp import web

import zerocheck
from zerocheck.clients.response import Chunk
from zerocheck.frontend.limits import HttpLimits, read_body
from zerocheck.frontend.errors import FrontendError, invalid
from zerocheck.frontend.fields import json_body
from zerocheck.frontend.generation import generation
from zerocheck.frontend.metrics import FrontendMetrics
from zerocheck.frontend.openai_schema import (CHAT, TEXT, Call, Choice, chunk_body, completion_body, logprobs_of,
                                              new_choices, parse_call, usage_chunk)
from zerocheck.frontend.path import asks_zero_check, requested_headers, served_headers
from zerocheck.tokenizer import TextTokenizer

FINGERPRINT = f"zerocheck-{zerocheck.__version__}"


class OpenAIRoutes:
    """Handlers over `client` (a tritonclient.grpc.aio client shared by every request) and `model`
    (the Triton model: generate). `served_model` is the name clients use; `tokenizer` gives token
    texts for log-probabilities (None: log-probabilities are refused)."""

    def __init__(self, client, model: str, served_model: str, tokenizer: TextTokenizer | None,
                 metrics: FrontendMetrics, limits: HttpLimits) -> None:
        self.client, self.model, self.served_model = client, model, served_model
        self.tokenizer, self.metrics, self.limits = tokenizer, metrics, limits

    def add_to(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{name}", self.model_card)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.prometheus)

    # -- small endpoints ---------------------------------------------------------------------------------
    def _card(self) -> dict:
        return {"id": self.served_model, "object": "model", "created": 0, "owned_by": "zerocheck"}

    async def models(self, request: web.Request) -> web.Response:
        self.metrics.answered("models", 200)
        return web.json_response({"object": "list", "data": [self._card()]})

    async def model_card(self, request: web.Request) -> web.Response:
        if request.match_info["name"] != self.served_model:
            self.metrics.answered("models", 404)
            return self._not_found(request.match_info["name"]).response()
        self.metrics.answered("models", 200)
        return web.json_response(self._card())

    async def health(self, request: web.Request) -> web.Response:
        """200 only when Triton and the generate model are ready."""
        try:
            ready = await self.client.is_server_ready() and await self.client.is_model_ready(self.model)
        except Exception:  # unreachable: not ready
            ready = False
        if not ready:
            return FrontendError(503, f"not ready: tritonserver or model {self.model!r} is not ready").response()
        return web.json_response({"status": "ready", "model": self.served_model})

    async def prometheus(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics.text(), content_type="text/plain", charset="utf-8")

    def _not_found(self, name: str) -> FrontendError:
        return FrontendError(404, f"The model `{name}` does not exist; this server serves `{self.served_model}`",
                             "model", "model_not_found")

    # -- completions -------------------------------------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, CHAT, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, TEXT, "completions")

    async def _complete(self, request: web.Request, kind: str, endpoint: str) -> web.StreamResponse:
        self.metrics.active_streams += 1
        path_headers: dict[str, str] = {}
        try:
            path_headers = requested_headers(asks_zero_check(request.headers, default=True))
            call = await self._call(request, kind)
            chunks = generation(self.client, self.model, call.generate, request.headers, call.param_of)
            try:  # leaving early (all choices at a stop string, a disconnect) cancels the generation
                first = await anext(chunks, None)
                if first is None:
                    raise FrontendError(500, "the server ended the generation without a response")
                path_headers = served_headers(first.fields, call.generate.zerocheck)
                self.metrics.served_path(endpoint, call.generate.zerocheck, path_headers)
                if call.stream:
                    return await self._stream(request, call, first, chunks, path_headers, endpoint)
                body = await self._collect(call, first, chunks)
            finally:
                await chunks.aclose()
            self.metrics.answered(endpoint, 200)
            return web.json_response(body, headers=path_headers)
        except FrontendError as error:
            self.metrics.answered(endpoint, error.status)
            return error.response(path_headers)
        except asyncio.CancelledError:
            self.metrics.disconnects[endpoint] += 1
            raise
        finally:
            self.metrics.active_streams -= 1

    async def _call(self, request: web.Request, kind: str) -> Call:
        call = parse_call(kind, json_body(await read_body(request, self.limits)), request.headers)
        if call.model != self.served_model:
            raise self._not_found(call.model)
        if call.logprobs and self.tokenizer is None:
            raise invalid("logprobs needs the model's tokenizer: start the front end with --artifacts", "logprobs")
        return call

    def _token_text(self, token: int) -> str:
        return self.tokenizer.decode([token])  # a Call with logprobs needs the tokenizer (see _call)

    def _take(self, call: Call, choices: list[Choice], chunk: Chunk) -> str:
        """Apply one server chunk to its choice; returns the choice's new text."""
        choice = choices[chunk.sequence_index]
        if choice.done:  # ended at a stop string; the server may still be generating it
            return ""
        choice.token_ids += chunk.token_ids
        choice.log_probs += chunk.log_probs
        choice.top_log_probs += chunk.top_log_probs
        choice.completion_tokens = int(chunk.fields.get("completion_tokens", len(choice.token_ids)))
        text = choice.add_text(chunk.text, chunk.final)
        if chunk.final and not choice.done:
            choice.finish_reason = str(chunk.fields["finish_reason"])
        self.metrics.streamed_tokens += len(chunk.token_ids)
        return text

    async def _collect(self, call: Call, first: Chunk, chunks: AsyncIterator[Chunk]) -> dict:
        choices = new_choices(call)
        prompt_tokens = int(first.fields.get("prompt_tokens", 0))
        chunk: Chunk | None = first
        while chunk is not None and not all(c.done for c in choices):
            self._take(call, choices, chunk)
            chunk = await anext(chunks, None)
        return completion_body(call, FINGERPRINT, choices, prompt_tokens, self._token_text)

    async def _stream(self, request: web.Request, call: Call, first: Chunk, chunks: AsyncIterator[Chunk],
                      path_headers: dict[str, str], endpoint: str) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               **path_headers})
        await response.prepare(request)
        choices = new_choices(call)
        prompt_tokens = int(first.fields.get("prompt_tokens", 0))

        async def send(body: dict) -> None:
            await response.write(b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n")

        if call.kind == CHAT:
            for choice in choices:  # OpenAI opens each choice with its role
                await send(chunk_body(call, FINGERPRINT, choice.index, role=True))
        chunk: Chunk | None = first
        try:
            while chunk is not None and not all(c.done for c in choices):
                choice = choices[chunk.sequence_index]
                was_done = choice.done
                text, tool_calls = choice.deltas(self._take(call, choices, chunk)) if not was_done else ("", [])
                if text or tool_calls or (call.logprobs and chunk.token_ids and not was_done):
                    logprobs = logprobs_of(call, chunk.token_ids, chunk.log_probs, chunk.top_log_probs,
                                           self._token_text)
                    await send(chunk_body(call, FINGERPRINT, choice.index, text=text, logprobs=logprobs,
                                          tool_calls=tool_calls))
                    self.metrics.forwarded("openai", time.perf_counter() - chunk.received_s)
                if choice.done and not was_done:
                    await send(chunk_body(call, FINGERPRINT, choice.index,
                                          finish_reason=choice.streamed_finish_reason))
                chunk = await anext(chunks, None)
            if call.include_usage:
                await send(usage_chunk(call, FINGERPRINT, prompt_tokens, choices))
            await response.write(b"data: [DONE]\n\n")
            self.metrics.answered(endpoint, 200)
        except FrontendError as error:  # mid-stream: the status is sent already
            self.metrics.answered(endpoint, error.status)
            await response.write(error.sse_frame())
        await response.write_eof()
        return response
