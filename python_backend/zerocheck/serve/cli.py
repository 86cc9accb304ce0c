"""`zerocheck serve`: build missing artifacts, start tritonserver on the model repository, serve until Ctrl-C."""
from __future__ import annotations

import argparse
import json
import secrets
import signal
import sys
import tempfile
import time
from pathlib import Path

from zerocheck import paths
from zerocheck.serve.binary import TritonServerNotFound
from zerocheck.serve.demo import DemoError, stream_chat
from zerocheck.frontend.cli import add_client_key_argument, add_limit_arguments, client_key_of, limits_of
from zerocheck.api.headers import API_KEY_HEADER, GRPC_API_KEY_HEADER, ZERO_CHECK_BETA
from zerocheck.serve.repository import GPU_MODELS, copy_repository
from zerocheck.serve.server import RESTRICTED_APIS, TritonServerError
from zerocheck.serve.stack import ServingStack

DEMO_QUESTION = "What is the capital of France? Answer in one sentence."
# the demo samples at a low temperature: at the API's default of 1 this 135M model's answers often wander off
# (past its few likely first tokens its distribution has a long tail, and a draw from the tail derails the answer)
DEMO_TEMPERATURE, DEMO_TOP_P = 0.2, 0.9
TRY_BODY = {"messages": json.dumps([{"role": "user", "content": "Write a haiku about the sea."}]), "max_tokens": 64}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-repository", type=Path, default=None,
                        help="default: $ZEROCHECK_MODEL_REPOSITORY, else the one installed with the package")
    parser.add_argument("--artifacts", type=Path, default=None,
                        help="artifacts the models load (default: $ZEROCHECK_ARTIFACTS, else "
                             "~/.cache/zerocheck/artifacts: `zerocheck paths`)")
    parser.add_argument("--http-port", type=int, default=8000,
                        help="the public HTTP port: Triton's HTTP API through the guarded door (0 picks a free port)")
    parser.add_argument("--grpc-port", type=int, default=8001, help="0 picks a free port")
    parser.add_argument("--metrics-port", type=int, default=8002, help="0 picks a free port")
    parser.add_argument("--openai-port", type=int, default=9000,
                        help="the OpenAI and Anthropic APIs (0 picks a free port)")
    parser.add_argument("--no-openai", action="store_true", help="serve no OpenAI or Anthropic API")
    add_limit_arguments(parser)
    add_client_key_argument(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 exposes the server)")
    parser.add_argument("--tritonserver", default=None, help="tritonserver binary (default: nvidia-pytriton's)")
    parser.add_argument("--api-key", default=None,
                        help=f"require header '{API_KEY_HEADER}: KEY' for the {', '.join(RESTRICTED_APIS)} APIs "
                             f"(default: a random key, so they are never open)")
    parser.add_argument("--log-file", type=Path, default=None, help="server log (default: a new file in ~/.local/state/zerocheck/logs: `zerocheck paths`)")
    parser.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for every model")
    parser.add_argument("--demo", action="store_true", help="stream one generation from `generate`, then exit")
    parser.add_argument("--no-build", action="store_true", help="do not build missing artifacts")
    parser.add_argument("--instances", choices=("auto", "cpu", "gpu"), default="auto",
                        help="where the decoder and zero_check_sampler instances run: gpu = KIND_GPU instance "
                             "groups (a copy of the repository); auto = gpu when torch sees a CUDA device")


def ensure_artifacts(artifacts: Path, build: bool) -> bool:
    """False when `artifacts` is missing or empty and cannot be built (says why); builds it when allowed."""
    if artifacts.is_dir() and any(artifacts.iterdir()):
        return True
    if not build:
        print(f"warning: no artifacts in {artifacts} (--no-build); models needing them will fail", file=sys.stderr)
        return True
    try:
        from zerocheck.build import BuildError, BuildOptions, build_artifacts
    except ImportError as error:
        print(f"no artifacts in {artifacts} and zerocheck.build is unavailable ({error}):\n"
              f"  run `zerocheck build` first (or pass --artifacts DIR)", file=sys.stderr)
        return False
    print(f"building artifacts into {artifacts} ...", flush=True)
    try:
        build_artifacts(BuildOptions(), artifacts)
    except BuildError as error:
        print(f"building artifacts failed: {error}\n  run `zerocheck build` to see why", file=sys.stderr)
        return False
    return True


