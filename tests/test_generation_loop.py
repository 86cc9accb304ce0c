"""The generation loop without Triton: sequences driven by the step scheduler over a scripted batched
step, request parsing and admission control."""
from __future__ import annotations

import asyncio
import copy
import re

import numpy as np
import pytest

import conftest
from zerocheck.generate.scheduler import StepScheduler
from zerocheck.api.sampler_path import SamplerPath
from zerocheck.generate.sequence import Sequence, choose_path
from zerocheck.wire.step import StepCall, StepOutput
from zerocheck.generate.service import GenerateService
from zerocheck.api.errors import InvalidRequest, Overloaded
from zerocheck.api.request import Limits, check_context, parse_generate_request, word_list_element
from zerocheck.tokenizer import load_tokenizer

PROMPT = "hello world"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(conftest.test_artifacts_dir())


def request(**fields):
    arrays = {name: np.array([[value]], dtype=object if isinstance(value, str) else None)
              for name, value in fields.items() if not isinstance(value, list)}
    arrays.update({name: np.array([value], dtype=object) for name, value in fields.items() if isinstance(value, list)})
    return arrays


class ScriptedSteps:
    """A batched step that answers each sequence from its own script (a token, or an exception for
    that row); records every batch and every release."""

    def __init__(self, scripts: dict[int, list], fail_batch_at: int | None = None):
        self.scripts, self.fail_batch_at = scripts, fail_batch_at
        self.batches: list[list[StepCall]] = []
        self.released: list[str] = []
        self.index_of: dict[str, int] = {}  # seq_id -> script key
        self.sequences: dict[str, Sequence] = {}

    async def step(self, path: str, calls: list[StepCall]) -> list:
        self.batches.append(calls)
        await asyncio.sleep(0)
        if self.fail_batch_at == len(self.batches):
            raise RuntimeError("the whole step failed")
        out = []
        for call in calls:
            script, seq = self.scripts[self.index_of[call.seq_id]], self.sequences[call.seq_id]
            items = script[len(seq.ids):len(seq.ids) + call.steps]  # from the step: tokens sampled so far
            failed = next((item for item in items if isinstance(item, Exception)), None)
            ends = [i for i, item in enumerate(items) if item in seq.end_ids]  # a multi-step row stops at one
            items = items[:ends[0] + 1] if ends else items
            out.append(failed or StepOutput(items[0], more=tuple(items[1:])))
        return out

    async def release(self, seq_ids: list[str]) -> None:
        self.released += seq_ids


def sequences(tokenizer, steps: ScriptedSteps, count=1, cancelled=lambda: False, path=SamplerPath.ZERO_CHECK, **fields):
    fields.setdefault("max_tokens", 16)  # GenerateService.prepare resolves a missing one; these tests skip it
    parsed = parse_generate_request(request(text_input=PROMPT, **fields), {})
    out = [Sequence(tokenizer, parsed, tokenizer.encode(PROMPT), path, 256, index, cancelled) for index in range(count)]
    for index, seq in enumerate(out):
        steps.index_of[seq.seq_id] = index
        steps.sequences[seq.seq_id] = seq
    return out


def run(tokenizer, script, cancelled=lambda: False, decode_steps=1, **fields):
    """One sequence to its end; returns (sequence, steps, streamed chunks, ended)."""
    steps = ScriptedSteps({0: script})
    (seq,) = sequences(tokenizer, steps, cancelled=cancelled, **fields)
    chunks, ended = [], []
    scheduler = StepScheduler(steps.step, steps.release, decode_steps=decode_steps, decode_steps_max_rows=4)
    asyncio.run(scheduler.run([seq], lambda s, chunk: chunks.append(chunk) if chunk else ended.append(s)))
    return seq, steps, chunks, ended


def calls_of(steps: ScriptedSteps) -> list[StepCall]:
    return [call for batch in steps.batches for call in batch]


def word_ids(tokenizer, text):
    ids = tokenizer.encode(text)
    assert ids
    return ids


