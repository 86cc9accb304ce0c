"""Anthropic Messages requests -> generate requests, and the sampler path a request asks for (pure functions)."""
from __future__ import annotations

import pytest

from zerocheck.frontend.anthropic_routes import Reply
from zerocheck.frontend.anthropic_schema import (error_body, event, message_body, parse_count_tokens, parse_messages,
                                                 up_to_server_limit, with_prompt)
from zerocheck.clients.response import Chunk
from zerocheck.frontend.errors import FrontendError
from zerocheck.frontend.path import asks_zero_check, betas, served_headers
from zerocheck.frontend.stops import StopMatcher

BETA = {"anthropic-beta": "zero-check-layer-2024-06"}
BODY = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]}


def test_a_request_becomes_a_chat_with_its_system_prompt_and_sampling():
    call = parse_messages({**BODY, "system": [{"type": "text", "text": "Be brief."}], "temperature": 0.5, "top_p": 0.9,
                           "top_k": 40, "stop_sequences": ["\n\n", ""], "stream": True, "metadata": {"user_id": "u"},
                           "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi "},
                                                                      {"type": "text", "text": "there",
                                                                       "cache_control": {"type": "ephemeral"}}]}]},
                          BETA)
    request = call.generate
    assert request.messages == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"})
    assert request.sampling == {"temperature": 0.5, "top_p": 0.9, "top_k": 40}
    assert request.stop == ("\n\n",) and request.max_tokens == 64 and request.zerocheck
    assert call.stream and call.id.startswith("msg_") and call.conversation.prefill is None


def test_the_beta_header_asks_for_the_zero_check_path_and_the_switch_header_decides():
    assert not parse_messages(BODY, {}).generate.zerocheck  # the Anthropic API's default: the checked chain
    assert parse_messages(BODY, {"anthropic-beta": "other-2025-01-01, zero-check-layer-2024-06"}).generate.zerocheck
    assert not parse_messages(BODY, {"anthropic-beta": "other-2025-01-01"}).generate.zerocheck  # unknown: ignored
    assert not parse_messages(BODY, {**BETA, "zerocheck": "off"}).generate.zerocheck
    assert asks_zero_check({}, default=True) and not asks_zero_check({"zerocheck": "off"}, default=True)
    assert betas({"anthropic-beta": " a ,b,, "}) == {"a", "b"}
    with pytest.raises(FrontendError) as error:
        asks_zero_check({"zerocheck": "maybe"}, default=False)
    assert error.value.param == "zerocheck"


def test_served_headers_say_which_path_served_the_answer():
    assert served_headers({"zerocheck_bypass": True, "sampler": "zero_check"}, True) == {
        "X-ZeroCheck-Bypass": "true", "X-Anthropic-ZeroCheck-Bypass": "true", "X-ZeroCheck-Sampler": "zero_check"}
    assert served_headers({"zerocheck_bypass": False, "sampler": "checked"}, True)["X-Anthropic-ZeroCheck-Bypass"] \
        == "false"


def test_a_final_assistant_turn_is_a_prefill():
    call = parse_messages({**BODY, "messages": [{"role": "user", "content": "Capital of France?"},
                                                {"role": "assistant", "content": "The capital is"}]}, {})
    assert call.conversation.prefill == "The capital is"
    assert call.generate.messages == ({"role": "user", "content": "Capital of France?"},)
    sent = with_prompt(call, "<prompt>The capital is").generate
    assert sent.prompt == "<prompt>The capital is" and sent.messages is None and sent.max_tokens == 64


def test_max_tokens_at_the_server_limit_asks_for_as_many_as_the_server_gives():
    call = parse_messages({**BODY, "max_tokens": 1024}, {})
    assert call.generate.max_tokens == 1024 and up_to_server_limit(call).generate.max_tokens is None


