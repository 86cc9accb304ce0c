"""Decoupled BLS model `generate`: the generation loop of every door, streaming. `ensemble`,
`tensorrt_llm_bls` and `tensorrt_llm` forward their requests here (zerocheck.triton.forward; the request
parameter `interface` says which interface a request speaks), so one admission and one scheduler serve them all.
Its parameter `engine` says what runs the sequences: `zerocheck` (below) or, in the trtllm flavor,
`tensorrt_llm`: TensorRT-LLM's LLM API with zerocheck's sampler as each sequence's logits processor
(zerocheck.trtllm.llm_api; the load stops naming a missing or unsupported TensorRT-LLM).

Every request runs as a task on the stub's asyncio event loop (Triton 2.51's Python backend crashes
when pb_utils objects are used from several threads, so only the loop touches them; guides compile in the
grammar compiler's worker threads, awaited by the loop). A
`StepScheduler` batches the decode steps of all active sequences: one BLS call per iteration and path
carries every sequence of that path as a row (zero-check: `decoder`, whose sampler is fused after the
forward; checked: `checked_step`, the decoder then the check layer's models). A request may hold
several rows (`[N, 1]` inputs): each is generated, its responses say their `batch_index`.
"""
import asyncio

import triton_python_backend_utils as pb_utils

from zerocheck.api.errors import ErrorCode, InvalidRequest, code_of, error_from_message, log
from zerocheck.api.sampler_path import SamplerPath
from zerocheck.generate.scheduler import StepScheduler
from zerocheck.generate.service import GenerateService
from zerocheck.grammar import GrammarCompiler
from zerocheck.wire.step import STEP_MODELS, STEP_OUTPUTS, release_arrays, step_arrays, step_results
from zerocheck.triton.watchdog import StubWatchdog, stop_server
from zerocheck.api.request import ENGINE_INPUTS, Limits
from zerocheck.generate.metrics import GenerateMetrics
from zerocheck.generate.relay import NEXT, RELAY_PARAMETER, START, Relay, error_arrays
from zerocheck.triton.config import TENSORRT_LLM_ENGINE, GenerateParameters, ModelConfig, built_max_seq_len, \
    parameters
from zerocheck.trtllm.llm_api import LlmApiParameters, refuse_unserved, require_tensorrt_llm, \
    start_llm_scheduler
from zerocheck.triton.tensors import error_for, request_arrays, request_parameters, tensors
from zerocheck.tokenizer import load_tokenizer

INPUT_NAMES = [spec.name for spec in ENGINE_INPUTS]
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
PARAMETER_OUTPUTS = ("zerocheck_bypass", "sampler", "finish_reason", "prompt_tokens", "completion_tokens")


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


async def bls_step(path: SamplerPath, calls: list) -> list:
    return step_results(path, await bls(STEP_MODELS[path], step_arrays(calls), STEP_OUTPUTS[path]), len(calls))


async def bls_release(seq_ids: list) -> None:
    await bls("decoder", release_arrays(seq_ids), ["error"])


def send_arrays(sender, arrays: dict) -> None:
    """One response that is the request's final."""
    sender.send(pb_utils.InferenceResponse(tensors(pb_utils, arrays)), flags=FINAL)


def response_parameters_supported() -> bool:
    """Whether this Python backend takes InferenceResponse(parameters=...) (Triton 2.51's does not)."""
    try:
        pb_utils.InferenceResponse(output_tensors=[], parameters={"probe": True})
    except TypeError:
        return False
    return True


