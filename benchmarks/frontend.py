"""What the HTTP front end adds per streamed token: the same load through it and around it, in one run.

    python benchmarks/frontend.py [--artifacts artifacts] [--streams 32] [--tokens 64] [--rounds 2]

One `zerocheck serve` stack; `--streams` concurrent streamed requests (fixed prompts and seeds,
`--tokens` tokens each, no early end), interleaved A/B/B/A per pair:
- OpenAI API (`/v1/completions`, SSE) vs straight gRPC to `ensemble` (what the API calls);
- the guarded door (`generate_stream` SSE) vs Triton's own HTTP endpoint behind it.
For each mode: p50 inter-token latency (ms between consecutive streamed tokens, per stream), p50 TTFT,
and the front end's CPU seconds per 1000 tokens and share of the run's wall time. The latency the
front end adds per streamed token is measured twice: end to end, p50 ITL(through) - p50 ITL(around)
(run-to-run noise of the decoder included), and by the front end itself, from each piece's arrival
from Triton to its bytes written to the client (`zerocheck_frontend_forward_seconds` on its /metrics).
Writes benchmarks/results/frontend.json.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import re
import statistics
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
import psutil
import tritonclient.grpc.aio as aiogrpc

ROOT = Path(__file__).resolve().parents[1]
from zerocheck import paths
from zerocheck.bench.e2e import sized_repository  # noqa: E402
from zerocheck.clients.aio_grpc_transport import stream_chunks  # noqa: E402
from zerocheck.clients.request import GenerateRequest  # noqa: E402
from zerocheck.serve.stack import ServingStack  # noqa: E402

PROMPTS = ("The capital of France is", "def merge_sort(items):", "Once upon a time", "import numpy as np\n",
           "The quick brown fox", "SELECT name FROM users WHERE", "# Parse the configuration file", "for i in range(10):")
SAMPLING = {"temperature": 0.7, "top_k": 50, "top_p": 0.9}


class Stream:
    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.arrivals: list[float] = []

    def tokens(self, count: int) -> None:
        self.arrivals += [time.perf_counter()] * count


async def grpc_stream(client, index: int, tokens: int) -> Stream:
    timing = Stream()
    request = GenerateRequest.build(PROMPTS[index % len(PROMPTS)], max_tokens=tokens, min_tokens=tokens,
                                    seed=1000 + index, **SAMPLING)
    async for chunk in stream_chunks(client, "ensemble", request, request.parameters(), {}):
        timing.tokens(len(chunk.token_ids))
    return timing


async def openai_stream(session: aiohttp.ClientSession, url: str, model: str, index: int, tokens: int) -> Stream:
    timing = Stream()
    body = {"model": model, "prompt": PROMPTS[index % len(PROMPTS)], "max_tokens": tokens, "min_tokens": tokens,
            "seed": 1000 + index, "stream": True, **SAMPLING}
    async with session.post(f"{url}/completions", json=body) as reply:
        reply.raise_for_status()
        async for line in reply.content:
            if line.startswith(b"data: {"):
                if json.loads(line[6:])["choices"][0]["text"]:
                    timing.tokens(1)
    return timing


async def sse_stream(session: aiohttp.ClientSession, http_url: str, index: int, tokens: int) -> Stream:
    timing = Stream()
    body = {"text_input": PROMPTS[index % len(PROMPTS)], "max_tokens": tokens, "min_tokens": tokens,
            "seed": 1000 + index, "stream": True, **SAMPLING}
    async with session.post(f"http://{http_url}/v2/models/ensemble/generate_stream", json=body) as reply:
        reply.raise_for_status()
        async for line in reply.content:
            if line.startswith(b"data: {"):
                ids = json.loads(line[6:]).get("output_ids", [])
                timing.tokens(len(ids) if isinstance(ids, list) else 1)  # one id arrives as a bare number
    return timing


def summary(streams: list[Stream]) -> dict:
    itl = [b - a for s in streams for a, b in zip(s.arrivals, s.arrivals[1:]) if b > a]
    ttft = [s.arrivals[0] - s.start for s in streams if s.arrivals]
    return {"itl_p50_ms": 1000 * statistics.median(itl), "itl_mean_ms": 1000 * statistics.fmean(itl),
            "ttft_p50_ms": 1000 * statistics.median(ttft), "tokens": sum(len(s.arrivals) for s in streams)}


async def run_mode(mode: str, stack: ServingStack, streams: int, tokens: int, model: str) -> dict:
    frontend = psutil.Process(stack._frontend.pid)
    cpu_before, began = sum(frontend.cpu_times()[:2]), time.perf_counter()
    if mode == "grpc":
        client = aiogrpc.InferenceServerClient(stack.grpc_url)
        results = await asyncio.gather(*(grpc_stream(client, i, tokens) for i in range(streams)))
        await client.close()
    else:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            if mode == "openai":
                coros = [openai_stream(session, stack.openai_url, model, i, tokens) for i in range(streams)]
            else:
                url = stack.http_url if mode == "door" else stack.triton_http_url
                coros = [sse_stream(session, url, i, tokens) for i in range(streams)]
            results = await asyncio.gather(*coros)
    wall = time.perf_counter() - began
    out = summary(list(results))
    cpu = sum(frontend.cpu_times()[:2]) - cpu_before
    out.update(wall_s=wall, frontend_cpu_s=cpu, frontend_cpu_ms_per_1k_tokens=1e6 * cpu / out["tokens"],
               frontend_cpu_share=cpu / wall)
    return out


async def bench(stack: ServingStack, args: argparse.Namespace) -> dict:
    model = stack.frontend_served_model
    pairs = {"openai_vs_grpc": ("openai", "grpc"), "door_vs_triton_http": ("door", "triton_http")}
    runs: dict[str, list[dict]] = {mode: [] for pair in pairs.values() for mode in pair}
    await run_mode("grpc", stack, args.streams, 8, model)  # warm-up
    for _ in range(args.rounds):
        for through, around in pairs.values():
            for mode in (through, around, around, through):
                result = await run_mode(mode, stack, args.streams, args.tokens, model)
                runs[mode].append(result)
                print(f"  {mode:12s} ITL p50 {result['itl_p50_ms']:7.2f} ms  TTFT p50 {result['ttft_p50_ms']:8.1f} ms"
                      f"  front end CPU {result['frontend_cpu_share']:.1%}", flush=True)
    merged = {mode: {key: statistics.median(r[key] for r in results) for key in results[0]}
              for mode, results in runs.items()}
    added = {name: {"itl_p50_ms": merged[t]["itl_p50_ms"] - merged[a]["itl_p50_ms"],
                    "ttft_p50_ms": merged[t]["ttft_p50_ms"] - merged[a]["ttft_p50_ms"]}
             for name, (t, a) in pairs.items()}
    return {"modes": merged, "added": added, "forward_ms": forward_quantiles(stack)}


def forward_quantiles(stack: ServingStack) -> dict[str, dict[str, float]]:
    """The front end's own measure of what it adds per streamed piece (arrival from Triton to written to the
    client), from its /metrics: {endpoint: {quantile: ms}}."""
    text = urllib.request.urlopen(stack.openai_url.removesuffix("/v1") + "/metrics", timeout=10).read().decode()
    found: dict[str, dict[str, float]] = {}
    for endpoint, quantile, value in re.findall(
            r'^zerocheck_frontend_forward_seconds\{endpoint="(\w+)",quantile="([\d.]+)"\} (\S+)$', text, re.M):
        found.setdefault(endpoint, {})[f"p{round(float(quantile) * 100)}"] = 1000 * float(value)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=paths.artifacts_dir())
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "frontend.json")
    args = parser.parse_args()
    stack = ServingStack(sized_repository(args.streams), env={"ZEROCHECK_ARTIFACTS": str(args.artifacts.resolve())})
    stack.start()
    try:
        stack.wait_ready(600)
        print(f"front end benchmark: {args.streams} streams x {args.tokens} tokens, {args.artifacts}", flush=True)
        result = asyncio.run(bench(stack, args))
    finally:
        stack.stop()
    result["meta"] = {"machine": f"{platform.machine()}, {psutil.cpu_count()} CPUs", "streams": args.streams,
                      "tokens": args.tokens, "rounds": args.rounds, "artifacts": str(args.artifacts),
                      "sampling": SAMPLING}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{'mode':12s} {'ITL p50':>9s} {'TTFT p50':>9s} {'CPU ms/1k tok':>14s} {'CPU share':>9s}")
    for mode, row in result["modes"].items():
        print(f"{mode:12s} {row['itl_p50_ms']:9.2f} {row['ttft_p50_ms']:9.1f} "
              f"{row['frontend_cpu_ms_per_1k_tokens']:14.1f} {row['frontend_cpu_share']:9.1%}")
    for name, delta in result["added"].items():
        print(f"end to end, {name}: ITL p50 {delta['itl_p50_ms']:+.2f} ms per token, TTFT p50 "
              f"{delta['ttft_p50_ms']:+.1f} ms (run-to-run noise included)")
    for endpoint, quantiles in result["forward_ms"].items():
        print(f"the front end's own measure, {endpoint}: arrival to written per streamed piece "
              + ", ".join(f"{q} {ms:.3f} ms" for q, ms in quantiles.items()))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
