"""The TensorRT-LLM logits processor's cost per request: `ZeroCheckLogitsProcessor` called once per request and
step as TensorRT-LLM's PyTorch backend calls it (a [1, 1, V] view of the request's row, token_ids = [prompt +
generated]), against a floor and against one batched sampler call.

    python benchmarks/trtllm_processor.py                          # B in {1, 8, 32, 64}, V = 49152, CPU
    python benchmarks/trtllm_processor.py --dtype bfloat16 --json /tmp/trtllm_processor.json
    python benchmarks/trtllm_processor.py --device cuda --quick

Per (mix, B) and round: B requests, each with its own seeded processor, take one step: the B processor calls in
the engine's order (timed together), the floor `logits[r].argmax()` for each row (one read of a row per request,
timed together), and `batched`: one call of the same zerocheck sampler over all B rows (what a batched hook would
cost; TensorRT-LLM's PyTorch backend has none: its `BatchedLogitsProcessor` reaches only the TensorRT-engine
executor). Before every timed contender the logits are written anew from a copy (untimed); after a round each
request appends its drawn token, so the steps and histories advance as in a generation. Prints medians in µs per
row and the ratios processor / floor and processor / batched. No assertion on timings: the ratios are the result.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from zerocheck.serve.binary import THREAD_ENVIRONMENT

for _name, _value in THREAD_ENVIRONMENT.items():  # the server's OpenMP settings, before torch starts its threads
    os.environ.setdefault(_name, _value)

import torch  # noqa: E402

from zerocheck.bench.machine import cpu  # noqa: E402
from zerocheck.sampling import SamplingParams  # noqa: E402
from zerocheck.sampling.cuda_graph import make_sampler  # noqa: E402
from zerocheck.sampling.history import TokenHistory  # noqa: E402
from zerocheck.trtllm import ZeroCheckLogitsProcessor  # noqa: E402

PROMPT_TOKENS = 256
MIXES: dict[str, SamplingParams] = {
    "T1.0": SamplingParams(),
    "k50+p0.9+T0.7": SamplingParams(top_k=50, top_p=0.9, temperature=0.7),
    "penalties+k50": SamplingParams(top_k=50, repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=0.3),
}


def zipf_logits(batch: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """[B, V] float32 -1.1 * log(rank), a random rank permutation per row, plus small noise: LM-like rows."""
    ranks = torch.argsort(torch.rand(batch, vocab, generator=gen), dim=-1).to(torch.float32) + 1.0
    return -1.1 * torch.log(ranks) + 0.05 * torch.randn(batch, vocab, generator=gen)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds for one call; on CUDA from events around it on the current stream."""
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3


def bench_case(params: SamplingParams, batch: int, vocab: int, dtype: torch.dtype, device: torch.device,
               repeats: int, gen: torch.Generator) -> dict[str, float]:
    """Median seconds per row of each contender over `repeats` rounds (one warm-up round first)."""
    source = zipf_logits(batch, vocab, gen).to(device=device, dtype=dtype)
    logits = source.clone()
    prompts = [torch.randint(0, vocab, (PROMPT_TOKENS,), generator=gen).tolist() for _ in range(batch)]
    processors = [ZeroCheckLogitsProcessor(replace(params, seed=1000 + r)) for r in range(batch)]
    token_ids = [[list(prompt)] for prompt in prompts]  # per request: [prompt + generated], one beam
    views = [logits[r].view(1, 1, -1) for r in range(batch)]
    histories = [TokenHistory(prompt) for prompt in prompts]
    batched_params = [p.params for p in processors]
    sampler = make_sampler(vocab, batch, device)  # the batched reference: every row in one call

    def requests() -> None:
        for r in range(batch):
            processors[r](r, views[r], token_ids[r], None, None)

    def floor() -> None:
        for r in range(batch):
            logits[r].argmax()

    def batched() -> None:
        steps = [len(ids[0]) - PROMPT_TOKENS for ids in token_ids]
        sampler.sample(logits, batched_params, histories, steps)

    calls = {"processor": requests, "floor": floor, "batched": batched}
    times: dict[str, list[float]] = {name: [] for name in calls}
    for round_ in range(repeats + 1):
        for name, fn in calls.items():
            logits.copy_(source)
            elapsed = timed(fn, device)
            if round_:
                times[name].append(elapsed / batch)
        logits.copy_(source)
        requests()  # this round's draws, appended as the engine appends them
        for r, token in enumerate(logits.argmax(-1).tolist()):
            token_ids[r][0].append(token)
            histories[r].extend([token])
    return {name: statistics.median(t) for name, t in times.items()}


def run(args: argparse.Namespace) -> list[dict]:
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    rows = []
    print(f"{'mix':>14} {'B':>3} {'processor us/row':>17} {'floor us/row':>13} {'batched us/row':>15} "
          f"{'proc/floor':>10} {'proc/batched':>12}", flush=True)
    for mix, params in MIXES.items():
        for batch in args.batch:
            t = bench_case(params, batch, args.vocab, dtype, device, args.repeats, gen)
            row = dict(device=device.type, dtype=args.dtype, vocab=args.vocab, batch=batch, mix=mix,
                       processor_s_per_row=t["processor"], floor_s_per_row=t["floor"],
                       batched_s_per_row=t["batched"], processor_over_floor=t["processor"] / t["floor"],
                       processor_over_batched=t["processor"] / t["batched"])
            rows.append(row)
            print(f"{mix:>14} {batch:>3} {1e6 * t['processor']:>17.1f} {1e6 * t['floor']:>13.1f} "
                  f"{1e6 * t['batched']:>15.1f} {row['processor_over_floor']:>10.1f} "
                  f"{row['processor_over_batched']:>12.2f}", flush=True)
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds per case (default 7, quick 3)")
    parser.add_argument("--quick", action="store_true", help="B in {1, 8} only")
    parser.add_argument("--json", type=Path, help="write the meta and rows to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch = [1, 8]
    if args.repeats is None:
        args.repeats = 3 if args.quick else 7
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"TensorRT-LLM processor benchmark: torch {torch.__version__} on {args.device} ({args.dtype}), "
          f"{torch.get_num_threads()} threads, V={args.vocab}, repeats {args.repeats}, load average {load}", flush=True)
    start = time.perf_counter()
    rows = run(args)
    print(f"done in {time.perf_counter() - start:.0f}s")
    if args.json:
        meta = {"command": " ".join(["benchmarks/trtllm_processor.py", *(argv if argv is not None else sys.argv[1:])]),
                "torch": torch.__version__, "threads": torch.get_num_threads(), "cpu": cpu(),
                "machine": platform.machine(), "load_average_at_start": load,
                "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
