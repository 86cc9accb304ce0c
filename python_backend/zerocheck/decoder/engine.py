"""`DecoderEngine.step`: one batched forward for many sequences, each with its own KV cache slot.

Rows may mix prefill (the whole prompt, `start=True`) and decode (one or more new tokens). Rows of
one forward are padded to the longest T; each row has its own positions and an attention mask over
its cached positions plus the causal part of its new tokens.
"""
from __future__ import annotations

import importlib.util
import json
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from zerocheck.decoder import attention_kernel
from zerocheck.decoder.backends import StepFunction, tensorrt_step, torch_step
from zerocheck.decoder.config import DecoderConfig
from zerocheck.decoder.errors import DecoderError
from zerocheck.decoder.kv_cache import KVCachePool, SlotState
from zerocheck.decoder.openvino_graph import GROUP, groups_supported
from zerocheck.decoder.openvino_paged import PagedOpenVINO, load_paged_openvino
from zerocheck.decoder.packed import PackedTransformer, int4_supported, packing_available
from zerocheck.decoder.prefix_cache import PrefixCache
from zerocheck.decoder.threads import ThreadShare, set_forward_threads
from zerocheck.decoder.weights import load_transformer
from zerocheck.tokenizer.text_tokenizer import MODEL_SUBDIR

ONNX_FILE = "decoder.onnx"  # the step exported for TensorRT (build_engines.py --onnx / --tensorrt)
TENSORRT_PLAN = "decoder.plan"  # ONNX_FILE as a TensorRT engine (build_engines.py --tensorrt, on a GPU)
BACKENDS = ("openvino", "torch", "tensorrt")
DEFAULT_BACKEND = "auto"  # choose_backend
DTYPES = ("fp32", "bf16", "int8", "int4")  # weights; activations and KV cache: TORCH_DTYPES, openvino_paged's
DTYPE_BACKENDS = {"fp32": BACKENDS, "bf16": ("torch",), "int8": ("openvino",), "int4": ("openvino",)}
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # the torch backends' activations and KV cache
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # the CPU multiplies bfloat16 natively


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


def choose_dtype(requested: str, backend: str, flags: set[str], device: str = "cpu") -> str:
    """`requested` ("auto" or one of DTYPES) made concrete for `backend` on `device` (a CPU with `flags`):
    auto is int8 on openvino (every weight in GGUF Q8_0's form, symmetric int8 groups of 32 with a scale each:
    integer products on VNNI CPUs; its speed against the other dtypes and its greedy top-1 agreement with fp32 on
    docs/performance.md), bf16 for the torch backend on CUDA
    (where the GPU does bf16) or on a CPU with bf16 instructions (AMX or AVX512-BF16), else fp32."""
    if requested not in ("auto", *DTYPES):
        raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}, got {requested!r}")
    if requested == "auto":
        if backend == "openvino":
            return "int8"
        if backend != "torch":
            return "fp32"
        if device.startswith("cuda"):
            return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
        return "bf16" if any(flag in flags for flag in BF16_CPU_FLAGS) else "fp32"
    if backend not in DTYPE_BACKENDS[requested]:
        raise ValueError(f"dtype {requested} needs backend {' or '.join(DTYPE_BACKENDS[requested])}, got {backend}")
    return requested


def choose_backend(requested: str, dtype: str, device: str, cuda_available: bool, tensorrt_ready: bool = False) -> str:
    """`requested` ("auto" or one of BACKENDS) made concrete for the requested `dtype` and `device`. auto
    is the faster one as measured (benchmarks/peers.py, benchmarks/decoder.py): on CUDA the TensorRT engine when
    it is built and `tensorrt` imports (`tensorrt_ready`; it is the fp32 export, so not for dtype bf16), else
    torch; on a CPU openvino (the checkpoint as an OpenVINO graph with paged attention, the KV cache in blocks
    written in place), except for dtype bf16, which the torch backend runs (packed weights where the CPU
    multiplies bf16 with oneDNN)."""
    if requested not in ("auto", *BACKENDS):
        raise ValueError(f"backend must be one of auto, {', '.join(BACKENDS)}, got {requested!r}")
    if requested != "auto":
        return requested
    if dtype in ("int8", "int4"):
        return "openvino"
    if device.startswith("cuda") or (device == "auto" and cuda_available):
        return "tensorrt" if tensorrt_ready and dtype in ("auto", "fp32") else "torch"
    if dtype == "bf16":
        return "torch"
    return "openvino"


