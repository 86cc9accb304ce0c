"""The output tensors of one response, for the two interfaces of the generation loop.

TEXT (`generate`, `ensemble`, `tensorrt_llm_bls`): `text_output` is 1-D, one element (tensorrtllm_backend's
clients read `text_output[0]`); every other field is `[1, 1]` (read as `[0][0]`); `output_ids` and
`output_log_probs` are `[1, T]`. TOKENS (`tensorrt_llm`): `output_ids` `[1, 1, T]` (one beam) and
`sequence_length` `[1, 1]`; a non-streamed answer's ids include the prompt unless
`exclude_input_in_output`, as TensorRT-LLM's backend answers. Both carry zerocheck's fields (path,
bypass, token counts, finish reason), `batch_index` and `sequence_index`, and what the request asked
for: log-probabilities, top alternatives, token counts, perf metrics.

Perf metrics zerocheck has no counterpart for carry neutral values: one KV-cache block per sequence
(a slot: `kv_cache_alloc_new_blocks` = `kv_cache_alloc_total_blocks` = 1, `kv_cache_reused_blocks` = 0),
no speculative decoding (`acceptance_rate` 0, draft tokens 0).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from zerocheck.api.sampler_path import SamplerPath
from zerocheck.generate.sequence import Chunk, Sequence
from zerocheck.api.request import TEXT, GenerateRequest


@dataclass(frozen=True)
class Prepared:
    """A validated, tokenized request row and the sampler path it will take."""

    request: GenerateRequest
    prompt_ids: list[int]
    path: SamplerPath
    degraded: str | None  # why a zero-check request runs on the checked path
    batch_index: int = 0  # its row in a request of several rows
    interface: str = TEXT  # the interface its responses speak (TEXT or TOKENS)

    @property
    def bypass(self) -> bool:
        """True when the check layer is skipped (the zero-check sampler ran)."""
        return self.path == SamplerPath.ZERO_CHECK


def _scalar(value, dtype) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


def response_arrays(prepared: Prepared, seq: Sequence, piece: Chunk, final: bool) -> dict[str, np.ndarray]:
    """One response of `seq`: `piece` is what it carries (a streamed chunk, or the whole generation
    for a non-streamed answer; empty for a streamed answer's last response); `final` marks its last."""
    request = prepared.request
    arrays = {
        "zerocheck_bypass": _scalar(prepared.bypass, bool),
        "sampler": _scalar(prepared.path.encode(), object),
        "prompt_tokens": _scalar(len(prepared.prompt_ids), np.int32),
        "completion_tokens": _scalar(len(seq.ids), np.int32),
        "finish_reason": _scalar((seq.finish or "").encode() if final else b"", object),
        "sequence_index": _scalar(seq.index, np.int32),
        "batch_index": _scalar(prepared.batch_index, np.int32),
    }
    whole = final and not request.stream
    if prepared.interface == TEXT:
        arrays["text_output"] = np.array([piece.text.encode()], dtype=object)
        arrays["output_ids"] = np.array(piece.ids, dtype=np.int32).reshape(1, -1)
        log_shape: tuple[int, ...] = (1, -1)
    else:
        ids = (list(prepared.prompt_ids) if whole and not request.exclude_input_in_output else []) + list(piece.ids)
        arrays["output_ids"] = np.array(ids, dtype=np.int32).reshape(1, 1, -1)
        arrays["sequence_length"] = _scalar(len(ids), np.int32)
        log_shape = (1, 1, -1)
    if request.return_log_probs or request.top_log_probs:
        arrays["output_log_probs"] = np.array(piece.log_probs, dtype=np.float32).reshape(log_shape)
        # the sequence's so far: its accepted tokens are this response's and the ones before
        arrays["cum_log_probs"] = _scalar(sum(seq.log_probs), np.float32)  # [1, 1]: [batch, beam]
    if request.top_log_probs:  # [1, tokens, k]: ids and log-probabilities of the k most likely, best first
        k = request.top_log_probs
        rows = [list(top) + [(-1, -math.inf)] * (k - len(top)) for top in piece.top_log_probs]
        arrays["output_top_ids"] = np.array([[t for t, _ in row] for row in rows], dtype=np.int32).reshape(1, -1, k)
        arrays["output_top_log_probs"] = np.array([[lp for _, lp in row] for row in rows],
                                                  dtype=np.float32).reshape(1, -1, k)
    if request.return_num_input_tokens:
        arrays["num_input_tokens"] = _scalar(len(prepared.prompt_ids), np.int32)
    if request.return_num_output_tokens:
        arrays["num_output_tokens"] = _scalar(len(piece.ids), np.int32)
    if request.return_perf_metrics:  # on every response, as TensorRT-LLM's backend sends them
        for name, value in (("arrival_time_ns", seq.arrival_ns), ("first_scheduled_time_ns", seq.first_scheduled_ns),
                            ("first_token_time_ns", seq.first_token_ns), ("last_token_time_ns", seq.last_token_ns)):
            arrays[name] = _scalar(value, np.int64)
        for name, value in (("kv_cache_alloc_new_blocks", 1), ("kv_cache_reused_blocks", 0),
                            ("kv_cache_alloc_total_blocks", 1), ("total_accepted_draft_tokens", 0),
                            ("total_draft_tokens", 0)):
            arrays[name] = _scalar(value, np.int32)
        arrays["acceptance_rate"] = _scalar(0.0, np.float32)
    return arrays
