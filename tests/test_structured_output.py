"""Structured output below the doors: guides parsed and compiled (`zerocheck.grammar`), the token mask
(`zerocheck.sampling.token_mask`) and its exactness: every sampler path draws from the constrained
distribution (the float64 reference over the masked logits), and the decoder's guided rows (zero-check,
multi-step and the checked chain's exported logits) only ever take tokens the guide allows."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from reference_sampling import reference_probs
from test_sampling_distribution import PATHS, assert_matches_reference, assert_thresholds_clear, draw, peaked_row, \
    seeded
from zerocheck.build import BuildOptions, build_artifacts
from zerocheck.decoder import load_decoder
from zerocheck.decoder.service import DecoderService, StepRows
from zerocheck.grammar import GrammarCompiler, GuideError, bitmask_words, parse_guide
from zerocheck.api.guide import MAX_GUIDE_BYTES, MAX_SCHEMA_DEPTH
from zerocheck.sampling import SamplingParams
from zerocheck.sampling.cuda_graph import make_sampler
from zerocheck.sampling.token_mask import TokenMask, apply_token_mask
from zerocheck.tokenizer import load_tokenizer
from zerocheck.wire.step import Registration, StepRow, parse_step, registration_arrays, step_arrays, StepCall
from zerocheck.api.errors import InvalidRequest
from zerocheck.api.sampler_path import SamplerPath

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}},
          "required": ["n", "ok"], "additionalProperties": False}


def random_mask(rows: int, vocab: int, seed: int, share: float = 0.3) -> tuple[TokenMask, np.ndarray]:
    """A mask allowing about `share` of the tokens of each row, and the same as bool [rows, vocab]."""
    allowed = np.random.default_rng(seed).random((rows, vocab)) < share
    padded = np.zeros((rows, bitmask_words(vocab) * 32), bool)
    padded[:, :vocab] = allowed
    bits = np.packbits(padded, axis=1, bitorder="little").view(np.int32)
    return TokenMask(np.ascontiguousarray(bits), np.ones(rows, bool)), allowed


# -- the mask --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_mask_writes_minus_inf_exactly_at_disallowed_tokens(dtype) -> None:
    mask, allowed = random_mask(3, 1000, seed=1)
    mask = TokenMask(mask.bits, np.array([True, False, True]))
    x = torch.randn(3, 1000).to(dtype)
    before = x.clone()
    apply_token_mask(x, mask)
    for r in range(3):
        expect = torch.from_numpy(~allowed[r] & mask.rows[r])
        assert torch.isneginf(x[r][expect].float()).all()
        assert torch.equal(x[r][~expect], before[r][~expect])  # the rest untouched
        assert all(mask.allows(r, t) == (bool(allowed[r, t]) or not mask.rows[r]) for t in range(0, 1000, 37))


def test_token_mask_refuses_a_mask_of_the_wrong_width() -> None:
    mask, _ = random_mask(1, 64, seed=2)
    with pytest.raises(ValueError, match="does not fit"):
        apply_token_mask(torch.zeros(1, 100), mask)


CASES = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature": SamplingParams(temperature=0.7),
    "top_k": SamplingParams(temperature=0.9, top_k=12),
    "top_p": SamplingParams(top_p=0.8),
    "min_p": SamplingParams(min_p=0.15),
    "penalties": SamplingParams(temperature=0.8, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2),
}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("case", list(CASES))
def test_constrained_draws_match_the_masked_reference(case: str, path: str) -> None:
    """Every path draws from reference_probs of the masked row: mask first, then bias, penalties, temperature,
    top-k, top-p and min-p (a masked token stays -inf through all of them)."""
    row = peaked_row(1000, seed=21, head=120)
    mask, allowed = random_mask(1, 1000, seed=22, share=0.4)
    masked = np.where(allowed[0], row, -np.inf).astype(np.float32)
    history = [int(t) for t in np.flatnonzero(allowed[0])[:6]] * 2 if case == "penalties" else None
    params = CASES[case]
    assert_thresholds_clear(masked, params, history)
    probs = reference_probs(masked, params, history)

    def constrained(logits, params, history, step):  # the mask applied to the batch, then the path's sampler
        rows = logits.shape[0]
        apply_token_mask(logits, TokenMask(np.repeat(mask.bits, rows, 0), np.ones(rows, bool)))
        return PATHS[path](logits, params, history, step)

    tokens = draw(constrained, row, seeded(params, 4000, base_seed=7), history)
    assert allowed[0][tokens].all()
    assert_matches_reference(tokens, probs, f"{case}/{path}", exact_support=False)


# -- guides ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("artifacts")
    build_artifacts(BuildOptions(model="tiny", vocab_size=512, layers=1, hidden=32, heads=2, kv_heads=1,
                                 max_seq_len=128, tokenizer_corpus_files=5), out)
    return out


@pytest.fixture(scope="module")
def compiler(artifacts: Path) -> GrammarCompiler:
    return GrammarCompiler.for_tokenizer(load_tokenizer(artifacts))


@pytest.mark.parametrize("kind, text, message", [
    ("xml", "<a/>", "guided_decoding_guide_type must be one of json, json_schema, regex, ebnf_grammar, lark, choice"),
    (None, "[0-9]+", "guided_decoding_guide needs guided_decoding_guide_type"),
    ("regex", "", "guided_decoding_guide is required with guided_decoding_guide_type 'regex'"),
    ("json_schema", "{not json", "guided_decoding_guide must be a JSON schema"),
    ("json_schema", "[1, 2]", "a JSON schema must be an object"),
    ("json_schema", "[" * 30_000 + "]" * 30_000, "nests deeper than"),
    ("json_schema", '{"a":' * (MAX_SCHEMA_DEPTH + 2) + "1" + "}" * (MAX_SCHEMA_DEPTH + 2), "nests deeper than"),
    ("json_schema", "{" + " " * MAX_GUIDE_BYTES + "}", f"must be at most {MAX_GUIDE_BYTES} bytes"),
    ("choice", '["a", 3]', "a choice guide must be a JSON array of 1 to"),
    ("json_schema", b"\xff", "guided_decoding_guide is not valid UTF-8"),
])
def test_bad_guides_are_refused_naming_the_input(kind, text, message) -> None:
    with pytest.raises(GuideError) as error:
        parse_guide(kind, text)
    assert message in str(error.value)


@pytest.mark.parametrize("schema, message", [
    ({"not": {"type": "string"}}, 'keyword(s) not supported (they cannot be enforced): ["not"]'),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, '["uniqueItems"]'),
])
def test_schema_keywords_that_cannot_be_enforced_are_refused(compiler, schema, message) -> None:
    with pytest.raises(GuideError) as error:
        compiler.check(parse_guide("json_schema", json.dumps(schema)))
    assert message in str(error.value)


def test_an_unknown_format_is_an_annotation_and_one_of_is_approximated(compiler) -> None:
    compiler.check(parse_guide("json_schema", json.dumps({"type": "string", "format": "semver"})))
    compiler.check(parse_guide("json_schema", json.dumps({"oneOf": [{"type": "string"}, {"type": "string",
                                                                                           "maxLength": 3}]})))


def test_every_guide_type_compiles_and_a_bad_grammar_names_its_error(compiler) -> None:
    for kind, text in [("json", None), ("json_schema", json.dumps(SCHEMA)), ("regex", r"[a-c]{2}\d"),
                       ("ebnf_grammar", 'root ::= "yes" | "no"'), ("lark", 'start: "a" "b"*'),
                       ("choice", '["red", "green"]')]:
        compiler.check(parse_guide(kind, text))
    with pytest.raises(GuideError, match="guided_decoding_guide: .*unclosed group"):
        compiler.check(parse_guide("regex", "("))


def test_a_slow_compile_is_refused_by_its_time_limit_and_remembered(artifacts) -> None:
    slow = GrammarCompiler.for_tokenizer(load_tokenizer(artifacts))
    slow.timeout_s = 0.0  # every compile is over the limit
    guide = parse_guide("regex", r"[a-z]{1,3}")
    with pytest.raises(GuideError, match="took longer than 0 s to compile"):
        slow.check(guide)
    began = time.perf_counter()
    with pytest.raises(GuideError, match="took longer than"):
        slow.check(guide)  # remembered: refused without a compile
    assert time.perf_counter() - began < 0.05


def test_guides_travel_with_the_registration_on_the_step_wire() -> None:
    guide = parse_guide("json_schema", json.dumps(SCHEMA))
    calls = [StepCall("a", [1, 2], True, False, Registration(SamplingParams(), guide=guide), SamplerPath.ZERO_CHECK,
                      False),
             StepCall("b", [3], True, False, Registration(SamplingParams()), SamplerPath.ZERO_CHECK, False)]
    rows = parse_step(step_arrays(calls))
    assert rows[0].registration.guide == guide and rows[1].registration.guide is None
    assert "guided_decoding_guide" not in registration_arrays([Registration(SamplingParams())], [1])
    with pytest.raises(InvalidRequest, match="row 1: guided_decoding_guide_type must be one of"):
        arrays = step_arrays(calls)
        arrays["guided_decoding_guide_type"][1, 0] = b"xml"
        parse_step(arrays)


# -- the decoder's guided rows ---------------------------------------------------------------------

def service(artifacts: Path) -> DecoderService:
    engine = load_decoder(artifacts, backend="torch", max_slots=8, dtype="fp32")
    return DecoderService(engine, make_sampler(engine.vocab_size, 8, "cpu"),
                          GrammarCompiler.for_tokenizer(load_tokenizer(artifacts), engine.vocab_size))


def generate(svc: DecoderService, seq_id: str, prompt: list[int], params: SamplingParams, guide, limit: int,
             steps: int = 1) -> list[int]:
    """The zero-check path's loop: a start row, then each drawn token fed back (`steps` tokens a call)."""
    end_ids = tuple(load_tokenizer_end_ids(svc))
    (answer,) = svc.run([StepRows([StepRow(seq_id, prompt, True, False,
                                           Registration(params, end_ids=end_ids, guide=guide))],
                                  want_token=True, want_logits=False)])
    assert answer.errors == [None], answer.errors
    out = answer.outputs["output_ids"][0].tolist()
    while out[-1] not in end_ids and len(out) < limit:
        (answer,) = svc.run([StepRows([StepRow(seq_id, [out[-1]], False, False, steps=steps)], want_token=True,
                                      want_logits=False)])
        assert answer.errors == [None], answer.errors
        out += [t for t in answer.outputs["output_ids"][0].tolist() if t >= 0]
    out = out[:limit]
    svc.run([StepRows([StepRow(seq_id, [], False, True)], want_token=True, want_logits=False)])
    return out


