"""Structured output and tool calling of the OpenAI API: request -> guide, the tools prompt and grammar, and
calls read back from answers (pure functions, the grammars compiled with llguidance against the test
tokenizer); then, against `zerocheck serve` over the real model (`real_server`), the openai SDK's
`parse`, tool calls (whole and streamed) and refusals."""
from __future__ import annotations

import json
import random

import jsonschema
import llguidance
import openai
import pydantic
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

import conftest
from zerocheck.frontend.errors import FrontendError
from zerocheck.frontend.openai_schema import (CHAT, TEXT, Choice, chunk_body, completion_body, new_choices,
                                              parse_call)
from zerocheck.frontend.tools import (TOOLS_INSTRUCTION, TOOLS_PREAMBLE, ToolCallStream, parse_tool_calls,
                                      parse_tools, rendered_call, tools_grammar)
from zerocheck.grammar import GrammarCompiler, parse_guide
from zerocheck.grammar import guide as guide_grammar

MODEL = "smollm2-135m-instruct"
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
        "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": CITY}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
    "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
BODY = {"model": "m", "messages": ASK}


def chat(**fields):
    return parse_call(CHAT, {**BODY, **fields}, {})


def refusal(kind: str, body: dict) -> FrontendError:
    with pytest.raises(FrontendError) as error:
        parse_call(kind, body, {})
    assert error.value.status == 400
    return error.value


# -- request -> guide ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fields, guide_type, guide, param", [
    ({"response_format": {"type": "text"}}, None, None, None),
    ({"response_format": {"type": "json_object"}}, "json", None, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY}}}, "json_schema",
     json.dumps(CITY), "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY, "strict": False}}},
     "json_schema", json.dumps(CITY), "response_format"),
    ({"structured_outputs": {"json": CITY}}, "json_schema", json.dumps(CITY), "structured_outputs"),
    ({"structured_outputs": {"json": json.dumps(CITY)}}, "json_schema", json.dumps(CITY), "structured_outputs"),
    ({"structured_outputs": {"regex": "[0-9]+"}}, "regex", "[0-9]+", "structured_outputs"),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, "choice", '["yes", "no"]', "structured_outputs"),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, "ebnf_grammar", 'root ::= "a"', "structured_outputs"),
    ({"structured_outputs": {"json_object": True}}, "json", None, "structured_outputs"),
    ({"guided_json": CITY}, "json_schema", json.dumps(CITY), "guided_json"),
    ({"guided_regex": "a|b"}, "regex", "a|b", "guided_regex"),
    ({"guided_choice": ["x"]}, "choice", '["x"]', "guided_choice"),
    ({"guided_grammar": 'root ::= "a"'}, "ebnf_grammar", 'root ::= "a"', "guided_grammar"),
])
def test_structured_output_fields_become_the_guide(fields, guide_type, guide, param):
    call = chat(**fields)
    assert (call.generate.guide_type, call.generate.guide, call.guide_param) == (guide_type, guide, param)
    values = call.generate.values()
    assert values.get("guided_decoding_guide_type") == guide_type and values.get("guided_decoding_guide") == guide
    if param:  # the server's refusal of the guide names the field that asked for it
        assert call.param_of["guided_decoding_guide"] == call.param_of["guided_decoding_guide_type"] == param


def test_text_completions_take_vllm_structured_outputs():
    call = parse_call(TEXT, {"model": "m", "prompt": "x", "structured_outputs": {"choice": ["a", "b"]}}, {})
    assert (call.generate.guide_type, call.generate.guide) == ("choice", '["a", "b"]')
    assert parse_call(TEXT, {"model": "m", "prompt": "x", "guided_regex": "[a-z]"}, {}).generate.guide == "[a-z]"


