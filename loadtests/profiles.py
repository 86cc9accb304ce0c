"""Load profiles as data: `profiles/<name>.yaml|json` holds the stages (users over time) and the workload
(prompt and output token-length distributions, sampling parameters). Every profile is bounded in users and time."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
MAX_USERS = 1024
MAX_DURATION_S = 24 * 3600
# Triton dtypes of the sampling inputs a profile may set (as in zerocheck.api.request.GENERATE_INPUTS,
# not imported here: it pulls in torch)
SAMPLING_DTYPES = {"temperature": "FP32", "top_k": "INT32", "top_p": "FP32", "min_p": "FP32",
                   "repetition_penalty": "FP32", "presence_penalty": "FP32", "frequency_penalty": "FP32",
                   "seed": "UINT64"}


class ProfileError(ValueError):
    """A profile file that is missing or malformed; the message names the file and the field."""


@dataclass(frozen=True)
class Stage:
    """`users` closed-loop users for `duration` seconds, reached at `spawn_rate` users/s."""

    duration: float
    users: int
    spawn_rate: float


@dataclass(frozen=True)
class LengthDistribution:
    """Token lengths: `lognormal` (median, sigma) or `uniform`, clipped to [min, max]."""

    distribution: str = "uniform"
    min: int = 16
    max: int = 64
    median: float = 32.0
    sigma: float = 0.5


@dataclass(frozen=True)
class Profile:
    name: str
    stages: tuple[Stage, ...]
    prompt_tokens: LengthDistribution = LengthDistribution(min=8, max=128)
    output_tokens: LengthDistribution = LengthDistribution()
    sampling: dict[str, int | float] = field(default_factory=dict)  # sampling input name -> value
    description: str = ""
    exact_output_tokens: bool = False  # every request generates exactly its output length (min_tokens = max_tokens)

    @property
    def duration(self) -> float:
        return sum(stage.duration for stage in self.stages)

    @property
    def peak_users(self) -> int:
        return max(stage.users for stage in self.stages)

    def stage_at(self, seconds: float) -> Stage | None:
        """The stage running `seconds` into the run, None once the last one has ended."""
        end = 0.0
        for stage in self.stages:
            end += stage.duration
            if seconds < end:
                return stage
        return None

    def scaled(self, users: int | None = None, duration: float | None = None) -> Profile:
        """The same shape with its peak at `users` and its length `duration` s (each when given)."""
        user_factor = users / self.peak_users if users else 1.0
        time_factor = duration / self.duration if duration else 1.0
        stages = tuple(Stage(s.duration * time_factor, max(1, math.ceil(s.users * user_factor)),
                             s.spawn_rate * user_factor) for s in self.stages)
        return replace(self, stages=stages)


def profile_path(name_or_path: str) -> Path:
    """A bundled profile by name (`ramp`) or any .yaml/.json file."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml", ".json"):
        return path
    for suffix in (".yaml", ".json"):
        if (PROFILES_DIR / f"{name_or_path}{suffix}").is_file():
            return PROFILES_DIR / f"{name_or_path}{suffix}"
    raise ProfileError(f"no profile {name_or_path!r}; bundled: {', '.join(bundled_profiles())}")


def bundled_profiles() -> list[str]:
    return sorted(path.stem for path in PROFILES_DIR.iterdir() if path.suffix in (".yaml", ".json"))


def load_profile(name_or_path: str) -> Profile:
    """Parse and validate a profile (raises ProfileError naming the file and field)."""
    path = profile_path(name_or_path)
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise ProfileError(f"{path}: {error}") from None
    try:
        return _profile(path.stem, data)
    except (KeyError, TypeError, ValueError) as error:
        raise ProfileError(f"{path}: {error}") from None


def _profile(name: str, data: Any) -> Profile:
    if not isinstance(data, dict) or not data.get("stages"):
        raise ValueError("needs a non-empty `stages` list")
    stages = tuple(Stage(float(s["duration"]), int(s["users"]), float(s.get("spawn_rate", s["users"])))
                   for s in data["stages"])
    for index, stage in enumerate(stages):
        if not (0 < stage.duration <= MAX_DURATION_S and 1 <= stage.users <= MAX_USERS and stage.spawn_rate > 0):
            raise ValueError(f"stages[{index}]: duration in (0, {MAX_DURATION_S}], users in [1, {MAX_USERS}], "
                             f"spawn_rate > 0; got {stage}")
    profile = Profile(name, stages, _lengths(data.get("prompt_tokens", {}), Profile.prompt_tokens),
                      _lengths(data.get("output_tokens", {}), Profile.output_tokens),
                      _sampling(data.get("sampling") or {}),
                      str(data.get("description", "")), _flag(data, "exact_output_tokens"))
    if profile.duration > MAX_DURATION_S:
        raise ValueError(f"total duration {profile.duration:.0f} s exceeds {MAX_DURATION_S} s")
    return profile


def _flag(data: dict[str, Any], name: str) -> bool:
    value = data.get(name, False)
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def _sampling(data: dict[str, Any]) -> dict[str, int | float]:
    for key, value in data.items():
        if key not in SAMPLING_DTYPES:
            raise ValueError(f"sampling.{key}: unknown; known: {', '.join(SAMPLING_DTYPES)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"sampling.{key} must be a number, got {value!r}")
    return {str(k): v for k, v in data.items()}


def _lengths(data: dict[str, Any], default: LengthDistribution) -> LengthDistribution:
    lengths = replace(default, **data)
    if lengths.distribution not in ("lognormal", "uniform"):
        raise ValueError(f"distribution must be lognormal or uniform, got {lengths.distribution!r}")
    if not 1 <= lengths.min <= lengths.max:
        raise ValueError(f"token lengths need 1 <= min <= max, got min={lengths.min} max={lengths.max}")
    return lengths
