"""`zerocheck health`: server live/ready and every model's readiness as a table; exit 0 when all is ready."""
from __future__ import annotations

import argparse

from zerocheck.clients.cli_options import add_connection_arguments, url_of
from zerocheck.clients.endpoint import Endpoint
from zerocheck.clients.health import Health, check_health


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_connection_arguments(parser)


def format_health(health: Health) -> str:
    rows = [("server", "", "LIVE" if health.live else "NOT LIVE", ""),
            ("server", "", "READY" if health.ready else "NOT READY", health.error)]
    rows += [(m.name, m.version, m.state, m.reason) for m in health.models]
    header = ("MODEL", "VERSION", "STATE", "REASON")
    widths = [max(len(str(row[i])) for row in (header, *rows)) for i in range(3)]
    return "\n".join(("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)) + "  " + row[3]).rstrip()
                     for row in (header, *rows))


def run(args: argparse.Namespace) -> int:
    endpoint = Endpoint(url_of(args), args.protocol, connect_timeout_s=args.connect_timeout, api_key=args.api_key)
    health = check_health(endpoint)
    print(format_health(health))
    return 0 if health.ok else 1
