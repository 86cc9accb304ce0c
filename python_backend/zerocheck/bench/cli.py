"""`zerocheck bench`: the end-to-end benchmark of both sampler paths (also `benchmarks/e2e.py`)."""
from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path

from zerocheck.bench.e2e import bench_vocab, ratios, table, write_results
from zerocheck.bench.machine import cpu
from zerocheck import paths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--artifacts", type=Path, nargs="+", default=None,
                        help="artifact sets, one server each (default: the served model's, `zerocheck paths artifacts`; "
                             "a 128K-vocabulary set: `zerocheck build --tiny --vocab-size 128256 --out artifacts-128k`)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=2, help="interleaved runs per path and level")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--out", type=Path, default=Path("zerocheck-bench"),
                        help="where the JSON and the plot go (default: %(default)s)")


def run(args: argparse.Namespace, meta: dict[str, str] | None = None) -> int:
    """`zerocheck bench`; `meta` adds to what the JSON records of the run (the checkout's commit and command)."""
    sampling = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    args.artifacts = args.artifacts or [paths.artifacts_dir()]
    missing = [str(a) for a in args.artifacts if not (a / "manifest.json").is_file()]
    if missing:
        print(f"missing artifacts: {', '.join(missing)}; build them with `zerocheck build` (--out DIR)")
        return 2
    rows = []
    for artifacts in args.artifacts:
        print(f"benchmarking {artifacts} ...", flush=True)
        rows += bench_vocab(artifacts, args.concurrency, args.rounds, args.max_tokens, sampling,
                            log=lambda line: print(line, flush=True))
    print(table(rows, ratios(rows)))
    meta = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}", "cpu": cpu(),
            "sampling": sampling,
            "max_tokens": args.max_tokens, "rounds": args.rounds, "artifacts": [str(a) for a in args.artifacts],
            **(meta or {})}
    json_path, png_path = write_results(rows, args.out, meta)
    print(f"wrote {json_path} and {png_path}")
    return 0
