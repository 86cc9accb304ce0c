"""A 20 s headless Locust run (`zerocheck load`: 4 users, gRPC and HTTP, --zerocheck ab) against the session server:
reports exist, TTFT/ITL were measured, nothing failed, and the server's zerocheck_requests_total moved by exactly
the number of successful requests Locust recorded on each sampler path."""
from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import pytest

from zerocheck.loadtests import cli
from zerocheck.loadtests.server_metrics import requests_by_sampler
from zerocheck.serve.stack import ServingStack

PATHS = ("zero_check", "checked")


def load_args(server: ServingStack, out: Path, protocol: str = "both", duration: int = 20) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args([
        "--profile", "steady", "--users", "4", "--duration", str(duration), "--zerocheck", "ab", "--protocol", protocol,
        "--grpc-url", server.grpc_url, "--http-url", server.http_url, "--openai-url", server.openai_url,
        "--metrics-url", server.metrics_url, "--artifacts", server.env["ZEROCHECK_ARTIFACTS"], "--out", str(out)])


def test_load_run_matches_server_counters(triton_server: ServingStack, tmp_path: Path) -> None:
    before = requests_by_sampler(triton_server.metrics_url)
    assert cli.run(load_args(triton_server, tmp_path)) == 0
    after = requests_by_sampler(triton_server.metrics_url)

    for report in ("locust_stats.csv", "locust_failures.csv", "report.html", "summary.json", "client_latency.prom"):
        assert (tmp_path / report).is_file(), report
    rows = list(csv.DictReader((tmp_path / "locust_stats.csv").open()))
    requests = {(r["Type"], r["Name"]): int(r["Request Count"]) - int(r["Failure Count"]) for r in rows}
    failures = sum(int(r["Failure Count"]) for r in rows if r["Name"] == "Aggregated")
    assert failures == 0, (tmp_path / "locust_failures.csv").read_text()
    for protocol, endpoint in (("gRPC", "stream_infer"), ("HTTP", "generate_stream")):
        for path in PATHS:
            name = f"{endpoint}[{path}]"
            assert requests.get((protocol, name), 0) > 0, (protocol, name)
            for metric in ("time_to_first_token", "inter_token_latency"):
                assert requests.get((metric, name), 0) > 0, (metric, name)

    for path in PATHS:
        recorded = requests[("gRPC", f"stream_infer[{path}]")] + requests[("HTTP", f"generate_stream[{path}]")]
        assert after.get(path, 0) - before.get(path, 0) == recorded, path

    summary = json.loads((tmp_path / "summary.json").read_text())["paths"]
    assert summary["zero_check"]["bypass_rate"] == 1.0 and summary["checked"]["bypass_rate"] == 0.0
    for path in PATHS:
        assert summary[path]["errors"] == 0
        assert summary[path]["ttft_ms"]["p50"] > 0 and summary[path]["itl_ms"]["p50"] > 0
        assert summary[path]["output_tokens_per_s"] > 0


@pytest.mark.parametrize("protocol, kind, endpoint", [("openai", "OpenAI", "chat_completions"),
                                                      ("anthropic", "Anthropic", "messages")])
def test_openai_and_anthropic_users_share_the_accounting(triton_server: ServingStack, tmp_path: Path, protocol: str,
                                                         kind: str, endpoint: str) -> None:
    before = requests_by_sampler(triton_server.metrics_url)
    assert cli.run(load_args(triton_server, tmp_path, protocol=protocol, duration=10)) == 0
    after = requests_by_sampler(triton_server.metrics_url)
    rows = list(csv.DictReader((tmp_path / "locust_stats.csv").open()))
    requests = {(r["Type"], r["Name"]): int(r["Request Count"]) - int(r["Failure Count"]) for r in rows}
    assert sum(int(r["Failure Count"]) for r in rows if r["Name"] == "Aggregated") == 0
    for path in PATHS:
        name = f"{endpoint}[{path}]"
        assert requests.get((kind, name), 0) > 0 and requests.get(("time_to_first_token", name), 0) > 0
        assert after.get(path, 0) - before.get(path, 0) == requests[(kind, name)], path
    summary = json.loads((tmp_path / "summary.json").read_text())["paths"]
    assert summary["zero_check"]["bypass_rate"] == 1.0 and summary["checked"]["bypass_rate"] == 0.0
