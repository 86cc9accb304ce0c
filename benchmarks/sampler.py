"""Sampler microbenchmark: checked chain vs zero-check sampler (eager torch and the server's runner)
vs a memory-bound floor.

    python benchmarks/sampler.py                     # B in {1,8,32,128}, V in {32000,128256}, CPU
    python benchmarks/sampler.py --device cuda --json results/sampler_cuda.json
    python benchmarks/sampler.py --quick             # B=32, V=128256 only

For every (V, B, logits kind, parameter mix) it times one call of `checked_sample`,
`zero_check_sample` (eager torch), the runner the server uses (`make_sampler`: the compiled CPU
kernel on CPU, CUDA graphs on GPU) and the floor `logits.amax(dim=-1)` (one read of the logits),
each call on logits just written after a read of FLUSH_BYTES of other memory (as a decoder step leaves the
caches: its weights read, then its logits written), the floor's calls included, so every contender starts from
the same cache state whatever ran before it; interleaved round-robin so machine noise hits all alike (under the
server's OpenMP settings), and prints the medians and the ratios
checked / zero-check, eager / runner and runner / floor. Rows are unseeded (the common serving case); histories
are `TokenHistory` objects, as the server's decoder keeps them.
No assertion on timings: the ratios are the result.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

from zerocheck.serve.binary import THREAD_ENVIRONMENT

for _name, _value in THREAD_ENVIRONMENT.items():  # the server's OpenMP settings, before torch starts its threads
    os.environ.setdefault(_name, _value)

import torch  # noqa: E402

from zerocheck.sampling import SamplingParams, checked_sample, zero_check_sample  # noqa: E402
from zerocheck.sampling.cuda_graph import make_sampler  # noqa: E402
from zerocheck.sampling.history import TokenHistory  # noqa: E402

HISTORY_TOKENS = 256
BIG_CALL = 4_000_000  # B * V above which the slow checked chain runs every third round only
FLOOR_CALLS = 3  # the floor is cheap and noisy: several timed calls per round
# read before every timed call (twice this machine's 32 MB L3): without it each call finds the caches as the call
# before it left them, so the floor, timed after itself, reads warm logits where the runner, timed after the eager
# path's 16 MB scratch passes, does not, and the comparison favours the floor
FLUSH_BYTES = 64 << 20

MIXES: dict[str, tuple[SamplingParams, bool]] = {  # name -> (params of every row, needs a history)
    "greedy": (SamplingParams(temperature=0.0), False),
    "T0.7": (SamplingParams(temperature=0.7), False),
    "top_k50": (SamplingParams(top_k=50), False),
    "top_p0.9": (SamplingParams(top_p=0.9), False),
    "min_p0.05": (SamplingParams(min_p=0.05), False),
    "k50+p0.9+T0.7": (SamplingParams(top_k=50, top_p=0.9, temperature=0.7), False),
    "penalties+k50": (SamplingParams(top_k=50, repetition_penalty=1.2, presence_penalty=0.5,
                                     frequency_penalty=0.3), True),
}


def gaussian_logits(batch: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """[B, V] float32 N(0, 3^2): a flat distribution, the hard case for top-p."""
    return torch.randn(batch, vocab, generator=gen) * 3.0


def zipf_logits(batch: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """[B, V] float32 -1.1 * log(rank) with a random rank permutation per row, plus small noise:
    a peaked, LM-like distribution."""
    ranks = torch.argsort(torch.rand(batch, vocab, generator=gen), dim=-1).to(torch.float32) + 1.0
    return -1.1 * torch.log(ranks) + 0.05 * torch.randn(batch, vocab, generator=gen)


LOGITS: dict[str, Callable[[int, int, torch.Generator], torch.Tensor]] = {
    "gauss": gaussian_logits, "zipf": zipf_logits}


def timed(fn: Callable[[], object], device: torch.device, fresh: Callable[[], object] | None = None) -> float:
    """Seconds for one call (right after `fresh()`, untimed, when given), synchronising around it on CUDA."""
    if fresh is not None:
        fresh()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def bench_case(logits: torch.Tensor, params: list[SamplingParams], history: list[list[int]] | None,
               repeats: int, device: torch.device, runner, thin_checked: bool = True) -> dict[str, float]:
    """Median seconds per call of each contender, calls interleaved round-robin. Before every timed call
    the logits are written anew from a copy (untimed), as a decoder step writes them before the sampler
    reads them, after FLUSH_BYTES of other memory are read: every contender, the floor included, starts from the
    same cache and thread state. thin_checked: on big calls, time the slow checked chain every third round only."""
    source = logits.clone()
    flush = torch.ones(FLUSH_BYTES // 4, device=logits.device)

    def fresh() -> None:
        flush.sum()
        logits.copy_(source)

    calls = {
        "floor": lambda: logits.amax(dim=-1),
        "zero_check": lambda: zero_check_sample(logits, params, history),
        "runner": lambda: runner.sample(logits, params, history).raise_errors(),
        "checked": lambda: checked_sample(logits, params, history),
    }
    big = thin_checked and logits.numel() > BIG_CALL
    times: dict[str, list[float]] = {name: [] for name in calls}
    for name, fn in calls.items():  # warm-up (the slow chain needs none on big calls)
        if not (name == "checked" and big):
            fn()
    for r in range(repeats):
        for name, fn in calls.items():
            if name == "checked" and big and r % 3:
                continue  # every third round only for the slow chain on big calls
            for _ in range(FLOOR_CALLS if name == "floor" else 1):
                times[name].append(timed(fn, device, fresh))
    return {name: statistics.median(t) for name, t in times.items()}


def run(args: argparse.Namespace) -> list[dict]:
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    rows = []
    print(f"{'V':>7} {'B':>4} {'logits':>6} {'mix':>14} {'checked ms':>11} {'zero-chk ms':>11} {'runner ms':>9} "
          f"{'floor ms':>9} {'chk/zc':>7} {'zc/run':>7} {'run/floor':>9}", flush=True)
    for vocab in args.vocab:
        for batch in args.batch:
            runner = make_sampler(vocab, batch, device)
            history = [TokenHistory(torch.randint(0, vocab, (HISTORY_TOKENS,), generator=gen).tolist())
                       for _ in range(batch)]  # as the server's decoder keeps them
            for kind, make in LOGITS.items():
                logits = make(batch, vocab, gen).to(device)
                for mix, (params, needs_history) in MIXES.items():
                    t = bench_case(logits, [params] * batch, history if needs_history else None,
                                   args.repeats, device, runner, thin_checked=not args.quick)
                    row = dict(device=device.type, vocab=vocab, batch=batch, logits=kind, mix=mix,
                               checked_s=t["checked"], zero_check_s=t["zero_check"], runner_s=t["runner"],
                               floor_s=t["floor"], checked_over_zero_check=t["checked"] / t["zero_check"],
                               eager_over_runner=t["zero_check"] / t["runner"],
                               runner_over_floor=t["runner"] / t["floor"])
                    rows.append(row)
                    print(f"{vocab:>7} {batch:>4} {kind:>6} {mix:>14} {1e3 * t['checked']:>11.2f} "
                          f"{1e3 * t['zero_check']:>11.2f} {1e3 * t['runner']:>9.2f} {1e3 * t['floor']:>9.3f} "
                          f"{row['checked_over_zero_check']:>7.1f} {row['eager_over_runner']:>7.1f} "
                          f"{row['runner_over_floor']:>9.1f}", flush=True)
    return rows


def summary(rows: list[dict]) -> str:
    geo = lambda xs: math.exp(statistics.fmean(math.log(x) for x in xs))  # noqa: E731
    return (f"geometric means over {len(rows)} rows: checked/zero-check "
            f"{geo([r['checked_over_zero_check'] for r in rows]):.2f}x, eager/runner "
            f"{geo([r['eager_over_runner'] for r in rows]):.2f}x, runner/floor "
            f"{geo([r['runner_over_floor'] for r in rows]):.1f}x")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000, 128256])
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per contender (default 5, quick 3)")
    parser.add_argument("--quick", action="store_true", help="only B=32, V=128256")
    parser.add_argument("--json", type=Path, help="write the rows to this file")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.vocab = [32], [128256]
    if args.repeats is None:
        args.repeats = 3 if args.quick else 5
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"sampler benchmark: torch {torch.__version__} on {args.device}, {torch.get_num_threads()} threads, "
          f"repeats {args.repeats}", flush=True)
    start = time.perf_counter()
    rows = run(args)
    print(summary(rows))
    print(f"done in {time.perf_counter() - start:.0f}s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
