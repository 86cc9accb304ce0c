"""A model's chat template: messages -> prompt text, rendered as transformers' `apply_chat_template` does.

The template is Jinja from the model's tokenizer files (`chat_template.jinja`, or `chat_template` in
`tokenizer_config.json`), rendered in a sandbox with transformers' settings (trim_blocks,
lstrip_blocks, loop controls, its `tojson`, `raise_exception` and `strftime_now`), so the text is
byte for byte what transformers renders (tests/test_chat_template.py checks it).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROLES = ("system", "user", "assistant")
_SENTINEL = "\x00zerocheck-end-of-turn\x00"


class ChatTemplateError(ValueError):
    """The template refused the conversation (its `raise_exception`) or failed to render."""


@dataclass(frozen=True)
class Message:
    role: str  # one of ROLES
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[jinja2.ext.loopcontrols])
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    return environment


class ChatTemplate:
    """A compiled chat template and the special tokens it may refer to (bos_token, eos_token, ...)."""

    def __init__(self, source: str, special_tokens: Mapping[str, str]) -> None:
        self.source = source
        self._template = _environment().from_string(source)
        self._special_tokens = dict(special_tokens)

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        """The prompt text of `messages`, ending with the assistant's turn opening when asked."""
        try:
            return self._template.render(messages=[m.as_dict() for m in messages],
                                         add_generation_prompt=add_generation_prompt, **self._special_tokens)
        except jinja2.exceptions.TemplateError as error:
            raise ChatTemplateError(str(error)) from None

    def end_of_turn_text(self) -> str:
        """What the template writes right after an assistant message's content (e.g. `<|im_end|>\\n`)."""
        messages = [Message("user", "hi"), Message("assistant", _SENTINEL)]
        text = self.render(messages, add_generation_prompt=False)
        return text[text.index(_SENTINEL) + len(_SENTINEL):] if _SENTINEL in text else ""


def read_chat_template(model_dir: Path, tokenizer_config: Mapping[str, Any]) -> str | None:
    """The Jinja source of the model's default chat template, if it has one."""
    path = model_dir / "chat_template.jinja"
    if path.is_file():
        return path.read_text()
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None
