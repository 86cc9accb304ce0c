"""Triton adapter for `zerocheck.decoder`: batched decoder steps with per-sequence KV cache.

A request holds R rows (one per sequence; `input_ids` rows padded at the end with -1). A request of
one row that fails is answered with its error; in a request of several rows each failed row carries
its error in `error` (see zerocheck.serving.row_errors) and zero logits, and the other rows succeed.
"""
import time

import numpy as np
import triton_python_backend_utils as pb_utils

from zerocheck.decoder import PoolFullError, StepRequest, load_decoder
from zerocheck.decoder.errors import DecoderError
from zerocheck.serving.inputs import InvalidRequest, Overloaded
from zerocheck.serving.row_errors import row_error_text
from zerocheck.serving.sampler_inputs import unpadded
from zerocheck.serving.triton import ModelConfig, error_response, request_arrays

INPUTS = ("sequence_id", "input_ids", "sequence_start", "sequence_end")


def parse(request) -> list[StepRequest]:
    arrays = request_arrays(pb_utils, request, INPUTS)
    seq_ids = arrays["sequence_id"].reshape(-1)
    ids = arrays["input_ids"]
    if ids.ndim != 2 or ids.shape[0] != len(seq_ids) or ids.dtype.kind not in "iu":
        raise InvalidRequest(f"input_ids must be INT32 of shape [{len(seq_ids)}, N], got {ids.dtype} {list(ids.shape)}")
    starts, ends = arrays["sequence_start"].reshape(-1), arrays["sequence_end"].reshape(-1)
    return [StepRequest(seq_id.decode() if isinstance(seq_id, bytes) else str(seq_id), unpadded(row).tolist(),
                        bool(start), bool(end)) for seq_id, row, start, end in zip(seq_ids, ids, starts, ends)]


def client_error(error: Exception) -> Exception:
    """A decoder row error as the client should see it (a failed forward stays an internal error)."""
    if isinstance(error, PoolFullError):
        return Overloaded(f"{error}; retry later")
    return InvalidRequest(str(error)) if isinstance(error, DecoderError) else error


class TritonPythonModel:
    def initialize(self, args):
        config = ModelConfig(args)
        self.engine = load_decoder(config.artifacts_dir(), backend=config.get("backend", "onnxruntime"),
                                   max_slots=config.get_int("max_slots", 16),
                                   max_seq_len=config.get_int("max_seq_len", 0) or None,
                                   idle_timeout_s=config.get_float("idle_timeout_s", 60.0),
                                   num_threads=config.get_int("num_threads", 0) or None,
                                   fail_token=config.get_int("test_fail_token", -1))
        self.delay_s = config.get_float("test_delay_ms", 0.0) / 1000.0
        gauge = pb_utils.MetricFamily.GAUGE  # families must outlive their metrics: keep both
        self.families = [pb_utils.MetricFamily(name="zerocheck_kv_slots_in_use", description="KV cache slots held "
                                               "by sequences", kind=gauge),
                         pb_utils.MetricFamily(name="zerocheck_kv_slots_total", description="KV cache slots in the pool",
                                               kind=gauge)]
        self.kv_slots, self.kv_capacity = (family.Metric(labels={"model": config.name}) for family in self.families)
        self.kv_capacity.set(self.engine.pool.max_slots)

    def execute(self, requests):
        if self.delay_s:
            time.sleep(self.delay_s)
        responses = [None] * len(requests)
        steps, spans = [], []
        for i, request in enumerate(requests):
            try:
                rows = parse(request)
            except Exception as error:  # a malformed request fails alone
                responses[i] = error_response(pb_utils, error)
                continue
            spans.append((i, len(steps), len(steps) + len(rows)))
            steps += rows
        if steps:
            try:
                result = self.engine.step(steps)
            except Exception as error:  # not a row's fault: every request of the step gets it
                for i, _, _ in spans:
                    responses[i] = error_response(pb_utils, error)
            else:
                self.answer(result, spans, responses)
        self.kv_slots.set(self.engine.pool.in_use)
        return responses

    def answer(self, result, spans, responses) -> None:
        logits = result.logits.numpy()
        errors = [None if error is None else client_error(error) for error in result.errors]
        for i, begin, end in spans:
            if end - begin == 1 and errors[begin] is not None:
                responses[i] = error_response(pb_utils, errors[begin])
                continue
            texts = np.array([[row_error_text(error).encode()] for error in errors[begin:end]], dtype=object)
            responses[i] = pb_utils.InferenceResponse([pb_utils.Tensor("logits", logits[begin:end]),
                                                       pb_utils.Tensor("error", texts)])
