"""`generate`'s sequences on TensorRT-LLM's LLM API (PyTorch backend), each drawn by zerocheck's sampler as its
logits processor: the trtllm flavor (model_repository_trtllm/ sets `generate`'s parameter `engine: tensorrt_llm`).

    every door --> `generate` (GenerateService: validation, tokenization, admission, stop rules, responses)
               --> LlmApiScheduler: one streaming `LLM.generate_async(prompt ids, SamplingParams(temperature=0,
                   logits_processor=ZeroCheckLogitsProcessor(...)))` per sequence, its outputs applied to the Sequence

So `ensemble`, `tensorrt_llm_bls`, `tensorrt_llm` and the OpenAI and Anthropic front ends reach the engine unchanged.
The generation loop and the KV cache are TensorRT-LLM's; zerocheck keeps the request contract (limits, admission,
errors), the draw and the stop rules. The engine samples greedily with its own penalties, bad words and min_tokens
off (they are the processor's) and the overlap scheduler off (`llm_arguments`), so it emits exactly the processor's
draw. Stop words stay out of the engine: the Sequence ends at one (the stop word kept in the output, as zerocheck's
decoder answers) and the engine's request is aborted. The engine's end token ends the sequence with finish_reason
eos whether the engine returns it or not.

Not served on this engine, refused by name (`refuse_unserved`): the checked path (request parameter
`zerocheck: off`), log-probabilities (the engine's would be those of the processor's one-hot mask) and guides
(zerocheck's grammars live in its decoder).

`require_tensorrt_llm` refuses a missing TensorRT-LLM or one outside SUPPORTED_TENSORRT_LLM before anything imports
it; `start_llm_scheduler` is what `generate` builds at load. Only `start_llm` and `llm_generate` import tensorrt_llm;
the rest runs (and is tested) without it.
"""
from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from zerocheck.api.errors import InternalError, InvalidRequest
from zerocheck.api.guide import GUIDE_TYPE_INPUT
from zerocheck.api.sampler_path import DEGRADE_LOG_PROBS
from zerocheck.generate.responses import Prepared
from zerocheck.generate.scheduler import Emit, deliver
from zerocheck.generate.sequence import Sequence
from zerocheck.tokenizer.text_tokenizer import MODEL_SUBDIR
from zerocheck.wire.step import StepOutput

log = logging.getLogger("zerocheck.trtllm")

# TensorRT-LLM versions whose LLM API this module speaks, as [from, to) of (major, minor), pre-releases of those
# minors included: 1.0 made the PyTorch backend the LLM API's default; 1.2 is the newest release read
SUPPORTED_TENSORRT_LLM = ((1, 0), (1, 3))
SUPPORTED_TEXT = "1.0, 1.1 or 1.2 (>= 1.0, < 1.3)"
CANCEL_POLL_S = 0.5  # how often a sequence waiting for the engine's next output asks whether it was cancelled


class UnsupportedTensorRTLLM(RuntimeError):
    """TensorRT-LLM is missing, or its version is not one this module speaks; the message names what was found."""


def check_tensorrt_llm_version(version: str) -> None:
    """Refuse a TensorRT-LLM version outside SUPPORTED_TENSORRT_LLM, naming it (UnsupportedTensorRTLLM)."""
    found = re.match(r"(\d+)\.(\d+)", version)
    low, high = SUPPORTED_TENSORRT_LLM
    if found is None or not low <= (int(found[1]), int(found[2])) < high:
        raise UnsupportedTensorRTLLM(
            f"generate's engine tensorrt_llm (the trtllm flavor) speaks TensorRT-LLM {SUPPORTED_TEXT} (the LLM API on "
            f"its PyTorch backend); found TensorRT-LLM {version!r}: install a supported version, or serve the "
            f"default model repository")


def installed_tensorrt_llm_version() -> str:
    """The installed tensorrt_llm's version, read from its metadata (nothing is imported); UnsupportedTensorRTLLM
    when it is not installed."""
    try:
        return importlib.metadata.version("tensorrt_llm")
    except importlib.metadata.PackageNotFoundError:
        raise UnsupportedTensorRTLLM(
            f"generate's engine tensorrt_llm (the trtllm flavor) needs TensorRT-LLM {SUPPORTED_TEXT} (the "
            f"tensorrt_llm package), which is not installed: serve it in NVIDIA's Triton TensorRT-LLM container "
            f"(deploy/docker/Dockerfile, FLAVOR=trtllm), or serve the default model repository") from None


