"""End-to-end benchmark: the same workload through both sampler paths of one real server.

For each artifact set (vocab size) one server is started over a copy of the model repository
sized for the largest concurrency. For each concurrency level the two paths run interleaved
(A, B, B, A, ...) so machine noise hits both; every run sends `concurrency` streams at once, each
a fixed prompt with a fixed seed and `max_tokens` tokens. Triton's per-model statistics, taken
around every run, give the per-step time breakdown.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from zerocheck.bench.triton_stats import ModelTime, delta, snapshot, wait_until_idle
from zerocheck.clients import Client
from zerocheck.serve import TritonServer
from zerocheck.serve.repository import copy_repository

PATHS = ("zero_check", "checked")
# the models of each path's check layer; the zero-check sampler runs inside `decoder` (its own counter)
SAMPLER_MODELS = {"zero_check": (), "checked": ("penalties", "softmax", "top_k_top_p", "multinomial")}
PROMPTS = (
    "def merge_sort(items):", "The quick brown fox", "import numpy as np\n", "class Stack:\n    def push(self, item):",
    "Once upon a time", "SELECT name FROM users WHERE", "# Parse the configuration file", "for i in range(10):",
)


@dataclass
class Sample:
    """One request: seconds to first token, decode seconds per token after it, completion tokens."""

    ttft_s: float
    tpot_s: float
    tokens: int


@dataclass
class Run:
    path: str
    concurrency: int
    wall_s: float
    samples: list[Sample]
    models: dict[str, ModelTime] = field(default_factory=dict)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))] if ordered else 0.0


def one_request(url: str, index: int, path: str, max_tokens: int, sampling: dict) -> Sample:
    client = Client(url, protocol="grpc", timeout=600.0)
    result = client.generate(PROMPTS[index % len(PROMPTS)], max_tokens=max_tokens, seed=1000 + index,
                             zerocheck=path == "zero_check", min_tokens=max_tokens, **sampling)
    decode = (result.latency_s - result.ttft_s) / max(result.completion_tokens - 1, 1)
    return Sample(result.ttft_s, decode, result.completion_tokens)


def run_level(server: TritonServer, path: str, concurrency: int, max_tokens: int, sampling: dict) -> Run:
    before = snapshot(server.http_url, server.metrics_url)
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        samples = list(pool.map(lambda i: one_request(server.grpc_url, i, path, max_tokens, sampling),
                                range(concurrency)))
    wall = time.perf_counter() - start
    wait_until_idle(server.metrics_url)
    return Run(path, concurrency, wall, samples, delta(before, snapshot(server.http_url, server.metrics_url)))


def sized_repository(concurrency: int, decoder: dict[str, str] | None = None) -> Path:
    """A copy of model_repository/ whose KV pool (and so `generate`'s admission) fits `concurrency` sequences; `decoder`:
    more of the decoder's parameters (backend, dtype)."""
    target = Path(tempfile.mkdtemp(prefix="zerocheck-bench-")) / "model_repository"
    return copy_repository(target, {"decoder": {"max_slots": str(concurrency), **(decoder or {})}})


@dataclass
class Row:
    """Aggregates of one (vocab, concurrency, path)."""

    vocab: int
    concurrency: int
    path: str
    ttft_p50_ms: float
    ttft_p95_ms: float
    tpot_p50_ms: float
    tpot_p95_ms: float
    tokens_per_s: float
    decoder_ms_per_step: float  # the decoder's forward (its compute, the KV-cache gather included)
    sampler_ms_per_step: float  # the fused zero-check sampler, or the checked chain's models' execute
    transport_ms_per_step: float  # Triton copying those models' tensors in and out (compute_input + output)
    overhead_ms_per_step: float  # TPOT p50 - decoder - sampler: everything else (Triton overhead)
    decoder_batch: float
    queue_wait_ms: float = 0.0  # mean wait of the admitted requests for KV-cache slots


def aggregate(vocab: int, runs: list[Run]) -> Row:
    samples = [s for run in runs for s in run.samples]
    models: dict[str, ModelTime] = {}
    for run in runs:
        for name, t in run.models.items():
            models.setdefault(name, ModelTime()).add(t)
    path = runs[0].path
    decoder, generate = models.get("decoder", ModelTime()), models.get("generate", ModelTime())
    steps = max(decoder.steps, 1)  # forwards: a multi-step execute runs several
    samplers = [models.get(m, ModelTime()) for m in SAMPLER_MODELS[path]]
    sampler_ms = (decoder.sample_ns + sum(m.infer_ns for m in samplers)) / steps / 1e6
    decoder_ms = decoder.forward_ns / steps / 1e6
    transport_ms = sum(m.input_ns + m.output_ns for m in [decoder, *samplers]) / steps / 1e6
    tpot_p50 = percentile([s.tpot_s for s in samples], 50) * 1e3
    return Row(vocab, runs[0].concurrency, path,
               percentile([s.ttft_s for s in samples], 50) * 1e3, percentile([s.ttft_s for s in samples], 95) * 1e3,
               tpot_p50, percentile([s.tpot_s for s in samples], 95) * 1e3,
               sum(s.tokens for s in samples) / sum(run.wall_s for run in runs),
               decoder_ms, sampler_ms, transport_ms, max(tpot_p50 - decoder_ms - sampler_ms, 0.0), decoder.mean_batch(),
               generate.queue_wait_ns / max(generate.admitted, 1) / 1e6)


def bench_vocab(artifacts: Path, concurrencies: list[int], rounds: int, max_tokens: int, sampling: dict,
                log=print) -> list[Row]:
    repository = sized_repository(max(concurrencies))
    with TritonServer(repository, env={"ZEROCHECK_ARTIFACTS": str(artifacts)}) as server:
        vocab = json.loads((artifacts / "manifest.json").read_text())["vocab_size"]
        for path in PATHS:  # warm-up: first calls load kernels and allocate buffers
            run_level(server, path, min(concurrencies), 8, sampling)
        rows = []
        for concurrency in concurrencies:
            runs: dict[str, list[Run]] = {p: [] for p in PATHS}
            for r in range(rounds):
                for path in PATHS if r % 2 == 0 else PATHS[::-1]:
                    run = run_level(server, path, concurrency, max_tokens, sampling)
                    runs[path].append(run)
                    log(f"  V={vocab} c={concurrency} {path:10s} round {r}: {run.wall_s:.1f} s")
            rows += [aggregate(vocab, runs[p]) for p in PATHS]
    shutil.rmtree(repository.parent, ignore_errors=True)
    return rows


def ratios(rows: list[Row]) -> list[dict]:
    """checked / zero-check of each metric (tokens/s: zero-check / checked), per (vocab, concurrency)."""
    out = []
    keyed = {(r.vocab, r.concurrency, r.path): r for r in rows}
    for (vocab, concurrency, path), zero in keyed.items():
        if path != "zero_check":
            continue
        checked = keyed[(vocab, concurrency, "checked")]
        out.append({"vocab": vocab, "concurrency": concurrency,
                    **{f"{m}_ratio": getattr(checked, m) / max(getattr(zero, m), 1e-9)
                       for m in ("ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "tpot_p95_ms")},
                    "tokens_per_s_ratio": zero.tokens_per_s / max(checked.tokens_per_s, 1e-9),
                    "sampler_share_zero_check": zero.sampler_ms_per_step / max(zero.tpot_p50_ms, 1e-9),
                    "sampler_share_checked": checked.sampler_ms_per_step / max(checked.tpot_p50_ms, 1e-9)})
    return out


def table(rows: list[Row], ratio_rows: list[dict]) -> str:
    lines = [f"{'V':>7} {'conc':>4} {'path':>10} {'TTFT p50':>9} {'p95':>8} {'TPOT p50':>9} {'p95':>8} "
             f"{'tok/s':>8} {'dec ms':>7} {'samp ms':>8} {'ovh ms':>7} {'(copy)':>7} {'batch':>6} {'queue ms':>9}"]
    for r in rows:
        lines.append(f"{r.vocab:>7} {r.concurrency:>4} {r.path:>10} {r.ttft_p50_ms:9.1f} {r.ttft_p95_ms:8.1f} "
                     f"{r.tpot_p50_ms:9.2f} {r.tpot_p95_ms:8.2f} {r.tokens_per_s:8.1f} {r.decoder_ms_per_step:7.2f} "
                     f"{r.sampler_ms_per_step:8.2f} {r.overhead_ms_per_step:7.2f} {r.transport_ms_per_step:7.2f} "
                     f"{r.decoder_batch:6.1f} {r.queue_wait_ms:9.1f}")
    lines.append("")
    lines.append(f"{'V':>7} {'conc':>4} {'checked/zero-check: TTFT p95':>29} {'TPOT p50':>9} {'TPOT p95':>9} "
                 f"{'tok/s zc/chk':>13} {'sampler share zc':>17} {'checked':>8}")
    for q in ratio_rows:
        lines.append(f"{q['vocab']:>7} {q['concurrency']:>4} {q['ttft_p95_ms_ratio']:29.2f} {q['tpot_p50_ms_ratio']:9.2f} "
                     f"{q['tpot_p95_ms_ratio']:9.2f} {q['tokens_per_s_ratio']:13.2f} "
                     f"{q['sampler_share_zero_check']:17.1%} {q['sampler_share_checked']:8.1%}")
    return "\n".join(lines)


def chart(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    vocabs = sorted({r.vocab for r in rows})
    fig, axes = plt.subplots(1, 2 * len(vocabs), figsize=(6 * len(vocabs) * 2, 4))
    for v_index, vocab in enumerate(vocabs):
        for m_index, (metric, label) in enumerate((("tpot_p95_ms", "P95 TPOT (ms)"), ("tokens_per_s", "output tokens/s"))):
            ax = axes[2 * v_index + m_index]
            for p in PATHS:
                points = sorted((r.concurrency, getattr(r, metric)) for r in rows if r.vocab == vocab and r.path == p)
                ax.plot([c for c, _ in points], [y for _, y in points], marker="o", label=p)
            ax.set_title(f"V={vocab}: {label}")
            ax.set_xlabel("concurrent streams")
            ax.set_xscale("log", base=2)
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_results(rows: list[Row], out_dir: Path, meta: dict) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out_dir / "e2e.json", out_dir / "e2e.png"
    json_path.write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows], "ratios": ratios(rows)},
                                    indent=2))
    chart(rows, png_path)
    return json_path, png_path