def test_runs_to_max_tokens_and_marks_the_last_step_end(tokenizer):
    script = word_ids(tokenizer, " the value of the result is")[:5]
    seq, steps, _, ended = run(tokenizer, script, max_tokens=len(script))
    calls = calls_of(steps)
    assert seq.generation().finish_reason == "length" and seq.ids == script and ended == [seq]
    assert calls[0].start and calls[0].tokens == tokenizer.encode(PROMPT)
    assert [c.tokens for c in calls[1:]] == [[t] for t in script[:-1]]
    assert calls[-1].end and not any(c.end for c in calls[:-1])
    assert steps.released == []  # the last step released the slot itself


def test_eos_stops_and_releases(tokenizer):
    seq, steps, _, _ = run(tokenizer, [5, 6, tokenizer.eos_id, 7], max_tokens=10)
    assert seq.generation().finish_reason == "eos" and seq.ids == [5, 6]
    assert steps.released == [seq.seq_id]


def test_min_tokens_and_the_end_ids_it_bans_are_registered(tokenizer):
    _, steps, _, _ = run(tokenizer, [5, 6, 7, 8], max_tokens=4, min_tokens=2)
    registration = calls_of(steps)[0].registration
    assert registration.min_tokens == 2 and tokenizer.eos_id in registration.end_ids


def test_stop_word_stops_after_it(tokenizer):
    stop = word_ids(tokenizer, " stop")
    seq, _, _, _ = run(tokenizer, [5] + stop + [9, 9], max_tokens=10, stop_words=[" stop"])
    assert seq.generation().finish_reason == "stop" and seq.ids == [5] + stop


def test_cancellation_ends_within_one_step(tokenizer):
    steps = ScriptedSteps({0: [5] * 50})
    (seq,) = sequences(tokenizer, steps, cancelled=lambda: len(steps.batches) >= 3, max_tokens=50)
    ended, freed = [], []

    async def scenario():
        scheduler = StepScheduler(steps.step, steps.release, on_cancel_freed=freed.append)
        await scheduler.run([seq], lambda s, c: ended.append(c))
        await asyncio.gather(*scheduler._background)  # the release runs in the background

    asyncio.run(scenario())
    assert seq.generation().finish_reason == "cancelled" and len(steps.batches) == 3
    assert steps.released == [seq.seq_id] and ended[-1] is None  # a cancelled sequence ends well
    assert len(freed) == 1 and 0 <= freed[0] < 1  # seen at a step's start, its slot freed right after


def test_sampling_is_registered_once_and_later_steps_carry_one_id(tokenizer):
    _, penalised, _, _ = run(tokenizer, [5, 6, 7], max_tokens=3, repetition_penalty=1.2)
    first, *later = calls_of(penalised)
    prompt = tokenizer.encode(PROMPT)
    assert first.registration.params.repetition_penalty == 1.2 and first.registration.prompt_length == len(prompt)
    assert [(c.registration, c.tokens) for c in later] == [(None, [5]), (None, [6])]


def test_every_sequence_gets_a_seed(tokenizer):
    _, unseeded, _, _ = run(tokenizer, [5, 6], max_tokens=2)
    seed = calls_of(unseeded)[0].registration.params.seed
    assert seed is not None  # one noise stream per sequence, whatever its batch row
    steps = ScriptedSteps({0: [5], 1: [5], 2: [5]})
    assert [s.sampling.seed for s in sequences(tokenizer, steps, count=3, random_seed=7)] == [7, 8, 9]


@pytest.mark.parametrize("interval", [1, 3])
def test_stream_chunks_concatenate_to_the_text(tokenizer, interval):
    script = word_ids(tokenizer, " é ü 漢字 emoji 🙂 done")[:12]
    seq, _, chunks, _ = run(tokenizer, script, max_tokens=len(script), stream=True, stream_interval=interval)
    assert "".join(c.text for c in chunks) == tokenizer.decode(script) == seq.generation().text
    assert [i for c in chunks for i in c.ids] == script
    assert all(len(c.ids) == interval for c in chunks[:-1])


def test_non_streamed_text_includes_the_prompt_unless_excluded(tokenizer):
    seq, _, chunks, _ = run(tokenizer, [5, 6], max_tokens=2)
    assert seq.generation().text.startswith(PROMPT) and chunks == []
    seq, _, _, _ = run(tokenizer, [5, 6], max_tokens=2, exclude_input_in_output=True)
    assert seq.generation().text == tokenizer.decode([5, 6])


