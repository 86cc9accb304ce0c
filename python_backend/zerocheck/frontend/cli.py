"""`zerocheck openai`: the HTTP front end alone, against a running tritonserver (`zerocheck serve`
starts it by itself). Also `python -m zerocheck.frontend`."""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
from pathlib import Path

from zerocheck.frontend.app import FrontendOptions, serve_forever
from zerocheck.frontend.limits import HttpLimits

DEFAULT_LIMITS = HttpLimits()
CLIENT_API_KEY_ENV = "ZEROCHECK_CLIENT_API_KEY"


def served_model_name(artifacts: Path | None) -> str:
    """The name clients use: the packaged model's, else the GGUF file's or checkpoint directory's name,
    from the artifacts' manifest; "zerocheck" without one."""
    manifest = artifacts / "manifest.json" if artifacts else None
    if manifest is None or not manifest.is_file():
        return "zerocheck"
    options = json.loads(manifest.read_text()).get("options", {})
    for key in ("gguf", "hf_checkpoint"):
        if options.get(key):
            return Path(options[key]).stem if key == "gguf" else Path(options[key]).name
    return str(options.get("model") or "zerocheck")


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """The request limits of the front end (shared with `zerocheck serve`)."""
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_LIMITS.max_body_bytes,
                        help="largest HTTP request body, answered 413 above (default %(default)s; below 4 MiB: "
                             "Triton 2.51's HTTP server crashed on a 4 MB body)")
    parser.add_argument("--body-timeout-s", type=float, default=DEFAULT_LIMITS.body_timeout_s,
                        help="seconds for a request body to arrive, answered 408 after (default %(default)s)")
    parser.add_argument("--header-timeout-s", type=float, default=DEFAULT_LIMITS.header_timeout_s,
                        help="seconds a connection may take to send a whole request head (default %(default)s)")


def add_client_key_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--client-api-key", default=None,
                        help=f"require this key from clients of the OpenAI and Anthropic APIs (x-api-key: KEY or "
                             f"Authorization: Bearer KEY; 401 otherwise); default: ${CLIENT_API_KEY_ENV}, else open")


def client_key_of(args: argparse.Namespace) -> str | None:
    return args.client_api_key or os.environ.get(CLIENT_API_KEY_ENV) or None


def limits_of(args: argparse.Namespace) -> HttpLimits:
    return HttpLimits(args.max_body_bytes, args.body_timeout_s, args.header_timeout_s)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="127.0.0.1:8001", help="tritonserver's gRPC endpoint (default %(default)s)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    parser.add_argument("--port", type=int, default=9000, help="OpenAI API port (default %(default)s; 0 picks one)")
    parser.add_argument("--no-openai", action="store_true", help="serve no OpenAI API (only the door)")
    parser.add_argument("--triton-http-url", default=None,
                        help="also serve the guarded door to Triton's HTTP endpoint at this URL (http://host:port)")
    parser.add_argument("--door-port", type=int, default=None, help="the door's port (with --triton-http-url)")
    parser.add_argument("--model", default="generate", help="the Triton model to call (default %(default)s)")
    parser.add_argument("--served-model-name", default=None,
                        help="the model name clients send (default: from the artifacts' manifest)")
    parser.add_argument("--artifacts", type=Path, default=None,
                        help="artifacts of the served model, for its name and tokenizer "
                             "(default: $ZEROCHECK_ARTIFACTS, else none)")
    add_limit_arguments(parser)
    add_client_key_argument(parser)
    parser.add_argument("--ready-file", type=Path, default=None, help=argparse.SUPPRESS)


def options_of(args: argparse.Namespace) -> FrontendOptions:
    artifacts = args.artifacts or (Path(os.environ["ZEROCHECK_ARTIFACTS"]) if os.environ.get("ZEROCHECK_ARTIFACTS")
                                   else None)
    return FrontendOptions(
        grpc_url=args.url, host=args.host, openai_port=None if args.no_openai else args.port, door_port=args.door_port,
        triton_http_url=args.triton_http_url, model=args.model,
        served_model=args.served_model_name or served_model_name(artifacts), artifacts=artifacts,
        limits=limits_of(args), api_key=client_key_of(args))


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        options = options_of(args)
    except ValueError as error:
        print(f"error: {error}")
        return 2
    asyncio.run(serve_forever(options, args.ready_file))
    return 0
