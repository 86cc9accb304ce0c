"""The `model_config` a model.py adapter gets in `initialize(args)`, parsed once, and each model's
parameters as a typed dataclass (`parameters`): every shipped parameter is declared in the model's
config.pbtxt (the dataclass has no default for it, so code and config cannot disagree); only the
test knobs have defaults, and no shipped config sets them (tests add them to copies of the repository).
A missing, unknown or malformed parameter stops the model's load with a message naming it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, TypeVar

from zerocheck import paths
from zerocheck.api.request import INTERFACES
from zerocheck.wire.step import MAX_DECODE_STEPS

# read by ModelConfig itself, or by the Python backend: any model may set them
SHARED_PARAMETERS = ("artifacts", "EXECUTION_ENV_PATH", "FORCE_CPU_ONLY_INPUT_TENSORS")
_BOOLEANS = {"true": True, "false": False}
ZEROCHECK_ENGINE, TENSORRT_LLM_ENGINE = "zerocheck", "tensorrt_llm"
GENERATE_ENGINES = (ZEROCHECK_ENGINE, TENSORRT_LLM_ENGINE)  # what `generate`'s sequences run on


class ConfigError(ValueError):
    """A model's config.pbtxt is wrong; the message names the model and the parameter."""


class ModelConfig:
    """The parsed `model_config` of `initialize(args)`: name, batch size, string parameters, artifacts."""

    def __init__(self, args: Mapping[str, str]) -> None:
        self.raw = json.loads(args["model_config"])
        self.name: str = self.raw["name"]
        self.parameters = {k: v["string_value"] for k, v in self.raw.get("parameters", {}).items()}
        self.max_batch_size = int(self.raw.get("max_batch_size", 0))
        self.instance_kind: str = args.get("model_instance_kind", "CPU")  # KIND_GPU instances: "GPU"
        self.instance_device_id = int(args.get("model_instance_device_id", 0))
        self.model_dir = Path(args.get("model_repository", "."))  # this model's directory in the repository

    def sibling_parameter(self, model: str, key: str) -> str:
        """Parameter `key` of another model of the same repository, read from its config.pbtxt (the models
        load in any order, so it cannot be asked at initialize)."""
        config = self.model_dir.parent / model / "config.pbtxt"
        found = re.findall(rf'key: "{re.escape(key)}" value: {{ string_value: "([^"]*)" }}', config.read_text())
        if len(found) != 1:
            raise ConfigError(f"model {self.name}: expected parameter {key} once in {config}, found it {len(found)} "
                              "times")
        return found[0]

    def instance_device(self, device: str) -> str:
        """Where this instance runs: the GPU Triton placed a KIND_GPU instance on (cuda:<device id>; a
        device parameter of cpu is refused there), else `device` (the model's device parameter)."""
        if self.instance_kind != "GPU":
            return device
        if device == "cpu":
            raise ConfigError(f"model {self.name}: parameter device is cpu, but the instance is KIND_GPU "
                              f"(GPU {self.instance_device_id})")
        return f"cuda:{self.instance_device_id}"

    def artifacts_dir(self) -> Path:
        """ZEROCHECK_ARTIFACTS, else the `artifacts` parameter, else the default (`zerocheck.paths`)."""
        return Path(os.environ.get(paths.ARTIFACTS_ENV) or self.parameters.get("artifacts")
                    or paths.artifacts_dir())

    def vocab_size(self) -> int:
        """The decoder's vocabulary size, from the built artifacts."""
        config = json.loads((self.artifacts_dir() / "hf_model" / "config.json").read_text())
        return int(config["vocab_size"])


P = TypeVar("P")


def parameters(kind: type[P], config: ModelConfig, shared_with: tuple[type, ...] = ()) -> P:
    """`config`'s parameters as a `kind` dataclass: each field from the parameter of its name, converted
    to the field's type (int, float, str, bool as "true" / "false"); a field without a default must be
    set; a parameter no field names (of `kind`, or of the dataclasses `shared_with`, which the same config
    feeds) is refused."""
    hints = typing.get_type_hints(kind)
    fields = {field.name: field for field in dataclasses.fields(kind)}
    others = {field.name for other in shared_with for field in dataclasses.fields(other)}
    unknown = sorted(set(config.parameters) - set(fields) - others - set(SHARED_PARAMETERS))
    if unknown:
        raise ConfigError(f"model {config.name}: unknown parameter(s) {', '.join(unknown)}; "
                          f"known: {', '.join(fields)}")
    values = {}
    for name, field in fields.items():
        raw = config.parameters.get(name)
        if raw is None:
            if field.default is dataclasses.MISSING:
                raise ConfigError(f"model {config.name}: parameter {name} is required in its config.pbtxt")
            continue
        values[name] = _convert(config.name, name, hints[name], raw)
    try:
        return kind(**values)
    except ValueError as error:
        raise ConfigError(f"model {config.name}: {error}") from None


def _convert(model: str, name: str, kind: type, raw: str):
    try:
        if kind is bool:
            return _BOOLEANS[raw]
        return kind(raw)
    except (KeyError, ValueError):
        expected = "true or false" if kind is bool else f"a{'n' if kind is int else ''} {kind.__name__}"
        raise ConfigError(f"model {model}: parameter {name} must be {expected}, got {raw!r}") from None


def _at_least(low: float, **values: float) -> None:
    for name, value in values.items():
        if value < low:
            raise ValueError(f"parameter {name} must be >= {low:g}, got {value:g}")


TORCH_FORWARD_SPIN_COUNT = 100000  # the decoder's spin with a torch forward (its config.pbtxt says why)