def require_tensorrt_llm() -> str:
    """The installed TensorRT-LLM's version; UnsupportedTensorRTLLM when it is missing or outside
    SUPPORTED_TENSORRT_LLM. Nothing is imported."""
    version = installed_tensorrt_llm_version()
    check_tensorrt_llm_version(version)
    return version


@dataclass(frozen=True)
class LlmApiParameters:
    """`generate`'s parameters for the tensorrt_llm engine (see the trtllm flavor's generate/config.pbtxt); the
    engine's max_batch_size and max_seq_len are `generate`'s max_concurrent_sequences and context."""

    dtype: str
    kv_cache_free_gpu_memory_fraction: float

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "bfloat16", "float16"):
            raise ValueError(f"parameter dtype must be auto, bfloat16 or float16, got {self.dtype!r}")
        if not 0 < self.kv_cache_free_gpu_memory_fraction <= 1:
            raise ValueError(f"parameter kv_cache_free_gpu_memory_fraction must be in (0, 1], got "
                             f"{self.kv_cache_free_gpu_memory_fraction}")


def llm_arguments(model_dir: Path, params: LlmApiParameters, max_batch_size: int, max_seq_len: int) -> dict[str, Any]:
    """The keyword arguments of `tensorrt_llm.LLM` (kv_cache_config as a dict of KvCacheConfig's fields): the
    Hugging Face directory the build wrote, the PyTorch backend, and the overlap scheduler off (with it on the
    engine calls processors before it appends the previous token: `zerocheck.trtllm.processor`)."""
    return {"model": str(model_dir), "backend": "pytorch", "disable_overlap_scheduler": True, "dtype": params.dtype,
            "max_batch_size": max_batch_size, "max_seq_len": max_seq_len,
            "kv_cache_config": {"free_gpu_memory_fraction": params.kv_cache_free_gpu_memory_fraction}}


def sampling_arguments(seq: Sequence) -> dict[str, Any]:
    """The keyword arguments of `tensorrt_llm.SamplingParams` for one sequence: greedy by both of the engine's
    rules (temperature 0, and top_k 1 for `SamplingParams._greedy_decoding`), so the processor's one-hot mask
    decides; none of the engine's penalties, bad words, min_tokens or bias; no detokenization (ids out);
    max_tokens and end ids; the sequence's zerocheck sampling (seeded: seed + its index) in the processor."""
    from zerocheck.trtllm.processor import ZeroCheckLogitsProcessor  # torch: loaded where the flavor draws

    end_ids = list(seq.end_ids)
    arguments: dict[str, Any] = {
        "max_tokens": seq.max_tokens, "temperature": 0.0, "top_k": 1, "detokenize": False,
        "logits_processor": ZeroCheckLogitsProcessor(seq.sampling, min_tokens=seq.request.min_tokens,
                                                     end_ids=seq.end_ids)}
    if end_ids:
        arguments["end_id"] = end_ids[0]
        if end_ids[1:]:
            arguments["stop_token_ids"] = end_ids[1:]
    else:  # end_id -1: no end token stops the sequence
        arguments["ignore_eos"] = True
    return arguments


# (prompt ids, SamplingParams keyword arguments) -> the engine's streaming request: async-iterable outputs, abort()
GenerateCall = Callable[[list[int], dict[str, Any]], Any]


