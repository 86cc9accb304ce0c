"""Doors that forward to `generate`: `ensemble`, `tensorrt_llm_bls` and `tensorrt_llm`.

Every door of the server feeds one generation loop, so every active sequence is a row of one batched
decoder call per step and one admission bounds them all by the KV cache. A door model keeps its own
name, inputs and outputs (tensorrtllm_backend's clients call it unchanged) and forwards each request,
tensors and request parameters as they came, to `generate` as a decoupled BLS call, with the request
parameter `interface` saying which interface the answer speaks (text, or tensorrt_llm's tokens). Every
response `generate` sends goes straight back to the client.

Cancellation goes through: a client that cancels (gRPC) or sends a stop request (tensorrtllm_backend's
`stop` input with the request's id) makes the door send `generate` a stop request for the forwarded
request's own id, and the sequence ends at `generate`'s next step.

Triton 2.51's BLS response iterator is synchronous (`next` blocks until a response arrives): the door
waits for each in a worker thread, which does nothing else; every other pb_utils call stays on the
stub's event loop. The workers are daemon threads: a wait that never ends (`generate` unloaded with the
request in flight) cannot hold the stub's exit, and after a second without a response the door asks
whether `generate` is still ready (a request of an unloaded `generate` ends with UNAVAILABLE). The
iterator shows no flags, so the door marks a response final itself: a response with an error, or the
final response (a non-empty `finish_reason`) of the request's last sequence.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import queue
import threading
from typing import Any, Callable, Mapping

import numpy as np

from zerocheck.api.errors import InvalidRequest, Unavailable
from zerocheck.triton.tensors import error_for, request_parameters

log = logging.getLogger("zerocheck")
ENGINE = "generate"  # the model that runs every door's sequences
CANCEL_POLL_S = 0.1  # how often a forwarded request's client is asked whether it cancelled, between responses
ENGINE_POLL_S = 1.0  # how long a forwarded request waits for a response before asking whether generate is ready


class Waiters:
    """Daemon worker threads that run blocking calls for the event loop (`run`); one more starts whenever
    every worker is busy, so each waiting request has its own."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._count = 0

    def run(self, call: Callable[..., Any], *args: Any) -> asyncio.Future:
        """`call(*args)` on a worker; the future (of the running loop) gets its result or its exception."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            if self._idle == 0:
                self._count += 1
                threading.Thread(target=self._work, name=f"{self.name}-{self._count}", daemon=True).start()
            else:
                self._idle -= 1
        self._jobs.put((loop, future, call, args))
        return future

    def _work(self) -> None:
        while True:
            loop, future, call, args = self._jobs.get()
            try:
                result, error = call(*args), None
            except BaseException as raised:  # handed to the waiting coroutine
                result, error = None, raised
            loop.call_soon_threadsafe(_settle, future, result, error)
            with self._lock:
                self._idle += 1


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def expected_sequences(arrays: Mapping[str, np.ndarray]) -> int:
    """How many sequences `generate` answers a request with: its rows times each row's num_return_sequences
    (a value `generate` refuses makes it answer with an error instead, which ends the request too)."""
    rows = max((array.shape[0] for array in arrays.values() if array.ndim), default=1)
    counts = arrays.get("num_return_sequences")
    if counts is None:
        return rows
    return int(sum(max(1, int(value)) for value in counts.reshape(-1)))


def is_stop_request(arrays: Mapping[str, np.ndarray]) -> bool:
    stop = arrays.get("stop")
    return stop is not None and bool(stop.reshape(-1)[0])


class Forwarder:
    """One door model's requests, forwarded to `generate` (module docstring). `pb_utils` is the stub's
    module; `outputs` are the door's declared output names."""

    def __init__(self, pb_utils: Any, door: str, interface: str, outputs: list[str]) -> None:
        self.pb, self.door, self.interface, self.outputs = pb_utils, door, interface, outputs
        self.final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        self._ids = itertools.count()
        self._forwarded: dict[str, set[str]] = {}  # the client's request id -> ids of its forwarded requests
        self._waiters = Waiters(f"{door}-responses")

    async def execute(self, requests: list) -> None:
        """Serves `requests` to their final responses (the stub runs it in the background)."""
        served = []
        for request in requests:
            sender = request.get_response_sender()
            try:
                arrays = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
                parameters = request_parameters(request)
            except Exception as error:
                sender.send(self.pb.InferenceResponse(output_tensors=[], error=error_for(self.pb, error)),
                            flags=self.final)
                continue
            if is_stop_request(arrays):
                served.append(self.stop(request, sender, parameters))
            else:
                served.append(self.forward(request, sender, arrays, parameters))
        await asyncio.gather(*served)

    async def forward(self, request: Any, sender: Any, arrays: Mapping[str, np.ndarray], parameters: dict) -> None:
        client_id = request.request_id()
        forwarded_id = f"{self.door}-{os.getpid()}-{next(self._ids)}"
        if client_id:
            self._forwarded.setdefault(client_id, set()).add(forwarded_id)
        sent_final, left, stopping = False, expected_sequences(arrays), False
        try:
            inference = self.pb.InferenceRequest(
                model_name=ENGINE, inputs=request.inputs(), requested_output_names=self.outputs,
                request_id=forwarded_id, parameters={**parameters, "interface": self.interface})
            responses = await inference.async_exec(decoupled=True)
            while True:
                waiting, silent_s = self._waiters.run(next, responses, None), 0.0
                while not waiting.done():
                    await asyncio.wait({waiting}, timeout=CANCEL_POLL_S)
                    silent_s += CANCEL_POLL_S
                    if waiting.done():
                        break
                    if not stopping and request.is_cancelled():
                        stopping = True
                        await self._stop_forwarded(forwarded_id)
                    if silent_s >= ENGINE_POLL_S:
                        silent_s = 0.0
                        if not self.pb.is_model_ready(ENGINE):
                            raise Unavailable(f"{ENGINE} is not ready (the server is stopping); retry later")
                response = waiting.result()
                if response is None:
                    break
                if sent_final:
                    log.warning("%s: a response of %s came after its final one; dropped", self.door, forwarded_id)
                    continue
                if response.has_error():
                    error = response.error()
                    sender.send(self.pb.InferenceResponse(
                        output_tensors=[], error=self.pb.TritonError(error.message(), error.code())), flags=self.final)
                    sent_final = True
                    continue
                outputs = response.output_tensors()
                if not outputs:  # an empty final response: nothing to pass on
                    continue
                finish = self.pb.get_output_tensor_by_name(response, "finish_reason")
                if finish is not None and finish.as_numpy().reshape(-1)[0]:
                    left -= 1
                sent_final = left <= 0
                sender.send(self.pb.InferenceResponse(output_tensors=outputs), flags=self.final if sent_final else 0)
                if not stopping and not sent_final and request.is_cancelled():
                    stopping = True
                    await self._stop_forwarded(forwarded_id)
        except Exception as error:  # never a traceback to the client, always a final flag
            log.error("%s: forwarding %s to %s failed: %s", self.door, forwarded_id, ENGINE, error)
            if not sent_final:
                sender.send(self.pb.InferenceResponse(output_tensors=[], error=error_for(self.pb, error)),
                            flags=self.final)
                sent_final = True
        finally:
            if not sent_final and left > 0 and not stopping:
                log.error("%s: %s ended with %d of its sequences unanswered", self.door, forwarded_id, left)
                sender.send(self.pb.InferenceResponse(output_tensors=[], error=error_for(
                    self.pb, RuntimeError(f"{ENGINE} ended the request without its answer"))), flags=self.final)
            elif not sent_final:
                sender.send(flags=self.final)
            if client_id:
                ids = self._forwarded.get(client_id, set())
                ids.discard(forwarded_id)
                if not ids:
                    self._forwarded.pop(client_id, None)

    async def stop(self, request: Any, sender: Any, parameters: dict) -> None:
        """A stop request (tensorrtllm_backend's `stop` input): the door's in-flight requests with its request id
        end as if cancelled; the stop request gets one empty final response, as `generate` answers one."""
        try:
            client_id = request.request_id()
            if not client_id:
                raise InvalidRequest("stop: give the request id of the request to stop")
            for forwarded_id in list(self._forwarded.get(client_id, ())):
                await self._stop_forwarded(forwarded_id)
        except Exception as error:
            sender.send(self.pb.InferenceResponse(output_tensors=[], error=error_for(self.pb, error)), flags=self.final)
            return
        sender.send(self.pb.InferenceResponse(output_tensors=[]), flags=self.final)

    async def _stop_forwarded(self, forwarded_id: str) -> None:
        """Ask `generate` to stop the forwarded request `forwarded_id` (its own stop request)."""
        stop = self.pb.InferenceRequest(
            model_name=ENGINE, inputs=[self.pb.Tensor("stop", np.array([[True]]))], requested_output_names=[],
            request_id=forwarded_id, parameters={"interface": self.interface})
        try:
            responses = await stop.async_exec(decoupled=True)
            for response in await self._waiters.run(list, responses):
                if response.has_error():
                    log.warning("%s: stopping %s failed: %s", self.door, forwarded_id, response.error().message())
        except Exception as error:
            log.warning("%s: stopping %s failed: %s", self.door, forwarded_id, error)


def forwarding_model(pb_utils: Any) -> type:
    """The TritonPythonModel class of a door model (`model.py`: `TritonPythonModel = forwarding_model(pb_utils)`)."""
    from zerocheck.triton.config import ForwardParameters, ModelConfig, parameters

    class TritonPythonModel:
        def initialize(self, args: dict) -> None:
            config = ModelConfig(args)
            params = parameters(ForwardParameters, config)
            outputs = [output["name"] for output in config.raw.get("output", [])]
            self.forwarder = Forwarder(pb_utils, config.name, params.interface, outputs)

        async def execute(self, requests: list) -> None:
            await self.forwarder.execute(requests)

    return TritonPythonModel
