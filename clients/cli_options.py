"""Flags shared by `zerocheck generate`, `zerocheck chat` and `zerocheck health`."""
from __future__ import annotations

import argparse

from zerocheck.clients.endpoint import DEFAULT_URLS, PROTOCOLS
from zerocheck.clients.request import SAMPLING_NAMES
from zerocheck.sampling import SAMPLING_PARAMETERS


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help=f"host:port (default {DEFAULT_URLS['grpc']} for grpc, "
                                      f"{DEFAULT_URLS['http']} for http)")
    parser.add_argument("--protocol", choices=PROTOCOLS, default="grpc")
    parser.add_argument("--connect-timeout", type=float, default=5.0, help="seconds to connect (default 5)")
    parser.add_argument("--api-key", help="sent as authorization: Bearer and as the restricted-API key")


def url_of(args: argparse.Namespace) -> str:
    return args.url or DEFAULT_URLS[args.protocol]


def add_generation_arguments(parser: argparse.ArgumentParser) -> None:
    """The model, the sampling knobs (SAMPLING_PARAMETERS), seed, stop words and the zero-check switch."""
    parser.add_argument("--model", default="ensemble", help="generate or ensemble (default)")
    parser.add_argument("--max-tokens", type=int, help="tokens to generate (default: the server's)")
    for spec in SAMPLING_PARAMETERS:
        parser.add_argument(f"--{spec.name.replace('_', '-')}", type=spec.kind,
                            help=f"{spec.doc}; in {spec.interval()}, default {spec.default}")
    parser.add_argument("--seed", type=int, help="same seed, same tokens")
    parser.add_argument("--stop", action="append", help="stop word (repeatable)")
    parser.add_argument("--bad-words", action="append", help="word that never appears (repeatable)")
    parser.add_argument("--zerocheck", choices=("on", "off"), default="on", help="zero-check sampler path")


def generation_kwargs(args: argparse.Namespace) -> dict:
    """`Client.generate` / `Client.chat` keyword arguments from `add_generation_arguments` flags."""
    return {"max_tokens": args.max_tokens, "seed": args.seed, "stop": args.stop, "bad_words": args.bad_words,
            "zerocheck": args.zerocheck == "on", **{name: getattr(args, name) for name in SAMPLING_NAMES}}
