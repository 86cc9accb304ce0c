"""`PrefixCache`: the keys and values of recent prompts, reused by prompts that open with the same tokens.

Chat prompts open alike: SmolLM2's template puts its system prompt before every conversation without one
(24 of the 34 tokens of a short question), and a conversation's next turn opens with its previous prompt.
A sequence whose first step shares at least `min_tokens` leading tokens with a cached prompt gets those
positions' keys and values copied into its KV slot and computes only the rest (vLLM's automatic prefix
caching and TensorRT-LLM's KV cache reuse do this with blocks; here whole prompts are the entries). The
step's last token is always computed: its logits are the step's answer.

A prefix's keys and values depend on its tokens only (causal attention), so a reused prefix holds what
the sequence's own prefill would have written, up to the arithmetic's order (the rest of the prompt then
runs as another step's rows would).

Entries are first steps' tokens with copies of their keys and values ([L, Hkv, n, D], the pool's dtype
and device); the least recently used go past `capacity_tokens` cached positions in all.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

MIN_TOKENS = 8  # shorter shared openings are not worth a lookup's copy


@dataclass(frozen=True)
class CachedPrefix:
    tokens: np.ndarray  # int64 [n]
    keys: torch.Tensor  # [L, Hkv, n, D]
    values: torch.Tensor


class PrefixCache:
    def __init__(self, capacity_tokens: int, min_tokens: int = MIN_TOKENS) -> None:
        if capacity_tokens < 1 or min_tokens < 1:
            raise ValueError(f"capacity_tokens and min_tokens must be >= 1, got {capacity_tokens}, {min_tokens}")
        self.capacity_tokens, self.min_tokens = capacity_tokens, min_tokens
        self._entries: OrderedDict[tuple[int, ...], CachedPrefix] = OrderedDict()
        self.cached_tokens = 0
        self.reused_tokens = 0  # positions copied instead of computed, over the cache's life

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, tokens: list[int]) -> tuple[CachedPrefix | None, int]:
        """The entry sharing the longest opening with `tokens` and that opening's length, at most
        len(tokens) - 1; (None, 0) when none shares min_tokens. A hit counts as a use (LRU)."""
        limit = len(tokens) - 1
        if limit < self.min_tokens or not self._entries:
            return None, 0
        probe = np.asarray(tokens[:limit], dtype=np.int64)
        best, best_key, length = None, None, 0
        for key, entry in self._entries.items():
            n = min(limit, len(entry.tokens))
            if n <= length:
                continue
            same = probe[:n] == entry.tokens[:n]
            shared = n if bool(same.all()) else int(same.argmin())
            if shared > length:
                best, best_key, length = entry, key, shared
        if length < self.min_tokens:
            return None, 0
        self._entries.move_to_end(best_key)
        self.reused_tokens += length
        return best, length

    def store(self, tokens: list[int], keys: torch.Tensor, values: torch.Tensor) -> None:
        """Cache `tokens` with copies of their keys and values [L, Hkv, len(tokens), D] (views of a slot)."""
        key = tuple(tokens)
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        if not self.min_tokens <= len(key) <= self.capacity_tokens:
            return
        self._entries[key] = CachedPrefix(np.asarray(key, dtype=np.int64), keys.clone(memory_format=torch.contiguous_format),
                                         values.clone(memory_format=torch.contiguous_format))
        self.cached_tokens += len(key)
        while self.cached_tokens > self.capacity_tokens:
            _, dropped = self._entries.popitem(last=False)
            self.cached_tokens -= len(dropped.tokens)