@pytest.mark.parametrize("kind, fields, param, message", [
    (CHAT, {"response_format": {"type": "xml"}}, "response_format", "response_format must be"),
    (CHAT, {"response_format": {"type": "json_schema"}}, "response_format", "json_schema is required"),
    (CHAT, {"response_format": {"type": "json_schema", "json_schema": {"schema": CITY}}}, "response_format",
     "name is required"),
    (CHAT, {"response_format": {"type": "json_schema", "json_schema": {"name": "c"}}}, "response_format",
     "schema is required"),
    (CHAT, {"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "exactly one of"),
    (CHAT, {"structured_outputs": {"backend": "xgrammar"}}, "structured_outputs", "exactly one of"),
    (CHAT, {"structured_outputs": {"json": "{not json"}}, "structured_outputs", "must be a JSON schema"),
    (CHAT, {"structured_outputs": {"choice": []}}, "structured_outputs", "non-empty list"),
    (CHAT, {"guided_regex": 3}, "guided_regex", "non-empty string"),
    (CHAT, {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "structured_outputs",
     "both constrain the answer"),
    (CHAT, {"structured_outputs": {"regex": "a"}, "guided_json": CITY}, "guided_json", "both constrain"),
    (CHAT, {"response_format": {"type": "json_object"}, "tools": [WEATHER], "tool_choice": "required"},
     "response_format", "tools with tool_choice 'required' both constrain"),
    (CHAT, {"response_format": {"type": "json_object"}, "tools": [WEATHER]}, "response_format", "tool_choice 'auto'"),
    (CHAT, {"response_format": {"type": "json_object"}, "min_tokens": 3}, "min_tokens", "a finished grammar"),
    (CHAT, {"tools": [WEATHER], "tool_choice": "required", "ignore_eos": True}, "ignore_eos", "a finished grammar"),
    (CHAT, {"tools": [{"type": "function"}]}, "tools", "tools[0] must be"),
    (CHAT, {"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools", "tools[0].function.name"),
    (CHAT, {"tools": [WEATHER, WEATHER]}, "tools", "unique"),
    (CHAT, {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]}, "tools",
     "schema of an object"),
    (CHAT, {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"not": {"type": "string"}}}}}}]}, "tools", "not supported"),
    (CHAT, {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "not in tools"),
    (CHAT, {"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "tool_choice must be"),
    (CHAT, {"tool_choice": "required"}, "tool_choice", "needs tools"),
    (CHAT, {"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
    (CHAT, {"functions": [{"name": "f"}]}, "functions", "not supported"),
    (TEXT, {"tools": [WEATHER]}, "tools", "/v1/chat/completions"),
])
def test_refusals_name_the_field(kind, fields, param, message):
    body = {**BODY, **fields} if kind == CHAT else {"model": "m", "prompt": "x", **fields}
    error = refusal(kind, body)
    assert error.param == param and message in error.message, error.message


# -- tools: the prompt -----------------------------------------------------------------------------------


def test_tools_go_into_the_system_message_as_qwen_renders_them():
    section = "\n".join([TOOLS_PREAMBLE, json.dumps(WEATHER), json.dumps({"type": "function", "function": {
        "name": "get_time", "parameters": TIME["function"]["parameters"]}}), TOOLS_INSTRUCTION])
    assert section.startswith("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n")
    assert section.endswith('<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
    created = chat(tools=[WEATHER, TIME]).generate.messages
    assert created == ({"role": "system", "content": section}, *ASK)
    appended = chat(tools=[WEATHER, TIME], messages=[{"role": "system", "content": "Be brief."}, *ASK])
    assert appended.generate.messages[0] == {"role": "system", "content": "Be brief.\n\n" + section}
    assert chat(tools=[WEATHER], tool_choice="none").generate.messages[0]["role"] == "system"  # rendered, free


def test_a_history_of_calls_and_results_becomes_plain_messages():
    arguments = '{"city":"Paris"}'
    history = [*ASK,
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}},
                   {"id": "call_2", "type": "function", "function": {"name": "get_time",
                                                                     "arguments": '{"zone":"cet"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
               {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "12:00"}]},
               {"role": "assistant", "content": "Sunny.", "tool_calls": [
                   {"id": "call_3", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
               {"role": "tool", "tool_call_id": "call_3", "content": "rain"}]
    messages = chat(messages=history).generate.messages
    assert messages[1:] == (
        {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n'
                                         '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": '
                                         '{"zone":"cet"}}\n</tool_call>'},
        {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>\n<tool_response>\n12:00\n"
                                    "</tool_response>"},
        {"role": "assistant", "content": "Sunny.\n" + rendered_call("get_weather", arguments)},
        {"role": "user", "content": "<tool_response>\nrain\n</tool_response>"})


@pytest.mark.parametrize("message", [
    {"role": "tool", "content": "x"},
    {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "f"}}]},
    {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]},
    {"role": "user", "content": "x", "tool_calls": []},
])
def test_malformed_history_is_refused(message):
    assert refusal(CHAT, {**BODY, "messages": [*ASK, message]}).param == "messages"


# -- tools: the grammar ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    """Guides compiled against the test artifacts' tokenizer (a byte-level BPE)."""
    model = conftest.test_artifacts_dir() / "hf_model"
    config = json.loads((model / "config.json").read_text())
    return GrammarCompiler((model / "tokenizer.json").read_text(), (config["eos_token_id"],), config["vocab_size"])


def accepts(compiler: GrammarCompiler, grammar: str, text: str) -> bool:
    """Whether `text` is a complete answer of the Lark `grammar`."""
    lark = guide_grammar.grammar_of(parse_guide("lark", grammar))
    matcher = llguidance.LLMatcher(compiler.tokenizer, lark, log_level=0)
    return all(matcher.consume_token(t) for t in compiler.tokenizer.tokenize_str(text)) and matcher.is_accepting()


def grammar_of(**fields) -> str:
    return tools_grammar(parse_tools({"tools": [WEATHER, TIME], **fields}))


CALL = rendered_call("get_weather", '{"city":"Paris"}')
TWO_CALLS = CALL + "\n" + rendered_call("get_time", '{"zone":"utc"}')


@pytest.mark.parametrize("fields, good, bad", [
    ({"tool_choice": "required"}, [CALL, TWO_CALLS],
     ["Hello", "", rendered_call("get_weather", '{"city": "Paris"}'), rendered_call("get_weather", '{"town":"x"}'),
      rendered_call("get_weather", '{"city":"Amsterdam"}'), rendered_call("get_time", '{"zone":"pst"}'),
      rendered_call("nope", "{}"), CALL + "\n"]),
    ({"tool_choice": "required", "parallel_tool_calls": False}, [CALL], [TWO_CALLS]),
    ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     [rendered_call("get_time", '{"zone":"cet"}')], [CALL, "Hello"]),
    ({}, ["Hello", "", "<tool", "a <tool_call>\n", "é\n\nx", CALL, TWO_CALLS],
     ["<tool_call>", "<tool_call>\nHello", rendered_call("get_weather", "{}")]),
])
def test_tool_choice_grammars_compile_and_admit_exactly_the_calls(compiler, fields, good, bad):
    grammar = grammar_of(**fields)
    compiler.check(parse_guide("lark", grammar))  # GuideError when llguidance cannot compile it
    for text in good:
        assert accepts(compiler, grammar, text), text
    for text in bad:
        assert not accepts(compiler, grammar, text), text


