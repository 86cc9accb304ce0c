"""Server-sent events of Triton's `generate_stream`: `data: {json}` lines, an error as `{"error": ...}`."""
from __future__ import annotations

import json

from zerocheck.clients.errors import ZerocheckError, error_from_message
from zerocheck.clients.response import Chunk


def parse_event_line(line: str) -> Chunk | ZerocheckError | None:
    """One line of the stream: a chunk, the error it carries, or None (blank line, comment, other field)."""
    if not line.startswith("data:"):
        return None
    try:
        event = json.loads(line[len("data:"):])
    except ValueError:
        return ZerocheckError(f"malformed event from the server: {line[:200]!r}")
    if "error" in event:
        return error_from_message(str(event["error"]))
    return Chunk.from_outputs(event)


def error_text(body: str) -> str:
    """The message of an error body: JSON `{"error": ...}` (also as an SSE line), else the body."""
    text = body.strip().removeprefix("data:").strip()
    try:
        return str(json.loads(text)["error"])
    except (ValueError, KeyError, TypeError):
        return text or "no message"


def ends_stream(item: Chunk | ZerocheckError | None) -> bool:
    """An error or the final chunk: nothing after it is read."""
    return isinstance(item, ZerocheckError) or isinstance(item, Chunk) and item.final
