"""OpenAI requests -> generate requests, and stop strings, without a server."""
from __future__ import annotations

import pytest

from zerocheck.frontend.errors import FrontendError
from zerocheck.frontend.openai_schema import CHAT, TEXT, parse_call
from zerocheck.frontend.stops import StopMatcher

CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_a_chat_request_maps_to_generate_inputs():
    call = parse_call(CHAT, {**CHAT_BODY, "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "seed": -1,
                             "stop": ["\n", "a,b"], "n": 2, "logit_bias": {"5": -100}, "top_k": 3,
                             "min_tokens": 2, "ignore_eos": True, "user": "u1",
                             "stream": True, "stream_options": {"include_usage": True}},
                      {"zerocheck": "off", "x-request-id": "r1"})
    assert (call.kind, call.stream, call.include_usage, call.n) == (CHAT, True, True, 2)
    values = call.generate.values()
    assert values["messages"] == '[{"role": "user", "content": "hi"}]' and "text_input" not in values
    assert values["max_tokens"] == 7 and values["seed"] == 2**64 - 1 and values["num_return_sequences"] == 2
    assert values["stop_words"] == ['"\n"', '"a,b"'] and values["end_id"] == -1 and values["min_tokens"] == 2
    assert values["logit_bias_ids"] == [5] and values["logit_bias_values"] == [-100.0]
    assert {k: values[k] for k in ("temperature", "top_p", "top_k")} == {"temperature": 0.5, "top_p": 0.9, "top_k": 3}
    assert call.generate.parameters("slow_response") == {"zerocheck": "off", "retry_reason": "slow_response",
                                                          "request_id": "r1"}


def test_content_parts_roles_and_prompts():
    call = parse_call(CHAT, {"model": "m", "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}, {})
    assert call.generate.messages == ({"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"})
    assert parse_call(TEXT, {"model": "m", "prompt": ["one"]}, {}).generate.prompt == "one"


@pytest.mark.parametrize("kind, body, param", [
    (CHAT, {"messages": [{"role": "user", "content": "x"}]}, "model"),
    (CHAT, {"model": "m"}, "messages"),
    (CHAT, {**CHAT_BODY, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
    (CHAT, {**CHAT_BODY, "stream_options": {"include_usage": True}}, "stream_options"),
    (CHAT, {**CHAT_BODY, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    (CHAT, {**CHAT_BODY, "logit_bias": {"x": 1}}, "logit_bias"),
    (CHAT, {**CHAT_BODY, "logit_bias": {"3": 101}}, "logit_bias"),
    (CHAT, {**CHAT_BODY, "top_logprobs": 2}, "top_logprobs"),
    (CHAT, {**CHAT_BODY, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    (CHAT, {**CHAT_BODY, "response_format": {"type": "xml"}}, "response_format"),
    (CHAT, {**CHAT_BODY, "frequency_penalty": 3}, "frequency_penalty"),
    (CHAT, {**CHAT_BODY, "n": 1.5}, "n"),
    (CHAT, {**CHAT_BODY, "stream": "yes"}, "stream"),
    (TEXT, {"model": "m", "prompt": [1, 2, 3]}, "prompt"),
    (TEXT, {"model": "m", "prompt": "x", "echo": True}, "echo"),
    (TEXT, {"model": "m", "prompt": "x", "best_of": 3}, "best_of"),
    (TEXT, {"model": "m", "prompt": "x", "suffix": "y"}, "suffix"),
    (TEXT, {"model": "m", "prompt": "x", "logprobs": 6}, "logprobs"),
])
def test_refusals_name_the_field(kind, body, param):
    with pytest.raises(FrontendError) as error:
        parse_call(kind, body, {})
    assert error.value.status == 400 and error.value.param == param


def test_a_bad_zerocheck_header():
    with pytest.raises(FrontendError, match="zerocheck must be 'on' or 'off'"):
        parse_call(CHAT, CHAT_BODY, {"zerocheck": "maybe"})


@pytest.mark.parametrize("pieces, stops, sent, stopped", [
    (["Hello", " wor", "ld. Next"], (".",), "Hello world", True),
    (["a", "b", "c"], ("bc",), "a", True),  # the stop string spans two pieces
    (["ab", "x", "cd"], ("abc",), "abxcd", False),  # a partial match that did not complete is sent
    (["END"], ("END",), "", True),
    (["no stop here"], (), "no stop here", False),
    (["x\n\ny"], ("\n\n", "y"), "x", True),  # the earliest stop string wins
])
def test_stop_strings_are_held_back_and_cut(pieces, stops, sent, stopped):
    matcher = StopMatcher(stops)
    out = "".join(matcher.push(piece) for piece in pieces) + matcher.flush()
    assert out == sent and matcher.stopped is stopped