def join_late(scheduler: StepScheduler, steps: ScriptedSteps, first: list[Sequence], late: Sequence) -> None:
    """Run `first` to their end, `late` joining once two batches went out."""
    async def both():
        early = asyncio.ensure_future(scheduler.run(first, lambda s, c: None))
        while len(steps.batches) < 2:
            await asyncio.sleep(0)
        await scheduler.run([late], lambda s, c: None)
        await early

    asyncio.run(both())


def test_concurrent_sequences_share_each_step_and_join_and_leave(tokenizer):
    steps = ScriptedSteps({0: [5] * 6, 1: [6, tokenizer.eos_id], 2: [7] * 6})
    first = sequences(tokenizer, steps, count=2, max_tokens=6)
    late = sequences(tokenizer, steps, max_tokens=3)[0]
    steps.index_of[late.seq_id] = 2
    scheduler = StepScheduler(steps.step, steps.release)

    join_late(scheduler, steps, first, late)
    rows = [sorted(steps.index_of[c.seq_id] for c in batch) for batch in steps.batches]
    assert rows[:2] == [[0, 1], [0, 1]]  # together from the start; 1 ends with eos at its second step
    assert [0, 2] in rows and all(len(r) <= 2 for r in rows[2:])  # the late one joins, the ended one left
    assert late.ids == [7, 7, 7] and first[0].ids == [5] * 6 and first[1].generation().finish_reason == "eos"
    assert first[1].seq_id in steps.released
    assert scheduler.steps == len(steps.batches)


def test_a_failed_row_fails_only_its_sequence(tokenizer):
    steps = ScriptedSteps({0: [5, 5, 5], 1: [6, InvalidRequest("row refused"), 6]})
    seqs = sequences(tokenizer, steps, count=2, max_tokens=3)
    asyncio.run(StepScheduler(steps.step, steps.release).run(seqs, lambda s, c: None))
    assert seqs[0].error is None and seqs[0].ids == [5, 5, 5]
    assert str(seqs[1].error) == "row refused" and seqs[1].ids == [6]
    assert steps.released == [seqs[1].seq_id]


def test_a_failed_batch_fails_its_rows_and_the_scheduler_goes_on(tokenizer):
    steps = ScriptedSteps({0: [5, 5, 5], 1: [6, 6, 6]}, fail_batch_at=2)
    seqs = sequences(tokenizer, steps, count=2, max_tokens=3)
    scheduler = StepScheduler(steps.step, steps.release)
    asyncio.run(scheduler.run(seqs, lambda s, c: None))
    assert all(str(s.error) == "the whole step failed" for s in seqs)
    assert sorted(steps.released) == sorted(s.seq_id for s in seqs)
    steps = ScriptedSteps({0: [5, 5]})
    after = sequences(tokenizer, steps, max_tokens=2)
    asyncio.run(StepScheduler(steps.step, steps.release).run(after, lambda s, c: None))
    assert after[0].ids == [5, 5]


def test_a_failed_send_fails_only_its_sequence(tokenizer):
    steps = ScriptedSteps({0: [5] * 4, 1: [6] * 4})
    seqs = sequences(tokenizer, steps, count=2, max_tokens=4, stream=True)

    def emit(seq, chunk):
        if seq is seqs[1]:
            raise ConnectionError("client gone")

    asyncio.run(StepScheduler(steps.step, steps.release).run(seqs, emit))
    assert seqs[0].ids == [5] * 4 and isinstance(seqs[1].error, ConnectionError)


def test_multi_step_calls_ask_for_several_tokens_once_the_prompt_is_in(tokenizer):
    script = word_ids(tokenizer, " é ü 漢字 emoji 🙂 done")[:10]
    seq, steps, chunks, ended = run(tokenizer, script, decode_steps=4, max_tokens=10, stream=True)
    calls = calls_of(steps)
    assert [c.steps for c in calls] == [1, 4, 4, 1]  # the prompt's step, then never past max_tokens
    assert [c.tokens for c in calls[1:]] == [[script[0]], [script[4]], [script[8]]]
    assert [c.end for c in calls] == [False, False, False, True] and steps.released == []
    assert seq.ids == script and ended == [seq] and seq.generation().finish_reason == "length"
    assert [len(c.ids) for c in chunks] == [1] * 10  # a response a token (stream_interval 1), sent a call at a time
    assert "".join(c.text for c in chunks) == tokenizer.decode(script)


