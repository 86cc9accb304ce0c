"""Reusable scratch tensors for the dense [R, V] passes: a fresh 16 MB tensor per call on CPU page-faults its
memory in again on every call, where a reused one is already mapped. One workspace per thread."""
from __future__ import annotations

import math
import threading

import numpy as np
import torch


class Workspace(threading.local):
    """`get(name, shape, dtype, device)`: a tensor of that shape, reused across calls (uninitialised);
    `array(name, shape, dtype)`: the same as a host numpy array, for the compiled kernels (a numpy slice and
    reshape cost far less than a tensor's, whose dispatch is dearer still right after a decoder step)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._arrays: dict[tuple, np.ndarray] = {}

    def array(self, name: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
        numel = math.prod(shape)
        key = (name, dtype)
        buffer = self._arrays.get(key)
        if buffer is None or buffer.shape[0] < numel:
            buffer = self._arrays[key] = np.empty(numel, dtype)
        return buffer[:numel].reshape(shape)

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        numel = math.prod(shape)
        key = (name, dtype, device)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < numel:
            buffer = self._buffers[key] = torch.empty(numel, dtype=dtype, device=device)
        return buffer[:numel].view(shape)
