"""Per-model time from Triton's statistics extension (`GET /v2/models/stats`), as deltas.

Triton counts, per model, executions (batches), inferences (requests) and cumulative nanoseconds
spent queued and computing. The difference of two snapshots over one benchmark run says where that
run's time went: per execution (one batched decode step) and per inference (one request).
"""
from __future__ import annotations

import re
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
    sample_ns: int = 0  # decoder only: the part of infer spent in the fused zero-check sampler

    @property
    def compute_ns(self) -> int:
        return self.input_ns + self.infer_ns + self.output_ns

    def add(self, other: "ModelTime") -> None:
        self.executions += other.executions
        self.inferences += other.inferences
        self.queue_ns += other.queue_ns
        self.input_ns += other.input_ns
        self.infer_ns += other.infer_ns
        self.output_ns += other.output_ns
        self.sample_ns += other.sample_ns

    def compute_ms_per_execution(self) -> float:
        return self.compute_ns / self.executions / 1e6 if self.executions else 0.0

    def queue_ms_per_inference(self) -> float:
        return self.queue_ns / self.inferences / 1e6 if self.inferences else 0.0

    def mean_batch(self) -> float:
        return self.inferences / self.executions if self.executions else 0.0


SAMPLE_SECONDS = re.compile(r'^zerocheck_decoder_seconds_total\{[^}]*stage="sample"[^}]*\} (\S+)$', re.M)


def snapshot(http_url: str, metrics_url: str | None = None) -> dict[str, ModelTime]:
    """Cumulative times of every model now; with metrics_url, also the decoder's fused sampler time
    (its `zerocheck_decoder_seconds_total{stage="sample"}` counter)."""
    stats = requests.get(f"http://{http_url}/v2/models/stats", timeout=30).json()["model_stats"]
    out = {}
    for model in stats:
        s = model["inference_stats"]
        out[model["name"]] = ModelTime(
            executions=int(model.get("execution_count", 0)), inferences=int(model.get("inference_count", 0)),
            queue_ns=int(s["queue"]["ns"]), input_ns=int(s["compute_input"]["ns"]),
            infer_ns=int(s["compute_infer"]["ns"]), output_ns=int(s["compute_output"]["ns"]))
    if metrics_url is not None and "decoder" in out:
        found = SAMPLE_SECONDS.search(requests.get(f"http://{metrics_url}/metrics", timeout=30).text)
        out["decoder"].sample_ns = int(float(found.group(1)) * 1e9) if found else 0
    return out


def delta(before: dict[str, ModelTime], after: dict[str, ModelTime]) -> dict[str, ModelTime]:
    """after - before, per model."""
    out = {}
    for name, a in after.items():
        b = before.get(name, ModelTime())
        out[name] = ModelTime(a.executions - b.executions, a.inferences - b.inferences, a.queue_ns - b.queue_ns,
                              a.input_ns - b.input_ns, a.infer_ns - b.infer_ns, a.output_ns - b.output_ns,
                              a.sample_ns - b.sample_ns)
    return out
