"""`TokenHistory`: the ids a sequence has seen (prompt and generated), with its distinct ids and their counts
kept up to date as the sequence grows: what penalties (counts) and bad words (the tail) read at each step.

A server keeps one per sequence and feeds it each step's new ids, so a step costs O(new ids), not a
re-count of the whole history (O(n) per step, O(n^2) per sequence), and the counts are numpy arrays a batch
concatenates instead of iterating Python objects. A plain list of ids is accepted wherever a history is, and
counted when used.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable, Iterator, Sequence, overload

import numpy as np

_FIRST_CAPACITY = 64


class TokenHistory(Sequence[int]):
    """A read-only sequence of ids (indexing and slicing as a list) plus `counted()`: its distinct ids and
    their counts."""

    def __init__(self, ids: Iterable[int] = ()) -> None:
        self._ids: list[int] = []
        self._position: dict[int, int] = {}  # id -> its index in the arrays below
        self._distinct = np.empty(_FIRST_CAPACITY, np.int64)
        self._counts = np.zeros(_FIRST_CAPACITY, np.float32)
        self.extend(ids)

    def extend(self, ids: Iterable[int]) -> None:
        new = list(ids)
        self._ids += new
        position = self._position
        for token, count in (Counter(new).items() if len(new) > 1 else ((token, 1) for token in new)):
            at = position.get(token)
            if at is None:
                at = position[token] = len(position)
                if at == len(self._distinct):  # doubled: amortised O(1) an id
                    self._distinct = np.concatenate([self._distinct, np.empty_like(self._distinct)])
                    self._counts = np.concatenate([self._counts, np.zeros_like(self._counts)])
                self._distinct[at] = token
            self._counts[at] += count

    def counted(self) -> tuple[np.ndarray, np.ndarray]:
        """(distinct ids int64, their counts float32) in first-seen order: views, valid until the next extend."""
        size = len(self._position)
        return self._distinct[:size], self._counts[:size]

    def __len__(self) -> int:
        return len(self._ids)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index):
        return self._ids[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids)


def counted(history: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(distinct ids int64, counts float32) of a history: kept by a TokenHistory, counted here for a plain
    sequence."""
    if isinstance(history, TokenHistory):
        return history.counted()
    counts = Counter(history)
    return (np.fromiter(counts.keys(), np.int64, len(counts)), np.fromiter(counts.values(), np.float32, len(counts)))
