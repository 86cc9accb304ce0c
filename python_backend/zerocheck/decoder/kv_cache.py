"""`KVCachePool`: a fixed set of preallocated KV cache slots, one per live sequence."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from zerocheck.decoder.errors import PoolFullError, SequenceTooLongError


@dataclass
class SlotState:
    slot: int
    length: int  # cached positions
    last_step: float  # clock time of the last step


class KVCachePool:
    """Preallocated K/V for `max_slots` sequences of up to `max_seq_len` tokens.

    `keys`, `values`: [L, max_slots, Hkv, max_seq_len, D] in `dtype` (the decoder's), zero-filled at creation;
    `keys[l]` is layer l's [slots, Hkv, max_seq_len, D] cache. Written in place by `write`. With `store=False`
    the pool keeps the slots' bookkeeping only (`keys` and `values` are None): an engine that holds the keys and
    values itself (`PagedOpenVINO`) frees a slot's storage through `on_slot_free`.
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        max_slots: int,
        max_seq_len: int,
        idle_timeout_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        store: bool = True,
    ) -> None:
        shape = (num_layers, max_slots, num_kv_heads, max_seq_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device) if store else None
        self.values = torch.zeros(shape, dtype=dtype, device=device) if store else None
        self.max_slots, self.max_seq_len, self.idle_timeout_s = max_slots, max_seq_len, idle_timeout_s
        self.clock = clock
        self._free = list(range(max_slots - 1, -1, -1))  # pop() hands out slot 0 first
        self._active: dict[str, SlotState] = {}
        self.on_release: Callable[[str], None] = lambda seq_id: None  # what else lives with a slot goes with it
        self.on_slot_free: Callable[[int], None] = lambda slot: None  # the slot's storage kept elsewhere

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes

    @property
    def in_use(self) -> int:
        return len(self._active)

    def describe(self) -> str:
        if self.keys is None:
            return f"{self.max_slots} sequence slots of up to {self.max_seq_len} tokens"
        l, s, h, t, d = self.keys.shape
        return (f"KV cache pool: {s} slots x {t} tokens x {l} layers x {h} kv heads x {d} dims, "
                f"{str(self.keys.dtype).removeprefix('torch.')}, {self.nbytes / 2**20:.1f} MiB on {self.keys.device}")

    def state(self, seq_id: str) -> SlotState | None:
        return self._active.get(seq_id)

    def check_length(self, seq_id: str, new_tokens: int) -> None:
        """Raise SequenceTooLongError if `new_tokens` more would pass max_seq_len."""
        held = self._active.get(seq_id)
        length = (held.length if held else 0) + new_tokens
        if length > self.max_seq_len:
            raise SequenceTooLongError(seq_id, length, self.max_seq_len)

    def acquire(self, seq_id: str) -> SlotState:
        """Give `seq_id` a free slot (length 0); raise PoolFullError when none is free."""
        if not self._free:
            raise PoolFullError(self.in_use, self.max_slots)
        held = SlotState(slot=self._free.pop(), length=0, last_step=self.clock())
        self._active[seq_id] = held
        return held

    def release(self, seq_id: str) -> None:
        """Free the slot of `seq_id` if held; no error if not."""
        held = self._active.pop(seq_id, None)
        if held is not None:
            self._free.append(held.slot)
            self.on_slot_free(held.slot)
            self.on_release(seq_id)

    def reclaim_idle(self, now: float | None = None) -> list[str]:
        """Release every sequence without a step for `idle_timeout_s`; returns their ids."""
        now = self.clock() if now is None else now
        idle = [seq_id for seq_id, held in self._active.items() if now - held.last_step >= self.idle_timeout_s]
        for seq_id in idle:
            self.release(seq_id)
        return idle

    def gather(self, slots: list[int], past_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy of the first `past_len` positions of `slots`: keys, values [L, B, Hkv, past_len, D]."""
        # numpy's single-threaded copy, a slot at a time: torch's indexing wakes its OpenMP threads
        # (passive wait), a hand-off that costs more than the copy itself at small batches; numpy's fancy
        # indexing makes a non-contiguous result that the backend would copy again. numpy has no bfloat16: its
        # bits are copied as int16.
        if self.keys.device.type != "cpu":  # on a GPU, one gather per cache
            index = torch.tensor(slots, device=self.keys.device)
            return tuple(cache[:, :, :, :past_len].index_select(1, index) for cache in (self.keys, self.values))
        dtype = self.keys.dtype
        bits = torch.int16 if dtype == torch.bfloat16 else dtype
        return tuple(torch.from_numpy(np.stack([cache[:, slot, :, :past_len] for slot in slots], axis=1)).view(dtype)
                     for cache in (self.keys.view(bits).numpy(), self.values.view(bits).numpy()))

    def write(self, held: SlotState, new_keys: torch.Tensor, new_values: torch.Tensor) -> None:
        """Append new_keys/new_values [L, Hkv, n, D] after the cached positions of `held` (in place)."""
        n = new_keys.shape[2]
        self.keys[:, held.slot, :, held.length : held.length + n] = new_keys
        self.values[:, held.slot, :, held.length : held.length + n] = new_values
        self.advance(held, n)

    def advance(self, held: SlotState, n: int) -> None:
        """Count `n` more cached positions for `held` (written in place by the step, or by `write`)."""
        held.length += n
        held.last_step = self.clock()
