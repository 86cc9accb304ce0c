"""Custom Prometheus metrics of the `generate` model, exported next to Triton's own on the
metrics port through `pb_utils.MetricFamily`.

zerocheck_requests_total{sampler, bypass}      requests by the path that served them (bypass rate)
zerocheck_degraded_total{reason}               zero-check requests served by the checked path
zerocheck_request_errors_total{code}           refused or failed requests, by error code (ErrorCode)
zerocheck_retried_requests_total{reason}       requests that say they retry another (retry_reason: slow_response
                                               = a hedge, unavailable = after a failure, other)
zerocheck_generated_tokens_total{sampler}      completion tokens
zerocheck_time_to_first_token_seconds{sampler} histogram
zerocheck_time_per_output_token_seconds{sampler} histogram
zerocheck_active_sequences                     sequences generating now
zerocheck_queue_wait_seconds                   histogram: from a request's arrival to its admission (a KV slot
                                               for each of its sequences), every door together
zerocheck_cancelled_slot_free_seconds          histogram: from seeing a cancellation (each decode step looks) to
                                               its KV slot freed

"""
from __future__ import annotations

from typing import Any

from zerocheck.api.errors import ErrorCode
from zerocheck.api.sampler_path import DEGRADE_REASONS, SamplerPath
from zerocheck.generate.sequence import Generation
from zerocheck.api.request import RETRY_REASONS

TTFT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
TPOT_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]
FREE_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
PATHS = tuple(SamplerPath)


class GenerateMetrics:
    def __init__(self, pb_utils: Any) -> None:
        family = pb_utils.MetricFamily
        self.families: list[Any] = []  # a MetricFamily must outlive its Metric objects

        def counter(name: str, doc: str) -> Any:
            return keep(family(name=name, description=doc, kind=family.COUNTER))

        def keep(created: Any) -> Any:
            self.families.append(created)
            return created

        requests = counter("zerocheck_requests_total", "generate requests by sampler path and check-layer bypass")
        self.requests = {(path, bypass): requests.Metric(labels={"sampler": path, "bypass": str(bypass).lower()})
                         for path in PATHS for bypass in (True, False)}
        # every known label value exists from the start (at 0), so rate() and the alerts see a series
        degraded = counter("zerocheck_degraded_total", "zero-check requests served by the checked path")
        self.degraded = {reason: degraded.Metric(labels={"reason": reason}) for reason in DEGRADE_REASONS}
        errors = counter("zerocheck_request_errors_total", "generate requests refused or failed, by error code")
        self.errors = {code: errors.Metric(labels={"code": code.value}) for code in ErrorCode}
        retried = counter("zerocheck_retried_requests_total", "requests retrying another, by retry_reason")
        self.retried = {reason: retried.Metric(labels={"reason": reason}) for reason in (*RETRY_REASONS, "other")}
        tokens = counter("zerocheck_generated_tokens_total", "completion tokens generated")
        self.tokens = {path: tokens.Metric(labels={"sampler": path}) for path in PATHS}
        ttft = keep(family(name="zerocheck_time_to_first_token_seconds", description="time to first token",
                           kind=family.HISTOGRAM))
        tpot = keep(family(name="zerocheck_time_per_output_token_seconds",
                           description="time per output token after the first", kind=family.HISTOGRAM))
        self.ttft = {p: ttft.Metric(labels={"sampler": p}, buckets=TTFT_BUCKETS) for p in PATHS}
        self.tpot = {p: tpot.Metric(labels={"sampler": p}, buckets=TPOT_BUCKETS) for p in PATHS}
        self.active = keep(family(name="zerocheck_active_sequences", description="sequences generating now",
                                  kind=family.GAUGE)).Metric(labels={})
        self.queue_wait = keep(family(
            name="zerocheck_queue_wait_seconds", kind=family.HISTOGRAM,
            description="from a request's arrival to its admission (KV-cache slots for its sequences)"
        )).Metric(labels={}, buckets=TTFT_BUCKETS)
        self.cancel_freed = keep(family(
            name="zerocheck_cancelled_slot_free_seconds", kind=family.HISTOGRAM,
            description="from seeing a cancellation at the start of a decode step to its KV slot freed"
        )).Metric(labels={}, buckets=FREE_BUCKETS)

    def request(self, path: SamplerPath, bypass: bool, degraded: str | None) -> None:
        self.requests[(path, bypass)].increment(1)
        if degraded:
            self.degraded[degraded].increment(1)

    def error(self, code: ErrorCode) -> None:
        self.errors[code].increment(1)

    def retry(self, reason: str | None) -> None:
        """Count a request that says it retries another one (its `retry_reason`)."""
        if reason is not None:
            self.retried[reason if reason in RETRY_REASONS else "other"].increment(1)

    def finished(self, path: SamplerPath, generation: Generation) -> None:
        self.tokens[path].increment(generation.completion_tokens)
        if generation.first_token_ns:
            self.ttft[path].observe((generation.first_token_ns - generation.arrival_ns) / 1e9)
            if generation.completion_tokens > 1:
                decode_s = (generation.last_token_ns - generation.first_token_ns) / 1e9
                self.tpot[path].observe(decode_s / (generation.completion_tokens - 1))
