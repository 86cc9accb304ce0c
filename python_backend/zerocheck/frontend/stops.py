"""Stop strings applied to streamed text (OpenAI's `stop`, Anthropic's `stop_sequences`)."""
from __future__ import annotations


class StopMatcher:
    """The text ends before the first stop string, which is not returned (`matched` names it). Text
    that may be the start of a stop string is held back until it is known not to be one. (The server
    also stops at the stop words' tokens; this catches a stop string that spans tokens otherwise.)"""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops, self.held = stops, ""
        self.matched: str | None = None

    @property
    def stopped(self) -> bool:
        return self.matched is not None

    def push(self, text: str) -> str:
        """The text that is final now; sets `matched` when a stop string appeared."""
        if self.stopped or not self.stops:
            return "" if self.stopped else text
        self.held += text
        hits = [(i, stop) for stop in self.stops if (i := self.held.find(stop)) >= 0]
        if hits:
            first, self.matched = min(hits, key=lambda hit: hit[0])
            out, self.held = self.held[:first], ""
            return out
        keep = max((n for stop in self.stops for n in range(1, len(stop)) if self.held.endswith(stop[:n])),
                   default=0)
        out = self.held[:len(self.held) - keep]
        self.held = self.held[len(out):]
        return out

    def flush(self) -> str:
        """What is held back once the sequence ended without a stop string."""
        out, self.held = ("" if self.stopped else self.held), ""
        return out


__all__ = ["StopMatcher"]
