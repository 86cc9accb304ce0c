"""`zerocheck` command line: one subcommand per module, imported only when it runs."""
from __future__ import annotations

import argparse
import importlib
import sys

from zerocheck import __version__

# subcommand -> module exposing `add_arguments(parser)` and `run(args) -> int`
SUBCOMMANDS = {
    "build": ("zerocheck.build.cli", "build the artifacts the model repository serves"),
    "serve": ("zerocheck.serve.cli", "start tritonserver on the model repository"),
    "generate": ("zerocheck.clients.cli_generate", "generate text from a running server"),
    "chat": ("zerocheck.clients.cli_chat", "chat with the served model in the terminal"),
    "openai": ("zerocheck.frontend.cli", "serve the OpenAI API (and the HTTP door) in front of a running server"),
    "health": ("zerocheck.clients.cli_health", "check server and model readiness"),
    "load": ("zerocheck.loadtests.cli", "run a Locust load test against the server"),
    "bench": ("zerocheck.bench.cli", "end-to-end benchmark of both sampler paths"),
    "paths": ("zerocheck.paths", "print where the model repository, artifacts, caches and logs are"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="zerocheck", description=__doc__)
    parser.add_argument("--version", action="version", version=f"zerocheck {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] not in SUBCOMMANDS:
        parser.parse_args(argv)  # prints usage / error and exits
    name = argv[0]
    module = importlib.import_module(SUBCOMMANDS[name][0])
    command_parser = argparse.ArgumentParser(prog=f"zerocheck {name}", description=SUBCOMMANDS[name][1])
    module.add_arguments(command_parser)
    return int(module.run(command_parser.parse_args(argv[1:])) or 0)


if __name__ == "__main__":
    sys.exit(main())
