"""Stress: 64 concurrent streams against 16 KV slots and a 16-deep queue, random cancellations, for
$ZEROCHECK_STRESS_SECONDS (default 60). Own server over a copied repository. Every request either
succeeds, is cancelled by its client, or is refused as overloaded before its first token (a message
starting `RESOURCE_EXHAUSTED:`; a gRPC stream error carries no status). At the end every KV slot is
free and the server's RSS (server + stubs) grew less than 10% after warm-up. Prints the numbers; a
failure names each failed request (id, fields, message) and the server's log lines about it."""
from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import pytest
import requests
from tritonclient.utils import InferenceServerException

import conftest
from generate_calls import grpc_generate, http_generate, slots_in_use
from zerocheck.api.errors import ErrorCode, parse_code
from zerocheck.clients.errors import ENSEMBLE_PREFIX

STREAMS = 64
PROMPTS = ["def fibonacci(n):", "class Stack:\n    def push(self, item):", "import os\n\ndef walk(path):",
           "for i in range(10):"]


def server_rss(server) -> int:
    """Resident memory of tritonserver and all its children (stubs), bytes."""
    processes = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue
    return total


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts = {"ok": 0, "overloaded": 0, "cancelled": 0, "failed": 0}
        self.failures: list[str] = []
        self.itl: list[float] = []

    def add(self, kind: str, itl: list[float] = (), failure: str | None = None) -> None:
        with self.lock:
            self.counts[kind] += 1
            self.itl += itl
            if failure:
                self.failures.append(failure)


def overloaded(message: str) -> bool:
    """A refusal before the first token: the message's code, not its prose (ensemble steps prefix theirs)."""
    code, _ = parse_code(ENSEMBLE_PREFIX.sub("", message))
    return code is ErrorCode.RESOURCE_EXHAUSTED


def one_request(server, rng: random.Random, tally: Tally, request_id: str) -> None:
    fields = {"text_input": rng.choice(PROMPTS), "max_tokens": rng.randint(8, 64), "stream": True,
              "temperature": rng.choice([0.0, 0.7, 1.0]), "top_k": rng.choice([0, 20])}
    if rng.random() < 0.1:  # some non-streamed HTTP requests (Triton's HTTP `generate` answers every model error
        # 400, and the message's code tells an overload apart)
        name = f"{request_id} (HTTP generate {fields})"
        try:
            reply = http_generate(server.http_url, {**fields, "stream": False}, timeout=120)
        except requests.RequestException as error:  # e.g. the server went away
            tally.add("failed", failure=f"{name}: {error!r}")
            return
        if reply.status_code != 200 and overloaded(reply.json().get("error", "")):
            tally.add("overloaded")
            time.sleep(rng.uniform(0.05, 0.3))
        else:
            tally.add("ok" if reply.status_code == 200 else "failed",
                      failure=None if reply.status_code == 200 else f"{name}: HTTP {reply.status_code} {reply.text[:200]}")
        return
    cancel_after = rng.randint(1, 6) if rng.random() < 0.25 else None
    name = f"{request_id} (gRPC stream {fields}, cancel after {cancel_after})"
    try:
        responses = grpc_generate(server.grpc_url, fields, timeout=120, cancel_after=cancel_after,
                                  request_id=request_id)
    except InferenceServerException as error:
        if overloaded(error.message()):
            tally.add("overloaded")
            time.sleep(rng.uniform(0.05, 0.3))  # a client backs off before retrying
        else:
            tally.add("failed", failure=f"{name}: {error.message()}")
        return
    except Exception as error:  # noqa: BLE001 - a hang (queue.Empty) or a transport error is a failure
        tally.add("failed", failure=f"{name}: {error!r}")
        return
    times = [r["t"] for r in responses if r.get("output_ids")]
    itl = list(np.diff(times)) if len(times) > 1 else []
    if cancel_after is not None and not responses[-1].get("finish_reason"):
        tally.add("cancelled", itl)
    elif responses and responses[-1].get("finish_reason") in ("length", "eos", "stop"):
        tally.add("ok", itl)
    else:
        tally.add("failed", failure=f"{name}: no finish_reason: {responses[-1:]}")


def failure_report(server, tally: Tally) -> str:
    """The failed requests (id, fields, message) and the server's log lines about each, else its last lines."""
    log = server.log_path.read_text(errors="replace").splitlines()
    lines = [f"{len(tally.failures)} failed requests:"]
    for failure in tally.failures[:5]:
        request_id = failure.split(" ", 1)[0]
        about = [line for line in log if repr(request_id) in line or f"'{request_id}'" in line]
        lines += [f"  {failure}", *(f"    server log: {line}" for line in about[:3])]
    return "\n".join([*lines, "server log tail:", server.log_tail(12)])


@pytest.mark.slow
def test_64_streams_on_16_slots_with_cancellations(server_factory, tmp_path: Path) -> None:
    seconds = float(os.environ.get("ZEROCHECK_STRESS_SECONDS", "60"))
    repository = conftest.copied_repository(tmp_path, generate={"max_concurrent_sequences": "16", "max_queue_size": "16",
                                                       "queue_timeout_s": "30"},
                                   decoder={"max_slots": "16", "idle_timeout_s": "60"})
    server = server_factory(repository, env={"ZEROCHECK_ARTIFACTS": str(conftest.test_artifacts_dir())})
    warm = Tally()
    with ThreadPoolExecutor(16) as pool:  # warm-up: every path and batch size once, then measure RSS
        list(pool.map(lambda i: one_request(server, random.Random(i), warm, f"warm-{i}"), range(48)))
    assert warm.counts["failed"] == 0, failure_report(server, warm)
    rss_before = server_rss(server)

    tally = Tally()
    deadline = time.monotonic() + seconds

    def worker(index: int) -> None:
        rng, sent = random.Random(1000 + index), 0
        while time.monotonic() < deadline:
            one_request(server, rng, tally, f"stress-{index}-{sent}")
            sent += 1

    start = time.monotonic()
    with ThreadPoolExecutor(STREAMS) as pool:
        list(pool.map(worker, range(STREAMS)))
    elapsed = time.monotonic() - start

    settle = time.monotonic() + 15
    while slots_in_use(server) != 0 and time.monotonic() < settle:
        time.sleep(0.2)
    slots = slots_in_use(server)
    rss_after = server_rss(server)
    growth = rss_after / rss_before - 1
    itl_ms = np.array(tally.itl) * 1e3
    p50, p95 = (np.percentile(itl_ms, [50, 95]) if len(itl_ms) else (float("nan"), float("nan")))
    print(f"\nstress {elapsed:.0f} s, {STREAMS} streams, 16 slots: requests ok {tally.counts['ok']}, "
          f"overloaded {tally.counts['overloaded']}, cancelled {tally.counts['cancelled']}, "
          f"failed {tally.counts['failed']}; ITL p50 {p50:.1f} ms p95 {p95:.1f} ms over {len(itl_ms)} gaps; "
          f"RSS {rss_before / 2**20:.0f} MiB -> {rss_after / 2**20:.0f} MiB ({growth:+.1%}); slots in use {slots:g}")
    assert tally.counts["failed"] == 0, failure_report(server, tally)
    assert tally.counts["ok"] > 0 and tally.counts["overloaded"] > 0 and tally.counts["cancelled"] > 0, tally.counts
    assert slots == 0
    assert growth < 0.10
    assert requests.get(f"http://{server.http_url}/v2/health/ready", timeout=10).status_code == 200
    reply = http_generate(server.http_url, {"text_input": PROMPTS[0], "max_tokens": 4})
    assert reply.status_code == 200, reply.text
