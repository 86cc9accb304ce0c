"""zerocheck.loadtests without a server and without importing locust (it gevent-patches the process):
profiles, stages, prompt lengths, A/B paths, loopback guard, summary."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from zerocheck.loadtests.client_textfile import client_latency_text
from zerocheck.loadtests.llm_metrics import StreamTiming
from zerocheck.loadtests.profiles import (SAMPLING_DTYPES, LengthDistribution, ProfileError, bundled_profiles,
                                          load_profile)
from zerocheck.loadtests.prompts import FilePrompts, draw_length
from zerocheck.loadtests.summary import summarize
from zerocheck.loadtests.targets import RemoteTargetRefused, check_targets, is_loopback
from zerocheck.loadtests.workload import Workload


def test_bundled_profiles_are_bounded() -> None:
    assert set(bundled_profiles()) >= {"steady", "ramp", "spike", "soak"}
    for name in bundled_profiles():
        profile = load_profile(name)
        assert 0 < profile.duration <= 24 * 3600 and 1 <= profile.peak_users <= 1024


def test_profile_scaling_keeps_the_shape() -> None:
    ramp = load_profile("ramp").scaled(users=4, duration=11)
    assert ramp.peak_users == 4 and ramp.duration == pytest.approx(11)
    assert [s.users for s in ramp.stages] == [1, 1, 2, 4, 1]


def test_bad_profile_names_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("stages: [{duration: 10, users: 0}]\n")
    with pytest.raises(ProfileError, match="stages\\[0\\]"):
        load_profile(str(bad))
    bad.write_text("stages: [{duration: 10, users: 1}]\nsampling: {temprature: 1.0}\n")
    with pytest.raises(ProfileError, match="temprature"):
        load_profile(str(bad))


def test_stages_follow_the_profile_then_end() -> None:
    profile = load_profile("spike").scaled(users=4, duration=7)  # 2 s at 1, 2 s at 4, 3 s at 1 user
    stages = [profile.stage_at(t) for t in (0.5, 2.5, 5.0, 7.5)]
    assert [None if s is None else s.users for s in stages] == [1, 4, 1, None]


@pytest.mark.parametrize("lengths", [LengthDistribution("lognormal", 8, 160, 48, 0.5),
                                     LengthDistribution("uniform", 16, 48)])
def test_lengths_stay_in_bounds(lengths: LengthDistribution) -> None:
    rng = random.Random(0)
    drawn = [draw_length(lengths, rng) for _ in range(2000)]
    assert lengths.min <= min(drawn) and max(drawn) <= lengths.max and len(set(drawn)) > 10


def test_ab_alternates_paths_and_prompts_have_the_length() -> None:
    workload = Workload(load_profile("steady"), FilePrompts.from_file(), "ab", seed=1)
    requests = [workload.next_request() for _ in range(6)]
    assert [r.path for r in requests] == ["zero_check", "checked"] * 3
    assert [r.zerocheck for r in requests[:2]] == ["on", "off"]
    assert all(16 <= r.max_tokens <= 48 and r.prompt for r in requests)


def test_sampling_dtypes_match_the_server_table() -> None:
    from zerocheck.api.request import INPUTS_BY_NAME

    for name, dtype in SAMPLING_DTYPES.items():
        assert INPUTS_BY_NAME[name].dtype == f"TYPE_{dtype}", name


def test_loopback_guard() -> None:
    assert is_loopback("127.0.0.1:8001") and is_loopback("localhost:8000") and is_loopback("http://[::1]:8000/x")
    assert not is_loopback("10.0.0.1:8001")
    check_targets(["10.0.0.1:8001"], allow_remote=True)
    with pytest.raises(RemoteTargetRefused, match="--allow-remote"):
        check_targets(["127.0.0.1:8001", "10.0.0.1:8001"], allow_remote=False)


def record(path: str, start: float, tokens: list[float], error: str = "") -> dict:
    timing = StreamTiming("gRPC", path, start=start, token_times=tokens, end=tokens[-1] if tokens else start + 1,
                          sampler=path, bypass=path == "zero_check", error=error)
    return timing.record()


def test_summary_per_path() -> None:
    records = [record("zero_check", 0.0, [0.1, 0.2, 0.3]), record("checked", 0.0, [0.2, 0.4, 0.6, 1.0]),
               record("checked", 0.5, [], error="StreamError: overloaded")]
    summary = summarize(records)
    zero, checked = summary["paths"]["zero_check"], summary["paths"]["checked"]
    assert summary["duration_s"] == pytest.approx(1.5)
    assert zero["ttft_ms"]["p50"] == pytest.approx(100) and zero["itl_ms"]["p50"] == pytest.approx(100)
    assert checked["tpot_ms"]["p50"] == pytest.approx(800 / 3, abs=1e-3)
    assert (zero["bypass_rate"], checked["bypass_rate"], checked["errors"]) == (1.0, 0.0, 1)
    assert summary["paths"]["all"]["output_tokens_per_s"] == pytest.approx(7 / 1.5, abs=1e-3)
    text = client_latency_text(summary)
    assert 'zerocheck_client_time_to_first_token_seconds{sampler="zero_check",quantile="0.95"} 0.100000' in text
    assert 'sampler="all"' not in text
