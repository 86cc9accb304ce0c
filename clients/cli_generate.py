"""`zerocheck generate "prompt"`: text as it arrives, then a one-line summary; `--json` for scripts.
`--json-schema FILE`, `--regex`, `--grammar FILE` or `--choice` constrain the answer (structured output)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from zerocheck.clients.attempts import DEFAULT_HEDGE_AFTER_S
from zerocheck.clients.cli_options import add_connection_arguments, add_generation_arguments, generation_kwargs, url_of
from zerocheck.clients.client import Client
from zerocheck.clients.errors import ZerocheckError, error_label
from zerocheck.clients.response import GenerateResult


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt")
    parser.add_argument("--chat", action="store_true",
                        help="send the prompt as one user turn of a chat (the model's chat template applies)")
    add_connection_arguments(parser)
    add_generation_arguments(parser)
    guides = parser.add_mutually_exclusive_group()
    guides.add_argument("--json-schema", metavar="FILE", type=Path, help="the answer is a JSON document of this schema")
    guides.add_argument("--json-object", action="store_true", help="the answer is a JSON object")
    guides.add_argument("--regex", help="the answer matches this regular expression")
    guides.add_argument("--grammar", metavar="FILE", type=Path, help="the answer matches this GBNF (or Lark) grammar")
    guides.add_argument("--choice", action="append", help="the answer is one of these strings (repeatable)")
    parser.add_argument("--stream", action="store_true", help="print tokens as they arrive")
    parser.add_argument("--json", action="store_true", help="one JSON object per line: events, then the final")
    parser.add_argument("--timeout", type=float, default=60.0, help="total deadline in seconds (default 60)")
    parser.add_argument("--retries", type=int, default=3, help="retries before the first token (default 3)")
    parser.add_argument("--hedge-after-s", type=float, nargs="?", const=DEFAULT_HEDGE_AFTER_S,
                        help=f"hedge a request with no token after this long (flag alone: {DEFAULT_HEDGE_AFTER_S})")


def summary(result: GenerateResult) -> str:
    return (f"{result.completion_tokens} tokens ({result.finish_reason}), TTFT {result.ttft_s * 1000:.0f} ms, "
            f"{result.tokens_per_s:.1f} tokens/s, sampler {result.sampler}, "
            f"bypass {str(result.zerocheck_bypass).lower()}, retries {result.retries}, "
            f"hedged {str(result.hedged).lower()}")


CHAT_HINT = ("hint: the model ended its completion before any token. It is chat-tuned (it has a chat template) "
             "and answers a prompt sent as a user turn: add --chat")


def ended_at_once(result: GenerateResult) -> bool:
    """A completion that stopped at an end-of-sequence token before its first token."""
    return result.completion_tokens == 0 and result.finish_reason == "eos"


def guide_kwargs(args: argparse.Namespace) -> dict:
    """`guide_type` / `guide` of the structured-output flag given (none: {})."""
    if args.json_schema is not None:
        return {"guide_type": "json_schema", "guide": args.json_schema.read_text()}
    if args.json_object:
        return {"guide_type": "json"}
    if args.regex is not None:
        return {"guide_type": "regex", "guide": args.regex}
    if args.grammar is not None:
        return {"guide_type": "ebnf_grammar", "guide": args.grammar.read_text()}
    if args.choice:
        return {"guide_type": "choice", "guide": json.dumps(args.choice)}
    return {}


def run(args: argparse.Namespace) -> int:
    client = Client(url_of(args), args.protocol, args.model, connect_timeout=args.connect_timeout,
                    timeout=args.timeout, retries=args.retries, hedge_after_s=args.hedge_after_s,
                    api_key=args.api_key)
    try:
        kwargs = {**generation_kwargs(args), **guide_kwargs(args)}
    except OSError as error:
        print(f"error: {error.filename}: {error.strerror}", file=sys.stderr)
        return 2
    events = client.chat_stream([{"role": "user", "content": args.prompt}], **kwargs) if args.chat \
        else client.stream(args.prompt, **kwargs)
    try:
        for event in events:
            if args.json and (args.stream or event.final):
                print(json.dumps(event.final.to_dict() if event.final else event.to_dict()), flush=True)
            elif args.stream:
                print(event.text, end="", flush=True)
            if event.final and not args.json:
                print(("\n" if args.stream else event.final.text + "\n") + summary(event.final))
            if event.final and not args.chat and ended_at_once(event.final) and client.has_chat_template():
                print(CHAT_HINT, file=sys.stderr)
    except ZerocheckError as error:
        print(f"error: {error_label(error)}: {error.message}", file=sys.stderr)
        return 1
    return 0
