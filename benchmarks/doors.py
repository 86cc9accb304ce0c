"""Closed-loop streams through each door of one served stack, and through all of its doors at once.

    python benchmarks/doors.py [--streams 8 32] [--requests 2] [--tokens 128] [--out benchmarks/results]

`zerocheck serve`'s stack as shipped (tritonserver and the front end, the served model's artifacts). Each
stream sends `--requests` streamed chat requests one after the other (a distinct prompt of ~90 tokens each,
exactly `--tokens` output tokens, T=0.7, top-k 50, top-p 0.9), all streams at once, with clients the project
did not write:
  openai   the openai SDK, streamed chat completions (`/v1/chat/completions`, `ignore_eos`)
  grpc     tritonclient's gRPC stream to `ensemble` (tensorrtllm_backend's text door; `min_tokens`)
  http     Triton's HTTP `generate_stream` on `generate` through the front end's door (SSE; `min_tokens`)
  mixed    stream i through openai, grpc, http in turn (a third of the streams each)
Prints, per door and stream count: TTFT p50/p95, TPOT p50/p95, tokens/s (all streams' tokens over the wall
time), requests refused, mean queue wait (`zerocheck_queue_wait_seconds`), and the decoder's executes and
rows per execute over the run (Triton's nv_inference_exec_count and nv_inference_count): with one batch
for all doors, mixed doors keep the rows per execute of one door. The ratio mixed / openai is the
one-batch check. Writes doors.json.
"""
from __future__ import annotations

import argparse
import functools
import json
import queue
import re
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from machine import write_result
from zerocheck import paths

ROOT = Path(__file__).resolve().parents[1]
DOORS = ("openai", "grpc", "http")
TOPICS = ["volcanoes", "the printing press", "photosynthesis", "black holes", "the Roman aqueducts", "vaccines",
          "plate tectonics", "the stock market", "jazz music", "honeybees", "the internet", "glaciers",
          "the French Revolution", "electric cars", "coral reefs", "the human heart", "chess openings",
          "renewable energy", "ancient Egypt", "the immune system", "rainbows", "bridges", "coffee",
          "the Moon landing", "earthquakes", "origami", "the Silk Road", "penguins", "semiconductors",
          "the water cycle", "Shakespeare", "hot air balloons"]
SAMPLING = {"temperature": 0.7, "top_p": 0.9}
TOP_K = 50


def messages(index: int) -> list[dict[str, str]]:
    topic = TOPICS[index % len(TOPICS)]
    return [{"role": "user", "content": (
        f"Request {index}: write a detailed explanation of {topic} for a curious student. Cover its history, "
        "how it works, why it matters today and the most common misconceptions about it, and give two concrete "
        "examples that a student could check for themselves. Keep the tone friendly, the structure clear and the "
        "paragraphs short, and end with one question the student could explore next.")}]


@dataclass
class Sample:
    door: str
    ttft_s: float = 0.0
    tpot_s: float = 0.0
    tokens: int = 0
    prompt_tokens: int = 0
    error: str = ""


def _timing(sample: Sample, began: float, token_times: list[float]) -> Sample:
    if token_times:
        sample.ttft_s = token_times[0] - began
        if sample.tokens > 1:
            sample.tpot_s = (token_times[-1] - token_times[0]) / (sample.tokens - 1)
    return sample


@functools.cache
def served_model(url: str) -> str:
    import openai

    return openai.OpenAI(base_url=url, api_key="unused").models.list().data[0].id


def openai_request(url: str, index: int, tokens: int) -> Sample:
    import openai

    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
    sample, times, began = Sample("openai"), [], time.perf_counter()
    try:
        stream = client.chat.completions.create(
            model=served_model(url), messages=messages(index), max_tokens=tokens, stream=True, seed=index,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True, "top_k": TOP_K}, **SAMPLING)
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                times.append(time.perf_counter())
            if chunk.usage:
                sample.tokens, sample.prompt_tokens = chunk.usage.completion_tokens, chunk.usage.prompt_tokens
    except openai.APIError as error:
        sample.error = f"{type(error).__name__}: {error}"[:200]
    return _timing(sample, began, times)


