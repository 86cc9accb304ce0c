"""Locust users that stream generations: `GrpcStreamUser` (tritonclient.grpc bidirectional stream),
`HttpStreamUser` (POST .../generate_stream, server-sent events), `OpenAIStreamUser` (the OpenAI API's
chat completions, server-sent events) and `AnthropicStreamUser` (the Anthropic Messages API's events).
Each times every token itself and reports
through `fire_request_events`; the request name carries the sampler path, e.g. `generate_stream[zero_check]`.

The locustfile must call `grpc.experimental.gevent.init_gevent()` before a gRPC user starts."""
from __future__ import annotations

import json
import queue
import time
from abc import abstractmethod
from typing import Any, ClassVar

import numpy as np
import requests
from locust import User, constant, task

from zerocheck.api.headers import BETA_HEADER, ZERO_CHECK_BETA
from zerocheck.loadtests.llm_metrics import StreamTiming, fire_request_events
from zerocheck.loadtests.options import load_options
from zerocheck.loadtests.profiles import SAMPLING_DTYPES
from zerocheck.loadtests.workload import GenerationRequest, Workload

NUMPY_OF = {"FP32": np.float32, "INT32": np.int32, "UINT64": np.uint64, "BOOL": np.bool_, "BYTES": np.object_}
JSON_OF = {"FP32": float, "INT32": int, "UINT64": int}


class StreamError(RuntimeError):
    """The server answered a request with an error (mid-stream or before the first response)."""


class LLMStreamUser(User):
    """A closed-loop user: one streamed generation after another, no think time."""

    abstract = True
    wait_time = constant(0)
    protocol: ClassVar[str]
    endpoint: ClassVar[str]

    def on_start(self) -> None:
        self.options = load_options(self.environment)
        self.workload = Workload(self.options.profile, self.options.prompts, self.options.zerocheck,
                                 seed=self.options.seed + id(self) % 100_000)

    @task
    def generate(self) -> None:
        request = self.workload.next_request()
        timing = StreamTiming(self.protocol, request.path)
        exception: Exception | None = None
        try:
            self.stream(request, timing)
        except Exception as error:  # any failure is this request's, reported to Locust, never raised
            exception = error
            timing.error = f"{type(error).__name__}: {error}"
        timing.finished()
        fire_request_events(self.environment.events, f"{self.endpoint}[{request.path}]", timing, exception)

    @abstractmethod
    def stream(self, request: GenerationRequest, timing: StreamTiming) -> None:
        """Send `request`, call `timing.tokens_arrived` per response and fill the final outputs; raise on error."""


def final_outputs(timing: StreamTiming, outputs: dict[str, Any]) -> None:
    """Copy sampler, bypass and token counts from a response's outputs (scalars) into `timing`."""
    timing.sampler = str(outputs.get("sampler", timing.sampler))
    timing.bypass = bool(outputs.get("zerocheck_bypass", timing.bypass))
    timing.completion_tokens = int(outputs.get("completion_tokens", timing.completion_tokens))
    timing.prompt_tokens = int(outputs.get("prompt_tokens", timing.prompt_tokens))
    timing.finish_reason = str(outputs.get("finish_reason", "")) or timing.finish_reason