def test_a_multi_step_call_that_ends_early_ends_the_sequence_there(tokenizer):
    seq, steps, _, _ = run(tokenizer, [5, 6, tokenizer.eos_id, 7, 8], decode_steps=4, max_tokens=10)
    assert [c.steps for c in calls_of(steps)] == [1, 4]
    assert seq.ids == [5, 6] and seq.generation().finish_reason == "eos" and steps.released == [seq.seq_id]
    stop = word_ids(tokenizer, " stop")
    seq, steps, _, _ = run(tokenizer, [5] + stop + [9] * 8, decode_steps=4, max_tokens=10, stop_words=[" stop"])
    assert seq.ids == [5] + stop and seq.generation().finish_reason == "stop"


def test_multi_step_waits_for_prompts_and_stays_off_big_batches_and_the_checked_path(tokenizer):
    steps = ScriptedSteps({0: [5] * 12, 1: [6] * 12, 2: [7] * 12})
    first = sequences(tokenizer, steps, count=2, max_tokens=12)
    late = sequences(tokenizer, steps, max_tokens=3)[0]
    steps.index_of[late.seq_id] = 2
    scheduler = StepScheduler(steps.step, steps.release, decode_steps=4, decode_steps_max_rows=2)

    join_late(scheduler, steps, first, late)
    counts = [[c.steps for c in batch] for batch in steps.batches]
    assert counts[:2] == [[1, 1], [4, 4]]  # two rows decoding: several tokens each
    assert [1, 1, 1] in counts  # the late prompt's step, and three rows are past decode_steps_max_rows
    assert first[0].ids == [5] * 12 and first[1].ids == [6] * 12 and late.ids == [7] * 3
    _, checked, _, _ = run(tokenizer, [5] * 6, decode_steps=4, max_tokens=6, path=SamplerPath.CHECKED)
    assert {c.steps for c in calls_of(checked)} == {1}


def test_a_multi_step_call_stops_at_the_nearest_max_tokens_of_its_rows(tokenizer):
    """Rows with 2 and 9 tokens left after the prompt's step: a call of 2 steps each (the short row's end
    does not wait for the other's later steps), then 4 for the row left alone, then the 3 it has left."""
    steps = ScriptedSteps({0: [5] * 3, 1: [6] * 10})
    short, long = sequences(tokenizer, steps, count=1, max_tokens=3) + sequences(tokenizer, steps, count=1,
                                                                                 max_tokens=10)
    steps.index_of[long.seq_id] = 1
    scheduler = StepScheduler(steps.step, steps.release, decode_steps=4, decode_steps_max_rows=2)

    asyncio.run(scheduler.run([short, long], lambda s, c: None))
    counts = [[c.steps for c in batch] for batch in steps.batches]
    assert counts == [[1, 1], [2, 2], [4], [3]]
    assert [c.end for c in steps.batches[1]] == [True, False]
    assert short.ids == [5] * 3 and long.ids == [6] * 10


def test_batches_are_split_at_max_batch(tokenizer):
    steps = ScriptedSteps({i: [5, 5] for i in range(5)})
    seqs = sequences(tokenizer, steps, count=5, max_tokens=2)
    asyncio.run(StepScheduler(steps.step, steps.release, max_batch=2).run(seqs, lambda s, c: None))
    assert [len(b) for b in steps.batches] == [2, 2, 1, 2, 2, 1]
    assert all(s.ids == [5, 5] for s in seqs)


def test_log_probs_degrade_to_the_checked_path():
    assert choose_path(parse_generate_request(request(text_input="x", return_log_probs=True), {})) == (
        SamplerPath.CHECKED, "return_log_probs")
    assert choose_path(parse_generate_request(request(text_input="x"), {"zerocheck": "off"})) == (SamplerPath.CHECKED, None)
    assert choose_path(parse_generate_request(request(text_input="x"), {})) == (SamplerPath.ZERO_CHECK, None)


