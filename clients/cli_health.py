"""`zerocheck health`: server live/ready and each model's readiness as a table, and where the models' states
came from; exit 0 when all is ready."""
from __future__ import annotations

import argparse

from zerocheck.clients.cli_options import add_connection_arguments, url_of
from zerocheck.clients.endpoint import Endpoint
from zerocheck.clients.health import DEFAULT_MODELS, INDEX, Health, check_health


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_connection_arguments(parser)
    parser.add_argument("--model", action="append", dest="models", default=None,
                        help=f"a model to check (repeatable; default: {', '.join(DEFAULT_MODELS)}); with --api-key "
                             "every model of the repository index")


def format_health(health: Health) -> str:
    rows = [("server", "", "LIVE" if health.live else "NOT LIVE", ""),
            ("server", "", "READY" if health.ready else "NOT READY", health.error)]
    rows += [(m.name, m.version, m.state, m.reason) for m in health.models]
    header = ("MODEL", "VERSION", "STATE", "REASON")
    widths = [max(len(str(row[i])) for row in (header, *rows)) for i in range(3)]
    table = "\n".join(("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)) + "  " + row[3]).rstrip()
                      for row in (header, *rows))
    if health.error:
        return table
    how = "every model, from the repository index (admin API, with --api-key)" if health.source == INDEX else \
        "checked through the model ready API (the repository index needs --api-key)"
    return f"{table}\nmodels: {how}"


def run(args: argparse.Namespace) -> int:
    endpoint = Endpoint(url_of(args), args.protocol, connect_timeout_s=args.connect_timeout, api_key=args.api_key)
    health = check_health(endpoint, args.models or DEFAULT_MODELS)
    print(format_health(health))
    return 0 if health.ok else 1
