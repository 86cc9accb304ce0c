"""Decoupled BLS model `generate` (also served as `ensemble`): the generation loop, streaming.

Each request runs its generation loop on a worker thread; every decode step is one BLS call to
`zero_check_step` or `checked_step`, where Triton's dynamic batcher batches the steps of concurrent
sequences. The Python backend of Triton 2.51 crashes when pb_utils objects (requests, tensors,
responses) are used from several threads at once, so worker threads touch none: they hand numpy
arrays to `on_loop`, which builds, sends and reads every pb_utils object on the stub's event loop.
"""
import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

from zerocheck.generate.loop import GenerationLoop, StepCancelled, StepOutput
from zerocheck.generate.service import GenerateService
from zerocheck.generate.step_inputs import STEP_MODELS, step_arrays, step_outputs
from zerocheck.serving.instance_watchdog import StubWatchdog, stop_server
from zerocheck.serving.inputs import GENERATE_INPUTS, InvalidRequest, Limits, Overloaded
from zerocheck.serving.metrics import GenerateMetrics
from zerocheck.serving.triton import ModelConfig, built_max_seq_len, error_for, request_arrays, request_parameters, tensors
from zerocheck.tokenizer import load_tokenizer

INPUT_NAMES = [spec.name for spec in GENERATE_INPUTS]
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
LOOP: asyncio.AbstractEventLoop | None = None


def on_loop(coroutine):
    """Run `coroutine` on the stub's event loop and wait for its result (from a worker thread)."""
    return asyncio.run_coroutine_threadsafe(coroutine, LOOP).result()


def step_error(error) -> Exception:
    code = error.code() if hasattr(error, "code") else None
    if code == pb_utils.TritonError.UNAVAILABLE:
        return Overloaded(error.message())
    if code == pb_utils.TritonError.INVALID_ARG:
        return InvalidRequest(error.message())
    return RuntimeError(error.message())


async def bls(model: str, arrays: dict, outputs: list) -> dict:
    """One BLS call; returns the requested outputs as numpy copies (raises the step's error)."""
    response = await pb_utils.InferenceRequest(model_name=model, inputs=tensors(pb_utils, arrays),
                                               requested_output_names=outputs).async_exec()
    if response.has_error():
        raise step_error(response.error())
    found = {name: pb_utils.get_output_tensor_by_name(response, name) for name in outputs}
    return {name: tensor.as_numpy().copy() for name, tensor in found.items() if tensor is not None}


async def checked_bls(request, model: str, arrays: dict, outputs: list) -> dict:
    """`bls` unless the client cancelled `request`: checked in the same hop as the step."""
    if request.is_cancelled():
        raise StepCancelled()
    return await bls(model, arrays, outputs)


def bls_step(call) -> StepOutput:
    out = on_loop(checked_bls(call.context, STEP_MODELS[call.path], step_arrays(call), step_outputs(call)))
    log_prob = out.get("output_log_prob")
    return StepOutput(int(out["output_id"].reshape(-1)[0]), None if log_prob is None else float(log_prob.reshape(-1)[0]))


def bls_release(seq_id: str) -> None:
    arrays = {"sequence_id": np.array([[seq_id.encode()]], dtype=object), "input_ids": np.zeros((1, 0), np.int32),
              "sequence_start": np.array([[False]]), "sequence_end": np.array([[True]])}
    on_loop(bls("decoder", arrays, ["logits"]))


def response_parameters_supported() -> bool:
    """Whether this Python backend takes InferenceResponse(parameters=...) (Triton 2.51's does not)."""
    try:
        pb_utils.InferenceResponse(output_tensors=[], parameters={"probe": True})
    except TypeError:
        return False
    return True


PARAMETER_OUTPUTS = ("zerocheck_bypass", "sampler", "finish_reason", "prompt_tokens", "completion_tokens")
WITH_PARAMETERS = False  # decided once in initialize


async def send(sender, arrays=None, error: Exception | None = None, final=False) -> None:
    flags = FINAL if final else 0
    if error is not None:
        sender.send(pb_utils.InferenceResponse(output_tensors=[], error=error_for(pb_utils, error)), flags=flags)
    elif arrays is not None and WITH_PARAMETERS:  # the same fields as response parameters too
        parameters = {name: arrays[name].reshape(-1)[0].item() for name in PARAMETER_OUTPUTS}
        parameters = {k: v.decode() if isinstance(v, bytes) else v for k, v in parameters.items()}
        sender.send(pb_utils.InferenceResponse(tensors(pb_utils, arrays), parameters=parameters), flags=flags)
    elif arrays is not None:
        sender.send(pb_utils.InferenceResponse(tensors(pb_utils, arrays)), flags=flags)
    else:
        sender.send(flags=flags)


