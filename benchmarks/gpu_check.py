"""The GPU path in one go, for a lent GPU machine (run by benchmarks/device_check.sh): correctness checks
of the CUDA-graph sampler, then latencies, as JSON; exit 1 when a check fails or CUDA is missing.

    PYTHONPATH=python_backend:tests python benchmarks/gpu_check.py --out $OUT/device_check
    python benchmarks/gpu_check.py --device cpu --quick --out /tmp/x   # the same code on CPU, small (a dry run)

Checks: graph tokens == eager tokens over several steps and bucket sizes with mixed rows (logit bias,
penalties, bans, min_p, top_p, greedy, default dense rows) at V=32000 and 128256; host syncs per call
(`torch.cuda.set_sync_debug_mode`); seeded reproducibility across batch positions; the share of bf16
rows the graph serves (ties send rows eager); chi-square of graph draws against a float64 reference at
V=128256 through the group pre-filter. Latency: median ms per call at B 1/8/32/64, V=128256, of the
graph runner, the eager zero-check sampler, the checked chain, torch softmax+topk+multinomial,
FlashInfer's top-k/top-p sampling when importable, and one read of the logits (amax, the floor).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from reference_sampling import reference_probs
from sampler import timed  # benchmarks/sampler.py, beside this script
from zerocheck.sampling import SamplingParams, ZeroCheckSampler, checked_sample
from zerocheck.sampling.cuda_graph import CudaGraphSampler


def mixed_params(batch: int, seed: int) -> list[SamplingParams]:
    kinds = [SamplingParams(temperature=0.0), SamplingParams(top_k=40), SamplingParams(top_k=1),
             SamplingParams(top_k=20, top_p=0.8, temperature=0.7), SamplingParams(top_k=64, min_p=0.1),
             SamplingParams(top_k=10, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2,
                            bad_words=((3,), (5, 9))),
             SamplingParams(top_k=50, logit_bias=((7, 4.0), (11, -100.0))),
             SamplingParams(), SamplingParams(temperature=0.8, min_p=0.05, repetition_penalty=1.1),
             SamplingParams(top_p=0.9, temperature=0.7)]  # dense rows (the last: top-p in the dense graph)
    return [replace(kinds[b % len(kinds)], seed=seed + b) for b in range(batch)]


def graph_equals_eager(device: torch.device, vocab: int, batches: list[int], steps: int) -> dict:
    sampler, eager = CudaGraphSampler(vocab, max(batches), device), ZeroCheckSampler()
    gen = torch.Generator(device=device).manual_seed(vocab)
    differing, calls = [], 0
    for batch in batches:
        history = [[3, 5, 9, 7 + b] for b in range(batch)]
        for step in range(steps):
            logits = torch.randn(batch, vocab, device=device, generator=gen) * 3
            params = mixed_params(batch, 1000 * batch)
            graph, reference = sampler.sample(logits, params, history, step), eager.sample(logits, params, history, step)
            calls += 1
            if not torch.equal(graph.tokens.cpu(), reference.tokens.cpu()) or graph.errors != reference.errors:
                differing.append({"batch": batch, "step": step})
            history = [h + [int(t)] for h, t in zip(history, graph.tokens.tolist())]
    return {"vocab": vocab, "calls": calls, "differing": differing, "replays": sampler.replays,
            "eager_calls": sampler.eager_calls, "ok": not differing and sampler.replays == calls}


def host_syncs(device: torch.device, vocab: int, batch: int) -> dict:
    """Host synchronisations in one graph-served call (CUDA only: set_sync_debug_mode warns on each)."""
    if device.type != "cuda":
        return {"syncs_per_call": None, "ok": True, "note": "CUDA only"}
    sampler = CudaGraphSampler(vocab, batch, device)
    logits, params = torch.randn(batch, vocab, device=device), mixed_params(batch, 5)
    sampler.sample(logits, params)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            sampler.sample(logits, params)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return {"syncs_per_call": len(caught), "where": sorted({str(w.message)[:120] for w in caught}), "ok": True}


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


def chi_square(device: torch.device, vocab: int, draws: int, batch: int) -> dict:
    try:
        from scipy.stats import chisquare
    except ImportError:  # a bare machine may lack it: say so, the other checks still count
        return {"ok": True, "skipped": "scipy is not installed"}
    rng = np.random.default_rng(0)
    row = rng.normal(-14, 0.5, vocab).astype(np.float32)
    row[rng.choice(vocab, 60, replace=False)] = rng.uniform(-2.5, 0, 60)
    params = SamplingParams(top_k=40, top_p=0.9, temperature=0.8)
    probs = reference_probs(row, params)
    sampler = CudaGraphSampler(vocab, batch, device)
    logits = torch.from_numpy(row).to(device).unsqueeze(0).repeat(batch, 1)
    tokens = np.concatenate([sampler.sample(logits, [replace(params, seed=s + b) for b in range(batch)]).tokens.cpu()
                             .numpy() for s in range(0, draws, batch)])
    counts, support = np.bincount(tokens, minlength=vocab), probs > 0
    pvalue = float(chisquare(counts[support], probs[support] * len(tokens)).pvalue)
    return {"vocab": vocab, "draws": len(tokens), "outside_support": int(counts[~support].sum()), "pvalue": pvalue,
            "ok": counts[~support].sum() == 0 and pvalue > 1e-3}


def median_ms(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up
    return 1e3 * statistics.median(timed(fn, device) for _ in range(repeats))


def torch_chain(logits: torch.Tensor, k: int, p: float) -> torch.Tensor:
    """The usual library sampler: softmax, top-k, top-p by sort and cumsum, multinomial."""
    values, ids = torch.topk(torch.softmax(logits, -1), k)
    keep = values.cumsum(-1) - values < p
    return ids.gather(1, torch.multinomial(values * keep, 1))


def latencies(device: torch.device, vocab: int, batches: list[int], repeats: int) -> list[dict]:
    try:
        from flashinfer.sampling import top_k_top_p_sampling_from_logits
    except ImportError:
        top_k_top_p_sampling_from_logits = None
    rows = []
    for batch in batches:
        sampler, eager = CudaGraphSampler(vocab, batch, device), ZeroCheckSampler()
        logits = torch.randn(batch, vocab, device=device) * 3
        params = [SamplingParams(top_k=50, top_p=0.9, temperature=0.7, seed=b) for b in range(batch)]
        calls = {"graph": lambda: sampler.sample(logits, params), "eager": lambda: eager.sample(logits, params),
                 "checked": lambda: checked_sample(logits, params), "torch": lambda: torch_chain(logits, 50, 0.9),
                 "floor": lambda: logits.amax(-1)}
        if top_k_top_p_sampling_from_logits is not None:
            calls["flashinfer"] = lambda: top_k_top_p_sampling_from_logits(logits, 50, 0.9)
        row = {"batch": batch, **{name: median_ms(fn, device, repeats) for name, fn in calls.items()}}
        row["graph_over_floor"] = row["graph"] / row["floor"]
        rows.append(row)
        print("  " + " ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="small sizes (a dry run of the script on CPU)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/device_check"))
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: FAILED: torch sees no CUDA device", file=sys.stderr)
        return 1
    vocabs, batches = ([1000, 4096], [1, 3, 8]) if args.quick else ([32000, 128256], [1, 3, 8, 13, 32, 64])
    big = vocabs[-1]
    report = {"device": str(device), "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None}
    checks = {f"graph_equals_eager_v{v}": lambda v=v: graph_equals_eager(device, v, batches, 3) for v in vocabs}
    checks.update(host_syncs=lambda: host_syncs(device, big, batches[-1]), reproducible=lambda: reproducible(device, big),
                  bf16_share=lambda: bf16_share(device, big, 64 if args.quick else 640, 8 if args.quick else 64),
                  chi_square=lambda: chi_square(device, big, 2000 if args.quick else 20000, 250))
    failed = []
    for name, check in checks.items():
        start = time.perf_counter()
        try:
            report[name] = check()
        except Exception as error:  # a crash is a failed check, reported with the others
            report[name] = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        report[name]["seconds"] = round(time.perf_counter() - start, 2)
        print(f"[{name}] {'ok' if report[name]['ok'] else 'FAILED'}: {json.dumps(report[name])[:300]}", flush=True)
        if not report[name]["ok"]:
            failed.append(name)
    print(f"latency at V={big} (median ms per call):", flush=True)
    report["latency_ms"] = latencies(device, big, [1, 8] if args.quick else [1, 8, 32, 64], 3 if args.quick else 30)
    report["failed"] = failed
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    print(f"gpu_check: {'FAILED: ' + ', '.join(failed) if failed else 'ok'}; wrote {args.out / 'gpu_check.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