class GrpcStreamUser(LLMStreamUser):
    """Streams over gRPC `ModelStreamInfer`, one stream per request; `zerocheck` as a request parameter."""

    protocol = "gRPC"
    endpoint = "stream_infer"

    def on_start(self) -> None:
        import tritonclient.grpc as grpcclient

        super().on_start()
        self.grpcclient = grpcclient
        self.client = grpcclient.InferenceServerClient(self.options.grpc_url)

    def on_stop(self) -> None:
        self.client.close()

    def inputs(self, request: GenerationRequest) -> list[Any]:
        values: dict[str, tuple[str, Any]] = {
            "text_input": ("BYTES", request.prompt.encode()), "max_tokens": ("INT32", request.max_tokens),
            "min_tokens": ("INT32", request.min_tokens),
            "stream": ("BOOL", True), **{k: (SAMPLING_DTYPES[k], v) for k, v in request.sampling.items()}}
        inputs = []
        for name, (dtype, value) in values.items():
            tensor = self.grpcclient.InferInput(name, [1, 1], dtype)
            tensor.set_data_from_numpy(np.array([[value]], dtype=NUMPY_OF[dtype]))
            inputs.append(tensor)
        return inputs

    def stream(self, request: GenerationRequest, timing: StreamTiming) -> None:
        responses: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: responses.put((result, error)),
                                 stream_timeout=self.options.timeout_s)
        try:
            timing.start = time.perf_counter()
            self.client.async_stream_infer(self.options.model, self.inputs(request),
                                           parameters={"zerocheck": request.zerocheck},
                                           enable_empty_final_response=True)
            while True:
                result, error = responses.get(timeout=self.options.timeout_s)
                if error is not None:
                    raise StreamError(str(error))
                response = result.get_response()
                ids = result.as_numpy("output_ids")
                if ids is not None:
                    text = result.as_numpy("text_output")
                    timing.tokens_arrived(ids.size, b"".join(text.reshape(-1)).decode(errors="replace"))
                    final_outputs(timing, {name: _scalar(result.as_numpy(name)) for name in
                                           ("sampler", "zerocheck_bypass", "completion_tokens", "prompt_tokens",
                                            "finish_reason")})
                if response.parameters["triton_final_response"].bool_param:
                    return
        finally:
            self.client.stop_stream()


def _scalar(array: np.ndarray | None) -> Any:
    if array is None:
        return None
    value = array.reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else value.item()


class HttpStreamUser(LLMStreamUser):
    """Streams over HTTP `generate_stream` (SSE `data: {json}` lines; `data: {"error": ...}` fails the request)."""

    protocol = "HTTP"
    endpoint = "generate_stream"

    def on_start(self) -> None:
        super().on_start()
        self.session = requests.Session()
        self.url = f"http://{self.options.http_url}/v2/models/{self.options.model}/generate_stream"

    def on_stop(self) -> None:
        self.session.close()

    def stream(self, request: GenerationRequest, timing: StreamTiming) -> None:
        sampling = {name: JSON_OF[SAMPLING_DTYPES[name]](value) for name, value in request.sampling.items()}
        body = {"text_input": request.prompt, "max_tokens": request.max_tokens, "min_tokens": request.min_tokens,
                "stream": True,
                "zerocheck": request.zerocheck, **sampling}
        timing.start = time.perf_counter()
        with self.session.post(self.url, json=body, stream=True, timeout=self.options.timeout_s) as reply:
            if reply.status_code != 200:
                raise StreamError(f"HTTP {reply.status_code}: {reply.text[:200]}")
            for line in reply.iter_lines(chunk_size=None):
                if not line.startswith(b"data:"):
                    continue
                event = json.loads(line[5:])
                if "error" in event:
                    raise StreamError(str(event["error"]))
                ids = event.get("output_ids", [])
                timing.tokens_arrived(len(ids) if isinstance(ids, list) else 1, event.get("text_output", ""))
                final_outputs(timing, event)
        if not timing.finish_reason:
            raise StreamError("stream ended without a final response (no finish_reason)")


class ChatApiStreamUser(LLMStreamUser):
    """A user of one of the front end's chat APIs (`{openai_url}/{path}`, the OpenAI and Anthropic APIs share
    the port): a requests session, the served model's name, the request body both APIs read alike."""

    abstract = True
    path: ClassVar[str]

    def on_start(self) -> None:
        super().on_start()
        self.session = requests.Session()
        base = self.options.openai_url.rstrip("/")  # http://host:port/v1
        self.url = f"{base}/{self.path}"
        self.model = self.options.served_model or self.session.get(f"{base}/models", timeout=30).json()["data"][0]["id"]

    def on_stop(self) -> None:
        self.session.close()

    def body(self, request: GenerationRequest) -> dict[str, Any]:
        sampling = {name: JSON_OF[SAMPLING_DTYPES[name]](value) for name, value in request.sampling.items()}
        return {"model": self.model, "messages": [{"role": "user", "content": request.prompt}],
                "max_tokens": request.max_tokens, "min_tokens": request.min_tokens, "stream": True, **sampling}


