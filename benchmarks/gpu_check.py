"""The GPU check, for a lent GPU machine (run by benchmarks/device_check.sh): correctness of the CUDA-graph sampler
and of the TensorRT-LLM logits processor on CUDA, then latencies; JSON into the output folder; exit 1 when a check
fails, when the time budget runs out, or without CUDA.

    PYTHONPATH=python_backend python3 benchmarks/gpu_check.py OUT_DIR            # on the GPU machine, <= 5 min
    PYTHONPATH=python_backend python3 benchmarks/gpu_check.py --dry-run OUT_DIR  # the same code on the CPU, small
                                                                                  # sizes; then refuses to pass

Checks (each returns a dict whose "ok" it computes):
- graph_equals_eager_v{V}: CUDA-graph tokens == the eager sampler's on the same device, over steps and bucket
  sizes with mixed rows (logit bias, penalties, bans, min-p, top-p, greedy, default dense rows).
- gpu_equals_cpu: CUDA-graph tokens vs the CPU runner's (`make_sampler` on the CPU) for the same logits, params,
  histories and keys (seed, step). float32 arithmetic in another order (group sums, exp, the top-p mass) can move
  a decision whose two sides are within rounding of each other: such float ties may differ, at most TIE_SHARE of
  the rows; each differing row is listed.
- host_syncs: synchronizing CUDA calls counted by torch.cuda.set_sync_debug_mode("warn") (each one warns; the
  warnings are recorded), per sampler call at B = 1, 8, 64 and per processor call; ok when repeated calls count
  the same and at least one is seen (the sampler reads back whether every row's max is finite: zero means the
  counting did not work).
- reproducible: a seeded row draws the same token on every batch position and alone.
- bf16_share: the share of bf16 top-k rows the graph serves (a k-th value tied past the candidates sends a row to
  the eager sampler).
- chi_square_top_k, chi_square_dense, chi_square_dense_top_p: draws of the candidate graph (top-k, top-p,
  temperature) and of the dense graphs (temperature and min-p; with top-p, the nucleus graph) against a float64
  reference written here from the definitions; p > 1e-3, no token outside the support.
- trtllm_processor: `ZeroCheckLogitsProcessor` in the stand-in engine loop (`zerocheck.trtllm.engine_loop`) on
  CUDA with bf16 logits of a table model (logits computed on the CPU, the same on both sides), tokens compared with
  the same loop on the CPU (one request of the twelve may part from it at a float tie), no mismatch reported by a
  processor, an edited row one-hot; the processor's synchronizing calls per call.
Latency (CUDA events, median ms per call, at B 1/8/32/64, V=128256, logits written anew after a read of a buffer of
4x the GPU's L2 before every call): the graph runner, the eager sampler, the checked chain, torch's
softmax/top-k/multinomial, FlashInfer's top-k/top-p when importable, amax (one read of the logits), and the
bandwidth floor: the logits' bytes at the read bandwidth measured over that 4x-L2 buffer.
"""
from __future__ import annotations

import argparse
import json
import math
import signal
import statistics
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from zerocheck.sampling import SamplingParams, ZeroCheckSampler, checked_sample
from zerocheck.sampling.cuda_graph import CudaGraphSampler, make_sampler
from zerocheck.trtllm import ZeroCheckLogitsProcessor
from zerocheck.trtllm.engine_loop import EngineLoop, EngineRequest

BUDGET_S = 290  # the whole script, checks and latencies; an alarm stops whatever runs 5 s later
TIE_SHARE = 0.005  # GPU rows that may differ from the CPU's (float ties)
P_MIN = 1e-3


