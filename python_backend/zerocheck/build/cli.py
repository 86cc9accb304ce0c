"""`zerocheck build` / `build_engines.py`: command-line flags for `build_artifacts`."""
from __future__ import annotations

import argparse
from pathlib import Path

from zerocheck.build.options import BuildOptions
from zerocheck.build.pipeline import build_artifacts
from zerocheck.build.tensorrt_engines import BuildError

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_OUT = REPO_ROOT / "artifacts"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = BuildOptions()
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"artifact directory (default {DEFAULT_OUT})")
    parser.add_argument("--vocab-size", type=int, default=defaults.vocab_size, help="vocabulary size (default %(default)s)")
    parser.add_argument("--layers", type=int, default=defaults.layers, help="decoder layers (default %(default)s)")
    parser.add_argument("--hidden", type=int, default=defaults.hidden, help="hidden size (default %(default)s)")
    parser.add_argument("--heads", type=int, default=defaults.heads, help="attention heads (default %(default)s)")
    parser.add_argument("--kv-heads", type=int, default=defaults.kv_heads, help="key/value heads (default %(default)s)")
    parser.add_argument("--intermediate", type=int, default=None, help="SwiGLU width (default 8/3 hidden, multiple of 64)")
    parser.add_argument("--max-seq-len", type=int, default=defaults.max_seq_len, help="positions per sequence (default %(default)s)")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="weight init seed (default %(default)s)")
    parser.add_argument("--corpus-files", type=int, default=None, help="train the tokenizer on the first N stdlib files (default all)")
    parser.add_argument("--hf-checkpoint", type=Path, default=None, help="Hugging Face Llama/Qwen2/Mistral directory to serve instead")
    parser.add_argument("--onnx", action=argparse.BooleanOptionalAction, default=True, help="export + verify decoder.onnx (default on)")
    parser.add_argument("--tensorrt", action="store_true", help="also build a TensorRT engine (GPU only)")
    parser.add_argument("--tensorrt-llm", action="store_true", help="also build a TensorRT-LLM engine (GPU only)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the artifacts are up to date")


def run(args: argparse.Namespace) -> int:
    try:
        options = BuildOptions(
            vocab_size=args.vocab_size,
            layers=args.layers,
            hidden=args.hidden,
            heads=args.heads,
            kv_heads=args.kv_heads,
            intermediate=args.intermediate,
            max_seq_len=args.max_seq_len,
            seed=args.seed,
            hf_checkpoint=str(args.hf_checkpoint) if args.hf_checkpoint else None,
            onnx=args.onnx,
            tensorrt=args.tensorrt,
            tensorrt_llm=args.tensorrt_llm,
            tokenizer_corpus_files=args.corpus_files,
        )
        build_artifacts(options, args.out, force=args.force)
    except (BuildError, ValueError, FileNotFoundError) as error:
        print(f"build failed: {error}")
        return 1
    return 0