@pytest.mark.parametrize("fields, parameters, message", [
    ({"text_input": ""}, {}, "text_input must not be empty"),
    ({"text_input": "x", "max_tokens": 0}, {}, "max_tokens must be an integer in [1, 1024]"),
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


@pytest.mark.parametrize("fields, message", [
    ({"min_tokens": 2}, "min_tokens cannot be combined with guided_decoding_guide_type"),
    ({"end_id": -1}, "end_id -1 (never stop at an end token) cannot be combined with guided_decoding_guide_type"),
    ({"end_id": 7}, "end_id 7 cannot be combined with guided_decoding_guide_type: a finished guide allows only"),
])
def test_a_guide_decides_where_the_answer_ends(tokenizer, fields, message):
    service = GenerateService(tokenizer, None, Limits(), max_active=1, max_queue=1)
    guided = request(text_input="x", guided_decoding_guide_type="json", **fields)
    with pytest.raises(InvalidRequest) as error:
        service.prepare(guided, {})
    assert message in str(error.value)
    service.prepare(request(text_input="x", **fields), {})  # without a guide: served


def test_context_limit_names_the_allowed_max_tokens():
    parsed = parse_generate_request(request(text_input="x", max_tokens=200), {})
    with pytest.raises(InvalidRequest, match="max_tokens must be <= 56"):
        check_context(parsed, 200, Limits(max_context=256, max_prompt_tokens=250))


def test_admission_queues_then_refuses_at_once():
    async def scenario():
        service = GenerateService(None, None, Limits(), max_active=1, max_queue=1, queue_timeout_s=0.05)
        service.reserve()
        service.reserve()  # one active + one queued fit
        with pytest.raises(Overloaded, match="retry later"):
            service.reserve()
        async with service.admission():
            assert service.active == 1
            with pytest.raises(Overloaded, match="no KV cache slot freed"):
                async with service.admission():  # the queued one times out while the slot is held
                    pass
        assert service.active == 0
        service.reserve()  # capacity is back
        with pytest.raises(InvalidRequest, match="num_return_sequences must be <= 1"):
            service.reserve(2)

    asyncio.run(scenario())


def test_a_request_cancelled_as_its_slot_frees_is_cancelled_and_gives_the_slot_back():
    """The queued request's slot is granted and its task cancelled in the same loop turn (a client that leaves
    as a slot frees): the cancellation must reach it (before Python 3.12, `asyncio.wait_for` returned the slot
    and dropped the cancellation, so the request ran on for nobody), and the slot must be free again."""
    async def scenario():
        service = GenerateService(None, None, Limits(), max_active=1, max_queue=1, queue_timeout_s=30.0)
        entered = []

        async def queued():
            service.reserve()
            async with service.admission():
                entered.append(True)
                await asyncio.sleep(30)

        holder = service.admission()
        service.reserve()
        await holder.__aenter__()
        task = asyncio.create_task(queued())
        for _ in range(3):
            await asyncio.sleep(0)  # the queued request now waits for the slot
        await holder.__aexit__(None, None, None)  # the slot goes to the waiting acquire ...
        task.cancel()  # ... as the client leaves
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not entered and service.active == 0
        async with service.admission():  # the slot is free again: no 30 s wait
            assert service.active == 1

    asyncio.run(asyncio.wait_for(scenario(), 5))


def test_max_tokens_defaults_to_what_fits(tokenizer):
    service = GenerateService(tokenizer, None, Limits(max_context=64, max_prompt_tokens=60, max_output_tokens=32),
                              max_active=1, max_queue=1)
    short = service.prepare(request(text_input="hi"), {})
    assert short.request.max_tokens == 32  # the server's limit
    long_prompt = " ".join(["hello"] * 200)
    ids = tokenizer.encode(long_prompt)[:50]
    near_full = service.prepare(request(text_input=tokenizer.decode(ids)), {})
    assert near_full.request.max_tokens == 64 - len(near_full.prompt_ids) < 32


def test_logit_bias_ids_are_checked_and_reach_the_sampler(tokenizer):
    service = GenerateService(tokenizer, None, Limits(), max_active=1, max_queue=1)
    prepared = service.prepare({**request(text_input="x"), "logit_bias_ids": np.array([[5, 7]], np.int32),
                                "logit_bias_values": np.array([[2.5, -100.0]], np.float32)}, {})
    seq = Sequence(tokenizer, prepared.request, prepared.prompt_ids, SamplerPath.ZERO_CHECK, 256)
    assert seq.sampling.logit_bias == ((5, 2.5), (7, -100.0))
    for ids, values, message in (([5], [1.0, 2.0], "logit_bias_ids has 1 ids but logit_bias_values has 2"),
                                 ([5], [101.0], "must be finite and in [-100, 100]"),
                                 ([tokenizer.vocab_size], [1.0], "logit_bias_ids must be token ids in [0, ")):
        with pytest.raises(InvalidRequest, match=re.escape(message)):
            service.prepare({**request(text_input="x"), "logit_bias_ids": np.array([ids], np.int32),
                             "logit_bias_values": np.array([values], np.float32)}, {})


@pytest.mark.parametrize("element, words", [("stop", ("stop",)), ("a,b", ("a", "b")), ('"a,b",c', ("a,b", "c")),
                                            ('"say ""hi"""', ('say "hi"',)), ('"\n"', ("\n",))])
def test_word_lists_read_csv_like_tensorrtllm_backend(element, words):
    assert parse_generate_request(request(text_input="x", stop_words=[element]), {}).stop_words == words


@pytest.mark.parametrize("word", ["stop", ",", "a,b", 'say "hi"', "\n", " x", "\r\n\r\n"])
def test_any_word_survives_word_list_element(word):
    element = word_list_element(word)
    assert parse_generate_request(request(text_input="x", stop_words=[element]), {}).stop_words == (word,)


def test_chat_needs_a_chat_template(tokenizer):
    messages = request(messages='[{"role": "user", "content": "hi"}]')
    service = GenerateService(tokenizer, None, Limits(), max_active=1, max_queue=1)
    prepared = service.prepare(messages, {})  # the tiny model's template frames turns with <s> ... </s>
    assert tokenizer.decode(prepared.prompt_ids, skip_special_tokens=False) == "<s>user\nhi</s>\n<s>assistant\n"
    assert tokenizer.end_ids == (tokenizer.eos_id,)
    without = copy.copy(tokenizer)
    without.chat_template = None
    with pytest.raises(InvalidRequest, match="messages: the served model has no chat template; send text_input"):
        GenerateService(without, None, Limits(), max_active=1, max_queue=1).prepare(messages, {})


class OneSlotDecoder:
    """A stand-in decoder with one KV slot: a prefill finding it taken is refused as overloaded, as the real
    decoder refuses a start row when its pool is full; the slot frees on a step with end or a release."""

    def __init__(self) -> None:
        self.holder: str | None = None
        self.starts: dict[str, int] = {}

    async def step(self, path: str, calls: list[StepCall]) -> list:
        await asyncio.sleep(0)
        out = []
        for call in calls:
            if call.start:
                self.starts[call.seq_id] = self.starts.get(call.seq_id, 0) + 1
                if self.holder is not None:
                    out.append(Overloaded("KV cache pool full: 1/1 slots in use; retry later"))
                    continue
                self.holder = call.seq_id
            out.append(StepOutput(5))
            if call.end:
                self.holder = None
        return out

    async def release(self, seq_ids: list[str]) -> None:
        await asyncio.sleep(0.01)  # frees in the background, after the sequence ended
        if self.holder in seq_ids:
            self.holder = None


def test_a_prefill_without_a_free_slot_waits_instead_of_failing(tokenizer):
    decoder = OneSlotDecoder()
    first, second = sequences(tokenizer, ScriptedSteps({}), count=2, max_tokens=3)
    asyncio.run(StepScheduler(decoder.step, decoder.release).run([first, second], lambda s, c: None))
    assert first.error is None and second.error is None and first.ids == second.ids == [5, 5, 5]
    assert decoder.starts[first.seq_id] == 1 and decoder.starts[second.seq_id] > 1  # its prefill went again


def test_a_prefill_gives_up_after_max_wait(tokenizer):
    decoder = OneSlotDecoder()
    decoder.holder = "someone else"  # never freed
    (seq,) = sequences(tokenizer, ScriptedSteps({}), count=1, max_tokens=3)
    seq.max_wait_s = 0.05
    asyncio.run(StepScheduler(decoder.step, decoder.release).run([seq], lambda s, c: None))
    assert isinstance(seq.error, Overloaded) and "no KV cache slot freed within 0.05 s" in str(seq.error)


def test_a_request_of_several_rows_is_split_and_checked(tokenizer):
    service = GenerateService(tokenizer, None, Limits(), max_active=4, max_queue=4)
    rows = service.prepare_batch({"text_input": np.array([[b"hi"], [b"there"]], dtype=object),
                                  "max_tokens": np.array([[3], [5]], dtype=np.int32)}, {})
    assert [(row.batch_index, row.request.prompt, row.request.max_tokens) for row in rows] == [(0, "hi", 3),
                                                                                              (1, "there", 5)]
    with pytest.raises(InvalidRequest, match="every input needs the batch size 2: max_tokens has 1"):
        service.prepare_batch({"text_input": np.array([[b"hi"], [b"there"]], dtype=object),
                               "max_tokens": np.array([[3]], dtype=np.int32)}, {})


def test_chunked_prefill_interleaves_prompts_with_decoding(tokenizer):
    """With 4 prompt tokens per step, a prompt arriving while another sequence decodes is sent in chunks
    of at most 4 (the first starts the slot), the running sequence steps every time, the token sampled
    after a partial chunk is dropped, and the result equals the unchunked one."""
    prompt = tokenizer.encode(PROMPT)
    assert len(prompt) > 4

    def generate(prefill_tokens):
        steps = ScriptedSteps({0: [5, 6, 7, 8, 9, 10, 11, 12], 1: [20, 21, 22]})
        first, second = sequences(tokenizer, steps, count=2, max_tokens=8)
        second.max_tokens = 3
        scheduler = StepScheduler(steps.step, steps.release, prefill_tokens=prefill_tokens)

        async def main():
            one = asyncio.ensure_future(scheduler.run([first], lambda s, c: None))
            while len(steps.batches) < 2:
                await asyncio.sleep(0)
            await scheduler.run([second], lambda s, c: None)
            await one
        asyncio.run(main())
        return first, second, steps

    first, second, steps = generate(4)
    second_calls = [call for batch in steps.batches for call in batch if call.seq_id == second.seq_id]
    chunks = -(-len(prompt) // 4)
    assert [call.tokens for call in second_calls[:chunks]] == [prompt[i:i + 4] for i in range(0, len(prompt), 4)]
    assert [call.start for call in second_calls[:chunks]] == [True] + [False] * (chunks - 1)
    assert not any(call.end for call in second_calls[:chunks])
    assert all(any(call.seq_id == first.seq_id for call in batch) for batch in steps.batches[:6])
    assert second.ids == [20, 21, 22] and first.ids == [5, 6, 7, 8, 9, 10, 11, 12]
    assert second.first_token_ns >= second.first_scheduled_ns
    unchunked_first, unchunked_second, _ = generate(0)
    assert (unchunked_first.ids, unchunked_second.ids) == (first.ids, second.ids)


def test_chunked_prefill_budget_is_shared_first_come_first_served(tokenizer):
    prompt = tokenizer.encode(PROMPT)
    steps = ScriptedSteps({0: [5, 6], 1: [7, 8]})
    seqs = sequences(tokenizer, steps, count=2, max_tokens=2)
    asyncio.run(StepScheduler(steps.step, steps.release, prefill_tokens=len(prompt) + 1).run(seqs, lambda s, c: None))
    first_step = {call.seq_id: call.tokens for call in steps.batches[0]}
    assert first_step == {seqs[0].seq_id: prompt, seqs[1].seq_id: prompt[:1]}
    assert [seq.ids for seq in seqs] == [[5, 6], [7, 8]]
    with pytest.raises(ValueError, match="prefill_tokens must be >= 0"):
        StepScheduler(steps.step, steps.release, prefill_tokens=-1)
