"""NVIDIA AIPerf against zerocheck's OpenAI API, and the same load from zerocheck's Locust users, in one run.

    python benchmarks/aiperf_compare.py [--artifacts artifacts] [--requests 48]

AIPerf (`aiperf profile --endpoint-type chat --streaming`, concurrency 8, 64-token synthetic prompts,
exactly 64 output tokens, the served model's own tokenizer) runs from its own virtualenv,
`.venv-aiperf` (created on first use: `pip install aiperf==0.13.0`, about 2 minutes and 1.2 GB; its pins
are not the project's). Then `zerocheck load --protocol openai --profile aiperf` sends the same load
(loadtests/profiles/aiperf.yaml). Both against one `zerocheck serve` stack. Prints both tools' TTFT and
ITL (p50; AIPerf's ITL is per request (latency - TTFT) / (tokens - 1), so Locust's counterpart is its
TPOT) and their ratio, AIPerf's error count, and, to tell the tools' measuring apart from the load they
put on a shared machine, the server's own mean TTFT and TPOT over each run (its histograms) and each
tool's CPU seconds. Writes benchmarks/results/aiperf_compare.json. Exit status 1 when AIPerf saw errors
or the two tools differ by more than --tolerance.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from zerocheck import paths
from zerocheck.serve.stack import ServingStack  # noqa: E402

AIPERF = "aiperf==0.13.0"
VENV = ROOT / ".venv-aiperf"
CONCURRENCY, ISL, OSL = 8, 64, 64


def aiperf_binary() -> Path:
    """`.venv-aiperf/bin/aiperf`, installing it first when missing."""
    binary = VENV / "bin" / "aiperf"
    if not binary.exists():
        print(f"creating {VENV} with {AIPERF} (first run only, ~2 min) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", AIPERF], check=True)
    return binary


def server_view(stack: ServingStack) -> dict[str, float]:
    """Sums and counts of the server's TTFT and TPOT histograms (zero-check path)."""
    text = urllib.request.urlopen(f"http://{stack.metrics_url}/metrics", timeout=10).read().decode()
    found = {}
    for name in ("time_to_first_token", "time_per_output_token"):
        for part in ("sum", "count"):
            match = re.search(rf'^zerocheck_{name}_seconds_{part}{{sampler="zero_check"}} (\S+)$', text, re.M)
            found[f"{name}_{part}"] = float(match.group(1)) if match else 0.0
    return found


def measured(stack: ServingStack, run) -> tuple[dict, dict]:
    """Run `run()` and return (its result, the server's mean TTFT/TPOT in ms and the client's CPU seconds)."""
    before, cpu = server_view(stack), resource.getrusage(resource.RUSAGE_CHILDREN)
    result = run()
    after, cpu_after = server_view(stack), resource.getrusage(resource.RUSAGE_CHILDREN)
    delta = {k: after[k] - before[k] for k in after}
    return result, {
        "server_ttft_mean_ms": 1000 * delta["time_to_first_token_sum"] / max(delta["time_to_first_token_count"], 1),
        "server_tpot_mean_ms": 1000 * delta["time_per_output_token_sum"] / max(delta["time_per_output_token_count"], 1),
        "client_cpu_s": (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu.ru_utime + cpu.ru_stime)}


def run_aiperf(stack: ServingStack, artifacts: Path, requests: int, out: Path) -> dict:
    base = stack.openai_url.removesuffix("/v1")
    command = [str(aiperf_binary()), "profile", "--model", stack.frontend_served_model, "--url", base,
               "--endpoint-type", "chat", "--streaming", "--concurrency", str(CONCURRENCY),
               "--request-count", str(requests), "--warmup-request-count", str(CONCURRENCY),
               "--isl", str(ISL), "--isl-stddev", "0", "--osl", str(OSL), "--extra-inputs", f"min_tokens:{OSL}",
               "--tokenizer", str(artifacts / "hf_model"), "--ui-type", "none", "--artifact-dir", str(out),
               "--no-gpu-telemetry", "--no-server-metrics", "--workers-max", "1", "--record-processors", "1"]
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}  # a local tokenizer dir fails with it
    began = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    (out / "aiperf_stdout.txt").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"aiperf failed ({done.returncode}); see {out / 'aiperf_stdout.txt'}")
    summary = json.loads((out / "profile_export_aiperf.json").read_text())
    return {"ttft_p50_ms": summary["time_to_first_token"]["p50"], "itl_p50_ms": summary["inter_token_latency"]["p50"],
            "requests": summary.get("request_count", {}).get("avg", requests) if isinstance(
                summary.get("request_count"), dict) else summary.get("request_count"),
            "errors": summary.get("error_request_count", {}).get("avg", 0) if isinstance(
                summary.get("error_request_count"), dict) else summary.get("error_request_count", 0),
            "wall_s": time.monotonic() - began}


