"""Doors that forward to `generate`: `ensemble`, `tensorrt_llm_bls` and `tensorrt_llm`.

Every door of the server feeds one generation loop, so every active sequence is a row of one batched
decoder call per step and one admission bounds them all by the KV cache. A door model keeps its own
name, inputs and outputs (tensorrtllm_backend's clients call it unchanged) and relays each request to
`generate` (`zerocheck.generate.relay`): the request's tensors and request parameters as they came, with
the request parameter `interface` saying which interface the answer speaks (text, or tensorrt_llm's
tokens) and `relay: start`; then one `relay: next` call per further response. Every call has exactly one
response, awaited on the stub's event loop (no thread, no blocking iterator), and each response goes
straight back to the client, the last one with the final flag.

Cancellation goes through: a client that cancels (gRPC; looked at between responses and twice a second
while one is awaited) or sends a stop request (tensorrtllm_backend's `stop` input with the request's id)
makes the door send `generate` a stop request for the relayed request's own id, and the sequence ends at
`generate`'s next step. A relay call unanswered for a second makes the door ask whether `generate` is still
ready: a request of an unloaded `generate` ends with UNAVAILABLE.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import thread as futures_thread
from typing import Any

import numpy as np

from zerocheck.api.errors import ErrorCode, InvalidRequest, Unavailable, error_from_message
from zerocheck.generate.relay import ERROR_OUTPUT, FINAL_OUTPUT, NEXT, RELAY_OUTPUTS, RELAY_PARAMETER, START
from zerocheck.triton.tensors import error_for, request_parameters

log = logging.getLogger("zerocheck")
ENGINE = "generate"  # the model that runs every door's sequences
CANCEL_POLL_S = 0.5  # how often a client is asked whether it cancelled while a response is awaited
ENGINE_POLL_S = 1.0  # how long a relay call waits before asking whether generate is still ready


MAX_RELAY_CALLS = 512  # relay calls a door has in flight at once (a worker thread each)


class RelayExecutor(ThreadPoolExecutor):
    """The door's event-loop executor. The stub runs each BLS `async_exec` on its loop's default executor, and
    a relay call holds a worker until `generate` answers (a step, or a queued request's whole wait): asyncio's
    default pool (min(32, CPUs + 4) workers: 6 on 2 cores) let only 6 of a door's requests reach `generate` at
    once and queued the others in the door, unbounded and unseen by `generate`'s admission. Its workers are
    daemon threads that the interpreter does not join at exit: one still waiting on a `generate` that was
    unloaded with the server's stop must not hold the stub's exit (its shared memory was then left behind)."""

    def __init__(self, door: str) -> None:
        super().__init__(max_workers=MAX_RELAY_CALLS, thread_name_prefix=f"{door}-bls")

    def _adjust_thread_count(self) -> None:  # ThreadPoolExecutor's (Python 3.11), with daemon threads
        if self._idle_semaphore.acquire(timeout=0):
            return
        if len(self._threads) < self._max_workers:
            worker = threading.Thread(
                name=f"{self._thread_name_prefix}_{len(self._threads)}", target=futures_thread._worker, daemon=True,
                args=(weakref.ref(self, lambda _, work=self._work_queue: work.put(None)), self._work_queue,
                      self._initializer, self._initargs))
            worker.start()
            self._threads.add(worker)


def is_stop_request(arrays: Mapping[str, np.ndarray]) -> bool:
    stop = arrays.get("stop")
    return stop is not None and bool(stop.reshape(-1)[0])


class Forwarder:
    """One door model's requests, relayed to `generate` (module docstring). `pb_utils` is the stub's
    module; `outputs` are the door's declared output names."""

    def __init__(self, pb_utils: Any, door: str, interface: str, outputs: list[str]) -> None:
        self.pb, self.door, self.interface = pb_utils, door, interface
        self.outputs = [*outputs, *RELAY_OUTPUTS]
        self.final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        self._ids = itertools.count()
        self._relayed: dict[str, set[str]] = {}  # the client's request id -> ids of its relayed requests

    async def execute(self, requests: list) -> None:
        """Serves `requests` to their final responses (the stub runs it in the background)."""
        served = []
        for request in requests:
            sender = request.get_response_sender()
            try:
                stop = self.pb.get_input_tensor_by_name(request, "stop")  # the other inputs pass on unread
                parameters = request_parameters(request)
            except Exception as error:  # never a traceback to the client
                self._fail(sender, error)
                continue
            if stop is not None and is_stop_request({"stop": stop.as_numpy()}):
                served.append(self.stop(request, sender))
            else:
                served.append(self.forward(request, sender, parameters))
        await asyncio.gather(*served)

    async def forward(self, request: Any, sender: Any, parameters: dict) -> None:
        client_id = request.request_id()
        relay_id = f"{self.door}-{os.getpid()}-{next(self._ids)}"
        if client_id:
            self._relayed.setdefault(client_id, set()).add(relay_id)
        inputs, relay_parameters = request.inputs(), {**parameters, "interface": self.interface,
                                                      RELAY_PARAMETER: START}
        stopping, ended = False, False
        try:
            while not ended:
                call = asyncio.ensure_future(self._call(inputs, relay_id, relay_parameters))
                waited = 0.0
                while not call.done():
                    await asyncio.wait({call}, timeout=CANCEL_POLL_S)
                    waited += CANCEL_POLL_S
                    if call.done():
                        break
                    stopping = stopping or await self._stop_if_cancelled(request, relay_id)
                    if waited >= ENGINE_POLL_S and not self._engine_ready():
                        call.cancel()
                        raise Unavailable(f"{ENGINE} is not ready (the server is stopping); retry later")
                ended = self._pass_on(sender, call.result())
                if not ended:
                    stopping = stopping or await self._stop_if_cancelled(request, relay_id)
                inputs = [self.pb.Tensor("stop", np.array([[False]]))]
                relay_parameters = {"interface": self.interface, RELAY_PARAMETER: NEXT}
        except Exception as error:  # never a traceback to the client, always a final flag
            if not isinstance(error, Unavailable):
                log.error("%s: relaying %s to %s failed: %s", self.door, relay_id, ENGINE, error)
            self._fail(sender, error)
        finally:
            if client_id:
                ids = self._relayed.get(client_id, set())
                ids.discard(relay_id)
                if not ids:
                    self._relayed.pop(client_id, None)

    async def _stop_if_cancelled(self, request: Any, relay_id: str) -> bool:
        """Whether the client cancelled; if so, `generate` is asked to stop the relayed request."""
        if not request.is_cancelled():
            return False
        await self._stop(relay_id)
        return True

    def _pass_on(self, sender: Any, response: Any) -> bool:
        """Send the client what one relay call answered; whether it was the request's last response."""
        if response.has_error():  # the call itself failed (generate unavailable)
            error = response.error()
            sender.send(self.pb.InferenceResponse(
                output_tensors=[], error=self.pb.TritonError(error.message(), error.code())), flags=self.final)
            return True
        error = self.pb.get_output_tensor_by_name(response, ERROR_OUTPUT)
        if error is not None:
            self._fail(sender, error_from_message(error.as_numpy().reshape(-1)[0].decode(), ErrorCode.INTERNAL))
            return True
        last = bool(self.pb.get_output_tensor_by_name(response, FINAL_OUTPUT).as_numpy().reshape(-1)[0])
        outputs = [tensor for tensor in response.output_tensors() if tensor.name() not in RELAY_OUTPUTS]
        if outputs:
            sender.send(self.pb.InferenceResponse(output_tensors=outputs), flags=self.final if last else 0)
        elif last:
            sender.send(flags=self.final)
        return last

    async def _call(self, inputs: list, relay_id: str, parameters: dict) -> Any:
        """One relay call: its one response (`async_exec` returns once it came; the iterator then holds it)."""
        responses = await self.pb.InferenceRequest(
            model_name=ENGINE, inputs=inputs, requested_output_names=self.outputs, request_id=relay_id,
            parameters=parameters).async_exec(decoupled=True)
        return next(responses)

    def _engine_ready(self) -> bool:
        try:
            return bool(self.pb.is_model_ready(ENGINE))
        except Exception:  # the server is stopping: "Server not ready"
            return False

    def _fail(self, sender: Any, error: BaseException) -> None:
        sender.send(self.pb.InferenceResponse(output_tensors=[], error=error_for(self.pb, error)), flags=self.final)

    async def stop(self, request: Any, sender: Any) -> None:
        """A stop request (tensorrtllm_backend's `stop` input): the door's in-flight requests with its request id
        end as if cancelled; the stop request gets one empty final response, as `generate` answers one."""
        client_id = request.request_id()
        if not client_id:
            self._fail(sender, InvalidRequest("stop: give the request id of the request to stop"))
            return
        for relay_id in list(self._relayed.get(client_id, ())):
            await self._stop(relay_id)
        sender.send(self.pb.InferenceResponse(output_tensors=[]), flags=self.final)

    async def _stop(self, relay_id: str) -> None:
        """Ask `generate` to stop the relayed request `relay_id` (its own stop request)."""
        try:
            responses = await self.pb.InferenceRequest(
                model_name=ENGINE, inputs=[self.pb.Tensor("stop", np.array([[True]]))], requested_output_names=[],
                request_id=relay_id, parameters={"interface": self.interface}).async_exec(decoupled=True)
            response = next(responses)
            if response.has_error():
                log.warning("%s: stopping %s failed: %s", self.door, relay_id, response.error().message())
        except Exception as error:
            log.warning("%s: stopping %s failed: %s", self.door, relay_id, error)


def forwarding_model(pb_utils: Any) -> type:
    """The TritonPythonModel class of a door model (`model.py`: `TritonPythonModel = forwarding_model(pb_utils)`)."""
    from zerocheck.triton.config import ForwardParameters, ModelConfig, parameters

    class TritonPythonModel:
        def initialize(self, args: dict) -> None:
            config = ModelConfig(args)
            params = parameters(ForwardParameters, config)
            outputs = [output["name"] for output in config.raw.get("output", [])]
            self.forwarder = Forwarder(pb_utils, config.name, params.interface, outputs)
            self.executor_set = False

        async def execute(self, requests: list) -> None:
            if not self.executor_set:  # the stub's loop runs here, not in initialize
                asyncio.get_running_loop().set_default_executor(RelayExecutor(self.forwarder.door))
                self.executor_set = True
            await self.forwarder.execute(requests)

    return TritonPythonModel