def _door_inputs(index: int, tokens: int) -> dict[str, np.ndarray]:
    return {"messages": np.array([[json.dumps(messages(index))]], dtype=object),
            "max_tokens": np.array([[tokens]], np.int32), "min_tokens": np.array([[tokens]], np.int32),
            "temperature": np.array([[SAMPLING["temperature"]]], np.float32),
            "top_p": np.array([[SAMPLING["top_p"]]], np.float32), "top_k": np.array([[TOP_K]], np.int32),
            "seed": np.array([[index]], np.uint64), "stream": np.array([[True]])}


def grpc_request(url: str, index: int, tokens: int) -> Sample:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    sample, times, events = Sample("grpc"), [], queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    inputs = []
    for name, array in _door_inputs(index, tokens).items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    began = time.perf_counter()
    client.start_stream(callback=lambda result, error: events.put((result, error, time.perf_counter())))
    try:
        client.async_stream_infer("ensemble", inputs, enable_empty_final_response=True)
        while True:
            result, error, at = events.get(timeout=600)
            if error is not None:
                sample.error = str(error)[:200]
                break
            text = result.as_numpy("text_output")
            if text is not None and text.size and text.reshape(-1)[0]:
                times.append(at)
            done = result.as_numpy("completion_tokens")
            if done is not None and result.as_numpy("finish_reason").reshape(-1)[0]:
                sample.tokens = int(done.reshape(-1)[0])
                sample.prompt_tokens = int(result.as_numpy("prompt_tokens").reshape(-1)[0])
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    return _timing(sample, began, times)


def http_request(url: str, index: int, tokens: int) -> Sample:
    import requests

    body = {name: array.reshape(-1)[0] for name, array in _door_inputs(index, tokens).items()}
    body = {name: value if isinstance(value, str) else value.item() for name, value in body.items()}
    sample, times, began = Sample("http"), [], time.perf_counter()
    with requests.post(f"http://{url}/v2/models/generate/generate_stream", json=body, stream=True,
                       timeout=600) as response:
        if response.status_code != 200:
            sample.error = f"HTTP {response.status_code}: {response.text[:150]}"
            return sample
        for line in response.iter_lines():
            if not line.startswith(b"data:"):
                continue
            event = json.loads(line[5:])
            if "error" in event:
                sample.error = str(event["error"])[:200]
                break
            if event.get("text_output"):
                times.append(time.perf_counter())
            if event.get("finish_reason"):
                sample.tokens, sample.prompt_tokens = event["completion_tokens"], event["prompt_tokens"]
    return _timing(sample, began, times)


REQUEST = {"openai": openai_request, "grpc": grpc_request, "http": http_request}


def metrics(url: str) -> dict[str, float]:
    """The counters this benchmark reads from Triton's metrics endpoint."""
    text = urllib.request.urlopen(f"http://{url}/metrics", timeout=30).read().decode()
    found = {}
    for name, pattern in (("decoder_executes", r'nv_inference_exec_count\{model="decoder",version="1"\} (\S+)'),
                          ("decoder_rows", r'nv_inference_count\{model="decoder",version="1"\} (\S+)'),
                          ("decoder_requests", r'nv_inference_request_success\{model="decoder",version="1"\} (\S+)'),
                          ("queue_wait_sum", r"zerocheck_queue_wait_seconds_sum\S* (\S+)"),
                          ("queue_wait_count", r"zerocheck_queue_wait_seconds_count\S* (\S+)")):
        match = re.search(pattern, text)
        found[name] = float(match[1]) if match else 0.0
    return found