def mixed_params(batch: int, seed: int) -> list[SamplingParams]:
    kinds = [SamplingParams(temperature=0.0), SamplingParams(top_k=40), SamplingParams(top_k=1),
             SamplingParams(top_k=20, top_p=0.8, temperature=0.7), SamplingParams(top_k=64, min_p=0.1),
             SamplingParams(top_k=10, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2,
                            bad_words=((3,), (5, 9))),
             SamplingParams(top_k=50, logit_bias=((7, 4.0), (11, -100.0))),
             SamplingParams(), SamplingParams(temperature=0.8, min_p=0.05, repetition_penalty=1.1),
             SamplingParams(top_p=0.9, temperature=0.7)]  # dense rows (the last: top-p in the dense graph)
    return [replace(kinds[b % len(kinds)], seed=seed + b) for b in range(batch)]


# -- measuring ---------------------------------------------------------------------------------------------------

def timed_ms(fn: Callable[[], object], device: torch.device, fresh: Callable[[], object] | None = None) -> float:
    """Milliseconds of one call (after `fresh()`, untimed): CUDA events around it on the current stream on a GPU,
    the host clock on the CPU."""
    if fresh is not None:
        fresh()
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - start)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end)


def synchronizing_calls(fn: Callable[[], object]) -> list[str]:
    """Where `fn` synchronised the host with the GPU: one entry ("file:line: message") per warning that
    torch.cuda.set_sync_debug_mode("warn") raises."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [f"{Path(w.filename).name}:{w.lineno}: {str(w.message)[:80]}" for w in caught
            if "synchroniz" in str(w.message).lower()]


def l2_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).L2_cache_size)
    return 1 << 20  # a dry run: small


class Flush:
    """A buffer of 4x the GPU's L2: reading it evicts what a call before left in the cache; timing that read
    gives the memory's read bandwidth."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.buffer = torch.ones(4 * l2_bytes(device) // 4, device=device)

    def __call__(self) -> None:
        self.buffer.sum()

    def bandwidth(self) -> dict:
        self()
        ms = statistics.median(timed_ms(self, self.device) for _ in range(10))
        nbytes = self.buffer.numel() * 4
        gb_s = nbytes / ms / 1e6
        return {"l2_bytes": l2_bytes(self.device), "buffer_bytes": nbytes, "read_ms": ms, "read_gb_s": gb_s,
                "ok": math.isfinite(gb_s) and gb_s > 0}


# -- a float64 reference, written from the definitions (tests/reference_sampling.py's order, no penalties) ------

def reference_probs(row: np.ndarray, params: SamplingParams) -> np.ndarray:
    """float64 [V]: temperature, top-k (every token >= the k-th kept), top-p on the top-k mass (the smallest top
    set reaching top_p, ties kept), min-p (>= min_p of the top probability)."""
    x = row.astype(np.float64)
    y = (x - x.max()) / params.temperature
    keep = np.ones(len(y), bool)
    if 0 < params.top_k < len(y):
        keep &= y >= np.partition(y, -params.top_k)[-params.top_k]
    probs = np.where(keep, np.exp(y), 0.0)
    probs /= probs.sum()
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cut = min(int(np.searchsorted(np.cumsum(probs[order]), params.top_p)), len(y) - 1)
        probs = np.where(probs >= probs[order[cut]], probs, 0.0)
    if params.min_p > 0.0:
        probs = np.where(probs >= params.min_p * probs.max(), probs, 0.0)
    return probs / probs.sum()


def chi_square_pvalue(tokens: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """(p-value, tokens drawn outside the support); bins with expected count < 5 pooled; the chi-square survival
    function by torch.special.gammaincc (no scipy on a bare machine)."""
    counts = np.bincount(tokens, minlength=len(probs)).astype(np.float64)
    support = probs > 0
    expected, observed = probs[support] * len(tokens), counts[support]
    small = expected < 5
    if small.any():
        expected = np.append(expected[~small], expected[small].sum())
        observed = np.append(observed[~small], observed[small].sum())
    stat = float(((observed - expected) ** 2 / expected).sum())
    dof = len(expected) - 1
    pvalue = 1.0 if dof < 1 else float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                                               torch.tensor(stat / 2, dtype=torch.float64)))
    return pvalue, int(counts[~support].sum())


