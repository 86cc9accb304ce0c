"""The e2e benchmark's per-step breakdown from Triton statistics (no server: synthetic deltas)."""
from __future__ import annotations

import pytest

from zerocheck.bench.e2e import Run, Sample, aggregate, ratios
from zerocheck.bench.triton_stats import ModelTime, delta

MS = 1_000_000  # ns


def run(path: str, tpot_ms: float, models: dict[str, ModelTime]) -> Run:
    return Run(path, 1, 1.0, [Sample(0.01, tpot_ms / 1e3, 100)], models)


def test_decoder_is_its_forward_and_overhead_is_everything_else() -> None:
    decoder = ModelTime(executions=100, inferences=100, infer_ns=400 * MS, forward_ns=250 * MS, sample_ns=50 * MS,
                        input_ns=10 * MS, output_ns=10 * MS, steps=100)
    row = aggregate(32000, [run("zero_check", 5.0, {"decoder": decoder})])
    assert row.decoder_ms_per_step == pytest.approx(2.5)
    assert row.sampler_ms_per_step == pytest.approx(0.5)
    assert row.overhead_ms_per_step == pytest.approx(2.0)  # 5 - 2.5 - 0.5: the decoder's own glue included
    assert row.transport_ms_per_step == pytest.approx(0.2)


def test_checked_sampler_is_the_check_layer_execute_and_ratios_compare_paths() -> None:
    decoder = ModelTime(executions=10, inferences=10, infer_ns=40 * MS, forward_ns=30 * MS, steps=10)
    layer = {name: ModelTime(executions=10, inferences=10, infer_ns=20 * MS)
             for name in ("penalties", "softmax", "top_k_top_p", "multinomial")}
    checked = aggregate(32000, [run("checked", 20.0, {"decoder": decoder, **layer})])
    assert checked.sampler_ms_per_step == pytest.approx(8.0)
    zero = aggregate(32000, [run("zero_check", 4.0, {"decoder": ModelTime(executions=10, forward_ns=30 * MS, steps=10)})])
    (ratio,) = ratios([zero, checked])
    assert ratio["tpot_p50_ms_ratio"] == pytest.approx(5.0)


def test_delta_subtracts_the_stage_counters_too() -> None:
    before = {"decoder": ModelTime(executions=1, forward_ns=5, sample_ns=2, steps=1)}
    after = {"decoder": ModelTime(executions=4, forward_ns=50, sample_ns=20, steps=10)}
    moved = delta(before, after)["decoder"]
    assert (moved.executions, moved.forward_ns, moved.sample_ns, moved.steps) == (3, 45, 18, 9)


def test_a_multi_step_execute_counts_each_of_its_forwards() -> None:
    """decode_steps: 10 executes of 4 forwards each are 40 decoder steps (per-token times, not per-execute)."""
    decoder = ModelTime(executions=10, inferences=10, forward_ns=400 * MS, sample_ns=40 * MS, steps=40)
    row = aggregate(32000, [run("zero_check", 12.0, {"decoder": decoder})])
    assert row.decoder_ms_per_step == pytest.approx(10.0) and row.sampler_ms_per_step == pytest.approx(1.0)