class OpenAIStreamUser(ChatApiStreamUser):
    """Streams chat completions from the OpenAI API (`POST {openai_url}/chat/completions`, SSE chunks); the
    path goes as the `zerocheck` header, the path served comes back in `X-ZeroCheck-Sampler`/`-Bypass`."""

    protocol = "OpenAI"
    endpoint = "chat_completions"
    path = "chat/completions"

    def stream(self, request: GenerationRequest, timing: StreamTiming) -> None:
        body = {**self.body(request), "stream_options": {"include_usage": True}}
        timing.start = time.perf_counter()
        with self.session.post(self.url, json=body, stream=True, timeout=self.options.timeout_s,
                               headers={"zerocheck": request.zerocheck}) as reply:
            if reply.status_code != 200:
                raise StreamError(f"HTTP {reply.status_code}: {reply.text[:200]}")
            final_outputs(timing, {"sampler": reply.headers.get("X-ZeroCheck-Sampler", ""),
                                   "zerocheck_bypass": reply.headers.get("X-ZeroCheck-Bypass") == "true"})
            for line in reply.iter_lines(chunk_size=None):
                if line.startswith(b"event: error"):
                    raise StreamError(f"error event: {reply.text[:200]}")
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    raise StreamError(str(chunk["error"]))
                for choice in chunk["choices"]:
                    if choice["delta"].get("content"):  # one server response, one token
                        timing.tokens_arrived(1, choice["delta"]["content"])
                    if choice.get("finish_reason"):
                        timing.finish_reason = choice["finish_reason"]
                if chunk.get("usage"):
                    final_outputs(timing, chunk["usage"])
        if not timing.finish_reason:
            raise StreamError("stream ended without a finish_reason")


class AnthropicStreamUser(ChatApiStreamUser):
    """Streams messages from the Anthropic Messages API (`POST {base}/v1/messages`, Anthropic's events) on the
    OpenAI API's port; the zero-check path is asked for with `anthropic-beta: zero-check-layer-2024-06` (its
    absence asks for the checked chain), the path served comes back in `X-Anthropic-ZeroCheck-Bypass`."""

    protocol = "Anthropic"
    endpoint = "messages"
    path = "messages"

    def stream(self, request: GenerationRequest, timing: StreamTiming) -> None:
        body = self.body(request)
        headers = {"anthropic-version": "2023-06-01", "x-api-key": "unused"}
        if request.zerocheck == "on":
            headers[BETA_HEADER] = ZERO_CHECK_BETA
        timing.start = time.perf_counter()
        with self.session.post(self.url, json=body, stream=True, timeout=self.options.timeout_s,
                               headers=headers) as reply:
            if reply.status_code != 200:
                raise StreamError(f"HTTP {reply.status_code}: {reply.text[:200]}")
            final_outputs(timing, {"sampler": reply.headers.get("X-ZeroCheck-Sampler", ""),
                                   "zerocheck_bypass": reply.headers.get("X-Anthropic-ZeroCheck-Bypass") == "true"})
            for line in reply.iter_lines(chunk_size=None):
                if not line.startswith(b"data:"):
                    continue
                event = json.loads(line[5:])
                if event["type"] == "error":
                    raise StreamError(str(event["error"]))
                if event["type"] == "message_start":
                    timing.prompt_tokens = int(event["message"]["usage"]["input_tokens"])
                elif event["type"] == "content_block_delta" and event["delta"].get("text"):
                    timing.tokens_arrived(1, event["delta"]["text"])  # one server response, one token
                elif event["type"] == "message_delta":
                    timing.finish_reason = str(event["delta"]["stop_reason"])
                    timing.completion_tokens = int(event["usage"]["output_tokens"])
        if not timing.finish_reason:
            raise StreamError("stream ended without a stop_reason")
