"""Decoupled BLS model `generate` (also served as `ensemble`): the generation loop, streaming.

Every request runs as a task on the stub's asyncio event loop (Triton 2.51's Python backend crashes
when pb_utils objects are used from several threads, so nothing here uses threads). A
`StepScheduler` batches the decode steps of all active sequences: one BLS call per iteration and path
carries every sequence of that path as a row (zero-check: `decoder`, whose sampler is fused after the
forward; checked: `checked_step`, the decoder then the check layer's models).
"""
import asyncio

import triton_python_backend_utils as pb_utils

from zerocheck.generate.scheduler import StepScheduler
from zerocheck.generate.service import GenerateService
from zerocheck.generate.step_inputs import STEP_MODELS, STEP_OUTPUTS, release_arrays, step_arrays, step_results
from zerocheck.serving.instance_watchdog import StubWatchdog, stop_server
from zerocheck.serving.inputs import GENERATE_INPUTS, Limits
from zerocheck.serving.metrics import GenerateMetrics
from zerocheck.api.errors import ErrorCode, code_of, error_from_message
from zerocheck.serving.triton import ModelConfig, built_max_seq_len, error_for, request_arrays, request_parameters, tensors
from zerocheck.tokenizer import load_tokenizer

INPUT_NAMES = [spec.name for spec in GENERATE_INPUTS]
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


async def bls(model: str, arrays: dict, outputs: list) -> dict:
    """One BLS call; returns the requested outputs as numpy copies (raises the call's error)."""
    response = await pb_utils.InferenceRequest(model_name=model, inputs=tensors(pb_utils, arrays),
                                               requested_output_names=outputs).async_exec()
    if response.has_error():  # the step models' messages carry their code; Triton's own may not
        error = response.error()
        uncoded = ErrorCode.INVALID_ARGUMENT if error.code() == pb_utils.TritonError.INVALID_ARG else ErrorCode.INTERNAL
        raise error_from_message(error.message(), uncoded)
    found = {name: pb_utils.get_output_tensor_by_name(response, name) for name in outputs}
    return {name: tensor.as_numpy().copy() for name, tensor in found.items() if tensor is not None}


async def bls_step(path: str, calls: list) -> list:
    return step_results(path, await bls(STEP_MODELS[path], step_arrays(calls), STEP_OUTPUTS[path]), len(calls))


async def bls_release(seq_ids: list) -> None:
    await bls("decoder", release_arrays(seq_ids), ["error"])


def response_parameters_supported() -> bool:
    """Whether this Python backend takes InferenceResponse(parameters=...) (Triton 2.51's does not)."""
    try:
        pb_utils.InferenceResponse(output_tensors=[], parameters={"probe": True})
    except TypeError:
        return False
    return True


PARAMETER_OUTPUTS = ("zerocheck_bypass", "sampler", "finish_reason", "prompt_tokens", "completion_tokens")
WITH_PARAMETERS = False  # decided once in initialize


def send(sender, arrays=None, error: Exception | None = None, final=False) -> None:
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


class LastHeld:
    """Sends responses one behind, so the last one carries the final flag (non-streamed requests
    then get exactly one response, as the HTTP generate endpoint requires)."""

    def __init__(self, sender) -> None:
        self.sender, self.pending = sender, None

    def send(self, arrays) -> None:
        if self.pending is not None:
            send(self.sender, self.pending)
        self.pending = arrays

    def close(self, error=None) -> None:
        send(self.sender, None if error is not None else self.pending, error, final=True)


class TritonPythonModel:
    def initialize(self, args):
        global WITH_PARAMETERS
        WITH_PARAMETERS = response_parameters_supported()
        config = ModelConfig(args)
        tokenizer = load_tokenizer(config.artifacts_dir())
        context = min(config.get_int("max_context", 1024), built_max_seq_len(config.artifacts_dir()))
        limits = Limits(max_prompt_tokens=min(config.get_int("max_prompt_tokens", 768), context - 1),
                        max_output_tokens=config.get_int("max_output_tokens", 256), max_context=context)
        scheduler = StepScheduler(bls_step, bls_release, max_batch=config.get_int("max_step_batch", 64))
        self.service = GenerateService(tokenizer, scheduler, limits, config.get_int("max_concurrent_sequences", 16),
                                       config.get_int("max_queue_size", 16), config.get_float("queue_timeout_s", 30.0))
        self.metrics = GenerateMetrics(pb_utils)
        self.test_delay_s = config.get_float("test_delay_ms", 0.0) / 1000.0
        # a dead model-instance stub is never restarted by Triton 2.51: stop the server instead of serving errors
        self.watchdog = StubWatchdog(stop_server).start() if config.get("exit_on_dead_instance", "true") == "true" else None

    async def execute(self, requests):
        """Serves `requests` to their final responses. The stub runs a decoupled model's coroutine in the
        background (it does not wait for it), so this lives as long as its requests; one that returned at
        once would race the stub's bookkeeping of it ("Cannot remove future from background")."""
        served = []
        for request in requests:
            sender = request.get_response_sender()
            try:
                prepared = self.service.prepare(request_arrays(pb_utils, request, INPUT_NAMES),
                                                request_parameters(request))
                self.service.reserve(prepared.request.num_return_sequences)
            except Exception as error:
                self.metrics.error(code_of(error))
                send(sender, error=error, final=True)
                continue
            served.append(self.serve(request, sender, prepared))
        await asyncio.gather(*served)

    async def serve(self, request, sender, prepared) -> None:
        """Run the request to its final response; every request ends with the final flag, never a traceback."""
        held, metrics = LastHeld(sender), self.metrics
        try:
            if self.test_delay_s and prepared.request.retry_reason is None:
                await asyncio.sleep(self.test_delay_s)  # test-only: a slow first attempt, so a hedge or retry wins
            async with self.service.admission(prepared.request.num_return_sequences):
                metrics.active.set(self.service.active)
                metrics.request(prepared.path, prepared.bypass, prepared.degraded)
                metrics.retry(prepared.request.retry_reason)
                generations = await self.service.serve(prepared, held.send, request.is_cancelled)
            for generation in generations:
                metrics.finished(prepared.path, generation)
            held.close()
        except Exception as error:
            metrics.error(code_of(error))
            held.close(error)
        finally:
            metrics.active.set(self.service.active)

    def finalize(self):
        if self.watchdog is not None:
            self.watchdog.stop()
