"""The Locust command-line options of the zerocheck locustfile, and `LoadOptions`: them parsed once per process."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from locust.env import Environment

from zerocheck.loadtests.profiles import Profile, load_profile
from zerocheck.loadtests.prompts import PromptSource, load_prompt_source
from zerocheck.loadtests.targets import DEFAULT_GRPC_URL, DEFAULT_HTTP_URL, DEFAULT_OPENAI_URL, check_targets

def add_locust_options(parser: argparse.ArgumentParser) -> None:
    """Listener of `events.init_command_line_parser` (Locust passes these on to its workers)."""
    group = parser.add_argument_group("zerocheck")
    group.add_argument("--load-profile", default="steady", help="bundled profile name or a .yaml/.json file")
    group.add_argument("--profile-users", type=int, default=0, help="scale the profile's peak to N users (0: as is)")
    group.add_argument("--profile-duration", type=float, default=0.0,
                       help="stretch the profile to S seconds (0: as is)")
    group.add_argument("--zerocheck", choices=("on", "off", "ab"), default="ab",
                       help="sampler path: on (zero_check), off (checked), ab (alternate per request)")
    group.add_argument("--grpc-url", default=DEFAULT_GRPC_URL, help="host:port of Triton's gRPC endpoint")
    group.add_argument("--http-url", default=DEFAULT_HTTP_URL, help="host:port of Triton's HTTP endpoint")
    group.add_argument("--openai-url", default=DEFAULT_OPENAI_URL, help="base URL of the OpenAI API (…/v1)")
    group.add_argument("--served-model", default="", help="model name for the OpenAI API (default: its first)")
    group.add_argument("--model", default="ensemble", help="decoupled generate model (ensemble or generate)")
    group.add_argument("--prompt-source", default="synthetic", help="synthetic (tokenizer vocabulary) or file[:PATH]")
    group.add_argument("--artifacts", default="", help="artifacts with the tokenizer (default: `zerocheck paths artifacts`)")
    group.add_argument("--request-log", default="", help="directory for per-request JSON lines (summary input)")
    group.add_argument("--request-timeout", type=float, default=120.0, help="seconds one request may take")
    group.add_argument("--seed", type=int, default=0, help="seed of prompts, lengths and paths")
    group.add_argument("--allow-remote", action="store_true", help="allow target hosts that are not loopback")


@dataclass(frozen=True)
class LoadOptions:
    profile: Profile
    prompts: PromptSource
    zerocheck: str
    grpc_url: str
    http_url: str
    openai_url: str
    served_model: str
    model: str
    timeout_s: float
    seed: int


_CACHE: dict[int, LoadOptions] = {}


def load_options(environment: Environment) -> LoadOptions:
    """The options of `environment` with profile and prompt source loaded (once per environment)."""
    key = id(environment)
    if key not in _CACHE:
        options = environment.parsed_options
        check_targets([options.grpc_url, options.http_url, options.openai_url], options.allow_remote)
        profile = load_profile(options.load_profile).scaled(options.profile_users or None,
                                                            options.profile_duration or None)
        prompts = load_prompt_source(options.prompt_source, Path(options.artifacts) if options.artifacts else None)
        _CACHE[key] = LoadOptions(profile, prompts, options.zerocheck, options.grpc_url, options.http_url,
                                  options.openai_url, options.served_model, options.model, options.request_timeout,
                                  options.seed)
    return _CACHE[key]
