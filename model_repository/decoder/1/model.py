"""Triton adapter for `zerocheck.decoder.service`: batched decoder steps with per-sequence KV cache and
sampling state, and the zero-check sampler fused after the forward for requests that ask for `output_id`.

A request of one row that fails is answered with its error; in a request of several rows each failed
row carries its error in `error` (see zerocheck.wire.step) and the other rows succeed.
"""
import logging
import time

import triton_python_backend_utils as pb_utils

from zerocheck.triton.config import DecoderParameters, ModelConfig, parameters
from zerocheck.triton.metrics import DeferredMetrics
from zerocheck.triton.openmp import set_spin_count
from zerocheck.triton.tensors import error_response
from zerocheck.wire.sampling import SAMPLER_INPUTS
from zerocheck.wire.step import DECODER_INPUTS, parse_step, row_errors

log = logging.getLogger("zerocheck")
INPUTS = frozenset(spec.name for spec in DECODER_INPUTS)
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
EXPORTS = tuple(spec.name for spec in SAMPLER_INPUTS)


def parse(request, vocab_size: int, step_rows: type):
    """The request as a `zerocheck.decoder.service.StepRows` (`step_rows`: that class, imported in initialize)."""
    steps = parse_step({tensor.name(): tensor.as_numpy() for tensor in request.inputs() if tensor.name() in INPUTS},
                       vocab_size)
    wanted = set(request.requested_output_names())
    return step_rows(steps, want_token=bool(wanted & {"output_id", "output_ids"}), want_logits="logits" in wanted,
                     exports=tuple(name for name in EXPORTS if name in wanted))


def respond(answer) -> object:
    if len(answer.errors) == 1 and answer.errors[0] is not None:
        return error_response(pb_utils, answer.errors[0])
    return pb_utils.InferenceResponse([pb_utils.Tensor(name, array) for name, array in answer.outputs.items()]
                                      + [pb_utils.Tensor("error", row_errors(answer.errors))])