def print_endpoints(server: ServingStack, key_given: bool) -> None:
    """The addresses, the log path and a curl line to try."""
    print(f"tritonserver ready (pid {server.pid}), log: {server.log_path}")
    print(f"  HTTP     http://{server.http_url}   (Triton's HTTP API through the guarded door)\n"
          f"  gRPC     {server.grpc_url}\n  metrics  http://{server.metrics_url}/metrics")
    if server.openai_port is not None:
        print(f"  OpenAI   {server.openai_url}   (model {server.frontend_served_model})\n"
              f"  Anthropic {server.anthropic_url}/v1/messages   (header anthropic-beta: {ZERO_CHECK_BETA} "
              f"for the zero-check path)")
    print(f"  {', '.join(RESTRICTED_APIS)} APIs need header '{API_KEY_HEADER}: <key>' "
          f"(gRPC metadata '{GRPC_API_KEY_HEADER}')"
          + ("" if key_given else "; no --api-key given: locked with a random key"))
    print(f"try:\n  zerocheck chat --url {server.grpc_url}\n"
          f"  curl -s -X POST http://{server.http_url}/v2/models/ensemble/generate -d '{json.dumps(TRY_BODY)}'")
    if server.openai_port is not None:
        chat = {"model": server.frontend_served_model, "messages": [{"role": "user", "content": "Hi!"}]}
        print(f"  curl -s {server.openai_url}/chat/completions -H 'Content-Type: application/json' "
              f"-d '{json.dumps(chat)}'")
    print(end="", flush=True)


def run_demo(server: ServingStack) -> None:
    """Print DEMO_QUESTION, then each streamed piece of the model's answer as it arrives."""
    print(f"user> {DEMO_QUESTION}\nassistant> ", end="", flush=True)
    for piece in stream_chat(server.grpc_url, DEMO_QUESTION, max_tokens=64, temperature=DEMO_TEMPERATURE,
                             top_p=DEMO_TOP_P):
        print(piece, end="", flush=True)
    print()


def serve_until_stopped(server: ServingStack) -> int:
    """Block until Ctrl-C/SIGTERM (KeyboardInterrupt, handled by the caller) or until the server dies (1)."""
    while server.is_alive():
        time.sleep(0.5)
    print(f"tritonserver exited on its own; log tail:\n{server.log_tail()}", file=sys.stderr)
    return 1


def interrupt(signum: int, frame: object) -> None:
    """SIGINT/SIGTERM handler: unwind as KeyboardInterrupt so the server is stopped (also when SIGINT was ignored)."""
    raise KeyboardInterrupt


def place_on_gpus(instances: str) -> bool:
    """--instances made concrete: auto is gpu when torch sees a CUDA device (decided once, at start)."""
    if instances != "auto":
        return instances == "gpu"
    import torch

    return torch.cuda.is_available()


def run(args: argparse.Namespace) -> int:
    repository = (args.model_repository or paths.model_repository()).resolve()
    artifacts = (args.artifacts or paths.artifacts_dir()).resolve()
    if not repository.is_dir():
        print(f"no model repository at {repository}", file=sys.stderr)
        return 2
    if not ensure_artifacts(artifacts, build=not args.no_build):
        return 2
    if place_on_gpus(args.instances):
        placed = Path(tempfile.mkdtemp(prefix="zerocheck-gpu-")) / "model_repository"
        repository = copy_repository(placed, source=repository, gpu_models=GPU_MODELS)
        print(f"KIND_GPU instances for {', '.join(GPU_MODELS)} (repository copied to {repository})", flush=True)
    try:
        server = ServingStack(
            repository, http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port,
            openai_port=args.openai_port, openai=not args.no_openai,
            limits=limits_of(args), client_api_key=client_key_of(args),
            host=args.host, tritonserver=args.tritonserver, log_file=args.log_file,
            env={"ZEROCHECK_ARTIFACTS": str(artifacts)},
            restricted_api_key=args.api_key or secrets.token_urlsafe(32),  # never open by default
        )
    except (TritonServerNotFound, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start()
        print(f"starting tritonserver on {repository} with artifacts {artifacts} (log: {server.log_path}) ...",
              flush=True)
        server.wait_ready(args.ready_timeout)
        print_endpoints(server, bool(args.api_key))
        if args.demo:
            run_demo(server)
            return 0
        return serve_until_stopped(server)
    except (TritonServerError, DemoError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        print("tritonserver stopped", flush=True)