def test_the_grammars_shapes():
    assert grammar_of(tool_choice="none") is None
    auto = grammar_of().splitlines()
    assert auto[:3] == ["start: TEXT | calls", 'calls: call ("\\n" call)*', "call: call_0 | call_1"]
    assert auto[3] == 'call_0: "<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": " args_0 ' \
                      '"}\\n</tool_call>"'
    assert auto[4].startswith('args_0: %json {"type": "object", "properties": {"city"')
    assert auto[-1] == "TEXT: /(?s:.*)/ & ~/<tool_call>(?s:.*)/"
    named = grammar_of(tool_choice={"type": "function", "function": {"name": "get_time"}}, parallel_tool_calls=False)
    assert named.splitlines()[:3] == ["start: calls", "calls: call", "call: call_1"]
    call = chat(tools=[WEATHER], tool_choice="required")
    assert (call.generate.guide_type, call.guide_param, call.tools.choice) == ("lark", "tools", "required")
    assert call.param_of["guided_decoding_guide"] == "tools"
    assert chat(tools=[WEATHER], tool_choice="none").generate.guide_type is None


def test_default_parameters_are_an_empty_object():
    tools = parse_tools({"tools": [{"type": "function", "function": {"name": "now"}}], "tool_choice": "required"})
    assert tools.functions[0].parameters == {"type": "object", "properties": {}}
    assert '"properties": {}' in tools_grammar(tools)