@dataclass(frozen=True)
class DecoderParameters:
    """`decoder` (see its config.pbtxt for each one's meaning)."""

    backend: str
    dtype: str
    device: str
    int4_single_row: bool
    int8_lm_head_single_row: bool
    prefix_cache_tokens: int  # 0: no prefix cache
    max_slots: int
    max_seq_len: int  # 0: the build's
    idle_timeout_s: float
    num_threads: int  # 0: OpenVINO's / torch's own choice
    omp_spin_count: str  # GOMP_SPINCOUNT of the decoder's process (`zerocheck.triton.openmp`): auto or a count
    metrics_interval_s: float
    test_fail_token: int = -1  # test-only: a forward whose tokens hold it raises
    test_delay_ms: float = 0.0  # test-only: a slow forward: each execute that steps sleeps this long first

    def __post_init__(self) -> None:
        _at_least(1, max_slots=self.max_slots)
        _at_least(0, prefix_cache_tokens=self.prefix_cache_tokens, max_seq_len=self.max_seq_len,
                  idle_timeout_s=self.idle_timeout_s, num_threads=self.num_threads,
                  metrics_interval_s=self.metrics_interval_s, test_delay_ms=self.test_delay_ms)
        if self.omp_spin_count != "auto" and not self.omp_spin_count.isdigit():
            raise ValueError(f"parameter omp_spin_count must be auto or a whole number >= 0, "
                             f"got {self.omp_spin_count!r}")

    def spin_count(self) -> int:
        """omp_spin_count as a count (0: the server's). auto: TORCH_FORWARD_SPIN_COUNT where the forward runs on
        OpenMP threads (backend torch, or dtype bf16, which only torch runs), else 0: openvino's forward runs on
        its own threads, and a long spin of the decoder's OpenMP threads (the sampler's) would hold the cores it
        needs (fewer tokens/s served at 8 and 32 streams, peers.py's client, one server per value alternating)."""
        if self.omp_spin_count != "auto":
            return int(self.omp_spin_count)
        return TORCH_FORWARD_SPIN_COUNT if self.backend == "torch" or self.dtype == "bf16" else 0


@dataclass(frozen=True)
class GenerateParameters:
    """`generate`: the generation loop of every door (see its config.pbtxt for each one's meaning)."""

    engine: str  # zerocheck: the decoder model; tensorrt_llm: TensorRT-LLM's LLM API (the trtllm flavor)
    max_concurrent_sequences: int  # 0: the decoder's max_slots
    max_queue_size: int
    queue_timeout_s: float
    max_context: int
    max_prompt_tokens: int
    max_output_tokens: int
    max_step_batch: int
    prefill_tokens_per_step: int  # 0: no limit
    decode_steps: int  # tokens a multi-step call asks for (1: one a call)
    decode_steps_max_rows: int  # multi-step calls while at most this many sequences run (0: never)
    exit_on_dead_instance: bool
    test_delay_ms: float = 0.0  # test-only: each execute sleeps this long first

    def __post_init__(self) -> None:
        _at_least(1, max_context=self.max_context,
                  max_prompt_tokens=self.max_prompt_tokens, max_output_tokens=self.max_output_tokens,
                  max_step_batch=self.max_step_batch, decode_steps=self.decode_steps)
        _at_least(0, max_concurrent_sequences=self.max_concurrent_sequences, max_queue_size=self.max_queue_size,
                  queue_timeout_s=self.queue_timeout_s,
                  prefill_tokens_per_step=self.prefill_tokens_per_step, test_delay_ms=self.test_delay_ms,
                  decode_steps_max_rows=self.decode_steps_max_rows)
        if self.decode_steps > MAX_DECODE_STEPS:
            raise ValueError(f"parameter decode_steps must be <= {MAX_DECODE_STEPS}, got {self.decode_steps}")
        if self.engine not in GENERATE_ENGINES:
            raise ValueError(f"parameter engine must be one of {', '.join(GENERATE_ENGINES)}, got {self.engine!r}")
        if self.engine == TENSORRT_LLM_ENGINE and not self.max_concurrent_sequences:
            raise ValueError("parameter max_concurrent_sequences must be >= 1 with engine tensorrt_llm (the "
                             "engine's max_batch_size)")


@dataclass(frozen=True)
class ForwardParameters:
    """`ensemble`, `tensorrt_llm_bls` (interface text) and `tensorrt_llm` (interface tokens): doors that
    forward every request to `generate` (`zerocheck.triton.forward`)."""

    interface: str

    def __post_init__(self) -> None:
        if self.interface not in INTERFACES:
            raise ValueError(f"parameter interface must be one of {', '.join(INTERFACES)}, got {self.interface!r}")


@dataclass(frozen=True)
class SamplerParameters:
    """`zero_check_sampler`. device: auto (cuda when available) | cpu | cuda."""

    device: str
    cuda_graph_max_top_k: int

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"parameter device must be auto, cpu or cuda, got {self.device!r}")
        _at_least(1, cuda_graph_max_top_k=self.cuda_graph_max_top_k)

    def resolved_device(self) -> str:
        """The device, decided once: auto means cuda when torch sees one."""
        import torch

        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("parameter device is cuda but torch sees no GPU")
        return self.device


def built_max_seq_len(artifacts_dir: Path) -> int:
    """The decoder's maximum sequence length recorded by build_engines.py (its KV-cache length)."""
    manifest = json.loads((artifacts_dir / "manifest.json").read_text())
    return int(manifest.get("options", {}).get("max_seq_len") or manifest.get("max_seq_len"))
