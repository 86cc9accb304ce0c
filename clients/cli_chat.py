"""`zerocheck chat`: an interactive chat in the terminal. Replies stream as they are generated; the
conversation is kept and sent whole each turn (the server renders it with the model's chat
template). `/reset` starts over, `/exit` or Ctrl-D quits, Ctrl-C stops the reply being written
(the request is cancelled on the server) and keeps the program."""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Iterator, TextIO

from zerocheck.clients.cli_options import add_connection_arguments, add_generation_arguments, generation_kwargs, url_of
from zerocheck.clients.client import Client
from zerocheck.clients.errors import ZerocheckError, error_label

RESET, EXIT = "/reset", ("/exit", "/quit")
DEFAULT_MAX_TOKENS = 256


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_connection_arguments(parser)
    add_generation_arguments(parser)
    parser.add_argument("--system", help="a system message that opens the conversation (default: the template's)")
    parser.add_argument("--timeout", type=float, default=120.0, help="deadline per reply in seconds (default 120)")
    parser.set_defaults(max_tokens=DEFAULT_MAX_TOKENS)


class ChatSession:
    """The conversation and one turn of it; `turn` streams the reply to `out` and keeps it."""

    def __init__(self, client: Client, system: str | None, kwargs: dict, out: TextIO) -> None:
        self.client, self.kwargs, self.out = client, kwargs, out
        self.opening = [{"role": "system", "content": system}] if system else []
        self.messages = list(self.opening)

    def reset(self) -> None:
        self.messages = list(self.opening)

    def turn(self, text: str) -> None:
        """Send `text` as the user's turn and stream the reply. Ctrl-C cancels the reply (what arrived
        stays in the conversation); an error drops the user's turn."""
        self.messages.append({"role": "user", "content": text})
        stream = self.client.chat_stream(self.messages, **self.kwargs)
        reply: list[str] = []
        with _interrupts() as interrupted:
            try:
                for event in stream:
                    reply.append(event.text)
                    self.out.write(event.text)
                    self.out.flush()
                    if interrupted.is_set():  # Ctrl-C came while a finalizer ran, which swallowed it
                        raise KeyboardInterrupt
            except KeyboardInterrupt:
                stream.close()  # cancels the request on the server
                self.out.write(" [stopped]")
            except ZerocheckError as error:
                self.messages.pop()
                self.out.write(f"\nerror: {error_label(error)}: {error.message}\n"
                               f"(the turn was not kept; {RESET} starts a new conversation)\n")
                return
        self.out.write("\n")
        self.messages.append({"role": "assistant", "content": "".join(reply)})


@contextmanager
def _interrupts() -> Iterator[threading.Event]:
    """Ctrl-C during a reply raises KeyboardInterrupt as usual, and is also recorded: an exception
    raised while a finalizer (`__del__`) runs is dropped by Python, so the reply loop checks the record
    after each token. Only the main thread takes signals; elsewhere nothing is installed."""
    interrupted = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield interrupted
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        interrupted.set()
        signal.default_int_handler(signum, frame)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


def run(args: argparse.Namespace, stdin: TextIO = sys.stdin, out: TextIO = sys.stdout) -> int:
    client = Client(url_of(args), args.protocol, args.model, connect_timeout=args.connect_timeout,
                    timeout=args.timeout, api_key=args.api_key)
    session = ChatSession(client, args.system, generation_kwargs(args), out)
    out.write(f"chatting with {args.model} at {url_of(args)} ({args.protocol}); {RESET} starts over, "
              f"{EXIT[0]} or Ctrl-D quits, Ctrl-C stops a reply\n")
    while True:
        out.write("you> ")
        out.flush()
        try:
            line = stdin.readline()
        except KeyboardInterrupt:  # at the prompt: a fresh line, as a shell does
            out.write("\n")
            continue
        if not line:  # Ctrl-D
            out.write("\n")
            return 0
        text = line.strip()
        if text in EXIT:
            return 0
        if text == RESET:
            session.reset()
            out.write("(conversation cleared)\n")
        elif text:
            out.write("assistant> ")
            session.turn(text)