@pytest.mark.parametrize("body, param, message", [
    ({"max_tokens": 5, "messages": BODY["messages"]}, "model", "model: Field required"),
    ({"model": "m", "messages": BODY["messages"]}, "max_tokens", "max_tokens: Field required"),
    ({**BODY, "max_tokens": 0}, "max_tokens", "max_tokens must be in [1, "),
    ({**BODY, "messages": []}, "messages", "at least one message"),
    ({**BODY, "messages": [{"role": "system", "content": "x"}]}, "messages", "top-level `system`"),
    ({**BODY, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages",
     "messages.0.content.0.type: only text blocks"),
    ({**BODY, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y "}]}, "messages",
     "trailing whitespace"),
    ({**BODY, "temperature": 1.5}, "temperature", "temperature must be in [0, 1]"),
    ({**BODY, "top_k": 2.5}, "top_k", "top_k must be an integer"),
    ({**BODY, "stop_sequences": "x"}, "stop_sequences", "must be a list of strings"),
    ({**BODY, "tools": [{"name": "f"}]}, "tools", "tool use is not supported"),
    ({**BODY, "thinking": {"type": "enabled"}}, "thinking", "extended thinking is not supported"),
    ({**BODY, "colour": "red"}, "colour", "colour: Extra inputs are not permitted"),
    ({**BODY, "stream": "yes"}, "stream", "stream must be true or false"),
])
def test_bad_requests_name_the_field(body, param, message):
    with pytest.raises(FrontendError) as error:
        parse_messages(body, {})
    assert error.value.status == 400 and error.value.param == param and message in error.value.message
    assert error_body(error.value) == {"type": "error", "error": {"type": "invalid_request_error",
                                                                 "message": error.value.message}}


def test_count_tokens_takes_the_conversation_only():
    model, turns = parse_count_tokens({"model": "m", "system": "s", "messages": [{"role": "user", "content": "x"}]})
    assert model == "m" and turns.messages == ({"role": "system", "content": "s"}, {"role": "user", "content": "x"})
    with pytest.raises(FrontendError, match="max_tokens: Extra inputs"):
        parse_count_tokens(BODY)


def test_errors_take_anthropic_types_by_status():
    kinds = {status: error_body(FrontendError(status, "m"))["error"]["type"] for status in (401, 404, 413, 429, 500, 504)}
    assert kinds == {401: "authentication_error", 404: "not_found_error", 413: "request_too_large",
                     429: "rate_limit_error", 500: "api_error", 504: "timeout_error"}


def test_a_reply_ends_at_a_stop_sequence_or_the_server_reason():
    def chunk(text: str, done: str | None = None, tokens: int = 1) -> Chunk:
        return Chunk(text, [0] * tokens, {"finish_reason": done} if done else {})

    reply = Reply(StopMatcher(("END",)))
    assert reply.take(chunk("Hello E")) == "Hello " and reply.take(chunk("ND and more")) == ""
    assert (reply.stop_reason, reply.stop_sequence, "".join(reply.text)) == ("stop_sequence", "END", "Hello ")
    for reason, expected in (("eos", "end_turn"), ("length", "max_tokens")):
        reply = Reply(StopMatcher(()))
        reply.take(chunk("x", reason))
        assert reply.stop_reason == expected and reply.stop_sequence is None and reply.output_tokens == 1


def test_message_body_and_events_have_anthropic_shapes():
    call = parse_messages(BODY, {})
    body = message_body(call, "Hi!", "end_turn", None, 12, 3)
    assert body == {"id": call.id, "type": "message", "role": "assistant", "model": "m",
                    "content": [{"type": "text", "text": "Hi!"}], "stop_reason": "end_turn", "stop_sequence": None,
                    "usage": {"input_tokens": 12, "output_tokens": 3}}
    assert message_body(call, "", None, None, 12, 0)["content"] == []
    assert event("ping", {"type": "ping"}) == b'event: ping\ndata: {"type":"ping"}\n\n'


@pytest.mark.parametrize("raw, message", [
    (b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests too deeply"),
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "not valid Unicode"),
    (b'{"model": ', "not valid JSON"),
])
def test_hostile_bodies_are_400_naming_the_problem(raw, message):
    from zerocheck.frontend.fields import json_body

    with pytest.raises(FrontendError) as error:
        json_body(raw)
    assert error.value.status == 400 and message in error.value.message
