"""Decoder step latency (openvino int8 / int4 / fp32, torch fp32 / bf16) and the sampler's share of a full
decode step.

    python benchmarks/decoder.py [--artifacts artifacts] [--artifacts-128k artifacts-128k] [--steps 20]

Prints, per backend and batch size, the median decode-step latency and tokens/s; then, at V=32000
and V=128256 (when that artifact set is built), the share of decoder + sampler time that
`checked_sample` (and `zero_check_sample`) takes. Ratios only, no asserts.

Each variant (backend:dtype) is measured in its own subprocess, alternating for `--rounds` rounds,
keeping the best median per cell: the runtimes' idle thread pools do not disturb each other, and a
noisy neighbour on a shared CPU hits all alike. bf16 runs where the CPU has bf16 instructions.
The subprocesses run under the server's OpenMP settings (`zerocheck.serve.binary.THREAD_ENVIRONMENT`).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from zerocheck import paths
from zerocheck.decoder import DecoderEngine, StepRequest, load_decoder
from zerocheck.decoder.engine import BF16_CPU_FLAGS, cpu_flags, variant_options
from zerocheck.serve.binary import THREAD_ENVIRONMENT

REPO_ROOT = Path(__file__).resolve().parents[1]
PROMPT_LEN = 32
VARIANTS = ["openvino:int8", "openvino:int8+int4", "openvino:int4", "openvino:fp32", "torch:fp32", "torch:bf16",
            "torch:bf16+int4", "torch:bf16+int4+int8head"]


def median_ms(run: Callable[[], object], steps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        run()
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return 1000 * statistics.median(times)


def decode_step_ms(engine: DecoderEngine, batch: int, steps: int) -> tuple[float, torch.Tensor]:
    """Prefill `batch` sequences, then time single-token decode steps. Returns (ms, last logits [B, V])."""
    seq_ids = [f"bench{i}" for i in range(batch)]
    prompt = [(7 * i) % engine.vocab_size for i in range(PROMPT_LEN)]
    engine.step([StepRequest(seq, prompt, start=True, end=False) for seq in seq_ids])
    decode = [StepRequest(seq, [1], start=False, end=False) for seq in seq_ids]
    last: list[torch.Tensor] = []
    ms = median_ms(lambda: last.append(engine.step(decode).logits), steps)
    for seq in seq_ids:
        engine.release(seq)
    return ms, last[-1]


def measure_backend(artifacts: Path, variant: str, batches: list[int], steps: int, threads: int | None) -> dict[int, float]:
    engine = load_decoder(artifacts, max_slots=max(batches), num_threads=threads, **variant_options(variant))
    return {batch: decode_step_ms(engine, batch, steps)[0] for batch in batches}


def measure_in_subprocess(artifacts: Path, variant: str, batches: list[int], steps: int, threads: int | None) -> dict[int, float]:
    command = [sys.executable, __file__, "--measure", variant, "--artifacts", str(artifacts), "--steps", str(steps),
               "--batches", *map(str, batches)] + (["--threads", str(threads)] if threads else [])
    env = {**THREAD_ENVIRONMENT, **os.environ}  # the server's OpenMP settings (as every model stub gets them)
    output = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
    return {int(batch): ms for batch, ms in json.loads(output.splitlines()[-1]).items()}


def backend_table(artifacts: Path, variants: list[str], batches: list[int], steps: int, threads: int | None,
                  rounds: int) -> dict[tuple[str, int], float]:
    results: dict[tuple[str, int], float] = {}
    for _ in range(rounds):
        for variant in variants:
            for batch, ms in measure_in_subprocess(artifacts, variant, batches, steps, threads).items():
                results[variant, batch] = min(ms, results.get((variant, batch), float("inf")))
    print(f"\ndecode step, {artifacts.name}: median ms/step (tokens/s)")
    print(f"{'batch':>6} " + " ".join(f"{variant:>24}" for variant in variants) + f" {'fastest':>18}")
    for batch in batches:
        cells = [f"{results[v, batch]:8.2f} ms ({batch / results[v, batch] * 1000:8.0f}/s)" for v in variants]
        fastest = min(variants, key=lambda v: results[v, batch])
        print(f"{batch:>6} " + " ".join(f"{cell:>24}" for cell in cells) + f" {fastest:>18}")
    return results


def sampler_share(artifacts: Path, variant: str, batches: list[int], steps: int, threads: int | None) -> None:
    """Decoder ms from a clean subprocess; sampler ms here, on random logits [B, V] of the same V."""
    try:
        from zerocheck.sampling import SamplingParams, checked_sample, zero_check_sample
    except ImportError as error:
        print(f"\nsampler share skipped: zerocheck.sampling is not importable yet ({error})")
        return
    vocab_size = json.loads((artifacts / "manifest.json").read_text())["vocab_size"]
    decoder_ms = measure_in_subprocess(artifacts, variant, batches, steps, threads)
    if threads:
        torch.set_num_threads(threads)
    print(f"\nfull step = decoder ({variant}) + sampler, V={vocab_size}: median ms, sampler share")
    print(f"{'batch':>6} {'decoder':>10} {'checked':>10} {'share':>7} {'zero_check':>11} {'share':>7}")
    for batch in batches:
        logits = torch.randn(batch, vocab_size, generator=torch.Generator().manual_seed(batch))
        params = [SamplingParams(temperature=0.8, top_k=50, top_p=0.9, repetition_penalty=1.1, seed=i) for i in range(batch)]
        history = [[1, 2, 3] for _ in range(batch)]
        checked_ms = median_ms(lambda: checked_sample(logits, params, history, step=1), steps)
        zero_ms = median_ms(lambda: zero_check_sample(logits, params, history, step=1), steps)
        step_ms = decoder_ms[batch]
        print(f"{batch:>6} {step_ms:>10.2f} {checked_ms:>10.2f} {checked_ms / (step_ms + checked_ms):>7.1%}"
              f" {zero_ms:>11.2f} {zero_ms / (step_ms + zero_ms):>7.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=paths.artifacts_dir())
    parser.add_argument("--artifacts-128k", type=Path, default=REPO_ROOT / "artifacts-128k")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None, help="torch / OpenVINO threads")
    parser.add_argument("--rounds", type=int, default=2, help="alternating subprocess rounds per backend")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=VARIANTS, help="backend:dtype to measure")
    parser.add_argument("--measure", choices=VARIANTS, help=argparse.SUPPRESS)  # subprocess mode: print JSON
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure_backend(args.artifacts, args.measure, args.batches, args.steps, args.threads)))
        return
    bf16 = any(flag in cpu_flags() for flag in BF16_CPU_FLAGS)
    variants = [v for v in args.variants if bf16 or "bf16" not in v]
    results = backend_table(args.artifacts, variants, args.batches, args.steps, args.threads, args.rounds)
    totals = {variant: sum(results[variant, batch] for batch in args.batches) for variant in variants}
    fastest = min(totals, key=totals.get)
    print(f"\nfaster overall on this machine: {fastest} ({totals[fastest]:.1f} ms vs "
          + ", ".join(f"{b} {t:.1f} ms" for b, t in totals.items() if b != fastest) + ", summed over batches)")
    for artifacts in (args.artifacts, args.artifacts_128k):
        if (artifacts / "manifest.json").is_file():
            sampler_share(artifacts, fastest, args.batches, args.steps, args.threads)
        else:
            print(f"\n{artifacts} not built: python build_engines.py --vocab-size 128256 --out {artifacts.name}")


if __name__ == "__main__":
    main()
