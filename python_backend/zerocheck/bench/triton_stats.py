"""Per-model time from Triton's statistics extension (`GET /v2/models/stats`), as deltas.

Triton counts, per model, executions (batches), inferences (requests) and cumulative nanoseconds
spent queued and computing. The difference of two snapshots over one benchmark run says where that
run's time went: per decoder step (`zerocheck_decoder_steps_total`: one batched forward; a multi-step execute
runs several) and per inference (one request).
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass

import requests


@dataclass
class ModelTime:
    """Totals of one model between two snapshots (nanoseconds, counts)."""

    executions: int = 0
    inferences: int = 0
    queue_ns: int = 0
    input_ns: int = 0  # compute_input: Triton copying the inputs in (to the stub's shared memory)
    infer_ns: int = 0  # compute_infer: the model's execute
    output_ns: int = 0  # compute_output: Triton taking the outputs back
    forward_ns: int = 0  # decoder only: the part of infer spent in the forward (the model's compute)
    sample_ns: int = 0  # decoder only: the part of infer spent in the fused zero-check sampler
    steps: int = 0  # decoder only: forwards run (an execute of a multi-step call runs several)
    queue_wait_ns: int = 0  # generate only: admitted requests' waits for KV-cache slots (zerocheck_queue_wait_seconds)
    admitted: int = 0  # generate only: requests those waits are of

    def add(self, other: "ModelTime") -> None:
        self.executions += other.executions
        self.inferences += other.inferences
        self.queue_ns += other.queue_ns
        self.input_ns += other.input_ns
        self.infer_ns += other.infer_ns
        self.output_ns += other.output_ns
        self.forward_ns += other.forward_ns
        self.sample_ns += other.sample_ns
        self.steps += other.steps
        self.queue_wait_ns += other.queue_wait_ns
        self.admitted += other.admitted

    def mean_batch(self) -> float:
        return self.inferences / self.executions if self.executions else 0.0


STAGE_SECONDS = re.compile(r'^zerocheck_decoder_seconds_total\{[^}]*stage="(\w+)"[^}]*\} (\S+)$', re.M)
DECODER_STEPS = re.compile(r'^zerocheck_decoder_steps_total\{[^}]*\} (\S+)$', re.M)
QUEUE_WAIT = re.compile(r'^zerocheck_queue_wait_seconds_(sum|count)(?:\{[^}]*\})? (\S+)$', re.M)
KV_SLOTS_IN_USE = re.compile(r'^zerocheck_kv_slots_in_use\{[^}]*\} (\S+)$', re.M)


def snapshot(http_url: str, metrics_url: str | None = None) -> dict[str, ModelTime]:
    """Cumulative times of every model now; with metrics_url, also the decoder's forward and fused
    sampler times (its `zerocheck_decoder_seconds_total{stage}` counters)."""
    stats = requests.get(f"http://{http_url}/v2/models/stats", timeout=30).json()["model_stats"]
    out = {}
    for model in stats:
        s = model["inference_stats"]
        out[model["name"]] = ModelTime(
            executions=int(model.get("execution_count", 0)), inferences=int(model.get("inference_count", 0)),
            queue_ns=int(s["queue"]["ns"]), input_ns=int(s["compute_input"]["ns"]),
            infer_ns=int(s["compute_infer"]["ns"]), output_ns=int(s["compute_output"]["ns"]))
    if metrics_url is not None and "decoder" in out:
        text = requests.get(f"http://{metrics_url}/metrics", timeout=30).text
        stages = dict(STAGE_SECONDS.findall(text))
        out["decoder"].forward_ns = int(float(stages.get("forward", 0)) * 1e9)
        out["decoder"].sample_ns = int(float(stages.get("sample", 0)) * 1e9)
        out["decoder"].steps = sum(int(float(value)) for value in DECODER_STEPS.findall(text))
        if "generate" in out:
            waits = {kind: float(value) for kind, value in QUEUE_WAIT.findall(text)}
            out["generate"].queue_wait_ns = int(waits.get("sum", 0.0) * 1e9)
            out["generate"].admitted = int(waits.get("count", 0.0))
    return out


def wait_until_idle(metrics_url: str, timeout_s: float = 10.0) -> None:
    """Wait until the decoder holds no KV slot: every sequence released, so its metrics are pushed
    (`DeferredMetrics`) and a snapshot taken now holds the whole run."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = KV_SLOTS_IN_USE.findall(requests.get(f"http://{metrics_url}/metrics", timeout=30).text)
        if found and not any(float(value) for value in found):
            return
        time.sleep(0.05)


def delta(before: dict[str, ModelTime], after: dict[str, ModelTime]) -> dict[str, ModelTime]:
    """after - before, per model."""
    out = {}
    for name, a in after.items():
        b = before.get(name, ModelTime())
        out[name] = ModelTime(a.executions - b.executions, a.inferences - b.inferences, a.queue_ns - b.queue_ns,
                              a.input_ns - b.input_ns, a.infer_ns - b.infer_ns, a.output_ns - b.output_ns,
                              a.forward_ns - b.forward_ns, a.sample_ns - b.sample_ns, a.steps - b.steps,
                              a.queue_wait_ns - b.queue_wait_ns, a.admitted - b.admitted)
    return out
