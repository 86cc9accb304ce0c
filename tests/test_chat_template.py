"""Chat templates: zerocheck renders a conversation byte for byte as transformers' `apply_chat_template`
does (the served model's ChatML template and templates in other families' styles), finds the
end-of-turn token, and refuses what a template refuses."""
from __future__ import annotations

import pytest

import conftest
from zerocheck.tokenizer import load_tokenizer
from zerocheck.tokenizer.chat import ChatTemplate, ChatTemplateError, Message

CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"}],
    [{"role": "user", "content": "  {{ not jinja }} {% raw %} \"quotes\" 'apostrophes' \\ back\nslash  "}],
    [{"role": "user", "content": "héllo wörld ✓ 你好 🙂"}],
    [{"role": "user", "content": ""}],
]
LLAMA3_STYLE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('bad role') }}{% endif %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
GEMMA_STYLE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)
NAMESPACE_STYLE = (
    "{% set ns = namespace(system='') %}{% for message in messages %}"
    "{% if message.role == 'system' %}{% set ns.system = message.content %}{% continue %}{% endif %}"
    "{{ message.role | upper }}: {{ message.content | tojson }}\n"
    "{% if loop.index > 20 %}{% break %}{% endif %}{% endfor %}"
    "{% if ns.system %}[system: {{ ns.system }}]\n{% endif %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizers():
    from transformers import AutoTokenizer

    model_dir = conftest.real_artifacts_dir() / "hf_model"
    return load_tokenizer(model_dir.parent), AutoTokenizer.from_pretrained(model_dir)


def messages_of(conversation):
    return [Message(m["role"], m["content"]) for m in conversation]


@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=range(len(CONVERSATIONS)))
def test_served_template_renders_as_transformers(tokenizers, conversation):
    ours, theirs = tokenizers
    expected = theirs.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    rendered = ours.apply_chat_template(messages_of(conversation))
    assert rendered.encode() == expected.encode()
    assert ours.encode(rendered) == theirs.apply_chat_template(conversation, add_generation_prompt=True)["input_ids"]


@pytest.mark.parametrize("template", [LLAMA3_STYLE, GEMMA_STYLE, NAMESPACE_STYLE], ids=["llama3", "gemma", "namespace"])
def test_other_template_styles_render_as_transformers(tokenizers, template):
    _, theirs = tokenizers
    specials = {"bos_token": "<BOS>", "eos_token": "<EOS>"}
    ours = ChatTemplate(template, specials)
    for conversation in CONVERSATIONS:
        try:
            expected = theirs.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True,
                                                  chat_template=template, **specials)
        except Exception as error:  # the template refuses this conversation: so must ours, with its message
            with pytest.raises(ChatTemplateError, match=str(error).split(":")[-1].strip()[:30]):
                ours.render(messages_of(conversation))
            continue
        assert ours.render(messages_of(conversation)).encode() == expected.encode()


def test_end_of_turn_and_end_ids(tokenizers):
    ours, _ = tokenizers
    assert ours.chat_template.end_of_turn_text() == "<|im_end|>\n"
    im_end = ours.encode("<|im_end|>")
    assert im_end == [2] and ours.end_ids == (2,)  # SmolLM2: EOS is the end-of-turn token
    llama = ChatTemplate(LLAMA3_STYLE, {"bos_token": "<BOS>"})
    assert llama.end_of_turn_text() == "<|eot_id|>"
    gemma = ChatTemplate(GEMMA_STYLE, {"bos_token": "<BOS>"})
    assert gemma.end_of_turn_text() == "<end_of_turn>\n"


def test_a_template_error_is_a_chat_template_error():
    template = ChatTemplate(GEMMA_STYLE, {"bos_token": ""})
    with pytest.raises(ChatTemplateError, match="System role not supported"):
        template.render([Message("system", "x"), Message("user", "y")])
    with pytest.raises(ChatTemplateError, match="alternate"):
        template.render([Message("user", "x"), Message("user", "y")])


def test_the_template_runs_in_a_sandbox():
    escape = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}", {})
    with pytest.raises(ChatTemplateError):
        escape.render([Message("user", "x")])
