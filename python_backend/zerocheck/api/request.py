"""The `generate` model's request contract: one table of inputs, validated in one place.

Input names, dtypes and shapes follow tensorrtllm_backend's `ensemble` / `tensorrt_llm_bls`
models (batch dimension first, dims [1]), so their clients run unchanged. `parse_generate_request`
turns the numpy arrays of one request (plus its request parameters) into a `GenerateRequest`, or
raises `InvalidRequest` whose message names the input and the allowed range.
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import numpy as np

from zerocheck.api.errors import InvalidRequest
from zerocheck.api.guide import GUIDE_INPUT, GUIDE_TYPE_INPUT, GUIDE_TYPES, Guide, parse_guide
from zerocheck.sampling import SAMPLING_PARAMETERS, SamplingParamError, SamplingParams
from zerocheck.sampling.params import fresh_seed
from zerocheck.tokenizer.chat import ROLES as CHAT_ROLES, Message


@dataclass(frozen=True)
class InputSpec:
    """One input of the generate model: Triton dtype, dims after the batch dim, and its role."""

    name: str
    dtype: str  # Triton type: TYPE_STRING, TYPE_INT32, ...
    dims: tuple[int, ...] = (1,)
    role: str = "scalar"  # scalar | text | chat | words | list | guide | unsupported | ignored
    doc: str = ""


_TRITON_OF = {float: "TYPE_FP32", int: "TYPE_INT32"}
GUIDE_SPECS = (InputSpec(GUIDE_TYPE_INPUT, "TYPE_STRING", role="guide",
                         doc=f"structured output: the guide's type, one of {', '.join(GUIDE_TYPES)}"),
               InputSpec(GUIDE_INPUT, "TYPE_STRING", role="guide",
                         doc="the JSON schema, regex, grammar or JSON array of choices the answer matches "
                             "(none for json: any JSON object)"))
TOP_LOG_PROBS = 20  # the most alternatives per token the checked path returns (OpenAI's top_logprobs limit)
SAMPLING_INPUTS = tuple(InputSpec(spec.name, _TRITON_OF[spec.kind], doc=spec.doc) for spec in SAMPLING_PARAMETERS)

GENERATE_INPUTS: tuple[InputSpec, ...] = (
    InputSpec("text_input", "TYPE_STRING", role="text", doc="prompt text (UTF-8); this or messages"),
    InputSpec("messages", "TYPE_STRING", role="chat",
              doc='chat: a JSON array of {"role", "content"} (OpenAI format), rendered with the model\'s chat '
                  'template; this or text_input'),
    InputSpec("max_tokens", "TYPE_INT32",
              doc="tokens to generate (default: as many as fit in the context, up to the server's limit)"),
    InputSpec("min_tokens", "TYPE_INT32", doc="end_id is banned until this many tokens were generated"),
    InputSpec("min_length", "TYPE_INT32", doc="older name of min_tokens (tensorrtllm_backend before 2025)"),
    InputSpec("stream", "TYPE_BOOL", doc="stream one response per token (decoupled)"),
    InputSpec("stream_interval", "TYPE_INT32", doc="tokens per streamed response"),
    *SAMPLING_INPUTS,
    InputSpec("random_seed", "TYPE_UINT64", doc="seed: same seed, same tokens"),
    InputSpec("seed", "TYPE_UINT64", doc="newer name of random_seed"),
    InputSpec("bad_words", "TYPE_STRING", (-1,), role="words", doc="words that never appear in the output"),
    InputSpec("stop_words", "TYPE_STRING", (-1,), role="words", doc="words that end generation"),
    InputSpec("end_id", "TYPE_INT32", doc="end-of-sequence token id (default: the tokenizer's EOS)"),
    InputSpec("pad_id", "TYPE_INT32", doc="padding token id (accepted; outputs are not padded)"),
    InputSpec("return_log_probs", "TYPE_BOOL", doc="return cum_log_probs and output_log_probs"),
    InputSpec("return_top_log_probs", "TYPE_INT32",
              doc=f"also the k most likely tokens per step, k in [0, {TOP_LOG_PROBS}] (output_top_ids, output_top_log_probs)"),
    InputSpec("exclude_input_in_output", "TYPE_BOOL", doc="non-streamed text_output without the prompt"),
    InputSpec("num_return_sequences", "TYPE_INT32", doc="independent samples per request"),
    InputSpec("return_perf_metrics", "TYPE_BOOL", doc="return arrival/first/last token timestamps"),
    InputSpec("embedding_bias_words", "TYPE_STRING", (-1,), role="words", doc="words whose logits get a bias"),
    InputSpec("embedding_bias_weights", "TYPE_FP32", (-1,), role="list", doc="bias per embedding_bias_words"),
    InputSpec("logit_bias_ids", "TYPE_INT32", (-1,), role="list", doc="token ids whose logits get a bias (OpenAI logit_bias)"),
    InputSpec("logit_bias_values", "TYPE_FP32", (-1,), role="list", doc="bias per logit_bias_ids, in [-100, 100]"),
    InputSpec("beam_width", "TYPE_INT32", doc="only 1 (sampling) is served"),
    InputSpec("length_penalty", "TYPE_FP32", role="ignored", doc="beam search only; no effect at beam_width 1"),
    InputSpec("return_context_logits", "TYPE_BOOL", doc="not served"),
    InputSpec("return_generation_logits", "TYPE_BOOL", doc="not served"),
    InputSpec("decoder_text_input", "TYPE_STRING", role="unsupported", doc="encoder-decoder models: not served"),
    InputSpec("image_input", "TYPE_FP16", (3, 224, 224), role="unsupported", doc="multimodal: not served"),
    InputSpec("prompt_embedding_table", "TYPE_FP16", (-1, -1), role="unsupported", doc="p-tuning: not served"),
    InputSpec("prompt_vocab_size", "TYPE_INT32", role="unsupported", doc="p-tuning: not served"),
    InputSpec("prompt_table_extra_id", "TYPE_UINT64", role="unsupported", doc="p-tuning: not served"),
    InputSpec("lora_task_id", "TYPE_UINT64", role="unsupported", doc="LoRA: not served"),
    InputSpec("lora_weights", "TYPE_FP16", (-1, -1), role="unsupported", doc="LoRA: not served"),
    InputSpec("lora_config", "TYPE_INT32", (-1, 3), role="unsupported", doc="LoRA: not served"),
    *GUIDE_SPECS,
    InputSpec("num_draft_tokens", "TYPE_INT32", doc="speculative decoding: only 0"),
    InputSpec("use_draft_logits", "TYPE_BOOL", doc="speculative decoding: only false"),
    InputSpec("return_num_input_tokens", "TYPE_BOOL", doc="return num_input_tokens (the prompt's tokens)"),
    InputSpec("return_num_output_tokens", "TYPE_BOOL", doc="return num_output_tokens (this response's tokens)"),
    InputSpec("stop", "TYPE_BOOL", role="stop",
              doc="true: end the in-flight request with this request's id as if cancelled (no other input needed)"),
)
INPUTS_BY_NAME = {spec.name: spec for spec in GENERATE_INPUTS}

# The token-level model `tensorrt_llm` (tensorrtllm_backend's names): token ids in and out, the same loop.
TOKEN_INPUTS: tuple[InputSpec, ...] = (
    InputSpec("input_ids", "TYPE_INT32", (-1,), role="ids", doc="prompt token ids"),
    InputSpec("input_lengths", "TYPE_INT32", role="length", doc="number of prompt ids (checked against input_ids)"),
    InputSpec("request_output_len", "TYPE_INT32", doc="tokens to generate (max_tokens)"),
    InputSpec("streaming", "TYPE_BOOL", doc="one response per token (stream)"),
    InputSpec("end_id", "TYPE_INT32", doc="end-of-sequence token id (default: the model's end ids)"),
    InputSpec("pad_id", "TYPE_INT32", doc="padding token id (accepted; outputs are not padded)"),
    InputSpec("beam_width", "TYPE_INT32", doc="only 1 (sampling) is served"),
    InputSpec("temperature", "TYPE_FP32", doc="softmax temperature; 0 = greedy"),
    InputSpec("runtime_top_k", "TYPE_INT32", doc="top_k; 0 = off"),
    InputSpec("runtime_top_p", "TYPE_FP32", doc="top_p; 0 = off (TensorRT-LLM's convention)"),
    InputSpec("len_penalty", "TYPE_FP32", role="ignored", doc="beam search only; no effect at beam_width 1"),
    InputSpec("early_stopping", "TYPE_BOOL", role="ignored", doc="beam search only"),
    InputSpec("repetition_penalty", "TYPE_FP32", doc="CTRL repetition penalty"),
    InputSpec("presence_penalty", "TYPE_FP32", doc="OpenAI presence penalty"),
    InputSpec("frequency_penalty", "TYPE_FP32", doc="OpenAI frequency penalty"),
    InputSpec("min_tokens", "TYPE_INT32", doc="end_id is banned until this many tokens were generated"),
    InputSpec("min_length", "TYPE_INT32", doc="older name of min_tokens"),
    InputSpec("seed", "TYPE_UINT64", doc="same seed, same tokens"),
    InputSpec("random_seed", "TYPE_UINT64", doc="older name of seed"),
    InputSpec("num_return_sequences", "TYPE_INT32", doc="independent samples per request"),
    InputSpec("return_log_probs", "TYPE_BOOL", doc="return cum_log_probs and output_log_probs"),
    InputSpec("return_context_logits", "TYPE_BOOL", doc="not served"),
    InputSpec("return_generation_logits", "TYPE_BOOL", doc="not served"),
    InputSpec("return_perf_metrics", "TYPE_BOOL", doc="return the perf metric outputs"),
    InputSpec("exclude_input_in_output", "TYPE_BOOL", doc="non-streamed output_ids without the prompt"),
    InputSpec("stop", "TYPE_BOOL", role="stop", doc="true: stop the in-flight request with this request id"),
    InputSpec("stop_words_list", "TYPE_INT32", (2, -1), role="id_words", doc="token-id sequences that end generation"),
    InputSpec("bad_words_list", "TYPE_INT32", (2, -1), role="id_words", doc="token-id sequences never generated"),
    InputSpec("embedding_bias", "TYPE_FP32", (-1,), role="list", doc="a bias per vocabulary entry (dense)"),
    InputSpec("return_num_input_tokens", "TYPE_BOOL", doc="return num_input_tokens"),
    InputSpec("return_num_output_tokens", "TYPE_BOOL", doc="return num_output_tokens"),
    InputSpec("prompt_embedding_table", "TYPE_FP16", (-1, -1), role="unsupported", doc="p-tuning: not served"),
    InputSpec("prompt_vocab_size", "TYPE_INT32", role="unsupported", doc="p-tuning: not served"),
    InputSpec("lora_task_id", "TYPE_UINT64", role="unsupported", doc="LoRA: not served"),
    InputSpec("lora_weights", "TYPE_FP16", (-1, -1), role="unsupported", doc="LoRA: not served"),
    InputSpec("lora_config", "TYPE_INT32", (-1, 3), role="unsupported", doc="LoRA: not served"),
    InputSpec("draft_input_ids", "TYPE_INT32", (-1,), role="unsupported", doc="speculative decoding: not served"),
    *GUIDE_SPECS,
)
TOKEN_INPUTS_BY_NAME = {spec.name: spec for spec in TOKEN_INPUTS}
# `generate`'s inputs: the text interface's and, for requests with `interface: tokens`, the token interface's
ENGINE_INPUTS: tuple[InputSpec, ...] = GENERATE_INPUTS + tuple(spec for spec in TOKEN_INPUTS
                                                              if spec.name not in INPUTS_BY_NAME)
# token-model names -> the generate model's
TOKEN_ALIASES = {"request_output_len": "max_tokens", "streaming": "stream", "runtime_top_k": "top_k",
                 "runtime_top_p": "top_p"}
# the two interfaces `generate` serves: TEXT (text in, text out: generate, ensemble, tensorrt_llm_bls) and TOKENS
# (tensorrt_llm's ids in, ids out), chosen per request by the request parameter `interface` (default text)
TEXT, TOKENS = "text", "tokens"
INTERFACES = (TEXT, TOKENS)
REQUEST_PARAMETERS = ("zerocheck", "retry_reason", "request_id", "interface")
TOKEN_PARAMETERS = ("Streaming",)  # tensorrtllm_backend's clients send it with unary calls: accepted, not used
# why a request repeats another: a hedge sent because the first was slow, or a retry after a failure
SLOW_RESPONSE, RETRY_UNAVAILABLE = "slow_response", "unavailable"
RETRY_REASONS = (SLOW_RESPONSE, RETRY_UNAVAILABLE)
_SWITCH = {"on": True, "true": True, "1": True, "yes": True, "off": False, "false": False, "0": False, "no": False}


@dataclass(frozen=True)
class Limits:
    """Server limits from the model config."""

    max_prompt_tokens: int = 1024
    max_output_tokens: int = 1024
    max_context: int = 2048
    max_words: int = 256
    max_word_bytes: int = 256
    max_prompt_bytes: int = 64 * 1024
    max_return_sequences: int = 4
    max_messages: int = 256
    max_batch_rows: int = 8  # rows of one request ([N, 1] inputs)


@dataclass(frozen=True)
class GenerateRequest:
    """A validated generation request: a prompt text, or a conversation (`messages`) the server renders
    with the model's chat template. Word lists are still text; `tokenize_words` fills ids."""

    prompt: str = ""
    messages: tuple[Message, ...] | None = None
    prompt_ids: tuple[int, ...] | None = None  # the token-level model's prompt
    max_tokens: int | None = None  # None: as many as fit (GenerateService.prepare resolves it)
    min_tokens: int = 0
    stream: bool = False
    stream_interval: int = 1
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seeded: bool = False
    bad_words: tuple[str, ...] = ()
    stop_words: tuple[str, ...] = ()
    bias_words: tuple[tuple[str, float], ...] = ()
    bias_ids: tuple[tuple[int, float], ...] = ()
    stop_ids: tuple[tuple[int, ...], ...] = ()  # stop words as token ids (the token-level model)
    dense_bias: tuple[float, ...] = ()  # the token-level model's embedding_bias: one value per vocabulary entry
    end_id: int | None = None
    return_log_probs: bool = False
    top_log_probs: int = 0
    exclude_input_in_output: bool = False
    num_return_sequences: int = 1
    return_perf_metrics: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False
    zerocheck: bool = True
    retry_reason: str | None = None
    guide: Guide | None = None  # structured output: what the answer must match

    @property
    def is_chat(self) -> bool:
        return self.messages is not None

    @property
    def prompt_input(self) -> str:
        """The input the prompt came from, for error messages."""
        return "messages" if self.is_chat else "input_ids" if self.prompt_ids is not None else "text_input"