DEVICES = ("auto", "cpu", "cuda")


def choose_device(requested: str, backend: str, cuda_available: bool) -> str:
    """`requested` (auto | cpu | cuda | cuda:N, the GPU Triton gave a KIND_GPU instance) made concrete for
    `backend`: the torch backend runs where asked, on CUDA for auto when torch sees a GPU; openvino runs
    on the CPU here (auto picks the CPU for it); TensorRT runs on CUDA only."""
    kind, _, index = requested.partition(":")
    if kind not in DEVICES or (index and (kind != "cuda" or not index.isdigit())):
        raise ValueError(f"device must be one of {', '.join(DEVICES)} or cuda:N, got {requested!r}")
    if backend == "tensorrt" and kind == "cpu":
        raise ValueError("backend tensorrt runs on CUDA only, got device cpu")
    if kind == "cuda" or backend == "tensorrt":
        if not cuda_available:
            raise ValueError(f"{'backend tensorrt' if kind != 'cuda' else 'device cuda'} asked for, but torch sees "
                             "no CUDA device")
        if backend == "openvino":
            raise ValueError(f"device cuda needs backend torch or tensorrt ({backend} runs on the CPU here), "
                             f"got {backend}")
    if requested == "auto":
        return "cuda" if cuda_available and backend in ("torch", "tensorrt") else "cpu"
    return requested


@dataclass
class StepRequest:
    seq_id: str
    tokens: list[int]  # the whole prompt when start, else the new token(s); empty with end: release only
    start: bool
    end: bool


@dataclass
class StepResult:
    logits: torch.Tensor  # [B, V] float32, next-token logits at each row's last position (zeros on error rows)
    errors: list[Exception | None]  # per row: DecoderError (refused) or what its forward raised

    @property
    def messages(self) -> list[str | None]:
        return [None if error is None else str(error) for error in self.errors]


class InjectedFault(RuntimeError):
    """test-only: raised by a forward whose tokens hold the engine's `fail_token`."""


@dataclass
class _Row:
    index: int  # row in the request batch
    seq_id: str
    held: SlotState
    tokens: list[int]
    start: bool


class _Logits:
    """The [B, V] float32 result of a step; a forward that covers every row in order is taken as it
    is (no zero-fill, no scatter copy)."""

    def __init__(self, rows: int, vocab_size: int, device: str = "cpu") -> None:
        self.rows, self.vocab_size, self.device, self.tensor = rows, vocab_size, device, None

    def put(self, index: list[int], values: torch.Tensor) -> None:
        if self.tensor is None and index == list(range(self.rows)):
            self.tensor = values
            return
        if self.tensor is None:
            self.tensor = torch.zeros(self.rows, self.vocab_size, dtype=torch.float32, device=self.device)
        self.tensor[index] = values

    def result(self) -> torch.Tensor:
        return self.tensor if self.tensor is not None else torch.zeros(self.rows, self.vocab_size, device=self.device)


