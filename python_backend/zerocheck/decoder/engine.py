"""`DecoderEngine.step`: one batched forward for many sequences, each with its own KV cache slot.

Rows may mix prefill (the whole prompt, `start=True`) and decode (one or more new tokens). Rows are
padded to the longest T; each row has its own positions and an attention mask over its cached
positions plus the causal part of its new tokens.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from zerocheck.decoder.backends import StepFunction, onnxruntime_step, torch_step
from zerocheck.decoder.config import DecoderConfig
from zerocheck.decoder.errors import DecoderError
from zerocheck.decoder.kv_cache import KVCachePool, SlotState
from zerocheck.decoder.weights import load_transformer
from zerocheck.tokenizer.text_tokenizer import MODEL_SUBDIR

ONNX_FILE = "decoder.onnx"
BACKENDS = ("torch", "onnxruntime")
DEFAULT_BACKEND = "onnxruntime"  # faster than torch on the 2-core CPU, summed over batch 1/8/32 (benchmarks/decoder.py)


@dataclass
class StepRequest:
    seq_id: str
    tokens: list[int]  # the whole prompt when start, else the new token(s)
    start: bool
    end: bool


@dataclass
class StepResult:
    logits: torch.Tensor  # [B, V] float32, next-token logits at each row's last position
    errors: list[str | None]  # per row; rows with an error have undefined logits


@dataclass
class _Row:
    index: int  # row in the request batch
    held: SlotState
    tokens: list[int]
    end: bool


class DecoderEngine:
    def __init__(self, config: DecoderConfig, step_fn: StepFunction, pool: KVCachePool, backend: str) -> None:
        self.config, self.pool, self.backend = config, pool, backend
        self.vocab_size: int = config.vocab_size
        self._step_fn = step_fn

    def step(self, requests: Sequence[StepRequest]) -> StepResult:
        """Run one batched forward; `end=True` rows release their slot after their logits are computed."""
        self.pool.reclaim_idle()
        errors: list[str | None] = [None] * len(requests)
        rows: list[_Row] = []
        seen: set[str] = set()
        for index, request in enumerate(requests):
            try:
                rows.append(_Row(index, self._admit(request, seen), list(request.tokens), request.end))
            except DecoderError as error:
                errors[index] = str(error)
                if request.end:
                    self.pool.release(request.seq_id)
            seen.add(request.seq_id)
        logits = torch.zeros(len(requests), self.vocab_size, dtype=torch.float32)
        if rows:
            try:
                row_logits = self._forward(rows)
            except Exception:
                for row, request in ((r, requests[r.index]) for r in rows):
                    if request.start:
                        self.pool.release(request.seq_id)
                raise
            logits[[row.index for row in rows]] = row_logits
            for row in rows:
                if row.end:
                    self.pool.release(requests[row.index].seq_id)
        return StepResult(logits=logits, errors=errors)

    def release(self, seq_id: str) -> None:
        """Cancellation: free the slot of `seq_id` if held; no error if not held."""
        self.pool.release(seq_id)

    def _admit(self, request: StepRequest, seen: set[str]) -> SlotState:
        seq_id = request.seq_id
        if seq_id in seen:
            raise DecoderError(f"sequence {seq_id!r} appears more than once in one step")
        if not request.tokens:
            raise DecoderError(f"sequence {seq_id!r}: tokens is empty")
        bad = next((t for t in request.tokens if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise DecoderError(f"sequence {seq_id!r}: token id {bad} outside [0, {self.vocab_size})")
        held = self.pool.state(seq_id)
        if request.start:
            if held is not None:
                raise DecoderError(f"sequence {seq_id!r} is already started; release it before starting again")
            self.pool.check_length(seq_id, len(request.tokens))
            return self.pool.acquire(seq_id)
        if held is None:
            raise DecoderError(f"sequence {seq_id!r} holds no KV cache slot "
                               f"(not started, ended, cancelled or idle for {self.pool.idle_timeout_s:g} s)")
        self.pool.check_length(seq_id, len(request.tokens))
        return held

    def _forward(self, rows: list[_Row]) -> torch.Tensor:
        """Pad rows to [B, T], gather their caches, run the backend, append new K/V. Returns [B, V]."""
        lengths = torch.tensor([row.held.length for row in rows])
        counts = torch.tensor([len(row.tokens) for row in rows])
        t, p = int(counts.max()), max(1, int(lengths.max()))
        tokens = torch.zeros(len(rows), t, dtype=torch.long)
        for b, row in enumerate(rows):
            tokens[b, : len(row.tokens)] = torch.tensor(row.tokens)
        steps = torch.arange(t)
        positions = lengths[:, None] + steps[None, :]
        past_visible = torch.arange(p)[None, None, :] < lengths[:, None, None]  # [B, 1, P]
        new_visible = (steps[None, :] <= steps[:, None])[None] & (steps[None, None, :] < counts[:, None, None])
        mask = torch.cat([past_visible.expand(-1, t, -1), new_visible], dim=-1)  # [B, T, P+T]
        past_keys, past_values = self.pool.gather([row.held.slot for row in rows], p)
        logits, new_keys, new_values = self._step_fn(tokens, positions, mask, counts - 1, past_keys, past_values)
        for b, row in enumerate(rows):
            n = len(row.tokens)
            self.pool.write(row.held, new_keys[:, b, :, :n], new_values[:, b, :, :n])
        return logits


def _manifest_max_seq_len(artifacts_dir: Path) -> int | None:
    manifest = artifacts_dir / "manifest.json"
    if not manifest.is_file():
        return None
    return json.loads(manifest.read_text()).get("options", {}).get("max_seq_len")


def load_decoder(
    artifacts_dir: str | Path,
    backend: str = DEFAULT_BACKEND,
    max_slots: int = 16,
    max_seq_len: int | None = None,
    idle_timeout_s: float = 60.0,
    num_threads: int | None = None,
) -> DecoderEngine:
    """Load the decoder built by build_engines.py; the backend is chosen here, once.

    max_seq_len defaults to the build's --max-seq-len (manifest.json), else the model config's
    max_position_embeddings. Prints the KV pool size.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    root = Path(artifacts_dir)
    model_dir = root / MODEL_SUBDIR
    config = DecoderConfig.from_pretrained(model_dir)
    if backend == "torch":
        if num_threads:
            torch.set_num_threads(num_threads)
        step_fn = torch_step(load_transformer(model_dir))
    else:
        onnx_path = root / ONNX_FILE
        if not onnx_path.is_file():
            raise FileNotFoundError(f"{onnx_path} is missing: build with --onnx or use backend='torch'")
        step_fn = onnxruntime_step(onnx_path, num_threads)
    max_seq_len = max_seq_len or _manifest_max_seq_len(root) or config.max_position_embeddings
    if config.sliding_window is not None and max_seq_len > config.sliding_window:
        raise ValueError(f"max_seq_len {max_seq_len} exceeds the model's sliding_window {config.sliding_window}; "
                         "sliding-window attention is not implemented, pass max_seq_len <= sliding_window")
    pool = KVCachePool(config.num_layers, config.num_kv_heads, config.head_dim, max_slots, max_seq_len, idle_timeout_s)
    print(f"decoder ({backend}): {pool.describe()}")
    return DecoderEngine(config, step_fn, pool, backend)
