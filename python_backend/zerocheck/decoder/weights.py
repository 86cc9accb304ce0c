"""Load Hugging Face Llama / Mistral / Qwen2 safetensors into `Transformer` by parameter name."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from zerocheck.decoder.config import DecoderConfig
from zerocheck.decoder.model import Transformer

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def read_hf_state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of `model_dir/*.safetensors` (sharded or not), names without the `model.` prefix."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {model_dir}")
    state: dict[str, torch.Tensor] = {}
    for path in files:
        for name, tensor in load_file(str(path)).items():
            if not name.endswith(IGNORED_SUFFIXES):
                state[name.removeprefix("model.")] = tensor
    return state


def load_transformer(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> Transformer:
    """Build `Transformer` from `config.json` and fill it from safetensors, in `dtype` (float32 or
    bfloat16), in eval mode."""
    config = DecoderConfig.from_pretrained(model_dir)
    model = Transformer(config)
    state = read_hf_state_dict(Path(model_dir))
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = {name for name, _ in model.named_parameters()}
    missing, unexpected = expected - state.keys(), state.keys() - expected
    if missing or unexpected:
        raise ValueError(f"checkpoint {model_dir} does not match {config.model_type}: "
                         f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(state[name].to(torch.float32))
    return model.to(dtype).eval()
