"""`zerocheck load`: run the Locust load test headless against a running server (or one it starts with --serve),
then write `summary.json`, `client_latency.prom` and print the summary table next to Locust's CSV/HTML reports."""
from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from zerocheck import paths
from zerocheck.loadtests.client_textfile import write_client_latency
from zerocheck.loadtests.profiles import ProfileError, bundled_profiles, load_profile, profile_path
from zerocheck.loadtests.request_log import read_request_log
from zerocheck.loadtests.server_metrics import queue_wait, requests_by_sampler
from zerocheck.loadtests.summary import format_table, summarize
from zerocheck.loadtests.targets import (DEFAULT_GRPC_URL, DEFAULT_HTTP_URL, DEFAULT_METRICS_URL, DEFAULT_OPENAI_URL,
                                        RemoteTargetRefused, check_targets)

LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
USER_CLASSES = {"grpc": ["GrpcStreamUser"], "http": ["HttpStreamUser"], "openai": ["OpenAIStreamUser"],
                "anthropic": ["AnthropicStreamUser"], "both": ["GrpcStreamUser", "HttpStreamUser"]}
STOP_TIMEOUT_S = 60  # in-flight requests finish when users stop, so the server's counters match Locust's


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default="steady", help=f"{', '.join(bundled_profiles())} or a .yaml/.json file")
    parser.add_argument("--users", type=int, default=0, help="scale the profile's peak to N users")
    parser.add_argument("--duration", type=float, default=0.0, help="stretch the profile to S seconds")
    parser.add_argument("--zerocheck", choices=("on", "off", "ab"), default="ab",
                        help="sampler path; ab alternates per request (request names carry the path)")
    parser.add_argument("--protocol", choices=tuple(USER_CLASSES), default="both", help="which users run")
    parser.add_argument("--url", default=None, help="host:port of the chosen --protocol (grpc or http), or the "
                                                    "OpenAI API's base URL (http://host:port/v1; the Anthropic "
                                                    "API is served on the same port)")
    parser.add_argument("--grpc-url", default=DEFAULT_GRPC_URL)
    parser.add_argument("--http-url", default=DEFAULT_HTTP_URL)
    parser.add_argument("--openai-url", default=DEFAULT_OPENAI_URL)
    parser.add_argument("--metrics-url", default=DEFAULT_METRICS_URL, help="server metrics, for counter deltas")
    parser.add_argument("--model", default="ensemble")
    parser.add_argument("--prompt-source", default="synthetic", help="synthetic or file[:PATH]")
    parser.add_argument("--artifacts", type=Path, default=None,
                        help="artifacts with the tokenizer (prompts; also served with --serve); "
                             "default: `zerocheck paths artifacts`")
    parser.add_argument("--serve", action="store_true", help="start a tritonserver on free loopback ports first")
    parser.add_argument("--master", action="store_true", help="run Locust as a master with --workers processes")
    parser.add_argument("--workers", type=int, default=2, help="worker processes with --master")
    parser.add_argument("--out", type=Path, default=None, help="report directory (default: loadtest-results/<time>)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--allow-remote", action="store_true", help="allow targets that are not loopback")


@dataclass(frozen=True)
class Targets:
    grpc_url: str
    http_url: str
    metrics_url: str
    openai_url: str


def targets_of(args: argparse.Namespace) -> Targets:
    """The endpoints from --url/--grpc-url/--http-url/--openai-url/--metrics-url (ValueError for --url with both)."""
    urls = {"grpc": args.grpc_url, "http": args.http_url, "openai": args.openai_url}
    if args.url:
        if args.protocol == "both":
            raise ValueError("--url needs --protocol grpc, http, openai or anthropic; use --grpc-url and --http-url "
                             "for both")
        urls["openai" if args.protocol == "anthropic" else args.protocol] = args.url
    return Targets(urls["grpc"], urls["http"], args.metrics_url, urls["openai"])


