"""Row keys of the counter-based noise: a seeded row's key depends on its (seed, step) only."""
from __future__ import annotations

import numpy as np

from zerocheck.sampling.noise import SMALL_BATCH, row_keys


def test_a_seeded_key_is_the_same_in_any_batch() -> None:
    """Few seeded rows take Python ints, many take numpy: the same words either way, at any position."""
    seeds = [2**40 + 7, None, 3, 0, 2**63 - 1]
    steps = [5, 1, 0, 9, 2**33 + 1]
    few = row_keys(seeds, steps)
    many_seeds = [None] * 3 + seeds * (SMALL_BATCH // 2)
    many = row_keys(many_seeds, [0] * 3 + steps * (SMALL_BATCH // 2))
    for copy in range(SMALL_BATCH // 2):
        block = many[3 + copy * len(seeds):3 + (copy + 1) * len(seeds)]
        for row in (0, 2, 3, 4):
            assert block[row].tolist() == few[row].tolist()
    assert ((few >= 0) & (few < 2**32)).all() and few.dtype == np.int64


def test_unseeded_rows_get_fresh_words() -> None:
    first, second = row_keys([None] * 16, [0] * 16), row_keys([None] * 16, [0] * 16)
    assert len({tuple(k) for k in first.tolist() + second.tolist()}) == 32
    assert ((first >= 0) & (first < 2**32)).all()
