"""Bytes a batched decode step sends from `generate` to `decoder` (zerocheck.wire.step), measured on the
encoder itself: S streams, a P-token prompt, N generated tokens, mean over the N steps, against the same
steps re-sending every sampling input each step (the wire before the sequence table: knobs, seed, step
and, for penalties, the whole history).

    python benchmarks/step_wire.py [--streams 32] [--prompt 64] [--tokens 64]
"""
from __future__ import annotations

import argparse

import numpy as np

from zerocheck.api.sampler_path import SamplerPath
from zerocheck.sampling import SamplingParams
from zerocheck.wire.sampling import KNOB_INPUTS, column, padded
from zerocheck.wire.step import Registration, StepCall, step_arrays

CASES = {"temperature 0.7, top-k 50, top-p 0.9, seed": SamplingParams(temperature=0.7, top_k=50, top_p=0.9, seed=1),
         "the same + repetition penalty 1.1": SamplingParams(temperature=0.7, top_k=50, top_p=0.9, seed=1,
                                                              repetition_penalty=1.1)}


def nbytes(arrays: dict[str, np.ndarray]) -> int:
    return sum(sum(len(x) for x in a.reshape(-1)) if a.dtype == object else a.nbytes for a in arrays.values())


def resent(params: SamplingParams, streams: int, history: list[int], step: int) -> dict[str, np.ndarray]:
    """The sampling inputs a step carried when every step re-sent them."""
    default = SamplingParams()
    arrays = {spec.name: column([getattr(params, spec.name)] * streams, spec.numpy) for spec in KNOB_INPUTS
              if getattr(params, spec.name) != getattr(default, spec.name)}
    arrays["random_seed"] = column([params.seed] * streams, np.uint64)
    arrays["step"] = column([step] * streams, np.int32)
    if params.has_penalties:
        arrays["history"] = padded([history] * streams, np.int32)
    return arrays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    prompt = list(range(args.prompt))
    print(f"{args.streams} streams, {args.prompt}-token prompts, {args.tokens} tokens: mean bytes per decode step")
    for name, params in CASES.items():
        registered = resend = 0
        for step in range(1, args.tokens):
            calls = [StepCall(f"{i:032x}", [7], False, False, None, SamplerPath.ZERO_CHECK, False)
                     for i in range(args.streams)]
            arrays = step_arrays(calls)
            registered += nbytes(arrays)
            resend += nbytes(arrays) + nbytes(resent(params, args.streams, prompt + [7] * step, step))
        first = nbytes(step_arrays([StepCall(f"{i:032x}", prompt, True, False, Registration(params), SamplerPath.ZERO_CHECK,
                                             False) for i in range(args.streams)]))
        steps = args.tokens - 1
        print(f"  {name}: registered once {registered / steps:,.0f} B (first step {first:,} B), re-sent every step "
              f"{resend / steps:,.0f} B: {resend / registered:.1f}x")


if __name__ == "__main__":
    main()
