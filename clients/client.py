"""`Client`: the synchronous client of the generate model, over gRPC or HTTP."""
from __future__ import annotations

import queue
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from zerocheck.clients.attempts import Attempts
from zerocheck.clients.errors import Cancelled, InvalidRequest
from zerocheck.clients.grpc_transport import GrpcAttempt
from zerocheck.clients.http_transport import HttpAttempt
from zerocheck.clients.request import GenerateRequest
from zerocheck.clients.response import GenerateResult, TokenEvent
from zerocheck.clients.settings import ClientSettings
from zerocheck.api.request import RETRY_UNAVAILABLE

TRANSPORTS = {"grpc": GrpcAttempt, "http": HttpAttempt}


class Client(ClientSettings):
    """Generate text from a zerocheck server, blocking; see `ClientSettings` for the constructor."""

    def generate(self, prompt: str, *, timeout: float | None = None, **kwargs: Any) -> GenerateResult:
        """The whole completion. kwargs: max_tokens, the SAMPLING_PARAMETERS knobs (temperature, top_k,
        top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty), seed, stop, bad_words,
        min_tokens, zerocheck (bool, default True), request_id. Streams on the wire, so TTFT, hedging and
        retries before the first token work the same as for `stream`."""
        return _result(self.stream(prompt, timeout=timeout, **kwargs))

    def stream(self, prompt: str, *, timeout: float | None = None, **kwargs: Any) -> Iterator[TokenEvent]:
        """TokenEvents as they arrive; the last one has `.final`. Closing the generator (break) cancels
        the request on the server."""
        return self._run(GenerateRequest.build(prompt, **kwargs), self._timeout(timeout))

    def chat(self, messages: Sequence[Mapping[str, str]], *, timeout: float | None = None,
             **kwargs: Any) -> GenerateResult:
        """The assistant's reply to `messages` ([{"role": "system"|"user"|"assistant", "content": str}]),
        rendered by the server with the model's chat template; arguments as `generate`."""
        return _result(self.chat_stream(messages, timeout=timeout, **kwargs))

    def chat_stream(self, messages: Sequence[Mapping[str, str]], *, timeout: float | None = None,
                    **kwargs: Any) -> Iterator[TokenEvent]:
        """TokenEvents of the assistant's reply to `messages`, as `stream`."""
        return self._run(GenerateRequest.build(None, messages=messages, **kwargs), self._timeout(timeout))

    def has_chat_template(self) -> bool:
        """Whether the served model renders chat messages: asks for one token of a reply (the server refuses
        `messages` with INVALID_ARGUMENT when the model has no chat template)."""
        try:
            self.chat([{"role": "user", "content": "Hello"}], max_tokens=1, temperature=0.0)
        except InvalidRequest:
            return False
        return True

    def _run(self, request: GenerateRequest, timeout: float) -> Iterator[TokenEvent]:
        state = Attempts(self.policy, timeout)
        arrived: queue.Queue = queue.Queue()
        running: dict[int, GrpcAttempt | HttpAttempt] = {}

        def launch(retry_reason: str | None) -> None:
            attempt = state.launch()
            sink = lambda item, attempt=attempt: arrived.put((attempt, item))  # noqa: E731
            running[attempt] = TRANSPORTS[self.endpoint.protocol](
                self.endpoint, request, request.parameters(retry_reason), state.remaining_s(), sink)

        launch(None)
        try:
            while True:
                try:
                    attempt, item = arrived.get(timeout=state.wait_s())
                except queue.Empty:
                    launch(state.on_timer())
                    continue
                delay, event, losers = state.on_item(attempt, item)
                for loser in losers:
                    running.pop(loser).cancel()
                if delay is not None:
                    time.sleep(delay)
                    launch(RETRY_UNAVAILABLE)
                if event is not None:
                    yield event
                    if event.final is not None:
                        return
        finally:
            for attempt in running.values():
                attempt.cancel()


def _result(events: Iterator[TokenEvent]) -> GenerateResult:
    for event in events:
        if event.final is not None:
            return event.final
    raise Cancelled("the stream ended without a result")