def peaked_row(vocab: int, seed: int, head: int, spread: float = 2.5) -> np.ndarray:
    """[V] float32: `head` tokens uniform in [-spread, 0], the rest ~14 lower."""
    rng = np.random.default_rng(seed)
    row = rng.normal(-14.0, 0.5, vocab)
    row[rng.choice(vocab, head, replace=False)] = rng.uniform(-spread, 0.0, head)
    return row.astype(np.float32)


# -- checks -------------------------------------------------------------------------------------------------------

def graph_equals_eager(device: torch.device, vocab: int, batches: list[int], steps: int) -> dict:
    sampler, eager = CudaGraphSampler(vocab, max(batches), device), ZeroCheckSampler()
    gen = torch.Generator(device=device).manual_seed(vocab)
    differing, calls = [], 0
    for batch in batches:
        history = [[3, 5, 9, 7 + b] for b in range(batch)]
        for step in range(steps):
            logits = torch.randn(batch, vocab, device=device, generator=gen) * 3
            params = mixed_params(batch, 1000 * batch)
            graph = sampler.sample(logits, params, history, step)
            reference = eager.sample(logits, params, history, step)
            calls += 1
            if not torch.equal(graph.tokens.cpu(), reference.tokens.cpu()) or graph.errors != reference.errors:
                differing.append({"batch": batch, "step": step})
            history = [h + [int(t)] for h, t in zip(history, graph.tokens.tolist())]
    return {"vocab": vocab, "calls": calls, "differing": differing, "replays": sampler.replays,
            "eager_calls": sampler.eager_calls, "ok": not differing and sampler.replays == calls}


def gpu_equals_cpu(device: torch.device, vocab: int, batches: list[int], steps: int) -> dict:
    graph, cpu = CudaGraphSampler(vocab, max(batches), device), make_sampler(vocab, max(batches), "cpu")
    gen = torch.Generator(device=device).manual_seed(vocab + 1)
    differing, rows = [], 0
    for batch in batches:
        history = [[3, 5, 9, 7 + b] for b in range(batch)]
        for step in range(steps):
            logits = torch.randn(batch, vocab, device=device, generator=gen) * 3
            params = mixed_params(batch, 2000 * batch)
            on_gpu = graph.sample(logits, params, history, step).tokens.cpu()
            host = logits.cpu()
            on_cpu = cpu.sample(host, params, history, step).tokens
            rows += batch
            for r in (on_gpu != on_cpu).nonzero().flatten().tolist():
                g, c = int(on_gpu[r]), int(on_cpu[r])
                differing.append({"batch": batch, "step": step, "row": r, "gpu": g, "cpu": c,
                                  "logit_gap": abs(float(host[r, g] - host[r, c]))})
            history = [h + [int(t)] for h, t in zip(history, on_gpu.tolist())]
    return {"vocab": vocab, "rows": rows, "cpu_runner": type(cpu).__name__, "differing": differing[:20],
            "differing_share": len(differing) / rows, "ok": len(differing) <= TIE_SHARE * rows}


def host_syncs(device: torch.device, vocab: int, batches: list[int]) -> dict:
    """Synchronizing calls per sampler call (three calls per batch size, after a warm-up call)."""
    if device.type != "cuda":
        return {"ok": False, "not_counted": "synchronizing calls are counted on CUDA only"}
    per_batch = {}
    for batch in batches:
        sampler = CudaGraphSampler(vocab, batch, device)
        logits, params = torch.randn(batch, vocab, device=device), mixed_params(batch, 5)
        history = [[3, 5, 9] for _ in range(batch)]
        sampler.sample(logits, params, history, 0)
        sites = [synchronizing_calls(lambda s=s: sampler.sample(logits, params, history, s)) for s in (1, 2, 3)]
        per_batch[batch] = {"syncs_per_call": [len(s) for s in sites], "where": sorted(set(sites[0]))}
    counts = [c for entry in per_batch.values() for c in entry["syncs_per_call"]]
    steady = all(len(set(entry["syncs_per_call"])) == 1 for entry in per_batch.values())
    return {"vocab": vocab, "per_batch": per_batch, "ok": steady and min(counts) >= 1}