def _scalar(name: str, value: np.ndarray) -> Any:
    if value.size != 1:
        raise InvalidRequest(f"{name} must hold exactly one value, got shape {list(value.shape)}")
    item = value.reshape(-1)[0]
    return item.item() if isinstance(item, np.generic) else item


def _text(name: str, value: np.ndarray, limit: int) -> str:
    item = _scalar(name, value)
    if not isinstance(item, (bytes, str)):
        raise InvalidRequest(f"{name} must be a string")
    if isinstance(item, bytes):
        if len(item) > limit:
            raise InvalidRequest(f"{name} must be at most {limit} bytes, got {len(item)}")
        try:
            item = item.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InvalidRequest(f"{name} is not valid UTF-8 (byte {error.start})") from None
    return item


def _words(name: str, value: np.ndarray, limits: Limits) -> tuple[str, ...]:
    """A word-list input: each element holds one word, or several as a CSV line (`a,b`, `"a,b"` for a word
    with a comma), as tensorrtllm_backend's preprocessing reads them; `word_list_element` writes one."""
    words = []
    for item in value.reshape(-1).tolist():
        if not isinstance(item, (bytes, str)):
            raise InvalidRequest(f"{name} must be a list of strings")
        text = _text(name, np.array([item], dtype=object), limits.max_word_bytes)
        words += [word for word in next(csv.reader([text]), []) if word]
    if len(words) > limits.max_words:
        raise InvalidRequest(f"{name} must hold at most {limits.max_words} words, got {len(words)}")
    return tuple(words)


