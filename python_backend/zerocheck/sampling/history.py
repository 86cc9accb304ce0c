"""`TokenHistory`: the ids a sequence has seen (prompt and generated), with each id's count kept up to
date as the sequence grows: what penalties (counts) and bad words (the tail) read at each step.

A server keeps one per sequence and feeds it each step's new ids, so a step costs O(new ids), not a
re-count of the whole history (O(n) per step, O(n^2) per sequence). A plain list of ids is accepted
wherever a history is, and counted when used.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable, Iterator, Sequence, overload


class TokenHistory(Sequence[int]):
    """A read-only sequence of ids (indexing and slicing as a list) plus `counts`: id -> occurrences."""

    def __init__(self, ids: Iterable[int] = ()) -> None:
        self._ids: list[int] = []
        self.counts: Counter[int] = Counter()
        self.extend(ids)

    def extend(self, ids: Iterable[int]) -> None:
        new = list(ids)
        self._ids += new
        self.counts.update(new)

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


def counts_of(history: Sequence[int]) -> Counter[int]:
    """id -> occurrences of a history: kept by a TokenHistory, counted here for a plain sequence."""
    return history.counts if isinstance(history, TokenHistory) else Counter(history)