def reproducible(device: torch.device, vocab: int) -> dict:
    sampler = CudaGraphSampler(vocab, 8, device)
    logits = torch.randn(1, vocab, device=device).repeat(8, 1)
    params = [SamplingParams(top_k=40, temperature=0.9, seed=42)] * 8
    first, again = sampler.sample(logits, params).tokens.tolist(), sampler.sample(logits, params).tokens.tolist()
    alone = sampler.sample(logits[:1], params[:1]).tokens.tolist()
    return {"tokens": first, "ok": first == again and len(set(first)) == 1 and alone == first[:1]}


def bf16_share(device: torch.device, vocab: int, rows: int, batch: int) -> dict:
    sampler = CudaGraphSampler(vocab, batch, device)
    gen = torch.Generator(device=device).manual_seed(1)
    for start in range(0, rows, batch):
        logits = (torch.randn(batch, vocab, device=device, generator=gen) * 3).to(torch.bfloat16)
        sampler.sample(logits, [SamplingParams(top_k=50, seed=start + b) for b in range(batch)])
    served = rows - sampler.eager_rows
    return {"rows": rows, "served_by_graph": served, "share": served / rows, "ok": sampler.eager_calls == 0}


def chi_square(device: torch.device, vocab: int, draws: int, batch: int, params: SamplingParams, head: int) -> dict:
    """Graph draws of one row (every draw its own seed) against `reference_probs`."""
    row = peaked_row(vocab, 0, head)
    probs = reference_probs(row, params)
    sampler = CudaGraphSampler(vocab, batch, device)
    logits = torch.from_numpy(row).to(device).unsqueeze(0).repeat(batch, 1)
    tokens = np.concatenate([sampler.sample(logits, [replace(params, seed=s + b) for b in range(batch)]).tokens.cpu()
                             .numpy() for s in range(0, draws, batch)])
    pvalue, outside = chi_square_pvalue(tokens, probs)
    return {"vocab": vocab, "params": repr(params), "draws": len(tokens), "replays": sampler.replays,
            "rows_redrawn_eager": sampler.eager_rows, "outside_support": outside, "pvalue": pvalue,
            "ok": outside == 0 and pvalue > P_MIN and sampler.replays > 0}


class TableForward:
    """A stand-in model for the engine loop: a request's next-token logits are a fixed low-rank table's row for its
    last token, computed on the CPU in float32 (the same numbers on every device), handed over in `dtype` on
    `device`."""

    def __init__(self, vocab: int, device: torch.device, dtype: torch.dtype = torch.bfloat16) -> None:
        gen = torch.Generator().manual_seed(7)
        self.embed, self.out = torch.randn(vocab, 32, generator=gen), torch.randn(32, vocab, generator=gen) * 0.6
        self.device, self.dtype = device, dtype

    def __call__(self, context, generation) -> torch.Tensor:
        last = [r.prompt[-1] for r in context] + [r.last_token() for r in generation]
        return (self.embed[last] @ self.out).to(device=self.device, dtype=self.dtype)

    def release(self, request) -> None:
        pass