def run(stack, doors: list[str], requests: int, tokens: int, offset: int) -> dict:
    """One closed-loop run: stream i through doors[i], `requests` requests each."""
    urls = {"openai": stack.openai_url, "grpc": stack.grpc_url, "http": stack.http_url}

    def stream(i: int) -> list[Sample]:
        return [REQUEST[doors[i]](urls[doors[i]], offset + i * requests + r, tokens) for r in range(requests)]

    before = metrics(stack.metrics_url)
    began = time.perf_counter()
    with ThreadPoolExecutor(len(doors)) as pool:
        samples = [s for batch in pool.map(stream, range(len(doors))) for s in batch]
    wall = time.perf_counter() - began
    after = metrics(stack.metrics_url)
    delta = {key: after[key] - before[key] for key in after}
    good = [s for s in samples if not s.error]

    def pct(values: list[float], q: float) -> float:
        return float(np.percentile(values, q)) * 1000 if values else float("nan")

    ttfts, tpots = [s.ttft_s for s in good], [s.tpot_s for s in good if s.tpot_s]
    return {"streams": len(doors), "requests": len(samples), "refused": len(samples) - len(good),
            "errors": sorted({s.error for s in samples if s.error})[:3],
            "prompt_tokens_mean": statistics.mean(s.prompt_tokens for s in good) if good else 0,
            "ttft_p50_ms": pct(ttfts, 50), "ttft_p95_ms": pct(ttfts, 95),
            "tpot_p50_ms": pct(tpots, 50), "tpot_p95_ms": pct(tpots, 95),
            "tokens_per_s": sum(s.tokens for s in good) / wall, "wall_s": wall,
            "queue_wait_mean_ms": 1000 * delta["queue_wait_sum"] / max(1.0, delta["queue_wait_count"]),
            "decoder_executes": delta["decoder_executes"],
            "decoder_requests_per_execute": delta["decoder_requests"] / max(1.0, delta["decoder_executes"]),
            "decoder_rows_per_execute": delta["decoder_rows"] / max(1.0, delta["decoder_executes"]),
            "by_door": {door: len([s for s in good if s.door == door]) for door in DOORS}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=paths.artifacts_dir())
    parser.add_argument("--streams", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--requests", type=int, default=2, help="requests per stream, one after the other")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--doors", nargs="+", choices=[*DOORS, "mixed"], default=["openai", "mixed"])
    parser.add_argument("--model-repository", type=Path, default=None, help="default: the packaged one")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()

    from zerocheck.serve.stack import ServingStack

    stack = ServingStack(args.model_repository or paths.model_repository(),
                         env={paths.ARTIFACTS_ENV: str(args.artifacts)})
    stack.start()
    rows = []
    try:
        stack.wait_ready(600)
        run(stack, ["openai"] * 2 + ["grpc"] * 2 + ["http"] * 2, 1, 16, 10_000)  # warm-up: every door
        runs = [(n, door) for n in args.streams for door in args.doors]
        for number, (n, door) in enumerate(runs, start=1):  # each run its own prompts: no prefix-cache hit
            doors = [DOORS[i % len(DOORS)] for i in range(n)] if door == "mixed" else [door] * n
            row = {"door": door, **run(stack, doors, args.requests, args.tokens, 1000 * number)}
            rows.append(row)
            print(f"{door:>6} x{n:<3} TTFT p50 {row['ttft_p50_ms']:8.0f} ms  p95 {row['ttft_p95_ms']:8.0f} ms  "
                  f"TPOT p50 {row['tpot_p50_ms']:6.1f} ms  p95 {row['tpot_p95_ms']:6.1f} ms  "
                  f"{row['tokens_per_s']:6.1f} tok/s  refused {row['refused']}/{row['requests']}  "
                  f"queue {row['queue_wait_mean_ms']:6.0f} ms  decoder rows/execute "
                  f"{row['decoder_rows_per_execute']:5.1f} (requests/execute "
                  f"{row['decoder_requests_per_execute']:.2f}) {row['errors'][:1]}", flush=True)
    finally:
        stack.stop()
    for n in args.streams:
        by = {row["door"]: row for row in rows if row["streams"] == n}
        if "mixed" in by and "openai" in by:
            print(f"x{n}: mixed doors / one door (openai) tokens/s = "
                  f"{by['mixed']['tokens_per_s'] / by['openai']['tokens_per_s']:.2f}")
    write_result(args.out, "doors.json", {"tokens": args.tokens, "requests_per_stream": args.requests, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
