"""Triton adapter for `zerocheck.decoder`: batched decoder steps with per-sequence KV cache."""
import time

import numpy as np
import triton_python_backend_utils as pb_utils

from zerocheck.decoder import StepRequest, load_decoder
from zerocheck.serving.inputs import InvalidRequest, Overloaded
from zerocheck.serving.triton import ModelConfig, error_response, request_arrays

INPUTS = ("sequence_id", "input_ids", "sequence_start", "sequence_end")


def parse(request) -> StepRequest:
    arrays = request_arrays(pb_utils, request, INPUTS)
    seq_id = arrays["sequence_id"].reshape(-1)[0]
    ids = arrays["input_ids"]
    if ids.ndim != 2 or ids.dtype.kind not in "iu":
        raise InvalidRequest(f"input_ids must be INT32 of shape [1, N], got {ids.dtype} {list(ids.shape)}")
    return StepRequest(seq_id.decode() if isinstance(seq_id, bytes) else str(seq_id), ids[0].tolist(),
                       bool(arrays["sequence_start"].reshape(-1)[0]), bool(arrays["sequence_end"].reshape(-1)[0]))


class InjectedFault(RuntimeError):
    """test-only: raised for a step whose input holds the `test_fail_token` id."""


def refusal(message: str) -> Exception:
    return Overloaded(f"{message}; retry later") if message.startswith("KV cache pool full") else InvalidRequest(message)


class TritonPythonModel:
    def initialize(self, args):
        config = ModelConfig(args)
        self.engine = load_decoder(config.artifacts_dir(), backend=config.get("backend", "onnxruntime"),
                                   max_slots=config.get_int("max_slots", 16),
                                   max_seq_len=config.get_int("max_seq_len", 0) or None,
                                   idle_timeout_s=config.get_float("idle_timeout_s", 60.0),
                                   num_threads=config.get_int("num_threads", 0) or None)
        self.delay_s = config.get_float("test_delay_ms", 0.0) / 1000.0
        self.fail_token = config.get_int("test_fail_token", -1)
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
        steps, rows = [], []
        for i, request in enumerate(requests):
            try:
                step = parse(request)
            except Exception as error:  # a malformed request fails alone
                responses[i] = error_response(pb_utils, error)
                continue
            if not step.tokens and step.end:  # release only
                self.engine.release(step.seq_id)
                responses[i] = pb_utils.InferenceResponse([pb_utils.Tensor("logits", np.zeros((1, 0), np.float32))])
                continue
            steps.append(step)
            rows.append(i)
        if steps:
            self.run_steps(steps, rows, responses)
        self.kv_slots.set(self.engine.pool.in_use)
        return responses

    def run_steps(self, steps, rows, responses) -> None:
        """One batched forward; when it raises, each row is run alone, so only the rows that fail
        alone get the error (a failed forward writes no KV cache, so a row may run again)."""
        try:
            result = self.step(steps)
        except Exception as error:
            if len(steps) == 1:
                responses[rows[0]] = error_response(pb_utils, error)
                return
            for step, i in zip(steps, rows):
                self.run_steps([step], [i], responses)
            return
        logits = result.logits.numpy()
        for b, (i, message) in enumerate(zip(rows, result.errors)):
            responses[i] = (error_response(pb_utils, refusal(message)) if message else
                            pb_utils.InferenceResponse([pb_utils.Tensor("logits", logits[b:b + 1])]))

    def step(self, steps):
        if self.fail_token >= 0 and any(self.fail_token in step.tokens for step in steps):
            raise InjectedFault(f"test fault: token {self.fail_token} in a step's input")
        return self.engine.step(steps)
