"""Relayed requests: how a forwarding door (`zerocheck.triton.forward`) streams a request `generate` serves.

Triton 2.51's Python backend streams a decoupled BLS call's responses through a blocking iterator, and
now and then loses an error response on it; a call answered with exactly one response (its final) is
awaited without blocking. So a door never streams from `generate`: it sends the request once with the
request parameter `relay: start` (its own request id), then asks for each next response with `relay: next`
and the same id, one single-response call each. `generate` serves the request as any other and queues
its responses in a `Relay`; every relay call takes the oldest, waiting for it if none is queued yet, and
answers with it plus `relay_final` (true on the request's last response). An error travels as data: the
output `error` holds "<CODE>: <message>".
"""
from __future__ import annotations

import asyncio

import numpy as np

from zerocheck.api.errors import coded_message

RELAY_PARAMETER = "relay"
START, NEXT = "start", "next"
ERROR_OUTPUT, FINAL_OUTPUT = "error", "relay_final"
RELAY_OUTPUTS = (ERROR_OUTPUT, FINAL_OUTPUT)


class Relay:
    """The queued responses of one relayed request; `send` / `close` as `generate`'s own responses are sent
    (a sequence's final response is held until the next, so the request's last is marked final)."""

    def __init__(self) -> None:
        self._items: asyncio.Queue[tuple[dict[str, np.ndarray], bool]] = asyncio.Queue()
        self._held: dict[str, np.ndarray] | None = None

    def send(self, arrays: dict[str, np.ndarray], final: bool) -> None:
        if self._held is not None:
            self._items.put_nowait((self._held, False))
            self._held = None
        if final:
            self._held = arrays
        else:
            self._items.put_nowait((arrays, False))

    def close(self, error: BaseException | None = None) -> None:
        """The request's last response: the held one, or `error` as data, or an empty one."""
        if error is not None:
            if self._held is not None:
                self._items.put_nowait((self._held, False))
            self._items.put_nowait(({ERROR_OUTPUT: error_array(error)}, True))
        else:
            self._items.put_nowait((self._held or {}, True))
        self._held = None

    async def next(self) -> tuple[dict[str, np.ndarray], bool]:
        """The oldest queued response with `relay_final`, and whether it is the last."""
        arrays, last = await self._items.get()
        return {**arrays, FINAL_OUTPUT: np.array([[last]])}, last


def error_array(error: BaseException) -> np.ndarray:
    return np.array([[coded_message(error).encode()]], dtype=object)


def error_arrays(error: BaseException) -> dict[str, np.ndarray]:
    """A relay call's answer that is an error (refused before it was queued, or an unknown relay)."""
    return {ERROR_OUTPUT: error_array(error), FINAL_OUTPUT: np.array([[True]])}
