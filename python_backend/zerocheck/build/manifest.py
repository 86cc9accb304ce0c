"""`manifest.json`: what was built, from what, with which options, and the checksum of every file."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = 1


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_checksums(out_dir: Path) -> dict[str, dict]:
    """{relative path: {sha256, bytes}} of every file under `out_dir` except the manifest."""
    return {
        str(path.relative_to(out_dir)): {"sha256": sha256_of(path), "bytes": path.stat().st_size}
        for path in sorted(out_dir.rglob("*"))
        if path.is_file() and path.name != MANIFEST_FILE
    }


def read_manifest(out_dir: Path) -> dict | None:
    path = out_dir / MANIFEST_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def write_manifest(out_dir: Path, manifest: dict) -> None:
    (out_dir / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def is_up_to_date(out_dir: Path, options: dict, source_fingerprint: dict) -> bool:
    """True when the manifest was built with `options` from the same sources and every file is unchanged."""
    manifest = read_manifest(out_dir)
    if manifest is None or manifest.get("format") != MANIFEST_FORMAT:
        return False
    if manifest.get("options") != options or manifest.get("source_fingerprint") != source_fingerprint:
        return False
    return manifest.get("files") == file_checksums(out_dir)