def trtllm_processor(device: torch.device, vocab: int, requests: int, max_tokens: int) -> dict:
    """The processor in the stand-in engine loop on `device` vs on the CPU; its synchronizing calls per call."""
    def run(on: torch.device) -> tuple[dict[int, list[int]], list[ZeroCheckLogitsProcessor]]:
        processors = [ZeroCheckLogitsProcessor(p, min_tokens=2, end_ids=(0,)) for p in mixed_params(requests, 77)]
        batch = [EngineRequest(r, [1 + r, 2 * r + 3, 5], [processors[r]], max_tokens, frozenset({0}))
                 for r in range(requests)]
        return EngineLoop(TableForward(vocab, on)).run(batch, arrivals=[r // 4 for r in range(requests)]), processors

    start = time.perf_counter()
    on_device, processors = run(device)
    seconds = time.perf_counter() - start
    on_cpu, _ = run(torch.device("cpu"))
    pairs = [(a, b) for r in on_device for a, b in zip(on_device[r], on_cpu[r])]
    first_differences = {r: next((i for i, (a, b) in enumerate(zip(on_device[r], on_cpu[r])) if a != b), None)
                         for r in on_device}
    differing = {r: i for r, i in first_differences.items() if i is not None}
    logits = torch.from_numpy(peaked_row(vocab, 3, 60)).to(device=device, dtype=torch.bfloat16).view(1, 1, -1)
    probe = ZeroCheckLogitsProcessor(SamplingParams(top_k=40, top_p=0.9, seed=1))
    probe(0, logits.clone(), [[1, 2, 3]], None, None)
    edited = logits.clone()
    sites = (synchronizing_calls(lambda: probe(1, edited, [[1, 2, 3]], None, None))  # warm: the same step
             if device.type == "cuda" else probe(1, edited, [[1, 2, 3]], None, None))
    one_hot = int(torch.isfinite(edited.float()).sum()) == 1 and float(edited.float().max()) == 0.0
    return {"vocab": vocab, "requests": requests, "tokens": len(pairs), "seconds_on_device": seconds,
            "requests_differing_from_cpu": differing, "mismatches": sum(p.mismatches for p in processors),
            "syncs_per_processor_call": None if sites is None else len(sites), "sync_sites": sites,
            "one_hot": one_hot, "ok": one_hot and len(differing) <= 1 and not any(p.mismatches for p in processors)}


# -- latency --------------------------------------------------------------------------------------------------------

def torch_chain(logits: torch.Tensor, k: int, p: float) -> torch.Tensor:
    """The usual library sampler: softmax, top-k, top-p by sort and cumsum, multinomial."""
    values, ids = torch.topk(torch.softmax(logits, -1), k)
    keep = values.cumsum(-1) - values < p
    return ids.gather(1, torch.multinomial(values * keep, 1))


def latencies(device: torch.device, vocab: int, batches: list[int], repeats: int, flush: Flush, read_gb_s: float
              ) -> list[dict]:
    try:
        from flashinfer.sampling import top_k_top_p_sampling_from_logits
    except ImportError:
        top_k_top_p_sampling_from_logits = None
    rows = []
    for batch in batches:
        sampler, eager = CudaGraphSampler(vocab, batch, device), ZeroCheckSampler()
        source = torch.randn(batch, vocab, device=device) * 3
        logits = source.clone()
        params = [SamplingParams(top_k=50, top_p=0.9, temperature=0.7, seed=b) for b in range(batch)]
        calls = {"graph": lambda: sampler.sample(logits, params), "eager": lambda: eager.sample(logits, params),
                 "checked": lambda: checked_sample(logits, params), "torch": lambda: torch_chain(logits, 50, 0.9),
                 "amax": lambda: logits.amax(-1)}
        if top_k_top_p_sampling_from_logits is not None:
            calls["flashinfer"] = lambda: top_k_top_p_sampling_from_logits(logits, 50, 0.9)

        def fresh() -> None:
            flush()
            logits.copy_(source)

        for fn in calls.values():
            fn()  # warm-up
        row = {"batch": batch, **{name: statistics.median(timed_ms(fn, device, fresh) for _ in range(repeats))
                                  for name, fn in calls.items()}}
        row["bandwidth_floor"] = batch * vocab * 4 / read_gb_s / 1e6
        row["graph_over_floor"] = row["graph"] / row["bandwidth_floor"]
        rows.append(row)
        print("  " + " ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
              flush=True)
    return rows


# -- the run ------------------------------------------------------------------------------------------------------

class OutOfTime(Exception):
    """The script's time budget ran out while a check ran."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for gpu_check.json")
    parser.add_argument("--dry-run", action="store_true",
                        help="every check on the CPU at small sizes (the script's code, not the GPU): refuses to pass")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not args.dry_run:
        print("gpu_check: FAILED: torch sees no CUDA device; this check passes only on a GPU "
              "(--dry-run runs its code on the CPU)", file=sys.stderr)
        return 1
    device = torch.device("cuda" if cuda and not args.dry_run else "cpu")
    small = device.type == "cpu"
    vocabs, batches = ([1000, 4096], [1, 3, 8]) if small else ([32000, 128256], [1, 3, 8, 13, 32, 64])
    big = vocabs[-1]
    deadline = time.monotonic() + args.budget_s

    def out_of_time(signum, frame):
        raise OutOfTime(f"the budget of {args.budget_s:.0f} s ran out")

    signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(int(args.budget_s) + 5)
    report = {"device": str(device), "dry_run": args.dry_run, "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None, "budget_s": args.budget_s}
    flush = Flush(device)
    checks: dict[str, Callable[[], dict]] = {"bandwidth": flush.bandwidth}
    checks.update({f"graph_equals_eager_v{v}": lambda v=v: graph_equals_eager(device, v, batches, 3) for v in vocabs})
    checks.update(
        gpu_equals_cpu=lambda: gpu_equals_cpu(device, big, batches, 2),
        host_syncs=lambda: host_syncs(device, big, [1, 8, 64] if not small else [1, 8]),
        reproducible=lambda: reproducible(device, big),
        bf16_share=lambda: bf16_share(device, big, 64 if small else 640, 8 if small else 64),
        chi_square_top_k=lambda: chi_square(device, big, 2000 if small else 20000, 250,
                                            SamplingParams(top_k=40, top_p=0.9, temperature=0.8), 60),
        chi_square_dense=lambda: chi_square(device, big, 2000 if small else 20000, 250,
                                            SamplingParams(temperature=0.8, min_p=0.1), 200),
        chi_square_dense_top_p=lambda: chi_square(device, big, 2000 if small else 20000, 250,
                                                  SamplingParams(temperature=1.2, top_p=0.6, min_p=0.01), 200),
        trtllm_processor=lambda: trtllm_processor(device, 4096 if small else 32000, 12, 12 if small else 24))
    failed = []
    for name, check in checks.items():
        start = time.perf_counter()
        try:
            if time.monotonic() > deadline:
                raise OutOfTime(f"not run: the budget of {args.budget_s:.0f} s is spent")
            report[name] = check()
        except Exception as error:  # a crash or the budget is a failed check, reported with the others
            report[name] = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        report[name]["seconds"] = round(time.perf_counter() - start, 2)
        print(f"[{name}] {'ok' if report[name]['ok'] else 'FAILED'}: {json.dumps(report[name])[:300]}", flush=True)
        if not report[name]["ok"]:
            failed.append(name)
    try:
        if time.monotonic() > deadline - 60:
            raise OutOfTime("latencies not run: under 60 s of the budget left")
        clock = "CUDA events" if device.type == "cuda" else "host clock"
        print(f"latency at V={big} (median ms per call, {clock}):", flush=True)
        report["latency_ms"] = latencies(device, big, [1, 8] if small else [1, 8, 32, 64], 3 if small else 20, flush,
                                         report["bandwidth"].get("read_gb_s") or float("nan"))
    except Exception as error:
        report["latency_ms"] = {"error": f"{type(error).__name__}: {error}"}
        failed.append("latency")
    signal.alarm(0)
    report["failed"] = failed
    report["seconds"] = round(args.budget_s - (deadline - time.monotonic()), 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    if args.dry_run:
        print(f"gpu_check: dry run on {device}: {len(checks) - len([f for f in failed if f in checks])} of "
              f"{len(checks)} checks passed on the CPU; wrote {args.out / 'gpu_check.json'}; "
              f"REFUSED: a dry run proves the script, not the GPU", file=sys.stderr)
        return 1
    print(f"gpu_check: {'FAILED: ' + ', '.join(failed) if failed else 'ok'}; wrote {args.out / 'gpu_check.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