class DecoderEngine:
    def __init__(self, config: DecoderConfig, step_fn: StepFunction | PackedTransformer | PagedOpenVINO, pool: KVCachePool,
                 backend: str, dtype: str = "fp32", fail_token: int = -1, device: str = "cpu",
                 prefix_cache: PrefixCache | None = None, threads: ThreadShare | None = None) -> None:
        """`step_fn`: a `StepFunction` (caches gathered per step), a `PackedTransformer` (the pool in place), or a
        `PagedOpenVINO` (its own paged cache; the pool keeps the slots' bookkeeping).
        `prefix_cache`: first steps reuse the keys and values of cached prompts that open alike. `threads`: sets
        the CPU forwards' thread count from the machine's load (`zerocheck.decoder.threads`)."""
        self.config, self.pool, self.backend, self.dtype, self.device = config, pool, backend, dtype, device
        self.vocab_size: int = config.vocab_size
        self._step_fn = step_fn
        self.fail_token = fail_token
        self.prefix_cache = prefix_cache
        self.threads = threads

    def step(self, requests: Sequence[StepRequest]) -> StepResult:
        """Run the rows of one batched step; a row's failure is its own (see `_run`). Single-token
        rows (decode) and longer ones (prefill) run as separate forwards, so a prompt does not pad
        every decode row to its length. `end=True` rows release their slot afterwards."""
        self.pool.reclaim_idle()
        errors: list[Exception | None] = [None] * len(requests)
        rows: list[_Row] = []
        seen: set[str] = set()
        for index, request in enumerate(requests):
            if request.end and not request.tokens:  # release only
                self.pool.release(request.seq_id)
                continue
            try:
                held = self._admit(request, seen)
                tokens = self._reuse_prefix(held, request.tokens) if request.start else list(request.tokens)
                rows.append(_Row(index, request.seq_id, held, tokens, request.start))
            except DecoderError as error:
                errors[index] = error
            seen.add(request.seq_id)
        logits = _Logits(len(requests), self.vocab_size, self.device)
        # rows padded to one length waste the decode rows' work on a prompt's length: prefill and decode run
        # apart, except on the paged engine, whose rows are not padded
        paged = isinstance(self._step_fn, PagedOpenVINO)
        groups = [rows] if paged else [[r for r in rows if len(r.tokens) == 1], [r for r in rows if len(r.tokens) > 1]]
        for group in groups:
            if group:
                with self.threads.forward() if self.threads is not None else nullcontext():
                    self._run(group, logits, errors)
        if self.prefix_cache is not None:
            for row in rows:
                if row.start and errors[row.index] is None:
                    self._store_prefix(row.held, requests[row.index].tokens)
        for request in requests:
            if request.end:
                self.pool.release(request.seq_id)
        return StepResult(logits=logits.result(), errors=errors)

    def _run(self, rows: list[_Row], logits: _Logits, errors: list[Exception | None]) -> None:
        """One forward for `rows`; when it raises, each row runs alone, so only the rows that fail
        alone get the error (a failed forward writes no KV cache, so a row may run again)."""
        try:
            logits.put([row.index for row in rows], self._forward(rows))
        except Exception as error:
            if len(rows) > 1:
                for row in rows:
                    self._run([row], logits, errors)
                return
            errors[rows[0].index] = error
            if rows[0].start:
                self.pool.release(rows[0].seq_id)

    def _reuse_prefix(self, held: SlotState, tokens: list[int]) -> list[int]:
        """A first step's tokens left to compute after copying a cached opening's keys and values into its
        (empty) slot: all of them without a prefix cache or a hit."""
        entry, length = self.prefix_cache.lookup(tokens) if self.prefix_cache is not None else (None, 0)
        if entry is None:
            return list(tokens)
        if isinstance(self._step_fn, PagedOpenVINO):
            self._step_fn.write_prefix(held.slot, entry.keys, entry.values, length)
            self.pool.advance(held, length)
            return list(tokens[length:])
        self.pool.keys[:, held.slot, :, :length] = entry.keys[:, :, :length]
        self.pool.values[:, held.slot, :, :length] = entry.values[:, :, :length]
        self.pool.advance(held, length)
        return list(tokens[length:])

    def _store_prefix(self, held: SlotState, tokens: list[int]) -> None:
        n = len(tokens)
        if isinstance(self._step_fn, PagedOpenVINO):
            self.prefix_cache.store(tokens, *self._step_fn.read_prefix(held.slot, n))
            return
        self.prefix_cache.store(tokens, self.pool.keys[:, held.slot, :, :n], self.pool.values[:, held.slot, :, :n])

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
        if self.fail_token >= 0 and any(self.fail_token in row.tokens for row in rows):
            raise InjectedFault(f"test fault: token {self.fail_token} in a step's input")
        if isinstance(self._step_fn, PagedOpenVINO):  # unpadded rows, the cache written in place
            logits = self._step_fn.step([row.held.slot for row in rows], [row.held.length for row in rows],
                                        [row.tokens for row in rows])
            for row in rows:
                self.pool.advance(row.held, len(row.tokens))
            return logits
        lengths = torch.tensor([row.held.length for row in rows])
        counts = torch.tensor([len(row.tokens) for row in rows])
        t, p = int(counts.max()), max(1, int(lengths.max()))
        tokens = torch.tensor([row.tokens + [0] * (t - len(row.tokens)) for row in rows], dtype=torch.long)
        if isinstance(self._step_fn, PackedTransformer):
            slots = torch.tensor([row.held.slot for row in rows])
            logits = self._step_fn.step(tokens, counts, lengths, slots, self.pool.keys, self.pool.values)
            for row in rows:
                self.pool.advance(row.held, len(row.tokens))
            return logits
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


