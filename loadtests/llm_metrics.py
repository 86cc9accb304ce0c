"""Per-request LLM timings measured by the load users, and the Locust request events they fire.

Each generate request fires one event with request_type "gRPC"/"HTTP" (response_time: end-to-end ms,
response_length: output text bytes). A successful one also fires entries named after genai-perf's metrics,
request_type = metric, name = the request's name:
  time_to_first_token                  ms from sending to the first token-carrying response
  inter_token_latency                  ms between consecutive tokens, one entry per gap (vLLM's ITL)
  time_per_output_token                ms per token after the first, one entry per request (TPOT)
  request_latency                      end-to-end ms
  output_token_throughput_per_request  tokens/s of that request (the value sits in response_time)
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # importing locust monkey-patches the process with gevent
    from locust.event import Events

LLM_METRICS = ("time_to_first_token", "inter_token_latency", "time_per_output_token", "request_latency",
               "output_token_throughput_per_request")


@dataclass
class StreamTiming:
    """Clock readings (time.perf_counter s) and final outputs of one streamed request; filled while it streams."""

    protocol: str
    path: str  # requested sampler path: zero_check | checked
    start: float = field(default_factory=time.perf_counter)
    token_times: list[float] = field(default_factory=list)
    end: float = 0.0
    text_bytes: int = 0
    completion_tokens: int = 0
    prompt_tokens: int = 0
    sampler: str = ""  # the path the server reports it served
    bypass: bool = False
    finish_reason: str = ""
    error: str = ""

    def tokens_arrived(self, count: int, text: str) -> None:
        """A response carrying `count` new tokens and `text` arrived now."""
        now = time.perf_counter()
        self.token_times.extend([now] * count)
        self.text_bytes += len(text.encode())

    def finished(self) -> None:
        self.end = time.perf_counter()

    @property
    def latency_s(self) -> float:
        return self.end - self.start

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] - self.start if self.token_times else None

    @property
    def itls_s(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def tpot_s(self) -> float | None:
        tokens = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (tokens - 1) if tokens > 1 else None

    @property
    def output_tokens(self) -> int:
        return self.completion_tokens or len(self.token_times)

    def record(self) -> dict[str, Any]:
        """A JSON-ready record: the raw fields plus the derived seconds (the request log keeps one per request)."""
        return {**asdict(self), "latency_s": self.latency_s, "ttft_s": self.ttft_s, "itls_s": self.itls_s,
                "tpot_s": self.tpot_s, "output_tokens": self.output_tokens}


def fire_request_events(events: Events, name: str, timing: StreamTiming, exception: Exception | None) -> None:
    """The generate request's event (context["llm"] = timing.record()) and, on success, the LLM metric entries."""
    events.request.fire(request_type=timing.protocol, name=name, response_time=timing.latency_s * 1000,
                        response_length=timing.text_bytes, exception=exception,
                        context={"llm": timing.record()})
    if exception is not None or timing.ttft_s is None:
        return

    def entry(metric: str, value: float, length: int = 0) -> None:
        events.request.fire(request_type=metric, name=name, response_time=value, response_length=length,
                            exception=None, context={})

    entry("time_to_first_token", timing.ttft_s * 1000)
    for gap in timing.itls_s:
        entry("inter_token_latency", gap * 1000)
    if timing.tpot_s is not None:
        entry("time_per_output_token", timing.tpot_s * 1000)
    entry("request_latency", timing.latency_s * 1000, timing.text_bytes)
    if timing.latency_s > 0:
        entry("output_token_throughput_per_request", timing.output_tokens / timing.latency_s, timing.output_tokens)