async def call(function, *args):
    return function(*args)


class LastHeld:
    """Sends responses one behind, so the last one carries the final flag (non-streamed requests
    then get exactly one response, as the HTTP generate endpoint requires)."""

    def __init__(self, sender) -> None:
        self.sender, self.pending = sender, None

    def send(self, arrays) -> None:
        if self.pending is not None:
            on_loop(send(self.sender, self.pending))
        self.pending = arrays

    def close(self, error=None) -> None:
        on_loop(send(self.sender, None if error is not None else self.pending, error, final=True))


class TritonPythonModel:
    def initialize(self, args):
        global WITH_PARAMETERS
        WITH_PARAMETERS = response_parameters_supported()
        config = ModelConfig(args)
        tokenizer = load_tokenizer(config.artifacts_dir())
        context = min(config.get_int("max_context", 1024), built_max_seq_len(config.artifacts_dir()))
        limits = Limits(max_prompt_tokens=min(config.get_int("max_prompt_tokens", 768), context - 1),
                        max_output_tokens=config.get_int("max_output_tokens", 256), max_context=context)
        max_active, max_queue = config.get_int("max_concurrent_sequences", 16), config.get_int("max_queue_size", 16)
        loop = GenerationLoop(tokenizer, bls_step, bls_release, limits.max_context)
        self.service = GenerateService(tokenizer, loop, limits, max_active, max_queue,
                                       config.get_float("queue_timeout_s", 30.0))
        self.pool = ThreadPoolExecutor(max_workers=max_active + max_queue + 2, thread_name_prefix="generate")
        self.sequence_pool = ThreadPoolExecutor(max_workers=max_active, thread_name_prefix="sequence")
        self.metrics = GenerateMetrics(pb_utils)
        self.test_delay_s = config.get_float("test_delay_ms", 0.0) / 1000.0
        # a dead model-instance stub is never restarted by Triton 2.51: stop the server instead of serving errors
        self.watchdog = StubWatchdog(stop_server).start() if config.get("exit_on_dead_instance", "true") == "true" else None

    async def execute(self, requests):
        global LOOP
        LOOP = asyncio.get_running_loop()
        for request in requests:
            sender = request.get_response_sender()
            try:
                prepared = self.service.prepare(request_arrays(pb_utils, request, INPUT_NAMES),
                                                request_parameters(request))
                self.service.reserve(prepared.request.num_return_sequences)
            except Exception as error:
                self.metrics.error(type(error).__name__)
                await send(sender, error=error, final=True)
                continue
            self.pool.submit(self.serve, request, sender, prepared)
        return None

    def serve(self, request, sender, prepared) -> None:
        """On a worker thread: run the request to its final response."""
        held = LastHeld(sender)
        metrics = self.metrics
        if self.test_delay_s and prepared.request.retry_reason is None:
            time.sleep(self.test_delay_s)  # test-only: a slow first attempt, so a hedge or retry wins
        try:
            with self.service.admission(prepared.request.num_return_sequences):
                on_loop(call(metrics.active.set, self.service.active))
                on_loop(call(metrics.request, prepared.path, prepared.bypass, prepared.degraded))
                generations = self.service.serve(prepared, held.send, self.run_parallel, context=request)
            for generation in generations:
                on_loop(call(metrics.finished, prepared.path, generation))
            held.close()
        except Exception as error:  # every request ends with the final flag, never a traceback
            on_loop(call(metrics.error, type(error).__name__))
            held.close(error)
        finally:
            on_loop(call(metrics.active.set, self.service.active))

    def run_parallel(self, jobs) -> None:
        """num_return_sequences > 1: one worker per extra sequence; the first failure is raised."""
        others = [self.sequence_pool.submit(job) for job in jobs[1:]]
        jobs[0]()
        for future in others:
            future.result()

    def finalize(self):
        if self.watchdog is not None:
            self.watchdog.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.sequence_pool.shutdown(wait=False, cancel_futures=True)
