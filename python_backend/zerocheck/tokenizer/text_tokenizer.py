"""`TextTokenizer`: the serving-side view of a model's tokenizer files (ids are Python ints): encode,
decode, the chat template, and the ids that end a generation."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from tokenizers import Tokenizer

from zerocheck.tokenizer.chat import ChatTemplate, Message, read_chat_template
from zerocheck.tokenizer.training import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN

MODEL_SUBDIR = "hf_model"  # artifacts layout: <artifacts>/hf_model/{tokenizer.json, config.json, ...}


class TextTokenizer:
    """Encode/decode text; knows the BOS/EOS/PAD ids. `decode` skips special tokens by default.

    `end_ids` are the ids that end a generation unless a request names its own `end_id`: EOS, the
    model's generation_config `eos_token_id`s, and the chat template's end-of-turn token.
    """

    def __init__(self, tokenizer: Tokenizer, bos_token: str, eos_token: str, pad_token: str | None,
                 chat_template: str | None = None, generation_eos_ids: Sequence[int] = (),
                 special_tokens: dict[str, str] | None = None) -> None:
        self._tokenizer = tokenizer
        self.vocab_size: int = tokenizer.get_vocab_size()
        self.bos_id: int = self._required_id(bos_token)
        self.eos_id: int = self._required_id(eos_token)
        pad_id = tokenizer.token_to_id(pad_token) if pad_token else None
        self.pad_id: int = self.eos_id if pad_id is None else pad_id
        tokens = {"bos_token": bos_token, "eos_token": eos_token, **(special_tokens or {})}
        self.chat_template = ChatTemplate(chat_template, tokens) if chat_template else None
        end_of_turn = self._end_of_turn_id()
        self.end_ids: tuple[int, ...] = tuple(dict.fromkeys(
            [self.eos_id, *generation_eos_ids, *([end_of_turn] if end_of_turn is not None else [])]))

    def _end_of_turn_id(self) -> int | None:
        """The special token the chat template closes an assistant turn with (`<|im_end|>` in ChatML)."""
        if self.chat_template is None:
            return None
        ids = self._tokenizer.encode(self.chat_template.end_of_turn_text(), add_special_tokens=False).ids
        special = {token_id for token_id, token in self._tokenizer.get_added_tokens_decoder().items() if token.special}
        return ids[0] if ids and ids[0] in special else None

    def apply_chat_template(self, messages: Sequence[Message]) -> str:
        """The prompt text of a conversation, ending with the assistant's turn opening (ValueError
        when the model has no chat template; ChatTemplateError when the template refuses it)."""
        if self.chat_template is None:
            raise ValueError("this model has no chat template")
        return self.chat_template.render(messages, add_generation_prompt=True)

    def _required_id(self, token: str) -> int:
        token_id = self._tokenizer.token_to_id(token)
        if token_id is None:
            raise ValueError(f"special token {token!r} is not in the vocabulary")
        return token_id

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Token ids of `text`, without special tokens unless `add_bos`."""
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; incomplete UTF-8 byte sequences become U+FFFD."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def json(self) -> str:
        """The tokenizer as tokenizer.json text (what llguidance reads)."""
        return self._tokenizer.to_str()

    def token_ids_of(self, words: list[str]) -> list[list[int]]:
        """Token id sequence of each word, as bad_words / stop_words lists expect."""
        return [self.encode(word) for word in words]


def _token_text(value: str | dict | None) -> str | None:
    """tokenizer_config.json stores a special token as a string or an AddedToken dict."""
    return value.get("content") if isinstance(value, dict) else value


def load_tokenizer(artifacts_dir: str | Path) -> TextTokenizer:
    """Load `<artifacts_dir>/hf_model/tokenizer.json` (or `<artifacts_dir>/tokenizer.json`) with its
    tokenizer_config.json, chat template and generation_config.json."""
    root = Path(artifacts_dir)
    model_dir = root / MODEL_SUBDIR if (root / MODEL_SUBDIR / "tokenizer.json").is_file() else root
    if not (model_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json in {root} or {root / MODEL_SUBDIR}: run `zerocheck build`")
    config = _read_json(model_dir / "tokenizer_config.json")
    eos = _read_json(model_dir / "generation_config.json").get("eos_token_id")
    specials = {name: text for name in ("unk_token", "pad_token")
                if (text := _token_text(config.get(name))) is not None}
    return TextTokenizer(
        Tokenizer.from_file(str(model_dir / "tokenizer.json")),
        bos_token=_token_text(config.get("bos_token")) or BOS_TOKEN,
        eos_token=_token_text(config.get("eos_token")) or EOS_TOKEN,
        pad_token=_token_text(config.get("pad_token")) or (PAD_TOKEN if "pad_token" not in config else None),
        chat_template=read_chat_template(model_dir, config),
        generation_eos_ids=[eos] if isinstance(eos, int) else list(eos or []),
        special_tokens=specials,
    )


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}
