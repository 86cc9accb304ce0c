"""The generation loop and request parsing without Triton: a fake step stands in for the BLS call."""
from __future__ import annotations

import numpy as np
import pytest

import conftest
from zerocheck.generate.loop import CHECKED, ZERO_CHECK, GenerationLoop, StepCall, StepOutput, choose_path
from zerocheck.serving.inputs import InvalidRequest, Limits, check_context, parse_generate_request
from zerocheck.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(conftest.test_artifacts_dir())


def request(**fields):
    arrays = {name: np.array([[value]], dtype=object if isinstance(value, str) else None)
              for name, value in fields.items() if not isinstance(value, list)}
    arrays.update({name: np.array([value], dtype=object) for name, value in fields.items() if isinstance(value, list)})
    return arrays


class ScriptedStep:
    """Returns tokens from a script; records every call."""

    def __init__(self, tokens):
        self.tokens, self.calls, self.released = list(tokens), [], []

    def __call__(self, call: StepCall) -> StepOutput:
        self.calls.append(call)
        return StepOutput(self.tokens[len(self.calls) - 1])

    def release(self, seq_id: str) -> None:
        self.released.append(seq_id)


def run(tokenizer, script, cancel_after=None, **fields):
    step = ScriptedStep(script)
    loop = GenerationLoop(tokenizer, step, step.release, max_context=256)
    parsed = parse_generate_request(request(text_input="hello world", **fields), {})
    chunks = []
    cancelled = (lambda: len(step.calls) >= cancel_after) if cancel_after else (lambda: False)
    result = loop.run(parsed, tokenizer.encode(parsed.prompt), ZERO_CHECK, chunks.append if parsed.stream else None,
                      cancelled)
    return result, step, chunks


def word_ids(tokenizer, text):
    ids = tokenizer.encode(text)
    assert ids
    return ids


def test_runs_to_max_tokens_and_marks_the_last_step_end(tokenizer):
    script = word_ids(tokenizer, " the value of the result is")[:5]
    result, step, _ = run(tokenizer, script, max_tokens=len(script))
    assert result.finish_reason == "length" and result.ids == script
    assert step.calls[0].start and step.calls[0].tokens == tokenizer.encode("hello world")
    assert [c.tokens for c in step.calls[1:]] == [[t] for t in script[:-1]]
    assert step.calls[-1].end and not any(c.end for c in step.calls[:-1])
    assert step.released == []  # the last step released the slot itself


def test_eos_stops_and_releases(tokenizer):
    result, step, _ = run(tokenizer, [5, 6, tokenizer.eos_id, 7], max_tokens=10)
    assert result.finish_reason == "eos" and result.ids == [5, 6]
    assert step.released == [step.calls[0].seq_id]


def test_min_tokens_bans_end_id_until_reached(tokenizer):
    _, step, _ = run(tokenizer, [5, 6, 7, 8], max_tokens=4, min_tokens=2)
    banned = [((tokenizer.eos_id,) in c.sampling.bad_words) for c in step.calls]
    assert banned == [True, True, False, False]


def test_stop_word_stops_after_it(tokenizer):
    stop = word_ids(tokenizer, " stop")
    result, _, _ = run(tokenizer, [5] + stop + [9, 9], max_tokens=10, stop_words=[" stop"])
    assert result.finish_reason == "stop" and result.ids == [5] + stop


def test_cancellation_ends_within_one_step(tokenizer):
    result, step, _ = run(tokenizer, [5] * 50, cancel_after=3, max_tokens=50)
    assert result.finish_reason == "cancelled" and len(step.calls) == 3
    assert step.released == [step.calls[0].seq_id]


def test_history_is_sent_only_when_needed(tokenizer):
    _, plain, _ = run(tokenizer, [5, 6, 7], max_tokens=3)
    assert all(c.history is None for c in plain.calls)
    _, penalised, _ = run(tokenizer, [5, 6, 7], max_tokens=3, repetition_penalty=1.2)
    prompt = tokenizer.encode("hello world")
    assert [c.history for c in penalised.calls] == [prompt, prompt + [5], prompt + [5, 6]]


def test_stream_chunks_concatenate_to_the_text(tokenizer):
    script = word_ids(tokenizer, " é ü 漢字 emoji 🙂 done")[:12]
    result, _, chunks = run(tokenizer, script, max_tokens=len(script), stream=True)
    assert "".join(c.text for c in chunks) == tokenizer.decode(script) == result.text
    assert [i for c in chunks for i in c.ids] == script


def test_non_streamed_text_includes_the_prompt_unless_excluded(tokenizer):
    result, _, _ = run(tokenizer, [5, 6], max_tokens=2)
    assert result.text.startswith("hello world")
    result, _, _ = run(tokenizer, [5, 6], max_tokens=2, exclude_input_in_output=True)
    assert result.text == tokenizer.decode([5, 6])


def test_log_probs_degrade_to_the_checked_path():
    assert choose_path(parse_generate_request(request(text_input="x", return_log_probs=True), {})) == (
        CHECKED, "return_log_probs")
    assert choose_path(parse_generate_request(request(text_input="x"), {"zerocheck": "off"})) == (CHECKED, None)
    assert choose_path(parse_generate_request(request(text_input="x"), {})) == (ZERO_CHECK, None)


@pytest.mark.parametrize("fields, parameters, message", [
    ({"text_input": ""}, {}, "text_input must not be empty"),
    ({"text_input": "x", "max_tokens": 0}, {}, "max_tokens must be an integer in [1, 256]"),
    ({"text_input": "x", "top_p": 1.5}, {}, "top_p must be in (0, 1], got 1.5"),
    ({"text_input": "x", "temperature": float("nan")}, {}, "temperature must be finite"),
    ({"text_input": "x", "beam_width": 2}, {}, "beam_width must be 1"),
    ({"text_input": "x"}, {"zerocheck": "maybe"}, "zerocheck must be 'on' or 'off'"),
    ({"text_input": "x"}, {"temprature": "0.5"}, "unknown request parameter(s): temprature"),
    ({"text_input": b"\xff\xfe"}, {}, "text_input is not valid UTF-8"),
])
def test_bad_requests_name_the_field(fields, parameters, message):
    with pytest.raises(InvalidRequest) as error:
        parse_generate_request(request(**fields), parameters)
    assert message in str(error.value)


def test_context_limit_names_the_allowed_max_tokens():
    parsed = parse_generate_request(request(text_input="x", max_tokens=200), {})
    with pytest.raises(InvalidRequest, match="max_tokens must be <= 56"):
        check_context(parsed, 200, Limits(max_context=256, max_prompt_tokens=250))


def test_admission_queues_then_refuses_at_once():
    from zerocheck.generate.service import GenerateService
    from zerocheck.serving.inputs import Overloaded

    service = GenerateService(None, None, Limits(), max_active=1, max_queue=1, queue_timeout_s=0.05)
    service.reserve()
    service.reserve()  # one active + one queued fit
    with pytest.raises(Overloaded, match="retry later"):
        service.reserve()
    with service.admission():
        assert service.active == 1
        with pytest.raises(Overloaded, match="no KV cache slot freed"):
            with service.admission():  # the queued one times out while the slot is held
                pass
    assert service.active == 0
    service.reserve()  # capacity is back
    with pytest.raises(InvalidRequest, match="num_return_sequences must be <= 1"):
        service.reserve(2)
