"""Reusable scratch tensors for the dense [R, V] passes: a fresh 16 MB tensor per call costs page
faults that are as slow as the pass itself on CPU. One workspace per thread."""
from __future__ import annotations

import threading

import torch


class Workspace(threading.local):
    """`get(name, shape, dtype, device)`: a tensor of that shape, reused across calls (uninitialised)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        numel = 1
        for size in shape:
            numel *= size
        key = (name, dtype, device)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < numel:
            buffer = self._buffers[key] = torch.empty(numel, dtype=dtype, device=device)
        return buffer[:numel].view(shape)