@contextlib.contextmanager
def served(args: argparse.Namespace, targets: Targets) -> Iterator[Targets]:
    """`targets` as given, or those of a server started here (stopped on exit) when --serve."""
    if not args.serve:
        yield targets
        return
    from zerocheck.serve.stack import ServingStack

    artifacts = args.artifacts or paths.artifacts_dir()
    server = ServingStack(paths.model_repository(), env={paths.ARTIFACTS_ENV: str(artifacts.resolve())})
    print(f"starting tritonserver and the front end (log: {server.log_path}) ...", flush=True)
    server.start()
    try:
        server.wait_ready(600)
        yield Targets(server.grpc_url, server.http_url, server.metrics_url, server.openai_url)
    finally:
        server.stop()


def locust_command(args: argparse.Namespace, targets: Targets, out: Path) -> list[str]:
    command = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
               "--csv", str(out / "locust"), "--html", str(out / "report.html"), "--stop-timeout", str(STOP_TIMEOUT_S),
               "--load-profile", str(profile_path(args.profile)), "--profile-users", str(args.users),
               "--profile-duration", str(args.duration), "--zerocheck", args.zerocheck,
               "--grpc-url", targets.grpc_url, "--http-url", targets.http_url, "--openai-url", targets.openai_url,
               "--model", args.model,
               "--prompt-source", args.prompt_source, "--request-log", str(out / "requests"), "--seed", str(args.seed)]
    if args.artifacts:
        command += ["--artifacts", str(args.artifacts)]
    if args.allow_remote:
        command.append("--allow-remote")
    if args.master:
        command += ["--processes", str(args.workers)]
    return command + USER_CLASSES[args.protocol]


def server_requests(metrics_url: str) -> dict[str, float] | None:
    """`zerocheck_requests_total` by sampler, and the queue wait's sum and count (keys `queue_wait_s`,
    `queue_wait_requests`); None when the metrics endpoint does not answer."""
    try:
        seconds, admitted = queue_wait(metrics_url)
        return {**requests_by_sampler(metrics_url), "queue_wait_s": seconds, "queue_wait_requests": admitted}
    except OSError:
        return None


def run(args: argparse.Namespace) -> int:
    try:
        profile = load_profile(args.profile).scaled(args.users or None, args.duration or None)
        targets = targets_of(args)
        check_targets([targets.grpc_url, targets.http_url, targets.metrics_url, targets.openai_url], args.allow_remote)
    except (ProfileError, RemoteTargetRefused, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = args.out or Path("loadtest-results") / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    with served(args, targets) as targets:
        before = server_requests(targets.metrics_url)
        print(f"load: profile {profile.name} ({profile.duration:.0f} s, peak {profile.peak_users} users), "
              f"zerocheck={args.zerocheck}, protocol={args.protocol}, reports in {out}", flush=True)
        try:
            returncode = subprocess.run(locust_command(args, targets, out),
                                        timeout=profile.duration + STOP_TIMEOUT_S + 60).returncode
        except subprocess.TimeoutExpired:
            print("error: Locust did not stop in time", file=sys.stderr)
            returncode = 1
        after = server_requests(targets.metrics_url)
    summary = summarize(read_request_log(out / "requests"))
    if before is not None and after is not None:
        delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
        waited, admitted = delta.pop("queue_wait_s"), delta.pop("queue_wait_requests")
        summary["server_requests_delta"] = delta
        summary["server_queue_wait_mean_ms"] = 1000 * waited / admitted if admitted else 0.0
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_client_latency(summary, out / "client_latency.prom")
    print(format_table(summary))
    if "server_queue_wait_mean_ms" in summary:
        print(f"server queue wait (arrival to a KV-cache slot): mean {summary['server_queue_wait_mean_ms']:.1f} ms")
    print(f"reports: {out}/summary.json, report.html, locust_stats.csv, client_latency.prom")
    return returncode
