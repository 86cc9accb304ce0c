"""What each load user sends: prompt, `max_tokens`, sampling inputs and the sampler path, drawn per request."""
from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass

from zerocheck.api.sampler_path import SamplerPath
from zerocheck.loadtests.profiles import Profile
from zerocheck.loadtests.prompts import PromptSource, draw_length

SWITCH_OF_PATH = {SamplerPath.ZERO_CHECK: "on", SamplerPath.CHECKED: "off"}
PATHS_OF_OPTION = {"on": (SamplerPath.ZERO_CHECK,), "off": (SamplerPath.CHECKED,), "ab": (SamplerPath.ZERO_CHECK, SamplerPath.CHECKED)}


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str
    max_tokens: int
    path: str  # zero_check | checked
    sampling: dict[str, int | float]
    min_tokens: int = 0  # = max_tokens when the profile asks for exact output lengths

    @property
    def zerocheck(self) -> str:
        """The `zerocheck` request parameter selecting `path`: on | off."""
        return SWITCH_OF_PATH[self.path]


class Workload:
    """An endless, seeded stream of requests; `--zerocheck ab` alternates the path request by request."""

    def __init__(self, profile: Profile, prompts: PromptSource, zerocheck: str, seed: int) -> None:
        self.profile, self.prompts = profile, prompts
        self.rng = random.Random(seed)
        self.paths: Iterator[str] = itertools.cycle(PATHS_OF_OPTION[zerocheck])

    def next_request(self) -> GenerationRequest:
        prompt = self.prompts.prompt(draw_length(self.profile.prompt_tokens, self.rng), self.rng)
        max_tokens = draw_length(self.profile.output_tokens, self.rng)
        return GenerationRequest(prompt, max_tokens, next(self.paths), self.profile.sampling,
                                 max_tokens if self.profile.exact_output_tokens else 0)
