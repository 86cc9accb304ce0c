"""`TextTokenizer`: the serving-side view of `tokenizer.json` (ids are Python ints)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from tokenizers import Tokenizer

from zerocheck.tokenizer.training import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN

MODEL_SUBDIR = "hf_model"  # artifacts layout: <artifacts>/hf_model/{tokenizer.json, config.json, ...}


class TextTokenizer:
    """Encode/decode text; knows the BOS/EOS/PAD ids. `decode` skips special tokens by default."""

    def __init__(self, tokenizer: Tokenizer, bos_token: str, eos_token: str, pad_token: str | None) -> None:
        self._tokenizer = tokenizer
        self.vocab_size: int = tokenizer.get_vocab_size()
        self.bos_id: int = self._required_id(bos_token)
        self.eos_id: int = self._required_id(eos_token)
        pad_id = tokenizer.token_to_id(pad_token) if pad_token else None
        self.pad_id: int = self.eos_id if pad_id is None else pad_id

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

    def token_ids_of(self, words: list[str]) -> list[list[int]]:
        """Token id sequence of each word, as bad_words / stop_words lists expect."""
        return [self.encode(word) for word in words]


def _token_text(value: str | dict | None) -> str | None:
    """tokenizer_config.json stores a special token as a string or an AddedToken dict."""
    return value.get("content") if isinstance(value, dict) else value


def load_tokenizer(artifacts_dir: str | Path) -> TextTokenizer:
    """Load `<artifacts_dir>/hf_model/tokenizer.json` (or `<artifacts_dir>/tokenizer.json`)."""
    root = Path(artifacts_dir)
    model_dir = root / MODEL_SUBDIR if (root / MODEL_SUBDIR / "tokenizer.json").is_file() else root
    if not (model_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json in {root} or {root / MODEL_SUBDIR}: run build_engines.py")
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    return TextTokenizer(
        Tokenizer.from_file(str(model_dir / "tokenizer.json")),
        bos_token=_token_text(config.get("bos_token")) or BOS_TOKEN,
        eos_token=_token_text(config.get("eos_token")) or EOS_TOKEN,
        pad_token=_token_text(config.get("pad_token")) or (PAD_TOKEN if "pad_token" not in config else None),
    )
