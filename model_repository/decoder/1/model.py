"""Triton adapter for `zerocheck.serving.decoder_service`: batched decoder steps with per-sequence KV
cache, and the zero-check sampler fused after the forward for requests that ask for `output_id`.

A request of one row that fails is answered with its error; in a request of several rows each failed
row carries its error in `error` (see zerocheck.serving.row_errors) and the other rows succeed.
"""
import time

import numpy as np
import triton_python_backend_utils as pb_utils

from zerocheck.decoder import load_decoder
from zerocheck.sampling.cuda_graph import make_sampler
from zerocheck.serving.decoder_service import DecoderService, StepRows, parse_step_rows
from zerocheck.serving.metrics import DeferredMetrics
from zerocheck.serving.row_errors import row_error_text
from zerocheck.serving.sampler_inputs import parse_sampler_rows
from zerocheck.serving.triton import ModelConfig, error_response

STEP_INPUTS = ("sequence_id", "input_ids", "sequence_start", "sequence_end")


def parse(request, vocab_size: int) -> StepRows:
    present = {tensor.name(): tensor for tensor in request.inputs()}
    steps = parse_step_rows({name: present[name].as_numpy() for name in STEP_INPUTS if name in present})
    wanted = set(request.requested_output_names())
    sampling = parse_sampler_rows(present, len(steps), vocab_size) if "output_id" in wanted else None
    return StepRows(steps, sampling, "logits" in wanted)


def respond(answer) -> object:
    if len(answer.errors) == 1 and answer.errors[0] is not None:
        return error_response(pb_utils, answer.errors[0])
    texts = np.array([[row_error_text(error).encode()] for error in answer.errors], dtype=object)
    return pb_utils.InferenceResponse([pb_utils.Tensor(name, array) for name, array in answer.outputs.items()]
                                      + [pb_utils.Tensor("error", texts)])


class TritonPythonModel:
    def initialize(self, args):
        config = ModelConfig(args)
        engine = load_decoder(config.artifacts_dir(), backend=config.get("backend", "onnxruntime"),
                              max_slots=config.get_int("max_slots", 16),
                              max_seq_len=config.get_int("max_seq_len", 0) or None,
                              idle_timeout_s=config.get_float("idle_timeout_s", 60.0),
                              num_threads=config.get_int("num_threads", 0) or None,
                              fail_token=config.get_int("test_fail_token", -1),
                              dtype=config.get("dtype", "auto"))
        self.service = DecoderService(engine, make_sampler(engine.vocab_size, config.max_batch_size, "cpu"))
        self.delay_s = config.get_float("test_delay_ms", 0.0) / 1000.0
        labels = {"model": config.name}
        gauge, counter = pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.COUNTER
        self.families = [  # families must outlive their metrics: keep both
            pb_utils.MetricFamily(name="zerocheck_kv_slots_in_use", description="KV cache slots held by sequences",
                                  kind=gauge),
            pb_utils.MetricFamily(name="zerocheck_kv_slots_total", description="KV cache slots in the pool", kind=gauge),
            pb_utils.MetricFamily(name="zerocheck_decoder_seconds_total", description="decoder execute time by stage: "
                                  "the forward, and the zero-check sampler fused after it", kind=counter)]
        self.kv_slots, self.kv_capacity = (family.Metric(labels=labels) for family in self.families[:2])
        self.stage_seconds = {stage: self.families[2].Metric(labels={**labels, "stage": stage})
                              for stage in ("forward", "sample")}
        self.kv_capacity.set(engine.pool.max_slots)
        self.metrics = DeferredMetrics(config.get_float("metrics_interval_s", 0.25))

    def execute(self, requests):
        if self.delay_s:
            time.sleep(self.delay_s)
        responses, parsed, indices = [None] * len(requests), [], []
        for i, request in enumerate(requests):
            try:
                parsed.append(parse(request, self.service.engine.vocab_size))
                indices.append(i)
            except Exception as error:  # a malformed request fails alone
                responses[i] = error_response(pb_utils, error)
        before = (self.service.forward_s, self.service.sample_s)
        try:
            answers = self.service.run(parsed) if parsed else []
        except Exception as error:  # not a row's fault: every request of the step gets it
            answers = [error] * len(parsed)
        for i, answer in zip(indices, answers):
            responses[i] = error_response(pb_utils, answer) if isinstance(answer, Exception) else respond(answer)
        self.metrics.increment(self.stage_seconds["forward"], self.service.forward_s - before[0])
        self.metrics.increment(self.stage_seconds["sample"], self.service.sample_s - before[1])
        self.metrics.set(self.kv_slots, self.service.engine.pool.in_use)
        self.metrics.flush()
        return responses