class Responses:
    """The responses of one request. A streamed chunk goes at once (more follow it: at least its sequence's
    final response); a sequence's final response is held until the next one, so the request's last carries
    the final flag (a non-streamed request then gets exactly one response, as the HTTP generate endpoint
    requires). With `with_parameters` the path fields go as response parameters too."""

    def __init__(self, sender, with_parameters: bool) -> None:
        self.sender, self.with_parameters, self.pending = sender, with_parameters, None

    def send(self, arrays, final: bool) -> None:
        if self.pending is not None:
            self._send(self.pending)
            self.pending = None
        if final:
            self.pending = arrays
        else:
            self._send(arrays)

    def close(self, error=None) -> None:
        """The final response: the held one, or the error (never a traceback), or an empty one."""
        if error is not None:
            self.sender.send(pb_utils.InferenceResponse(output_tensors=[], error=error_for(pb_utils, error)),
                             flags=FINAL)
        elif self.pending is not None:
            self._send(self.pending, FINAL)
        else:
            self.sender.send(flags=FINAL)

    def _send(self, arrays, flags=0) -> None:
        if self.with_parameters:
            parameters = {name: arrays[name].reshape(-1)[0].item() for name in PARAMETER_OUTPUTS}
            parameters = {k: v.decode() if isinstance(v, bytes) else v for k, v in parameters.items()}
            response = pb_utils.InferenceResponse(tensors(pb_utils, arrays), parameters=parameters)
        else:
            response = pb_utils.InferenceResponse(tensors(pb_utils, arrays))
        self.sender.send(response, flags=flags)