# -- answers -> calls ------------------------------------------------------------------------------------


def test_calls_are_read_by_the_grammars_delimiters():
    calls = parse_tool_calls(TWO_CALLS)
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city":"Paris"}'),
                                                      ("get_time", '{"zone":"utc"}')]
    assert calls[0].id.startswith("call_") and calls[0].id != calls[1].id
    assert calls[0].body()["function"] == {"name": "get_weather", "arguments": '{"city":"Paris"}'}
    assert parse_tool_calls(rendered_call("f", '{"a":"x\\n</tool_call>\\n"}'))[0].arguments == \
        '{"a":"x\\n</tool_call>\\n"}'  # an escaped delimiter inside a string is part of the arguments
    for text in ["Hello", "", CALL[:-3], CALL + "\n", "<tool_call>\nnot json\n</tool_call>"]:
        assert parse_tool_calls(text) is None


@pytest.mark.parametrize("text", [CALL, TWO_CALLS, rendered_call("f", '{"s":"}\\n<\\/tool_call>","n":[{}]}'),
                                  "Plain text, no calls.", "<tool", ""])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_streamed_answer_assembles_to_the_whole_one(text, seed):
    """Pieces of any size through ToolCallStream, accumulated by the openai SDK, equal the whole answer."""
    rng = random.Random(seed)
    call = chat(tools=[WEATHER, TIME])  # tool_choice auto: the stream decides between content and calls
    whole, = new_choices(call)
    whole.add_text(text, final=True)
    whole.finish_reason = "eos"
    expected = completion_body(call, "fp", [whole], 3, str)["choices"][0]
    streamed, = new_choices(call)
    state = ChatCompletionStreamState()

    def send(body: dict) -> None:
        state.handle_chunk(ChatCompletionChunk.model_validate(body))

    send(chunk_body(call, "fp", 0, role=True))
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, 6))) if len(text) > 1 else []
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])] or [""]
    for i, piece in enumerate(pieces):
        if i == len(pieces) - 1:
            streamed.finish_reason = "eos"
        content, deltas = streamed.deltas(streamed.add_text(piece, final=streamed.done))
        send(chunk_body(call, "fp", 0, text=content, tool_calls=deltas))
    send(chunk_body(call, "fp", 0, finish_reason=streamed.streamed_finish_reason))
    got = state.get_final_completion().choices[0]
    assert got.finish_reason == expected["finish_reason"]
    assert (got.message.content or None) == (expected["message"]["content"] or None)
    assert [(c.function.name, c.function.arguments) for c in got.message.tool_calls or []] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in expected["message"].get("tool_calls", [])]


def test_a_required_stream_sends_the_name_first_then_argument_fragments():
    stream = ToolCallStream(detect=False)
    pushes = []
    for piece in ['<tool_call>\n{"name": "get_', 'weather", "argu', 'ments": ', '{"city', '":"Pa', 'ris"}}\n</tool',
                  '_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone":"utc"}}\n</tool_call>']:
        content, deltas = stream.push(piece)
        assert content == ""
        pushes.append(deltas)
    assert pushes[:2] == [[], []] and pushes[2] == [{"index": 0, "id": stream.calls[0].id, "type": "function",
                                                     "function": {"name": "get_weather", "arguments": ""}}]
    assert pushes[5] == [{"index": 0, "function": {"arguments": 'ris"}'}}]  # "}" held until known
    assert [d["index"] for d in pushes[6]] == [1]  # one delta per call and push: name and arguments together
    assert pushes[6][0]["function"] == {"name": "get_time", "arguments": '{"zone":"utc"}'}
    assert "".join(d["function"]["arguments"] for push in pushes for d in push if d["index"] == 0) == \
        '{"city":"Paris"}'


def test_a_reply_cut_inside_a_call_is_content_with_finish_reason_length():
    call = chat(tools=[WEATHER], tool_choice="required")
    choice = Choice(0, new_choices(call)[0].stop)
    choice.add_text(CALL[:30], final=True)
    choice.finish_reason = "length"
    body = completion_body(call, "fp", [choice], 1, str)["choices"][0]
    assert body["message"] == {"role": "assistant", "content": CALL[:30]} and body["finish_reason"] == "length"
    choice.text, choice.finish_reason = [CALL], "eos"
    body = completion_body(call, "fp", [choice], 1, str)["choices"][0]
    assert body["finish_reason"] == "tool_calls" and body["message"]["content"] is None
    assert body["message"]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city":"Paris"}'}


