"""`PagedOpenVINO`: the decoder step on OpenVINO Runtime with the KV cache in place, in blocks.

The compiled model (`zerocheck.decoder.openvino_graph`) takes every row's new tokens as one flat list and
a block table per row; PagedAttention reads each row's cached positions from its blocks and writes the new
tokens' keys and values into them, so nothing of the cache passes through Python. The cache tensors have the
element type and block shape the compiled model asks for (on a CPU: u8 with per-token scales, blocks of 32
positions) and are allocated once for `num_blocks` blocks; pages are committed by the OS as blocks are first
written. A sequence slot holds a list of blocks that grows as it does (`BlockTable`); releasing the slot
returns them, most recently used first out.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import torch

from zerocheck.decoder.config import DecoderConfig
from zerocheck.decoder.errors import DecoderError


# Inputs sharing a scale when the CPU plugin quantizes activations for integer products: the largest group that
# keeps int8's greedy agreement with fp32 over the 98 % bar. 32 makes large batches faster and falls under the
# bar; 8 makes every batch of a few rows or more far slower (measured with this value changed:
# benchmarks/precision.py, benchmarks/decoder.py)
DQ_GROUP = 16


class BlockTable:
    """Blocks of `block_size` positions handed to slots as they grow; a freed block is the next handed out."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free = list(range(num_blocks - 1, -1, -1))
        self._held: dict[int, list[int]] = {}

    def blocks(self, slot: int) -> list[int]:
        return self._held.get(slot, [])

    def reserve(self, slot: int, positions: int) -> list[int]:
        """The blocks of `slot`, grown to hold `positions`; raises DecoderError when none are left."""
        held = self._held.setdefault(slot, [])
        needed = -(-positions // self.block_size) - len(held)
        if needed > len(self._free):
            raise DecoderError(f"the KV cache's {self.num_blocks} blocks are all in use")
        for _ in range(needed):
            held.append(self._free.pop())
        return held

    def release(self, slot: int) -> None:
        self._free.extend(reversed(self._held.pop(slot, [])))

    @property
    def in_use(self) -> int:
        return self.num_blocks - len(self._free)


class PagedOpenVINO:
    """One forward over rows of (slot, cached length, new tokens) on a compiled paged model; with `single_row`, a
    second compiled model of the same paged form (other weights) runs the steps of one row and one token, over the
    same cache blocks."""

    def __init__(self, compiled: ov.CompiledModel, num_layers: int, max_positions: int, max_slots: int,
                 single_row: ov.CompiledModel | None = None) -> None:
        self.request = compiled.create_infer_request()
        self.single_row = single_row.create_infer_request() if single_row is not None else None
        key = compiled.input("key_cache.0")
        self.block_size = int(compiled.input("value_cache.0").get_partial_shape()[2].get_length())
        blocks_per_slot = -(-max_positions // self.block_size)
        self.table = BlockTable(blocks_per_slot * max_slots, self.block_size)
        self.cache_type = key.get_element_type()
        self.caches: list[ov.Tensor] = []
        for layer in range(num_layers):
            for kind in ("key_cache", "value_cache"):
                shape = [self.table.num_blocks, *(d.get_length() for d in compiled.input(f"{kind}.{layer}").get_partial_shape()[1:])]
                tensor = ov.Tensor(self.cache_type, ov.Shape(shape))
                self.request.set_tensor(f"{kind}.{layer}", tensor)
                if single_row is not None:
                    port = single_row.input(f"{kind}.{layer}")
                    if port.get_element_type() != self.cache_type or \
                            [d.get_length() for d in port.get_partial_shape()[1:]] != shape[1:]:
                        raise ValueError(f"the one-row model's {kind}.{layer} is {port.get_element_type()} "
                                         f"{port.get_partial_shape()}, not the batch model's {self.cache_type} {shape}")
                    self.single_row.set_tensor(f"{kind}.{layer}", tensor)
                self.caches.append(tensor)

    @property
    def nbytes(self) -> int:
        return sum(tensor.byte_size for tensor in self.caches)

    def describe(self) -> str:
        return (("a one-row model for one-row steps, " if self.single_row is not None else "")
                + f"paged KV cache: {self.table.num_blocks} blocks x {self.block_size} positions, "
                f"{self.cache_type.get_type_name()}, {self.nbytes / 2**20:.1f} MiB reserved (committed as used)")

    def read_prefix(self, slot: int, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the blocks holding the first `positions` positions of `slot`, as the cache stores them
        (element type and layout the compiled model's): keys, values [L, blocks, ...]."""
        blocks = self.table.blocks(slot)[: -(-positions // self.block_size)]
        keys = np.stack([tensor.data[blocks] for tensor in self.caches[0::2]])
        values = np.stack([tensor.data[blocks] for tensor in self.caches[1::2]])
        return torch.from_numpy(keys), torch.from_numpy(values)

    def write_prefix(self, slot: int, keys: torch.Tensor, values: torch.Tensor, positions: int) -> None:
        """`read_prefix`'s blocks into the empty `slot`, which then holds their first `positions` positions
        (the last block's later positions are overwritten as the slot grows)."""
        count = -(-positions // self.block_size)
        blocks = self.table.reserve(slot, positions)[:count]
        for layer, (key_cache, value_cache) in enumerate(zip(self.caches[0::2], self.caches[1::2])):
            key_cache.data[blocks] = keys[layer, :count].numpy()
            value_cache.data[blocks] = values[layer, :count].numpy()

    def step(self, slots: list[int], lengths: list[int], tokens: list[list[int]]) -> torch.Tensor:
        """Rows' new `tokens` after their `lengths` cached positions in `slots`; returns logits [rows, V] float32
        at each row's last new token. The caller counts the new positions as cached afterwards."""
        counts = np.fromiter((len(row) for row in tokens), dtype=np.int32, count=len(tokens))
        past = np.asarray(lengths, dtype=np.int32)
        begins = np.zeros(len(tokens) + 1, dtype=np.int32)
        np.cumsum(counts, out=begins[1:])
        tables = [self.table.reserve(slot, int(p + n)) for slot, p, n in zip(slots, past, counts)]
        block_begins = np.zeros(len(tokens) + 1, dtype=np.int32)
        np.cumsum([len(blocks) for blocks in tables], out=block_begins[1:])
        positions = np.concatenate([np.arange(p, p + n, dtype=np.int64) for p, n in zip(past, counts)])
        inputs = {
            "input_ids": np.fromiter((t for row in tokens for t in row), dtype=np.int64, count=int(begins[-1])),
            "position_ids": positions,
            "logits_indices": begins[1:].astype(np.int64) - 1,
            "past_lens": past,
            "subsequence_begins": begins,
            "block_indices": np.fromiter((b for blocks in tables for b in blocks), dtype=np.int32, count=int(block_begins[-1])),
            "block_indices_begins": block_begins,
            "max_context_len": np.asarray(int((past + counts).max()), dtype=np.int32),
        }
        request = self.single_row if self.single_row is not None and begins[-1] == 1 else self.request
        for name, value in inputs.items():
            request.set_tensor(name, ov.Tensor(value))
        request.infer()
        return torch.from_numpy(request.get_tensor("logits").data.copy())


def load_paged_openvino(model_dir: Path, config: DecoderConfig, weights: str, max_slots: int, max_seq_len: int,
                        num_threads: int | None, single_row_weights: str | None = None) -> PagedOpenVINO:
    """Build the paged model of the checkpoint in `model_dir` with `weights` (`openvino_graph.WEIGHTS`) and
    compile it for the CPU; with `single_row_weights`, a second one with those weights for the steps of one row
    and one token (a lone sequence's decode, whose time is reading the weights). fp32 is exact: fp32 inference
    and an f32 KV cache. int8 / int4: f32 inference on every CPU (the plugin's default is bf16 where the CPU has
    AMX or AVX512-BF16, which lost 0.9 points of greedy agreement with fp32 there at no measured speed:
    benchmarks/precision.py, benchmarks/decoder.py), activations quantized per group of DQ_GROUP inputs for the
    integer products of the compressed matrix multiplies, and a u8 KV cache."""
    from safetensors.numpy import load_file

    from zerocheck.decoder.openvino_graph import build_paged_model

    state: dict[str, np.ndarray] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        state.update({name.removeprefix("model."): tensor.astype(np.float32, copy=False)
                      for name, tensor in load_file(str(path)).items()})
    properties: dict[str, object] = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    if weights == "fp32":
        properties["KV_CACHE_PRECISION"] = "f32"
    else:
        properties |= {"KV_CACHE_PRECISION": "u8", "DYNAMIC_QUANTIZATION_GROUP_SIZE": str(DQ_GROUP)}
    if num_threads:
        properties["INFERENCE_NUM_THREADS"] = num_threads
    core = ov.Core()
    compiled = core.compile_model(build_paged_model(config, state, weights), "CPU", properties)
    single_row = core.compile_model(build_paged_model(config, state, single_row_weights), "CPU", properties) \
        if single_row_weights else None
    return PagedOpenVINO(compiled, config.num_layers, max_seq_len, max_slots, single_row)
