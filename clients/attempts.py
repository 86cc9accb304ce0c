"""`Attempts`: the retry and hedge decisions of one call, shared by the sync and asyncio clients.

The client drives it with what happened (a chunk, an error, the end of a stream, a timer) and does
what it answers (launch, sleep, cancel). Retries only before the first token, only for retryable
errors, with exponential backoff and jitter (at least the server's Retry-After); one hedged attempt
(retry_reason=slow_response) when no token arrived within `hedge_after_s`; the first attempt to
answer wins and the others are cancelled.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from zerocheck.clients.errors import Timeout, ZerocheckError
from zerocheck.api.request import SLOW_RESPONSE
from zerocheck.clients.response import Chunk, ResultBuilder, TokenEvent

DEFAULT_HEDGE_AFTER_S = 0.3


@dataclass(frozen=True)
class RetryPolicy:
    """retries: attempts after retryable failures; backoff doubles from backoff_s up to backoff_max_s,
    each delay drawn in [delay/2, delay]; hedge_after_s None: no hedging."""

    retries: int = 3
    backoff_s: float = 0.1
    backoff_max_s: float = 2.0
    hedge_after_s: float | None = None

    def backoff(self, retry: int, retry_after_s: float | None) -> float:
        delay = min(self.backoff_max_s, self.backoff_s * 2**retry) * random.uniform(0.5, 1.0)
        return max(delay, retry_after_s or 0.0)


@dataclass
class Attempts:
    """State of one call: live attempt ids, the winner, retries and hedging, the result builder."""

    policy: RetryPolicy
    timeout_s: float
    started: float = field(default_factory=time.monotonic)
    live: set[int] = field(default_factory=set)
    winner: int | None = None
    retries: int = 0
    hedged: bool = False
    _next_id: int = 0

    def __post_init__(self) -> None:
        self.builder = ResultBuilder(self.started)

    @property
    def deadline(self) -> float:
        return self.started + self.timeout_s

    def remaining_s(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def launch(self) -> int:
        """A new attempt id, counted live."""
        self._next_id += 1
        self.live.add(self._next_id)
        return self._next_id

    def wait_s(self) -> float:
        """How long to wait for the next item before `on_timer`."""
        now = time.monotonic()
        if self.hedge_due():
            return max(0.0, min(self.deadline, self.started + self.policy.hedge_after_s) - now)
        return max(0.0, self.deadline - now)

    def hedge_due(self) -> bool:
        return self.policy.hedge_after_s is not None and not self.hedged and self.winner is None

    def on_timer(self) -> str:
        """Nothing arrived in `wait_s`: returns the retry_reason of the hedge to launch, or raises Timeout."""
        if time.monotonic() >= self.deadline or not self.hedge_due():
            raise Timeout(f"no complete answer within the {self.timeout_s:g} s deadline")
        self.hedged = True
        return SLOW_RESPONSE

    def on_chunk(self, attempt: int, chunk: Chunk) -> tuple[TokenEvent | None, set[int]]:
        """The event to yield (None: from a losing attempt) and the attempts to cancel now."""
        if attempt not in self.live:
            return None, set()
        losers: set[int] = set()
        if self.winner is None:
            self.winner = attempt
            losers, self.live = self.live - {attempt}, {attempt}
        if attempt != self.winner:
            return None, set()
        return self.builder.add(chunk, time.monotonic(), self.retries, self.hedged), losers

    def on_error(self, attempt: int, error: ZerocheckError) -> float | None:
        """Raises `error` when the call fails; else the backoff in seconds before launching a retry,
        or None while another attempt is still live."""
        if attempt not in self.live:
            return None
        self.live.discard(attempt)
        if attempt == self.winner or not error.retryable:
            raise error
        if self.live:
            return None
        delay = self.policy.backoff(self.retries, error.retry_after_s)
        if self.retries >= self.policy.retries or time.monotonic() + delay >= self.deadline:
            raise error
        self.retries += 1
        return delay

    def on_item(self, attempt: int, item: Chunk | ZerocheckError | None
                ) -> tuple[float | None, TokenEvent | None, set[int]]:
        """What one delivery of an attempt means (a chunk, an error, or None for end of stream):
        (backoff before launching a retry or None, event to yield or None, attempts to cancel).
        Raises the error when the call fails."""
        if isinstance(item, ZerocheckError):
            return self.on_error(attempt, item), None, set()
        if item is None:
            self.on_end(attempt)
            return None, None, set()
        event, losers = self.on_chunk(attempt, item)
        return None, event, losers

    def on_end(self, attempt: int) -> None:
        """A stream ended without a final response."""
        if attempt in self.live:
            self.on_error(attempt, ZerocheckError("the server closed the stream before the final response"))
