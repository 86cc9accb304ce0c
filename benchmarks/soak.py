"""Soak and chaos: mixed load on the real model for minutes; no admitted request may fail.

    python benchmarks/soak.py [--minutes 10] [--clients 64] [--artifacts artifacts]

One `zerocheck serve` stack (32 KV slots); `--clients` closed-loop clients (default 64: twice the
slots) each send one request after another for `--minutes`: gRPC streams to `ensemble`, HTTP
`generate_stream` and `generate` through the door, OpenAI chat completions streamed and whole, with
random sampling parameters, seeds (or none), lengths and the zero-check switch on or off. 20 % of the
streamed requests are given up by their client after a few tokens: gRPC ones are cancelled, HTTP and
OpenAI ones disconnect mid-stream. Every request ends one way:
  ok        answered to the end
  cancelled given up by its client
  refused   turned away before its first token because the server is full (RESOURCE_EXHAUSTED / 429)
  failed    anything else (an error after admission, a broken stream, a wrong answer)
Then: KV slots in use after the load (must be 0), RSS of server, stubs and front end at the end
against its value once warm (must be within +10 %), and the time from a cancellation being seen to its
slot freed (the server's `zerocheck_cancelled_slot_free_seconds`): within a decode step, at most 1 % of
them past the p99 time per output token (both histograms, so both to their bucket bounds: the upper bound
of the token-time bucket that holds its p99, and the cancelled-slot bucket that holds that bound counted
as within), with at least one cancellation measured. A cancellation is seen at the start of its path's
next iteration, whose release goes to the decoder just ahead of that iteration's step and is answered
before the step's forward when the two share an execute: the slot is free by the time that step returns.
The decoder runs one execute at a time, so the release waits for the one in progress (the decoder's p99
compute time per request, Triton's latency summary, is reported beside it). Prints a summary, writes
benchmarks/results/soak.json; exit 1 when a check fails.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import requests

ROOT = Path(__file__).resolve().parents[1]
from zerocheck import paths
from zerocheck.api.errors import ErrorCode  # noqa: E402
from zerocheck.clients import Client as GenerateClient  # noqa: E402
from zerocheck.clients.errors import ZerocheckError  # noqa: E402
from zerocheck.serve.stack import ServingStack  # noqa: E402

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "The three primary colors are",
           "import numpy as np\n", "Write a haiku about the sea.", "What is 2 + 2?", "Name three fruits."]
KINDS = {"grpc_stream": 3, "http_stream": 2, "http_whole": 1, "openai_stream": 2, "openai_whole": 1}
CANCEL_SHARE = 0.2


def sampling(rng: random.Random) -> dict:
    params = {"temperature": round(rng.choice([0.0, 0.5, 0.8, 1.0, 1.3]), 2)}
    if rng.random() < 0.5:
        params["top_k"] = rng.choice([1, 10, 50, 200])
    if rng.random() < 0.5:
        params["top_p"] = rng.choice([0.5, 0.9, 0.95])
    if rng.random() < 0.2:
        params["repetition_penalty"] = 1.1
    if rng.random() < 0.2:
        params["presence_penalty"] = 0.5
    if rng.random() < 0.5:
        params["seed"] = rng.randrange(2**32)
    return params


def refused(status: int, message: str) -> bool:
    """An up-front refusal over HTTP: 429 from the door or the OpenAI API (both carry the code)."""
    return status == 429 and "RESOURCE_EXHAUSTED" in message


class Client(threading.Thread):
    def __init__(self, stack: ServingStack, index: int, deadline: float, outcomes: Counter, lock: threading.Lock,
                 failures: list) -> None:
        super().__init__(daemon=True)
        self.stack, self.rng, self.deadline = stack, random.Random(index), deadline
        self.outcomes, self.lock, self.failures = outcomes, lock, failures
        self.session = requests.Session()

    def run(self) -> None:
        kinds, weights = list(KINDS), list(KINDS.values())
        while time.monotonic() < self.deadline:
            kind = self.rng.choices(kinds, weights)[0]
            cancel_after = self.rng.randint(1, 8) if kind.endswith("stream") and self.rng.random() < CANCEL_SHARE \
                else None
            try:
                outcome = getattr(self, kind)(cancel_after)
            except Exception as error:  # noqa: BLE001 - the soak classifies every failure
                outcome = "failed"
                with self.lock:
                    self.failures.append(f"{kind}: {type(error).__name__}: {error}"[:300])
            with self.lock:
                self.outcomes[(kind, outcome)] += 1

    def _fields(self) -> tuple[str, dict, int, str]:
        return (self.rng.choice(PROMPTS), sampling(self.rng), self.rng.randint(4, 48),
                self.rng.choice(["on", "on", "off"]))

    def grpc_stream(self, cancel_after: int | None) -> str:
        """The project's gRPC client to `ensemble`, no retries; giving up closes the stream of events, which
        stops the request (a stop request on the same call, see zerocheck.clients.grpc_transport)."""
        prompt, params, max_tokens, switch = self._fields()
        client = GenerateClient(self.stack.grpc_url, "grpc", timeout=300.0, retries=0)
        events = client.stream(prompt, max_tokens=max_tokens, zerocheck=switch == "on", **params)
        tokens = 0
        try:
            for event in events:
                tokens += len(event.token_ids)
                if cancel_after is not None and tokens >= cancel_after and not event.final:
                    return "cancelled"
                if event.final:
                    return "ok"
        except ZerocheckError as error:
            if tokens == 0 and error.code is ErrorCode.RESOURCE_EXHAUSTED:
                return "refused"
            raise
        finally:
            events.close()
        raise RuntimeError("the stream ended without its final response")

    def _stream_http(self, url: str, body: dict, headers: dict, cancel_after: int | None, openai: bool) -> str:
        with self.session.post(url, json=body, headers=headers, stream=True, timeout=300) as reply:
            if reply.status_code != 200:
                if refused(reply.status_code, reply.text):
                    return "refused"
                raise RuntimeError(f"HTTP {reply.status_code}: {reply.text[:200]}")
            tokens = 0
            for line in reply.iter_lines():
                if line.startswith(b"event: error"):
                    raise RuntimeError(f"error event: {reply.text[:200]}")
                if not line.startswith(b"data: "):
                    continue
                if line == b"data: [DONE]":
                    return "ok"
                event = json.loads(line[6:])
                if "error" in event:
                    message = str(event["error"].get("message", event["error"]) if isinstance(event["error"], dict)
                                  else event["error"])
                    if tokens == 0 and message.startswith("RESOURCE_EXHAUSTED"):
                        return "refused"  # Triton streams an overload of generate_stream as an error event
                    raise RuntimeError(message)
                ids = event.get("output_ids", [])
                tokens += 1 if openai else len(ids) if isinstance(ids, list) else 1  # one id comes bare
                if cancel_after is not None and tokens >= cancel_after:
                    reply.raw.shutdown()  # the client goes away mid-stream
                    return "cancelled"
                if not openai and event.get("finish_reason"):
                    return "ok"
        raise RuntimeError("the stream ended without its end")

    def http_stream(self, cancel_after: int | None) -> str:
        prompt, params, max_tokens, switch = self._fields()
        body = {"text_input": prompt, "max_tokens": max_tokens, "stream": True, "zerocheck": switch, **params}
        return self._stream_http(f"http://{self.stack.http_url}/v2/models/generate/generate_stream", body, {},
                                 cancel_after, openai=False)

    def http_whole(self, cancel_after: int | None) -> str:
        prompt, params, max_tokens, switch = self._fields()
        body = {"text_input": prompt, "max_tokens": max_tokens, "zerocheck": switch, **params}
        reply = self.session.post(f"http://{self.stack.http_url}/v2/models/generate/generate", json=body, timeout=300)
        if reply.status_code == 200 and reply.json().get("finish_reason"):
            return "ok"
        if refused(reply.status_code, reply.text):
            return "refused"
        raise RuntimeError(f"HTTP {reply.status_code}: {reply.text[:200]}")

    def _chat(self, stream: bool) -> tuple[str, dict, dict]:
        prompt, params, max_tokens, switch = self._fields()
        body = {"model": self.stack.frontend_served_model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens, "stream": stream, **params}
        return f"{self.stack.openai_url}/chat/completions", body, {"zerocheck": switch}

    def openai_stream(self, cancel_after: int | None) -> str:
        url, body, headers = self._chat(True)
        return self._stream_http(url, body, headers, cancel_after, openai=True)

    def openai_whole(self, cancel_after: int | None) -> str:
        url, body, headers = self._chat(False)
        reply = self.session.post(url, json=body, headers=headers, timeout=300)
        if reply.status_code == 200 and reply.json()["choices"][0]["finish_reason"]:
            return "ok"
        if refused(reply.status_code, reply.text):
            return "refused"
        raise RuntimeError(f"HTTP {reply.status_code}: {reply.text[:200]}")


def rss(stack: ServingStack) -> int:
    processes = [psutil.Process(stack.pid), *psutil.Process(stack.pid).children(recursive=True),
                 psutil.Process(stack.frontend_pid)]
    return sum(p.memory_info().rss for p in processes if p.is_running())


def metrics(stack: ServingStack) -> str:
    return requests.get(f"http://{stack.metrics_url}/metrics", timeout=10).text


def histogram(text: str, name: str, labels: str = "") -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of a histogram's buckets, summed over the models that export it."""
    buckets: dict[float, float] = {}
    for le, count in re.findall(rf'^{name}_bucket{{{labels}[^}}]*le="([^"]+)"[^}}]*}} (\S+)$', text, re.M):
        buckets[float(le)] = buckets.get(float(le), 0.0) + float(count)
    return sorted(buckets.items())


def quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """The upper bound of the bucket holding quantile q (inf when it lies past the last finite bucket)."""
    total = buckets[-1][1] if buckets else 0
    for bound, count in buckets:
        if total and count >= q * total:
            return bound
    return float("nan")


def decoder_compute_p99_s(text: str) -> float:
    """The decoder's p99 compute time per request over the last minute (Triton's latency summary: an execute
    of several requests counts once for each)."""
    match = re.search(r'^nv_inference_compute_infer_summary_us\{[^}]*model="decoder"[^}]*quantile="0.99"[^}]*\} (\S+)$',
                      text, re.M)
    return float(match.group(1)) / 1e6 if match else float("nan")


def share_above(buckets: list[tuple[float, float]], limit: float) -> float:
    """The share of a histogram's observations that certainly lie above `limit`: those past the bucket that
    holds it (its own may lie on either side). 1.0 when `limit` is unknown (nan); 0.0 with no observations."""
    total = buckets[-1][1] if buckets else 0.0
    if not total or math.isnan(limit):
        return 1.0 if total else 0.0
    return 1.0 - next(count for bound, count in buckets if bound >= limit) / total


def slots_in_use(stack: ServingStack) -> float:
    match = re.search(r'^zerocheck_kv_slots_in_use\{model="decoder"\} (\S+)$', metrics(stack), re.M)
    return float(match.group(1)) if match else -1.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--artifacts", type=Path, default=paths.artifacts_dir())
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "soak.json")
    args = parser.parse_args()
    stack = ServingStack(paths.model_repository(), env={"ZEROCHECK_ARTIFACTS": str(args.artifacts.resolve())})
    stack.start()
    outcomes: Counter = Counter()
    failures: list[str] = []
    lock = threading.Lock()
    try:
        stack.wait_ready(600)
        began = time.monotonic()
        deadline = began + 60 * args.minutes
        clients = [Client(stack, i, deadline, outcomes, lock, failures) for i in range(args.clients)]
        for client in clients:
            client.start()
        time.sleep(min(60.0, 6 * args.minutes))  # warm: every model and path has run
        warm_rss = rss(stack)
        while time.monotonic() < deadline:
            time.sleep(10)
            with lock:
                print(f"  {time.monotonic() - began:5.0f} s  " + ", ".join(
                    f"{k} {sum(v for (_, o), v in outcomes.items() if o == k)}" for k in
                    ("ok", "cancelled", "refused", "failed")), flush=True)
        for client in clients:
            client.join(timeout=360)
        settle = time.monotonic() + 15
        while slots_in_use(stack) != 0 and time.monotonic() < settle:
            time.sleep(0.2)
        slots, end_rss, text = slots_in_use(stack), rss(stack), metrics(stack)
        alive = stack.is_alive()
    finally:
        stack.stop()
    freed = histogram(text, "zerocheck_cancelled_slot_free_seconds")
    tpot = histogram(text, "zerocheck_time_per_output_token_seconds")
    totals = Counter()
    for (_, outcome), count in outcomes.items():
        totals[outcome] += count
    result = {
        "minutes": args.minutes, "clients": args.clients, "kv_slots": 32,
        "outcomes": dict(totals), "by_kind": {f"{kind} {outcome}": n for (kind, outcome), n in sorted(outcomes.items())},
        "failures": failures[:20], "slots_in_use_after": slots, "server_alive": alive,
        "rss_warm_mib": warm_rss / 2**20, "rss_end_mib": end_rss / 2**20, "rss_growth": end_rss / warm_rss - 1,
        "cancelled_slot_free_p99_s": quantile(freed, 0.99), "cancelled_slot_free_count": freed[-1][1] if freed else 0,
        "tpot_p50_s": quantile(tpot, 0.5), "tpot_p99_s": quantile(tpot, 0.99),
        "cancelled_slot_free_buckets": freed, "decoder_compute_p99_s": decoder_compute_p99_s(text),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    checks = {"no admitted request failed": totals["failed"] == 0, "the server is alive": alive,
              "every KV slot is free": slots == 0, "RSS within +10 % of warm": result["rss_growth"] <= 0.10,
              # from seeing a cancellation to its slot freed: within a decode step (the p99 time per output token)
              "cancelled slots freed within a decode step (p99)":
                  result["cancelled_slot_free_count"] > 0 and math.isfinite(result["tpot_p99_s"])
                  and share_above(freed, result["tpot_p99_s"]) <= 0.01}
    for name, passed in checks.items():
        print(f"{'PASS' if passed else 'FAIL'}  {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
