"""Copies of the model repository with some models' string parameters changed (tests' knobs, the
benchmarks' sizes and decoder variants): the shipped configs stay as they are."""
from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from pathlib import Path

from zerocheck import REPO_ROOT


def copy_repository(target: Path, parameters: Mapping[str, Mapping[str, str]] | None = None,
                    source: Path = REPO_ROOT / "model_repository") -> Path:
    """`source` copied to `target` with `parameters` ({model: {key: value}}) set in that model's
    config.pbtxt: a parameter the config has gets the new value, one it lacks is added (the test-only
    knobs the shipped configs never carry: `test_delay_ms`, `test_fail_token`)."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
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