def run_locust(stack: ServingStack, artifacts: Path, out: Path) -> dict:
    command = [sys.executable, "-m", "zerocheck.cli", "load", "--protocol", "openai", "--profile", "aiperf",
               "--zerocheck", "on", "--openai-url", stack.openai_url, "--grpc-url", stack.grpc_url,
               "--http-url", stack.http_url, "--metrics-url", stack.metrics_url, "--artifacts", str(artifacts),
               "--out", str(out)]
    subprocess.run(command, check=True, timeout=600, capture_output=True)
    path = json.loads((out / "summary.json").read_text())["paths"]["zero_check"]
    return {"ttft_p50_ms": path["ttft_ms"]["p50"], "itl_p50_ms": path["tpot_ms"]["p50"],  # AIPerf's ITL is a TPOT
            "itl_gap_p50_ms": path["itl_ms"]["p50"], "requests": path["requests"], "errors": path["errors"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=paths.artifacts_dir())
    parser.add_argument("--requests", type=int, default=48, help="AIPerf's request count")
    parser.add_argument("--tolerance", type=float, default=0.15)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "aiperf")
    args = parser.parse_args()
    artifacts = args.artifacts.resolve()
    aiperf_binary()
    stack = ServingStack(paths.model_repository(), env={"ZEROCHECK_ARTIFACTS": str(artifacts)})
    stack.start()
    try:
        stack.wait_ready(600)
        print(f"AIPerf: concurrency {CONCURRENCY}, ISL {ISL}, OSL {OSL}, {args.requests} requests ...", flush=True)
        aiperf, aiperf_server = measured(stack, lambda: run_aiperf(stack, artifacts, args.requests,
                                                                   args.out / "aiperf_run"))
        print("zerocheck load --protocol openai --profile aiperf ...", flush=True)
        locust, locust_server = measured(stack, lambda: run_locust(stack, artifacts, args.out / "locust_run"))
        aiperf.update(aiperf_server)
        locust.update(locust_server)
    finally:
        stack.stop()
    ratios = {key: aiperf[key] / locust[key] for key in ("ttft_p50_ms", "itl_p50_ms")}
    result = {"aiperf": aiperf, "locust": locust, "aiperf_over_locust": ratios, "tolerance": args.tolerance}
    args.out.mkdir(parents=True, exist_ok=True)
    (ROOT / "benchmarks" / "results" / "aiperf_compare.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'tool':8s} {'TTFT p50 ms':>12s} {'ITL p50 ms':>11s} {'requests':>9s} {'errors':>7s} "
          f"{'server TTFT':>12s} {'server TPOT':>12s} {'tool CPU s':>11s}")
    for tool, row in (("AIPerf", aiperf), ("Locust", locust)):
        print(f"{tool:8s} {row['ttft_p50_ms']:12.1f} {row['itl_p50_ms']:11.2f} {row['requests']:9} {row['errors']:7} "
              f"{row['server_ttft_mean_ms']:12.1f} {row['server_tpot_mean_ms']:12.2f} {row['client_cpu_s']:11.1f}")
    print("AIPerf / Locust: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    within = all(abs(r - 1) <= args.tolerance for r in ratios.values())
    return 0 if aiperf["errors"] == 0 and within else 1


if __name__ == "__main__":
    sys.exit(main())