class TritonPythonModel:
    def initialize(self, args):
        self.with_parameters = response_parameters_supported()
        config = ModelConfig(args)
        # the tensorrt_llm engine's own parameters sit in the same config; the zerocheck engine's config has none
        on_llm_api = config.parameters.get("engine") == TENSORRT_LLM_ENGINE
        params = parameters(GenerateParameters, config, shared_with=(LlmApiParameters,) if on_llm_api else ())
        if on_llm_api:
            require_tensorrt_llm()  # before anything loads
        tokenizer = load_tokenizer(config.artifacts_dir())
        context = min(params.max_context, built_max_seq_len(config.artifacts_dir()))
        limits = Limits(max_prompt_tokens=min(params.max_prompt_tokens, context - 1),
                        max_output_tokens=min(params.max_output_tokens, context), max_context=context)
        self.metrics = GenerateMetrics(pb_utils)
        self.shutdown = lambda: None
        if on_llm_api:  # the trtllm flavor: TensorRT-LLM's LLM API runs the sequences
            engine_params = parameters(LlmApiParameters, config, shared_with=(GenerateParameters,))
            max_active = params.max_concurrent_sequences
            scheduler, self.shutdown = start_llm_scheduler(config.artifacts_dir(), engine_params, max_active, context)
            engine_rules = {"refuse_unserved": refuse_unserved}
        else:
            scheduler = StepScheduler(bls_step, bls_release, max_batch=params.max_step_batch,
                                      prefill_tokens=params.prefill_tokens_per_step,
                                      on_cancel_freed=self.metrics.cancel_freed.observe,
                                      decode_steps=params.decode_steps,
                                      decode_steps_max_rows=params.decode_steps_max_rows)
            # every KV-cache slot by default: the decoder's refuses a sequence only when all are taken
            max_active = params.max_concurrent_sequences or int(config.sibling_parameter("decoder", "max_slots"))
            engine_rules = {"grammars": GrammarCompiler.for_tokenizer(tokenizer)}
        self.service = GenerateService(tokenizer, scheduler, limits, max_active, params.max_queue_size,
                                       params.queue_timeout_s, on_queue_wait=self.metrics.queue_wait.observe,
                                       **engine_rules)
        self.test_delay_s = params.test_delay_ms / 1000.0
        self.stopped: dict[str, bool] = {}  # request id -> a stop request came for it (a door forwards its own)
        self.relays: dict[str, Relay] = {}  # a door's relayed requests, by request id
        # a dead model-instance stub is never restarted by Triton 2.51: stop the server instead of serving errors
        self.watchdog = StubWatchdog(stop_server).start() if params.exit_on_dead_instance else None

    async def execute(self, requests):
        """Serves `requests` to their final responses. The stub runs a decoupled model's coroutine in the
        background (it does not wait for it), so this lives as long as its requests; one that returned at
        once would race the stub's bookkeeping of it ("Cannot remove future from background")."""
        served = []
        for request in requests:
            sender = request.get_response_sender()
            relay = None
            try:
                arrays = request_arrays(pb_utils, request, INPUT_NAMES)
                parameters = request_parameters(request)
                relay = parameters.pop(RELAY_PARAMETER, None)
                if relay == NEXT:
                    served.append(self.relay_next(request, sender))
                    continue
                if bool(arrays.get("stop", [[False]])[0][0]):
                    self.stop(request, sender)
                    continue
                rows = self.service.prepare_batch(arrays, parameters)
                self.service.reserve(sum(row.request.num_return_sequences for row in rows))
            except Exception as error:
                self.metrics.error(code_of(error))
                if relay is not None:
                    send_arrays(sender, error_arrays(error))
                else:
                    Responses(sender, False).close(error)
                continue
            if relay == START:  # a door's request: its responses wait in a Relay for the door's calls
                self.relays[request.request_id()] = responses = Relay()
                served += [self.serve(request, responses, rows), self.relay_next(request, sender)]
            else:
                served.append(self.serve(request, Responses(sender, self.with_parameters), rows))
        await asyncio.gather(*served)

    async def relay_next(self, request, sender) -> None:
        """A relay call (zerocheck.generate.relay): the relayed request's oldest queued response, once there is one."""
        relay_id = request.request_id()
        relay = self.relays.get(relay_id)
        if relay is None:
            send_arrays(sender, error_arrays(InvalidRequest(f"relay: no relayed request {relay_id!r}")))
            return
        arrays, last = await relay.next()
        if last:
            del self.relays[relay_id]
        send_arrays(sender, arrays)

    def stop(self, request, sender) -> None:
        """A stop request (tensorrtllm_backend's `stop` input): the in-flight request with the same request
        id ends as if cancelled (one that has ended already stays ended); the stop request gets one empty
        final response. The project's clients cancel this way over gRPC rather than by cancelling the call:
        Triton 2.51's gRPC stream handler can crash on a call cancelled while responses are in flight."""
        request_id = request.request_id()
        if not request_id:
            raise InvalidRequest("stop: give the request id of the request to stop")
        if request_id in self.stopped:
            self.stopped[request_id] = True
        sender.send(pb_utils.InferenceResponse(output_tensors=[]), flags=FINAL)  # no outputs: "cancellation response"

    async def serve(self, request, responses, rows) -> None:
        """Run the request to its final response (`responses`: its Responses, or the Relay a door reads);
        every request ends with the final flag, never a traceback."""
        metrics = self.metrics
        request_id = request.request_id()
        relayed = isinstance(responses, Relay)
        if request_id:  # a stop request can name it
            self.stopped.setdefault(request_id, False)
        sequences = sum(row.request.num_return_sequences for row in rows)
        try:
            try:
                await self.service.check_guides(rows)
            except Exception:
                self.service.release_reservation(sequences)
                raise
            if self.test_delay_s and rows[0].request.retry_reason is None:
                await asyncio.sleep(self.test_delay_s)  # test-only: a slow first attempt, so a hedge or retry wins
            async with self.service.admission(sequences):
                metrics.active.set(self.service.active)
                for row in rows:
                    metrics.request(row.path, row.bypass, row.degraded)
                    metrics.retry(row.request.retry_reason)
                # a relayed request's client is watched by its door, which sends a stop request
                generations = await self.service.serve(
                    rows, responses.send, lambda: self.stopped.get(request_id, False) or (
                        not relayed and request.is_cancelled()))
            for row, generation in zip((row for row in rows for _ in range(row.request.num_return_sequences)),
                                       generations):
                metrics.finished(row.path, generation)
            responses.close()
        except Exception as error:
            code = code_of(error)
            metrics.error(code)
            if code in (ErrorCode.INTERNAL, ErrorCode.UNAVAILABLE):  # failed after admission: worth a log line
                log.error("request %r failed: %s", request_id, error)
            responses.close(error)
        finally:
            if request_id:
                self.stopped.pop(request_id, None)
            metrics.active.set(self.service.active)

    def finalize(self):
        if getattr(self, "watchdog", None) is not None:  # a refused load has none
            self.watchdog.stop()
        if hasattr(self, "shutdown"):
            self.shutdown()