class TritonPythonModel:
    def initialize(self, args):
        config = ModelConfig(args)
        params = parameters(DecoderParameters, config)
        # the decoder's own OpenMP spin count, before the imports below load torch (and with it libgomp)
        set_spin_count(params.spin_count())
        from zerocheck.decoder import load_decoder
        from zerocheck.decoder.service import DecoderService, StepRows
        from zerocheck.grammar import GrammarCompiler
        from zerocheck.sampling.cuda_graph import make_sampler
        from zerocheck.tokenizer import load_tokenizer

        self.step_rows = StepRows
        engine = load_decoder(config.artifacts_dir(), backend=params.backend, max_slots=params.max_slots,
                              max_seq_len=params.max_seq_len or None, idle_timeout_s=params.idle_timeout_s,
                              num_threads=params.num_threads or None, fail_token=params.test_fail_token,
                              dtype=params.dtype, device=config.instance_device(params.device),
                              int4_single_row=params.int4_single_row,
                              int8_lm_head_single_row=params.int8_lm_head_single_row,
                              prefix_cache_tokens=params.prefix_cache_tokens)
        grammars = GrammarCompiler.for_tokenizer(load_tokenizer(config.artifacts_dir()), engine.vocab_size)
        self.service = DecoderService(engine, make_sampler(engine.vocab_size, config.max_batch_size, engine.device),
                                      grammars)
        self.delay_s = params.test_delay_ms / 1000.0
        labels = {"model": config.name}
        gauge, counter = pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.COUNTER
        self.families = [  # families must outlive their metrics: keep both
            pb_utils.MetricFamily(name="zerocheck_kv_slots_in_use", description="KV cache slots held by sequences",
                                  kind=gauge),
            pb_utils.MetricFamily(name="zerocheck_kv_slots_total", description="KV cache slots in the pool", kind=gauge),
            pb_utils.MetricFamily(name="zerocheck_decoder_seconds_total", description="decoder execute time by stage: "
                                  "the forward, and the zero-check sampler fused after it", kind=counter),
            pb_utils.MetricFamily(name="zerocheck_decoder_info", description="what the decoder runs with (chosen at "
                                  "load): backend, dtype, device; always 1", kind=gauge),
            pb_utils.MetricFamily(name="zerocheck_prefix_cache_reused_tokens_total", description="prompt positions "
                                  "whose keys and values came from the prefix cache instead of the forward",
                                  kind=counter),
            pb_utils.MetricFamily(name="zerocheck_decoder_steps_total", description="decoder steps (forwards) run: "
                                  "one an execute, several for a multi-step call (decode_steps)", kind=counter)]
        self.kv_slots, self.kv_capacity = (family.Metric(labels=labels) for family in self.families[:2])
        self.stage_seconds = {stage: self.families[2].Metric(labels={**labels, "stage": stage})
                              for stage in ("forward", "sample")}
        self.kv_capacity.set(engine.pool.max_slots)
        self.info = self.families[3].Metric(labels={**labels, "backend": engine.backend, "dtype": engine.dtype,
                                                    "device": engine.device})
        self.info.set(1)
        self.reused_tokens = self.families[4].Metric(labels=labels)
        self.steps = self.families[5].Metric(labels=labels)
        self.metrics = DeferredMetrics(params.metrics_interval_s)

    def execute(self, requests):
        """Every request answered, once. Release-only requests that the dynamic batcher merged with steps
        (it merges what arrives while a forward runs) are answered first, through their response senders,
        before the steps' forward: a freed slot is acknowledged without waiting for that forward (`generate`'s
        zerocheck_cancelled_slot_free_seconds); the others then go through their senders too. A release of a
        sequence that a step of the same execute touches keeps its place among the steps. Without such
        releases (or with releases only) the responses are returned as a list."""
        responses, parsed, indices = [None] * len(requests), [], []
        for i, request in enumerate(requests):
            try:
                parsed.append(parse(request, self.service.engine.vocab_size, self.step_rows))
                indices.append(i)
            except Exception as error:  # a malformed request fails alone
                responses[i] = error_response(pb_utils, error)
        stepped = {row.seq_id for rows in parsed if not rows.release_only for row in rows.steps}
        early, rest = [], []
        for k, rows in enumerate(parsed):
            (early if rows.release_only and not any(row.seq_id in stepped for row in rows.steps) else rest).append(k)
        if not early or len(early) == len(parsed):
            for i, response in zip(indices, self._answer(parsed), strict=True):
                responses[i] = response
            self._flush_metrics()
            return responses
        sent = set()
        try:
            for k, response in zip(early, self._answer([parsed[k] for k in early]), strict=True):
                requests[indices[k]].get_response_sender().send(response, flags=FINAL)
                sent.add(indices[k])
            for k, response in zip(rest, self._answer([parsed[k] for k in rest]), strict=True):
                responses[indices[k]] = response
        except Exception as error:  # once a response went through a sender, nothing may escape execute
            responses = [error_response(pb_utils, error) for _ in requests]
        for i, (request, response) in enumerate(zip(requests, responses)):
            if i not in sent:
                try:
                    request.get_response_sender().send(response, flags=FINAL)
                except Exception as error:  # the request is gone (its caller's side); the others still get theirs
                    log.error("decoder: answering request %d of %d failed: %s", i, len(requests), error)
        self._flush_metrics()
        return None

    def _answer(self, parsed: list) -> list:
        """The service run on these requests: a response each (a step that fails as a whole fails each)."""
        if self.delay_s and not all(rows.release_only for rows in parsed):
            time.sleep(self.delay_s)
        cache = self.service.engine.prefix_cache
        before = (self.service.forward_s, self.service.sample_s, cache.reused_tokens if cache is not None else 0,
                  self.service.forwards)
        try:
            answers = self.service.run(parsed) if parsed else []
        except Exception as error:  # not a row's fault: every request of the step gets it
            answers = [error] * len(parsed)
        self.metrics.increment(self.stage_seconds["forward"], self.service.forward_s - before[0])
        self.metrics.increment(self.stage_seconds["sample"], self.service.sample_s - before[1])
        self.metrics.increment(self.steps, self.service.forwards - before[3])
        if cache is not None:
            self.metrics.increment(self.reused_tokens, cache.reused_tokens - before[2])
        return [error_response(pb_utils, answer) if isinstance(answer, Exception) else respond(answer)
                for answer in answers]

    def _flush_metrics(self) -> None:
        self.metrics.set(self.kv_slots, self.service.engine.pool.in_use)
        self.metrics.flush()
