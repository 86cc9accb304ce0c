"""Decoupled BLS model `generate` (also served as `ensemble`): the generation loop, streaming.

Each request runs on its own thread; every decode step is one BLS call to `zero_check_step` or
`checked_step`, where Triton's dynamic batcher batches the steps of concurrent sequences.
"""
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

from zerocheck.generate.loop import GenerationLoop, StepOutput
from zerocheck.generate.service import GenerateService
from zerocheck.generate.step_inputs import STEP_MODELS, step_arrays, step_outputs
from zerocheck.serving.inputs import GENERATE_INPUTS, InvalidRequest, Limits, Overloaded
from zerocheck.serving.metrics import GenerateMetrics
from zerocheck.serving.triton import ModelConfig, built_max_seq_len, error_for, request_arrays, request_parameters, tensors
from zerocheck.tokenizer import load_tokenizer

INPUT_NAMES = [spec.name for spec in GENERATE_INPUTS]
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def step_error(error) -> Exception:
    code = error.code() if hasattr(error, "code") else None
    if code == pb_utils.TritonError.UNAVAILABLE:
        return Overloaded(error.message())
    if code == pb_utils.TritonError.INVALID_ARG:
        return InvalidRequest(error.message())
    return RuntimeError(error.message())


def bls_step(call) -> StepOutput:
    response = pb_utils.InferenceRequest(model_name=STEP_MODELS[call.path], inputs=tensors(pb_utils, step_arrays(call)),
                                         requested_output_names=step_outputs(call)).exec()
    if response.has_error():
        raise step_error(response.error())
    token = int(pb_utils.get_output_tensor_by_name(response, "output_id").as_numpy().reshape(-1)[0])
    log_prob = pb_utils.get_output_tensor_by_name(response, "output_log_prob")
    return StepOutput(token, None if log_prob is None else float(log_prob.as_numpy().reshape(-1)[0]))


def bls_release(seq_id: str) -> None:
    arrays = {"sequence_id": np.array([[seq_id.encode()]], dtype=object), "input_ids": np.zeros((1, 0), np.int32),
              "sequence_start": np.array([[False]]), "sequence_end": np.array([[True]])}
    pb_utils.InferenceRequest(model_name="decoder", inputs=tensors(pb_utils, arrays),
                              requested_output_names=["logits"]).exec()


class LastHeld:
    """Sends responses one behind, so the last one carries the final flag (non-streamed requests
    then get exactly one response, as the HTTP generate endpoint requires)."""

    def __init__(self, sender) -> None:
        self.sender, self.pending = sender, None

    def send(self, arrays) -> None:
        if self.pending is not None:
            self.sender.send(pb_utils.InferenceResponse(tensors(pb_utils, self.pending)))
        self.pending = arrays

    def close(self, error=None) -> None:
        if error is not None:
            self.sender.send(pb_utils.InferenceResponse(output_tensors=[], error=error), flags=FINAL)
        elif self.pending is not None:
            self.sender.send(pb_utils.InferenceResponse(tensors(pb_utils, self.pending)), flags=FINAL)
        else:
            self.sender.send(flags=FINAL)


class TritonPythonModel:
    def initialize(self, args):
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
        self.metrics = GenerateMetrics(pb_utils)
        self.test_delay_s = config.get_float("test_delay_ms", 0.0) / 1000.0

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                prepared = self.service.prepare(request_arrays(pb_utils, request, INPUT_NAMES),
                                                request_parameters(request))
            except Exception as error:
                self.metrics.error(type(error).__name__)
                LastHeld(sender).close(error_for(pb_utils, error))
                continue
            self.pool.submit(self.serve, request, sender, prepared)
        return None

    def serve(self, request, sender, prepared) -> None:
        held = LastHeld(sender)
        if self.test_delay_s and prepared.request.retry_reason is None:
            time.sleep(self.test_delay_s)  # test-only: a slow first attempt, so a hedge or retry wins
        try:
            with self.service.admission(prepared.request.num_return_sequences):
                self.metrics.active.set(self.service.active)
                self.metrics.request(prepared.path, prepared.bypass, prepared.degraded)
                generations = self.service.serve(prepared, held.send, request.is_cancelled, self.run_parallel)
            for generation in generations:
                self.metrics.finished(prepared.path, generation)
            held.close()
        except Exception as error:  # every request ends with the final flag, never a traceback
            self.metrics.error(type(error).__name__)
            held.pending = None
            held.close(error_for(pb_utils, error))
        finally:
            self.metrics.active.set(self.service.active)

    @staticmethod
    def run_parallel(jobs) -> None:
        if len(jobs) == 1:
            jobs[0]()
            return
        errors = []
        threads = [threading.Thread(target=lambda j=job: _collect(j, errors)) for job in jobs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def finalize(self):
        self.pool.shutdown(wait=False, cancel_futures=True)


def _collect(job, errors) -> None:
    try:
        job()
    except Exception as error:
        errors.append(error)