# -- the real server -------------------------------------------------------------------------------------


class City(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=8)


@pytest.fixture(scope="module")
def client(real_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=real_server.openai_url, api_key="unused", max_retries=0, timeout=120)


def test_parse_returns_the_pydantic_object(client):
    completion = client.chat.completions.parse(model=MODEL, messages=ASK, response_format=City, max_tokens=48,
                                               temperature=0)
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(choice.message.parsed, City) and len(choice.message.parsed.city) <= 8
    anything = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=64, temperature=0,
                                              response_format={"type": "json_object"})
    if anything.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(anything.choices[0].message.content), dict)


def test_vllm_structured_outputs_on_both_endpoints(client):
    answer = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, temperature=0,
                                            extra_body={"structured_outputs": {"choice": ["sunny", "rainy"]}})
    assert answer.choices[0].message.content in ("sunny", "rainy") and answer.choices[0].finish_reason == "stop"
    number = client.completions.create(model=MODEL, prompt="Two plus two is", max_tokens=8, temperature=0,
                                       extra_body={"guided_regex": "[0-9]{1,3}"})
    assert number.choices[0].text.isdigit() and number.choices[0].finish_reason == "stop"


def tool_request(**fields) -> dict:
    return dict(model=MODEL, messages=ASK, tools=[WEATHER, TIME], max_tokens=64, temperature=0, **fields)


def valid_call(call, tools=(WEATHER, TIME)) -> None:
    parameters = {t["function"]["name"]: t["function"]["parameters"] for t in tools}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), parameters)
    assert call.type == "function" and call.id.startswith("call_")


def test_required_and_named_tool_calls(client):
    required = client.chat.completions.create(**tool_request(tool_choice="required", parallel_tool_calls=False))
    choice = required.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert len(choice.message.tool_calls) == 1
    valid_call(choice.message.tool_calls[0])
    named = client.chat.completions.create(**tool_request(
        tool_choice={"type": "function", "function": {"name": "get_time"}}))
    if named.choices[0].finish_reason == "tool_calls":  # parallel calls may run past max_tokens
        assert {c.function.name for c in named.choices[0].message.tool_calls} == {"get_time"}
        for call in named.choices[0].message.tool_calls:
            valid_call(call)


def test_a_streamed_tool_call_equals_the_whole_one(client):
    request = tool_request(tool_choice="required", parallel_tool_calls=False)
    whole = client.chat.completions.create(**request).choices[0].message.tool_calls[0]
    with client.chat.completions.stream(**request) as stream:
        chunks = list(stream)
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls"
    streamed = final.message.tool_calls[0]
    assert streamed.function.name == whole.function.name and streamed.function.arguments == whole.function.arguments
    valid_call(streamed)
    deltas = [c.chunk.choices[0].delta.tool_calls for c in chunks if c.type == "chunk" and c.chunk.choices
              and c.chunk.choices[0].delta.tool_calls]
    assert deltas[0][0].id == streamed.id and deltas[0][0].function.name == whole.function.name


def test_a_history_with_calls_and_results_is_answered(client):
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    answer = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], max_tokens=48,
                                            temperature=0)
    choice = answer.choices[0]
    assert choice.finish_reason in ("stop", "tool_calls", "length")
    if choice.finish_reason == "tool_calls":
        for call in choice.message.tool_calls:
            valid_call(call, (WEATHER,))
    else:
        assert choice.message.content is not None and not choice.message.tool_calls


@pytest.mark.parametrize("fields, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "c"}}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": {
        "type": "object", "properties": {"a": {"not": {}}}}}}}, "response_format"),  # refused by the server
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ({"structured_outputs": {"regex": "("}}, "structured_outputs"),  # refused by the server
])
def test_bad_structured_requests_are_400_naming_the_field(client, fields, param):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, extra_body=fields)
    assert error.value.param == param and error.value.code == "INVALID_ARGUMENT", error.value.message
