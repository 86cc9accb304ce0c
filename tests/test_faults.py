"""Faults on a real server (own servers over a copied repository): a decoder step that raises fails only
its own requests; a killed model-instance stub turns the server not-ready and clients get errors, not hangs."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import requests
from tritonclient.utils import InferenceServerException

import conftest
from generate_calls import grpc_generate, slots_in_use
from zerocheck.serve.server import port_is_free
from zerocheck.serve.shm import SHM_DIR
from zerocheck.tokenizer import load_tokenizer

PROMPT = "def fibonacci(n):"
POISON_WORD = " return"  # one token in the test tokenizer; its id is the decoder's test_fail_token
ERROR_WITHIN_S = 60.0  # a client must get its error within this (no hang); the real figure is printed




def outcome(server, fields, started: threading.Event | None = None) -> tuple[str, str, float]:
    """("ok", finish_reason, seconds) or ("error", message, seconds); sets `started` at the first token."""
    start = time.perf_counter()
    try:
        responses = grpc_generate(server.grpc_url, fields, timeout=ERROR_WITHIN_S,
                                  on_response=started and (lambda response: started.set()))
    except InferenceServerException as error:
        return "error", error.message(), time.perf_counter() - start
    except Exception as error:  # e.g. the stream's queue timed out: a hang
        return "hang" if "Empty" in type(error).__name__ else "error", repr(error), time.perf_counter() - start
    return "ok", responses[-1]["finish_reason"], time.perf_counter() - start


def test_decoder_fault_fails_only_the_affected_requests(server_factory, tmp_path: Path) -> None:
    tokenizer = load_tokenizer(conftest.test_artifacts_dir())
    (fail_token,) = tokenizer.encode(POISON_WORD)
    assert fail_token not in tokenizer.encode(PROMPT) and fail_token in tokenizer.encode(PROMPT + POISON_WORD)
    repository = conftest.copied_repository(tmp_path, decoder={"test_fail_token": str(fail_token)})
    server = server_factory(repository, env={"ZEROCHECK_ARTIFACTS": str(conftest.test_artifacts_dir())})
    good = {"text_input": PROMPT, "max_tokens": 12, "stream": True, "temperature": 0.8,
            "bad_words": [POISON_WORD]}  # never generate the poison token
    poisoned = {"text_input": PROMPT + POISON_WORD, "max_tokens": 12, "stream": True}
    jobs = [good if i % 3 else poisoned for i in range(24)]  # 16 good, 8 poisoned, all at once
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(lambda fields: outcome(server, {**fields, "seed": 7}), jobs))
    good_results = [r for r, fields in zip(results, jobs) if fields is good]
    bad_results = [r for r, fields in zip(results, jobs) if fields is poisoned]
    print(f"good: {[r[:2] for r in good_results[:3]]}..., poisoned: {bad_results[0]}; "
          f"slowest {max(r[2] for r in results):.1f} s")
    assert all(r[0] == "ok" and r[1] == "length" for r in good_results), good_results
    assert all(r[0] == "error" and "internal error (" in r[1] and "Traceback" not in r[1] for r in bad_results), bad_results
    deadline = time.monotonic() + 15
    while slots_in_use(server) != 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert slots_in_use(server) == 0
    stats = requests.get(f"http://{server.http_url}/v2/models/decoder/stats", timeout=10).json()
    sizes = [b["batch_size"] for b in stats["model_stats"][0]["batch_stats"]]
    print(f"decoder batch sizes: {sizes}")


def stub_of(server, model: str) -> psutil.Process:
    """The python backend stub process of `model`'s instance (its argv names the model's model.py)."""
    stubs = [p for p in psutil.Process(server.pid).children(recursive=True)
             if f"/{model}/1/model.py" in " ".join(p.cmdline())]
    assert len(stubs) == 1, stubs
    return stubs[0]


def health_ready(server) -> int | None:
    """HTTP status of /v2/health/ready; None when nothing answers (the server is gone)."""
    try:
        return requests.get(f"http://{server.http_url}/v2/health/ready", timeout=5).status_code
    except requests.RequestException:
        return None


@pytest.mark.parametrize("model", ["decoder"])
def test_killed_stub_turns_the_server_not_ready_and_clients_get_errors(server_factory, tmp_path: Path,
                                                                        model: str) -> None:
    server = server_factory(conftest.copied_repository(tmp_path),
                            env={"ZEROCHECK_ARTIFACTS": str(conftest.test_artifacts_dir())})
    regions = {arg for child in psutil.Process(server.pid).children(recursive=True) for arg in child.cmdline()
               if "shm_region" in arg}
    assert health_ready(server) == 200
    long_stream = {"text_input": PROMPT, "max_tokens": 200, "stream": True, "end_id": -1}  # no early EOS
    started = [threading.Event() for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        in_flight = [pool.submit(outcome, server, long_stream, event) for event in started]
        assert all(event.wait(ERROR_WITHIN_S) for event in started)  # every stream is generating
        killed_at = time.perf_counter()
        stub_of(server, model).kill()
        after = pool.submit(outcome, server, {"text_input": PROMPT, "max_tokens": 4, "stream": True})
        results = [f.result() for f in in_flight] + [after.result()]
    status = health_ready(server)
    while status == 200 and time.perf_counter() - killed_at < ERROR_WITHIN_S:
        time.sleep(0.2)
        status = health_ready(server)
    not_ready_s = time.perf_counter() - killed_at
    print(f"killed {model}: health {status} after {not_ready_s:.1f} s; clients: "
          f"{[(r[0], r[1][:60], round(r[2], 1)) for r in results]}")
    assert status != 200, "the server still reports ready with a dead model instance"
    assert all(r[0] != "hang" for r in results), results
    assert all(r[0] == "error" or r[1] != "length" for r in results[:4]), "an in-flight stream outlived its decoder"
    assert results[-1][0] == "error", results[-1]
    assert all("Traceback" not in r[1] for r in results)
    server.stop()  # clean restart: no stale shared memory, ports free
    assert not any((SHM_DIR / region).exists() for region in regions)
    assert all(port_is_free(server.host, port) for port in server.ports.values())