def word_list_element(word: str) -> str:
    """One word as a word-list element: CSV-quoted when it holds a comma, a quote or a line break."""
    if not any(char in word for char in ',"\r\n'):
        return word
    line = io.StringIO()
    csv.writer(line, lineterminator="", quoting=csv.QUOTE_ALL).writerow([word])
    return line.getvalue()


def _expect(name: str, value: np.ndarray, dtype: str) -> None:
    kinds = {"TYPE_STRING": "OSU", "TYPE_BOOL": "b", "TYPE_FP32": "f", "TYPE_FP16": "f", "TYPE_INT32": "iu",
             "TYPE_UINT64": "iu"}
    if value.dtype.kind not in kinds[dtype]:
        raise InvalidRequest(f"{name} must be {dtype.removeprefix('TYPE_')}, got {value.dtype}")


def _bounded_int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not float(value).is_integer() or not low <= value <= high:
        raise InvalidRequest(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return int(value)


def parse_switch(value: Any) -> bool:
    """The `zerocheck` request parameter / header: on|off (also true/false, 1/0, JSON booleans)."""
    if isinstance(value, bool):
        return value
    key = str(value).strip().lower()
    if key not in _SWITCH:
        raise InvalidRequest(f"zerocheck must be 'on' or 'off', got {value!r}")
    return _SWITCH[key]


def split_batch(arrays: Mapping[str, np.ndarray], limits: Limits) -> list[dict[str, np.ndarray]]:
    """One request of N rows ([N, ...] inputs, as tensorrtllm_backend's clients send with --batch-inputs)
    -> N requests of one row each; every input must have the same batch size."""
    sizes = {name: value.shape[0] for name, value in arrays.items() if value.ndim}
    batch = max(sizes.values(), default=1)
    if batch == 1:
        return [dict(arrays)]
    odd = sorted(name for name, size in sizes.items() if size != batch)
    if odd:
        raise InvalidRequest(f"every input needs the batch size {batch}: {', '.join(odd)} has "
                             f"{sizes[odd[0]]}")
    if batch > limits.max_batch_rows:
        raise InvalidRequest(f"a request may hold at most {limits.max_batch_rows} rows, got {batch}")
    return [{name: value[row:row + 1] for name, value in arrays.items()} for row in range(batch)]


def _check_inputs(arrays: Mapping[str, np.ndarray], parameters: Mapping[str, Any], table: Mapping[str, InputSpec],
                  known_parameters: tuple[str, ...]) -> dict[str, Any]:
    """Names, dtypes, batch size 1 and support of the inputs; returns the scalar inputs' values."""
    unknown = sorted(set(parameters) - set(known_parameters))
    if unknown:
        raise InvalidRequest(f"unknown request parameter(s): {', '.join(unknown)}; "
                             f"known: {', '.join(known_parameters)}")
    for name, value in arrays.items():
        spec = table.get(name)
        if spec is None:
            raise InvalidRequest(f"unknown input {name!r}")
        _expect(name, value, spec.dtype)
        if value.ndim and value.shape[0] != 1:
            raise InvalidRequest(f"{name}: batch size must be 1, got shape {list(value.shape)}")
        if spec.role == "unsupported":
            raise InvalidRequest(f"{name} is not supported by this server ({spec.doc})")
    values = {name: _scalar(name, arrays[name]) for name, spec in table.items()
              if name in arrays and spec.role in ("scalar", "stop", "length")}
    for name, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidRequest(f"{name} must be finite, got {value}")
    return values


def _request(values: Mapping[str, Any], parameters: Mapping[str, Any], limits: Limits, **fields: Any) -> GenerateRequest:
    """The GenerateRequest of validated scalar `values` (the generate model's names) and the prompt and
    word `fields` each interface parses itself."""
    _refuse(values)
    seed = values.get("seed", values.get("random_seed"))
    try:
        sampling = SamplingParams(**{spec.name: values[spec.name] for spec in SAMPLING_PARAMETERS
                                     if spec.name in values}, seed=seed if seed is not None else fresh_seed())
    except SamplingParamError as error:
        raise InvalidRequest(str(error)) from None
    if fields.get("bad_ids"):
        sampling = replace(sampling, bad_words=fields.pop("bad_ids"))
    fields.pop("bad_ids", None)
    min_tokens = values.get("min_tokens", values.get("min_length", 0))
    return GenerateRequest(
        max_tokens=_bounded_int("max_tokens", values["max_tokens"], 1, limits.max_output_tokens)
        if "max_tokens" in values else None,
        min_tokens=_bounded_int("min_tokens", min_tokens, 0, limits.max_output_tokens),
        stream=bool(values.get("stream", False)),
        stream_interval=_bounded_int("stream_interval", values.get("stream_interval", 1), 1, limits.max_output_tokens),
        sampling=sampling,
        seeded=seed is not None,
        end_id=_bounded_int("end_id", values["end_id"], -1, 2**31 - 1) if "end_id" in values else None,
        return_log_probs=bool(values.get("return_log_probs", False)),
        top_log_probs=_bounded_int("return_top_log_probs", values.get("return_top_log_probs", 0), 0, TOP_LOG_PROBS),
        exclude_input_in_output=bool(values.get("exclude_input_in_output", False)),
        num_return_sequences=_bounded_int("num_return_sequences", values.get("num_return_sequences", 1), 1,
                                          limits.max_return_sequences),
        return_perf_metrics=bool(values.get("return_perf_metrics", False)),
        return_num_input_tokens=bool(values.get("return_num_input_tokens", False)),
        return_num_output_tokens=bool(values.get("return_num_output_tokens", False)),
        zerocheck=parse_switch(parameters.get("zerocheck", "on")),
        retry_reason=str(parameters["retry_reason"]) if "retry_reason" in parameters else None,
        **fields,
    )


def request_interface(parameters: Mapping[str, Any]) -> str:
    """The interface a request speaks: its `interface` request parameter (the doors set it), default TEXT."""
    interface = parameters.get("interface", TEXT)
    if interface not in INTERFACES:
        raise InvalidRequest(f"request parameter interface must be one of {', '.join(INTERFACES)}, got {interface!r}")
    return interface


def parse_generate_request(arrays: Mapping[str, np.ndarray], parameters: Mapping[str, Any],
                           limits: Limits = Limits()) -> GenerateRequest:
    """Validate one request of the text-level models (generate, ensemble, tensorrt_llm_bls). arrays: input
    name -> numpy array (batch dim included, batch size 1); parameters: request parameters (gRPC headers
    matching `zerocheck.*` arrive here too)."""
    values = _check_inputs(arrays, parameters, INPUTS_BY_NAME, REQUEST_PARAMETERS)
    if ("text_input" in arrays) == ("messages" in arrays):
        raise InvalidRequest("give exactly one of text_input (a prompt) and messages (a chat)"
                             if "text_input" in arrays else "text_input or messages is required")
    messages = parse_messages(arrays["messages"], limits) if "messages" in arrays else None
    prompt = "" if messages is not None else _text("text_input", arrays["text_input"], limits.max_prompt_bytes)
    if messages is None and not prompt:
        raise InvalidRequest("text_input must not be empty")
    return _request(values, parameters, limits, prompt=prompt, messages=messages,
                    bad_words=_words("bad_words", arrays["bad_words"], limits) if "bad_words" in arrays else (),
                    stop_words=_words("stop_words", arrays["stop_words"], limits) if "stop_words" in arrays else (),
                    bias_words=_bias_words(arrays, limits), bias_ids=_bias_ids(arrays), guide=_guide(arrays))


def parse_token_request(arrays: Mapping[str, np.ndarray], parameters: Mapping[str, Any],
                        limits: Limits = Limits()) -> GenerateRequest:
    """Validate one request of the token-level model `tensorrt_llm` (TOKEN_INPUTS): the same request, its
    prompt as token ids, word lists as token-id lists, TensorRT-LLM's names and conventions."""
    values = _check_inputs(arrays, parameters, TOKEN_INPUTS_BY_NAME, REQUEST_PARAMETERS + TOKEN_PARAMETERS)
    if "input_ids" not in arrays:
        raise InvalidRequest("input_ids is required")
    ids = tuple(int(i) for i in arrays["input_ids"].reshape(-1))
    length = values.pop("input_lengths", len(ids))
    if not 1 <= length <= len(ids):
        raise InvalidRequest(f"input_lengths must be in [1, {len(ids)}] (the ids of input_ids), got {length}")
    values = {TOKEN_ALIASES.get(name, name): value for name, value in values.items()}
    if values.get("top_p") == 0:
        del values["top_p"]  # TensorRT-LLM: top_p 0 means off
    words = {name: decode_word_list(name, arrays[name].reshape(2, -1)) if name in arrays else ()
             for name in ("stop_words_list", "bad_words_list")}
    dense = arrays.get("embedding_bias", np.zeros((1, 0), np.float32)).reshape(-1)
    if dense.size and not np.isfinite(dense).all():
        raise InvalidRequest("embedding_bias must be finite")
    return _request(values, parameters, limits, prompt_ids=ids[:length], stop_ids=words["stop_words_list"],
                    bad_ids=words["bad_words_list"], dense_bias=tuple(dense.tolist()), guide=_guide(arrays))


def _guide(arrays: Mapping[str, np.ndarray]) -> Guide | None:
    """The request's guide (guided_decoding_guide_type / guided_decoding_guide), checked but not compiled."""
    kind, text = (_scalar(name, arrays[name]) if name in arrays else None for name in (GUIDE_TYPE_INPUT, GUIDE_INPUT))
    return parse_guide(kind, text)


def decode_word_list(name: str, array: np.ndarray) -> tuple[tuple[int, ...], ...]:
    """INT32 [2, N] word list of one row (concatenated ids; end offsets padded with -1) -> token-id sequences."""
    ids, offsets = array[0].tolist(), [o for o in array[1].tolist() if o >= 0]
    words, begin = [], 0
    for end in offsets:
        if not begin < end <= len(ids):
            raise InvalidRequest(f"{name} offsets must increase within [1, {len(ids)}], got {offsets}")
        words.append(tuple(ids[begin:end]))
        begin = end
    return tuple(words)


def parse_messages(value: np.ndarray, limits: Limits) -> tuple[Message, ...]:
    """The `messages` input: one UTF-8 string holding a JSON array of {"role", "content"} objects."""
    text = _text("messages", value, limits.max_prompt_bytes)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidRequest(f"messages must be a JSON array of {{\"role\", \"content\"}} objects: "
                             f"{error.msg} at character {error.pos}") from None
    if not isinstance(data, list):
        raise InvalidRequest(f"messages must be a JSON array of {{\"role\", \"content\"}} objects, "
                             f"got {_json_type(data)}")
    if not data:
        raise InvalidRequest("messages must hold at least one message")
    if len(data) > limits.max_messages:
        raise InvalidRequest(f"messages must hold at most {limits.max_messages} messages, got {len(data)}")
    parsed = []
    for i, message in enumerate(data):
        if not isinstance(message, dict):
            raise InvalidRequest(f"messages[{i}] must be an object with role and content, got {_json_type(message)}")
        unknown = sorted(set(message) - {"role", "content"})
        if unknown:
            raise InvalidRequest(f"messages[{i}] has unknown key(s) {', '.join(unknown)}; allowed: role, content")
        role, content = message.get("role"), message.get("content")
        if role not in CHAT_ROLES:
            raise InvalidRequest(f"messages[{i}].role must be one of {', '.join(CHAT_ROLES)}, got {role!r}")
        if not isinstance(content, str):
            raise InvalidRequest(f"messages[{i}].content must be a string, got {_json_type(content)}")
        parsed.append(Message(role, content))
    return tuple(parsed)


def _json_type(value: Any) -> str:
    """JSON's name for the type of a parsed value."""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def check_context(request: GenerateRequest, prompt_tokens: int, limits: Limits) -> None:
    """Prompt length and prompt + max_tokens against the limits (after tokenization)."""
    if prompt_tokens > limits.max_prompt_tokens:
        raise InvalidRequest(f"{request.prompt_input} is {prompt_tokens} tokens, the limit is "
                             f"{limits.max_prompt_tokens}")
    if request.max_tokens is not None and prompt_tokens + request.max_tokens > limits.max_context:
        raise InvalidRequest(f"max_tokens {request.max_tokens} + prompt {prompt_tokens} tokens exceeds the context "
                             f"of {limits.max_context} tokens; max_tokens must be <= "
                             f"{limits.max_context - prompt_tokens}")


def _refuse(values: Mapping[str, Any]) -> None:
    """Inputs that are accepted only at their neutral value."""
    if values.get("beam_width", 1) != 1:
        raise InvalidRequest(f"beam_width must be 1 (beam search is not supported), got {values['beam_width']}")
    if values.get("num_draft_tokens", 0) != 0 or values.get("use_draft_logits", False):
        raise InvalidRequest("num_draft_tokens/use_draft_logits: speculative decoding is not supported")
    for name in ("return_context_logits", "return_generation_logits"):
        if values.get(name, False):
            raise InvalidRequest(f"{name} is not supported by this server")


def _bias_words(arrays: Mapping[str, np.ndarray], limits: Limits) -> tuple[tuple[str, float], ...]:
    if "embedding_bias_words" not in arrays and "embedding_bias_weights" not in arrays:
        return ()
    words = _words("embedding_bias_words", arrays.get("embedding_bias_words", np.array([[]], dtype=object)), limits)
    weights = arrays.get("embedding_bias_weights", np.zeros((1, 0), dtype=np.float32)).reshape(-1).tolist()
    if len(words) != len(weights):
        raise InvalidRequest(f"embedding_bias_words has {len(words)} words but embedding_bias_weights "
                             f"has {len(weights)} values")
    if not all(math.isfinite(w) for w in weights):
        raise InvalidRequest("embedding_bias_weights must be finite")
    return tuple(zip(words, weights))


def _bias_ids(arrays: Mapping[str, np.ndarray]) -> tuple[tuple[int, float], ...]:
    """logit_bias_ids / logit_bias_values: (token id, bias) pairs (ids are checked against the vocabulary
    once it is known)."""
    if "logit_bias_ids" not in arrays and "logit_bias_values" not in arrays:
        return ()
    ids = arrays.get("logit_bias_ids", np.zeros((1, 0), np.int32)).reshape(-1).tolist()
    values = arrays.get("logit_bias_values", np.zeros((1, 0), np.float32)).reshape(-1).tolist()
    if len(ids) != len(values):
        raise InvalidRequest(f"logit_bias_ids has {len(ids)} ids but logit_bias_values has {len(values)} values")
    if not all(math.isfinite(v) and -100 <= v <= 100 for v in values):
        raise InvalidRequest("logit_bias_values must be finite and in [-100, 100]")
    return tuple(zip(ids, values))

