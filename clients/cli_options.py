"""Connection flags shared by `zerocheck generate` and `zerocheck health`."""
from __future__ import annotations

import argparse

from zerocheck.clients.endpoint import DEFAULT_URLS, PROTOCOLS


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help=f"host:port (default {DEFAULT_URLS['grpc']} for grpc, "
                                      f"{DEFAULT_URLS['http']} for http)")
    parser.add_argument("--protocol", choices=PROTOCOLS, default="grpc")
    parser.add_argument("--connect-timeout", type=float, default=5.0, help="seconds to connect (default 5)")
    parser.add_argument("--api-key", help="sent as authorization: Bearer and as the restricted-API key")


def url_of(args: argparse.Namespace) -> str:
    return args.url or DEFAULT_URLS[args.protocol]