class LlmApiScheduler:
    """`GenerateService`'s scheduler over TensorRT-LLM's LLM API (the role `StepScheduler` has over zerocheck's
    decoder): each sequence is one streaming engine request, whose outputs (cumulative `outputs[0].token_ids`,
    `finished`, `outputs[0].finish_reason`) are applied to the Sequence as they come. `generate` is injected
    (`llm_generate` in the server, a script in tests); everything runs on the model's event loop."""

    def __init__(self, generate: GenerateCall, cancel_poll_s: float = CANCEL_POLL_S) -> None:
        self._generate, self.cancel_poll_s = generate, cancel_poll_s

    async def run(self, sequences: list[Sequence], emit: Emit) -> None:
        """Generate `sequences` to their end; `emit` gets each streamed chunk and each good end (a failed
        sequence ends with `seq.error` set and no end emitted)."""
        await asyncio.gather(*(self._drive(seq, emit) for seq in sequences))

    async def _drive(self, seq: Sequence, emit: Emit) -> None:
        seq.first_scheduled_ns = time.time_ns()
        try:
            result = self._generate(list(seq.prompt_ids), sampling_arguments(seq))
        except Exception as error:
            seq.fail(error)
            return
        consume = asyncio.ensure_future(self._consume(seq, result, emit))
        try:
            while not consume.done():  # the engine's outputs may be far apart (queued, a long prompt)
                await asyncio.wait({consume}, timeout=self.cancel_poll_s)
                if not consume.done() and not seq.done and seq.cancelled():
                    seq.cancel()
                    consume.cancel()
            if not consume.cancelled() and consume.exception() is not None and not seq.done:
                seq.fail(consume.exception())
        finally:
            if not consume.done():
                consume.cancel()
            if not getattr(result, "finished", False):
                result.abort()  # ended here first (stop word, cancellation, failure): the engine stops too
        deliver(seq, emit)  # what is left to stream, and the end of a sequence that ended well

    async def _consume(self, seq: Sequence, result: Any, emit: Emit) -> None:
        seen = 0
        async for output in result:
            if seq.done:
                return
            ids = list(output.outputs[0].token_ids)
            new, seen = ids[seen:], len(ids)
            if new:
                seq.accept(StepOutput(new[0], more=tuple(new[1:])))
            if output.finished and not seq.done:
                _engine_ended(seq, output.outputs[0].finish_reason)
            if seq.done:
                return  # _drive delivers the rest with the end
            deliver(seq, emit)
        if not seq.done:
            seq.fail(InternalError(f"TensorRT-LLM's output stream ended after {len(seq.ids)} tokens without "
                                   f"finishing the request"))


def _engine_ended(seq: Sequence, reason: str | None) -> None:
    """The engine finished a sequence its tokens have not ended: at an end token it left out of its output
    (ends it as that end id would), else it failed."""
    if reason == "stop" and seq.end_ids:
        seq.accept(StepOutput(seq.end_ids[0]))
    else:
        seq.fail(InternalError(f"TensorRT-LLM ended the request ({reason}) after {len(seq.ids)} of "
                               f"{seq.max_tokens} tokens"))


def refuse_unserved(row: Prepared) -> None:
    """What the tensorrt_llm engine does not serve, refused by name (InvalidRequest)."""
    request = row.request
    if request.guide is not None:
        raise InvalidRequest(f"{GUIDE_TYPE_INPUT}: the tensorrt_llm engine (trtllm flavor) serves no guides")
    if row.degraded == DEGRADE_LOG_PROBS:
        raise InvalidRequest("return_log_probs is not served by the tensorrt_llm engine (trtllm flavor): the engine's "
                             "log-probabilities would be those of zerocheck's one-hot mask")
    if not request.zerocheck:
        raise InvalidRequest("zerocheck off: the tensorrt_llm engine (trtllm flavor) draws with zerocheck's sampler "
                             "only (the checked chain is not served there)")


def start_llm(model_dir: Path, params: LlmApiParameters, max_batch_size: int, max_seq_len: int) -> Any:
    """`tensorrt_llm.LLM` over the Hugging Face directory (`llm_arguments`), after the version check."""
    version = require_tensorrt_llm()
    from tensorrt_llm import LLM
    from tensorrt_llm.llmapi import KvCacheConfig

    arguments = llm_arguments(model_dir, params, max_batch_size, max_seq_len)
    kv_cache = KvCacheConfig(**arguments.pop("kv_cache_config"))
    log.info("starting TensorRT-LLM %s: LLM(%s)", version, arguments)
    return LLM(**arguments, kv_cache_config=kv_cache)


def llm_generate(llm: Any) -> GenerateCall:
    """The GenerateCall of a started LLM: a streaming `generate_async` of prompt ids."""
    from tensorrt_llm import SamplingParams

    def generate(prompt_ids: list[int], arguments: dict[str, Any]) -> Any:
        return llm.generate_async(prompt_ids, SamplingParams(**arguments), streaming=True)

    return generate


def start_llm_scheduler(artifacts_dir: Path, params: LlmApiParameters, max_batch_size: int,
                        max_seq_len: int) -> tuple[LlmApiScheduler, Callable[[], None]]:
    """What `generate` builds at load for the tensorrt_llm engine: the engine over the artifacts' Hugging Face
    directory (after the version check); returns the scheduler and the engine's shutdown."""
    llm = start_llm(Path(artifacts_dir) / MODEL_SUBDIR, params, max_batch_size, max_seq_len)
    return LlmApiScheduler(llm_generate(llm)), llm.shutdown