def load_tokenizer_end_ids(svc: DecoderService) -> tuple[int, ...]:
    return tuple(svc.grammars.tokenizer.eos_tokens)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=5),
                                    SamplingParams(top_k=20, top_p=0.9, seed=9, repetition_penalty=1.2)])
def test_guided_answers_match_their_schema_single_and_multi_step(artifacts, params) -> None:
    """The tiny model writes nonsense, but every answer that ends is a document of the schema; a seeded
    sequence gets the same tokens one step a call and eight steps a call."""
    svc = service(artifacts)
    tokenizer = load_tokenizer(artifacts)
    guide = parse_guide("json_schema", json.dumps(SCHEMA))
    one = generate(svc, "one", [1, 5, 7], params, guide, limit=120)
    many = generate(svc, "many", [1, 5, 7], params, guide, limit=120, steps=8)
    assert one == many
    assert one[-1] in tokenizer.end_ids, "the answer did not finish within the limit"
    document = json.loads(tokenizer.decode(one[:-1]))
    assert set(document) == {"n", "ok"} and isinstance(document["n"], int) and isinstance(document["ok"], bool)


def test_the_checked_chain_gets_the_masked_logits(artifacts) -> None:
    svc = service(artifacts)
    guide = parse_guide("choice", '["yes", "no"]')
    (answer,) = svc.run([StepRows([StepRow("c", [1, 2, 3], True, False, Registration(SamplingParams(), guide=guide)),
                                   StepRow("u", [1, 2, 3], True, False, Registration(SamplingParams()))],
                                  want_token=False, want_logits=True)])
    logits = answer.outputs["logits"]
    tokenizer = load_tokenizer(artifacts)
    allowed = np.flatnonzero(np.isfinite(logits[0]))
    firsts = {tokenizer.encode(word)[0] for word in ("yes", "no")}
    assert set(allowed.tolist()) >= firsts and len(allowed) < 20  # the prefixes of "yes" and "no" only
    assert np.isfinite(logits[1]).all()  # the unguided row is untouched


def test_a_guide_the_decoder_cannot_serve_fails_its_row_alone(artifacts) -> None:
    svc = service(artifacts)
    bad = parse_guide("json_schema", json.dumps({"not": {}}))
    (answer,) = svc.run([StepRows([StepRow("bad", [1, 2], True, False, Registration(SamplingParams(), guide=bad)),
                                   StepRow("good", [1, 2], True, False, Registration(SamplingParams()))],
                                  want_token=True, want_logits=False)])
    assert "not supported" in str(answer.errors[0]) and answer.errors[1] is None
    assert svc.engine.pool.state("bad") is None  # its slot is free again
