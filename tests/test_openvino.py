"""The openvino decoder backend: the paged OpenVINO graph against the torch module, its block table, prefix
reuse through cache blocks, and compressed weights."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from zerocheck.build import BuildOptions, build_artifacts
from zerocheck.decoder import StepRequest, load_decoder
from zerocheck.decoder.errors import DecoderError
from zerocheck.decoder.openvino_graph import compress_minimum, compress_symmetric
from zerocheck.decoder.openvino_paged import BlockTable

SCHEDULE = [  # prefill and decode rows in one step, sequences ending, a prompt longer than a cache block
    [StepRequest("a", [1, 2, 3, 4, 5], True, False), StepRequest("b", [7], True, False)],
    [StepRequest("a", [6], False, False), StepRequest("b", [8, 9, 10], False, False), StepRequest("c", [3, 3], True, False)],
    [StepRequest("a", [11], False, True), StepRequest("b", [12], False, False), StepRequest("c", [13], False, False)],
    [StepRequest("b", [14], False, True), StepRequest("d", list(range(40)), True, False)],
    [StepRequest("c", [15], False, False), StepRequest("d", [16], False, True)],
]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("artifacts")
    options = BuildOptions(model="tiny", vocab_size=512, layers=2, hidden=64, heads=4, kv_heads=2, max_seq_len=96,
                           tokenizer_corpus_files=20)
    build_artifacts(options, out)
    return out


def test_fp32_engine_matches_the_torch_module(artifacts: Path) -> None:
    engines = [load_decoder(artifacts, backend=backend, max_slots=4, dtype="fp32") for backend in ("torch", "openvino")]
    for requests in SCHEDULE:
        reference, paged = (engine.step(requests) for engine in engines)
        assert reference.errors == paged.errors == [None] * len(requests)
        torch.testing.assert_close(paged.logits, reference.logits, atol=1e-4, rtol=0)
    assert engines[0].pool.in_use == engines[1].pool.in_use == 1  # only c is still running
    table = engines[1]._step_fn.table
    assert table.in_use == 1  # c's 18 positions fit one block; the ended sequences' blocks came back


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_compressed_weights_follow_fp32(artifacts: Path, dtype: str) -> None:
    engines = [load_decoder(artifacts, backend="openvino", max_slots=4, dtype=kind) for kind in ("fp32", dtype)]
    assert engines[1].dtype == dtype and engines[1]._step_fn.cache_type.get_type_name() == "u8"
    for requests in SCHEDULE:
        exact, compressed = (engine.step(requests) for engine in engines)
        assert compressed.errors == [None] * len(requests)
        scale = float(exact.logits.abs().max())  # the tiny model's random weights are on no int4 grid
        assert float((compressed.logits - exact.logits).abs().max()) < (0.1 if dtype == "int8" else 0.25) * scale


def test_int4_single_row_runs_one_row_steps_on_int4_weights_over_the_same_cache(artifacts: Path) -> None:
    """int8 with int4_single_row: a step of one row and one token runs the int4 model, any other step the int8 one,
    both over the one set of cache blocks."""
    mixed = load_decoder(artifacts, backend="openvino", max_slots=4, dtype="int8", int4_single_row=True)
    int8, int4 = (load_decoder(artifacts, backend="openvino", max_slots=4, dtype=kind) for kind in ("int8", "int4"))
    assert mixed._step_fn.single_row is not None and int8._step_fn.single_row is None
    lone = [[StepRequest("a", [5], True, False)], *([StepRequest("a", [t], False, False)] for t in (9, 2, 40, 7))]
    for requests in lone:  # a one-token prompt, then decode: every step is one row and one token
        torch.testing.assert_close(mixed.step(requests).logits, int4.step(requests).logits, atol=0, rtol=0)
    batched = [[StepRequest("b", [1, 2, 3], True, False), StepRequest("c", [4], True, False)],
               [StepRequest("b", [6], False, False), StepRequest("c", [8], False, False)]]
    for requests in batched:
        torch.testing.assert_close(mixed.step(requests).logits, int8.step(requests).logits, atol=0, rtol=0)
    # one row after the int8 steps: the int4 model reads the blocks the int8 model wrote
    step = mixed.step([StepRequest("b", [11], False, True)])
    assert step.errors == [None] and bool(torch.isfinite(step.logits).all())


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_a_reused_prefix_gives_what_its_own_prefill_gives(artifacts: Path, dtype: str) -> None:
    """Prefix reuse copies cache blocks, the last one partly used (blocks of 32 positions, a 45-token opening)."""
    cached = load_decoder(artifacts, backend="openvino", max_slots=2, dtype=dtype, prefix_cache_tokens=512)
    plain = load_decoder(artifacts, backend="openvino", max_slots=2, dtype=dtype)
    opening = [int(t) for t in np.random.default_rng(0).integers(3, 500, 45)]
    for engine in (cached, plain):
        engine.step([StepRequest("first", opening + [9, 9], True, True)])
    steps = [[StepRequest("second", opening + [4, 5, 6], True, False)], [StepRequest("second", [7], False, False)],
             [StepRequest("second", [8], False, True)]]
    for requests in steps:
        reused, computed = cached.step(requests), plain.step(requests)
        assert reused.errors == [None]
        torch.testing.assert_close(reused.logits, computed.logits, atol=1e-4 if dtype == "fp32" else 0.05, rtol=0)
    assert cached.prefix_cache.reused_tokens == 45


def test_block_table_grows_slots_and_takes_blocks_back() -> None:
    table = BlockTable(num_blocks=4, block_size=8)
    assert table.reserve(0, 9) == [0, 1] and table.reserve(0, 16) == [0, 1] and table.reserve(1, 1) == [2]
    with pytest.raises(DecoderError, match="4 blocks are all in use"):
        table.reserve(1, 17)
    table.release(0)
    assert table.in_use == 1 and table.reserve(2, 16) == [0, 1]  # the freed blocks, in their order


def test_weight_compression_round_trips() -> None:
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((8, 64)).astype(np.float32)
    codes, scale = compress_symmetric(weight)
    assert codes.dtype == np.int8 and codes.shape == (8, 2, 32) and scale.shape == (8, 2, 1)
    assert np.abs((codes * scale).reshape(8, 64) - weight).max() <= scale.max() / 2 + 1e-6
    # a weight on a Q8_0 grid (blocks of 32, a scale each, the largest code 127) comes back exactly
    q8_0 = rng.integers(-127, 128, (8, 2, 32)).astype(np.float32)
    q8_0[:, :, 0] = 127
    q8_0 = (q8_0 * rng.uniform(0.001, 0.01, (8, 2, 1))).astype(np.float32)
    codes, scale = compress_symmetric(q8_0.reshape(8, 64))
    np.testing.assert_allclose(codes * scale, q8_0, rtol=1e-6)
    # a weight on a Q4_1 grid (blocks of 32 with a scale and a minimum, codes 0 and 15 used) comes back exactly
    # from Q4_1's form, and from int8 symmetric groups closer than with the plain scale max |w| / 127
    grid = rng.integers(0, 16, (8, 2, 32)).astype(np.float32)
    grid[:, :, 0], grid[:, :, 1] = 0, 15
    step, low = rng.uniform(0.01, 0.1, (8, 2, 1)), rng.uniform(-1, 0, (8, 2, 1))
    q4_1 = (grid * step + low).astype(np.float32).reshape(8, 64)
    codes, scale, minimum = compress_minimum(q4_1)
    assert codes.max() == 15 and codes.shape == (8, 2, 32)
    np.testing.assert_allclose((codes * scale + minimum).reshape(8, 64), q4_1, atol=1e-6)
    codes, scale = compress_symmetric(q4_1)
    blocks = q4_1.reshape(8, 2, 32)
    error = np.square(codes * scale - blocks).sum(axis=2)
    plain = np.abs(blocks).max(axis=2, keepdims=True) / 127
    plain_error = np.square(np.clip(np.rint(blocks / plain), -127, 127) * plain - blocks).sum(axis=2)
    assert (error <= plain_error).all() and error.sum() < 0.75 * plain_error.sum()
    assert (np.abs(codes).max(axis=2) <= 127).all()


def test_openvino_runs_on_the_cpu_only(artifacts: Path) -> None:
    from zerocheck.decoder.engine import choose_device

    assert choose_device("auto", "openvino", cuda_available=True) == "cpu"
    with pytest.raises(ValueError, match="openvino runs on the CPU"):
        choose_device("cuda", "openvino", cuda_available=True)
    with pytest.raises(ValueError, match="dtype int4 needs backend openvino"):
        load_decoder(artifacts, backend="torch", dtype="int4")