VARIANT_EXTRAS = {"int4": "int4_single_row", "int8head": "int8_lm_head_single_row"}


def variant_options(variant: str) -> dict[str, object]:
    """`load_decoder` keyword arguments for a benchmark variant "backend:dtype", then "+int4" for `int4_single_row`
    and "+int8head" for `int8_lm_head_single_row` (e.g. "torch:bf16+int4+int8head")."""
    backend, _, dtype = variant.partition(":")
    base, *extras = dtype.split("+")
    if not base or any(extra not in VARIANT_EXTRAS for extra in extras):
        raise ValueError(f"variant must be backend:dtype[+int4][+int8head], got {variant!r}")
    return {"backend": backend, "dtype": base, **{option: extra in extras for extra, option in VARIANT_EXTRAS.items()}}


def load_decoder(
    artifacts_dir: str | Path,
    backend: str = DEFAULT_BACKEND,
    max_slots: int = 16,
    max_seq_len: int | None = None,
    idle_timeout_s: float = 60.0,
    num_threads: int | None = None,
    fail_token: int = -1,
    dtype: str = "auto",
    device: str = "cpu",
    int4_single_row: bool = False,
    prefix_cache_tokens: int = 0,
    int8_lm_head_single_row: bool = False,
) -> DecoderEngine:
    """Load the decoder built by build_engines.py; the backend (`choose_backend`), the device (`choose_device`)
    and the dtype of weights, activations and KV cache (`choose_dtype`) are chosen here, once; the KV cache
    and the logits live on that device.

    max_seq_len defaults to the build's --max-seq-len (manifest.json), else the model config's
    max_position_embeddings. int4_single_row: steps of one row and one token use int4 copies of the layers'
    weights: on the packed bf16 CPU path (`PackedTransformer`; with int8_lm_head_single_row an int8 copy of lm_head's
    too, `int8_kernel`, needs numba) and with openvino int8 (a second compiled model, GGUF Q4_1's form, over the same
    KV cache blocks); elsewhere they are not used (printed). Prints the
    KV pool size. prefix_cache_tokens > 0: a `PrefixCache` of that many positions (first steps reuse the keys
    and values of recent prompts that open alike). fail_token >= 0 (test-only) makes every forward
    whose tokens hold that id raise InjectedFault.
    """
    root = Path(artifacts_dir)
    model_dir = root / MODEL_SUBDIR
    config = DecoderConfig.from_pretrained(model_dir)
    max_seq_len = max_seq_len or _manifest_max_seq_len(root) or config.max_position_embeddings
    if config.sliding_window is not None and max_seq_len > config.sliding_window:
        raise ValueError(f"max_seq_len {max_seq_len} exceeds the model's sliding_window {config.sliding_window}; "
                         "sliding-window attention is not implemented, pass max_seq_len <= sliding_window")
    flags, packing, cuda = cpu_flags(), packing_available(), torch.cuda.is_available()
    tensorrt_ready = (root / TENSORRT_PLAN).is_file() and importlib.util.find_spec("tensorrt") is not None
    backend = choose_backend(backend, dtype, device, cuda, tensorrt_ready)
    device = choose_device(device, backend, cuda)
    requested_dtype, dtype = dtype, choose_dtype(dtype, backend, flags, device)
    if backend == "openvino" and dtype in ("int8", "int4") and not groups_supported(config):
        if requested_dtype != "auto":
            raise ValueError(f"dtype {dtype} needs layer widths that are multiples of {GROUP}: this model's are "
                             f"{config.hidden_size}, {config.intermediate_size}, {config.num_heads * config.head_dim}")
        print(f"decoder: this model's layer widths are not multiples of {GROUP}: dtype auto is fp32, not {dtype}")
        dtype = "fp32"
    packed = backend == "torch" and device == "cpu" and dtype == "bf16" and packing  # `PackedTransformer`
    # where each one-row option has a use: the packed path, and (int4 only) openvino's second, int4 compiled model
    used = {"int4_single_row": packed or (backend == "openvino" and dtype == "int8"), "int8_lm_head_single_row": packed}
    if backend == "torch":
        if num_threads:
            torch.set_num_threads(num_threads)
        model = load_transformer(model_dir, TORCH_DTYPES[dtype]).to(device)
        if packed:
            int4 = int4_single_row and int4_supported(config)
            if int4_single_row and not int4:
                print("decoder: int4_single_row asked for, but this torch has no CPU int4 GEMM or the model's "
                      "layer widths are not multiples of 32: one-row steps use the bf16 weights")
            compiled = attention_kernel.available()
            if not compiled:
                print("decoder: numba is not installed; attention and the layers' glue run as torch ops (slower)")
            int8_head = int8_lm_head_single_row and compiled
            if int8_lm_head_single_row and not int8_head:
                print("decoder: int8_lm_head_single_row asked for, but numba is not installed: one-row steps use "
                      "the bf16 lm_head")
            step_fn = PackedTransformer(model, int4_single_row=int4, compiled=compiled,
                                        int8_lm_head_single_row=int8_head)
            kernels = ("packed oneDNN bf16 weights" + (", int4 weights for one-row steps" if int4 else "")
                       + (", int8 lm_head for one-row steps" if int8_head else "")
                       + (", compiled decode attention and layer glue" if compiled else ""))
        else:
            if device == "cpu" and dtype == "bf16":
                print("decoder: this torch cannot pack bf16 weights for oneDNN; running the module's forward (slower)")
            step_fn = torch_step(model, device)
            kernels = "module forward"
    elif backend == "tensorrt":
        plan = root / TENSORRT_PLAN
        if not plan.is_file():
            raise FileNotFoundError(f"{plan} is missing: build with --tensorrt (on a GPU) or use backend='torch'")
        step_fn = tensorrt_step(plan, device, max_slots, max_seq_len)
        kernels = plan.name
    else:
        single_row = "int4" if int4_single_row and used["int4_single_row"] else None
        step_fn = load_paged_openvino(model_dir, config, dtype, max_slots, max_seq_len, num_threads, single_row)
        kernels = f"OpenVINO {step_fn.describe()}"
    for option, asked in (("int4_single_row", int4_single_row), ("int8_lm_head_single_row", int8_lm_head_single_row)):
        if asked and not used[option]:
            print(f"decoder: {option} is not used with {backend} {dtype} on {device}")
    paged = isinstance(step_fn, PagedOpenVINO)
    pool = KVCachePool(config.num_layers, config.num_kv_heads, config.head_dim, max_slots, max_seq_len, idle_timeout_s,
                       dtype=TORCH_DTYPES.get(dtype, torch.float32), device=device, store=not paged)
    if paged:
        pool.on_slot_free = step_fn.table.release
    prefix_cache = PrefixCache(prefix_cache_tokens) if prefix_cache_tokens else None
    reuse = f"; prefix cache of {prefix_cache_tokens} tokens" if prefix_cache else ""
    threads = None
    if backend == "torch" and device == "cpu" and torch.get_num_threads() > 1:
        threads = ThreadShare(torch.get_num_threads(), set_forward_threads)
        kernels += f", {threads.max_threads} threads while the machine's other processes leave the cores"
    print(f"decoder ({backend}, {dtype}, {device}, {kernels}): {pool.describe()}{reuse}")
    return DecoderEngine(config, step_fn, pool, backend, dtype, fail_token, device, prefix_cache, threads)
