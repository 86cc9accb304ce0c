"""Copies of the model repository with some models' string parameters changed (tests' knobs, the
benchmarks' sizes and decoder variants) or their instances placed on GPUs (`zerocheck serve` on a GPU
machine): the shipped configs stay as they are."""
from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from pathlib import Path

from zerocheck import paths


GPU_MODELS = ("decoder", "zero_check_sampler")  # the models that run on a GPU when the machine has one
_CPU_INSTANCES = "instance_group [ { count: 1 kind: KIND_CPU } ]"


def copy_repository(target: Path, parameters: Mapping[str, Mapping[str, str]] | None = None,
                    source: Path | None = None, gpu_models: tuple[str, ...] = ()) -> Path:
    """`source` (default: the packaged model repository) copied to `target` with `parameters` ({model: {key: value}}) set in that model's
    config.pbtxt: a parameter the config has gets the new value, one it lacks is added (the test-only
    knobs the shipped configs never carry: `test_delay_ms`, `test_fail_token`); the `gpu_models` get a
    KIND_GPU instance group (one instance on each GPU Triton sees; the model then runs on the GPU its
    instance is given, `ModelConfig.instance_device`)."""
    shutil.copytree(source or paths.packaged_model_repository(), target, ignore=shutil.ignore_patterns("__pycache__"))
    for model in gpu_models:
        config = target / model / "config.pbtxt"
        text = config.read_text()
        if text.count(_CPU_INSTANCES) != 1:
            raise ValueError(f"{config}: expected one {_CPU_INSTANCES!r} to place on GPUs")
        config.write_text(text.replace(_CPU_INSTANCES, "instance_group [ { count: 1 kind: KIND_GPU } ]"))
    for model, values in (parameters or {}).items():
        config = target / model / "config.pbtxt"
        text = config.read_text()
        for key, value in values.items():
            text, count = re.subn(rf'(key: "{key}" value: {{ string_value: )"[^"]*"', rf'\g<1>"{value}"', text)
            if count == 0:
                text += f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
            elif count > 1:
                raise ValueError(f"{config}: parameter {key!r} is set {count} times")
        config.write_text(text)
    return target
