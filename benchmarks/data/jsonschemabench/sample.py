"""Draws this folder's sample of JSONSchemaBench from a git directory of github.com/guidance-ai/jsonschemabench.

    python benchmarks/data/jsonschemabench/sample.py GIT_DIR [--commit HEAD]

schemas.jsonl: per split in SPLITS, SCHEMAS_PER_SPLIT schemas of `data/<split>/`, drawn with
random.Random(SEED).sample from the split's file names sorted; one line per schema:
{"split", "name", "schema"} (the schema as the file holds it, re-serialized compactly).
maskbench.jsonl: per group in MASKBENCH_GROUPS, MASKBENCH_PER_GROUP files of `maskbench/data/<group>---*.json`
with at least one valid instance, drawn the same way; one line per schema: {"group", "name", "features",
"schema", "tests": [{"valid", "description", "why", "data"}]} (`why`: the first line of the source's
python_error, the reason an invalid instance is invalid). MaskBench's schemas are the benchmark's schemas
with some properties reordered to the order of the instances, so they are kept beside their instances.
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 0
SPLITS = ("Github_easy", "Github_medium", "Github_hard", "Glaiveai2K", "Kubernetes", "Snowplow",
          "JsonSchemaStore", "WashingtonPost")
SCHEMAS_PER_SPLIT = 12
MASKBENCH_GROUPS = SPLITS + ("Handwritten", "Synthesized")
MASKBENCH_PER_GROUP = 6


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], capture_output=True, text=True,
                          check=True).stdout


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def schemas(git_dir: str, commit: str) -> list[dict]:
    names = git(git_dir, "ls-tree", "-r", "--name-only", commit, "data/").split()
    rows = []
    for split in SPLITS:
        files = sorted(n for n in names if n.startswith(f"data/{split}/"))
        for path in random.Random(SEED).sample(files, SCHEMAS_PER_SPLIT):
            rows.append({"split": split, "name": Path(path).name,
                         "schema": json.loads(git(git_dir, "show", f"{commit}:{path}"))})
    return rows


def maskbench(git_dir: str, commit: str) -> list[dict]:
    names = git(git_dir, "ls-tree", "-r", "--name-only", commit, "maskbench/data/").split()
    rows = []
    for group in MASKBENCH_GROUPS:
        files = sorted(n for n in names if Path(n).name.startswith(f"{group}---"))
        drawn = []
        for path in random.Random(SEED).sample(files, len(files)):  # a seeded order; the first with tests
            source = json.loads(git(git_dir, "show", f"{commit}:{path}"))
            if not any(test["valid"] for test in source["tests"]):
                continue
            tests = [{"valid": t["valid"], "description": t.get("description", ""),
                      "why": (t.get("python_error") or "").split("\n")[0][:200], "data": t["data"]}
                     for t in source["tests"]]
            drawn.append({"group": group, "name": Path(path).name.split("---", 1)[1],
                          "features": source["meta"]["features"], "schema": source["schema"], "tests": tests})
            if len(drawn) == MASKBENCH_PER_GROUP:
                break
        rows.extend(drawn)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("git_dir")
    parser.add_argument("--commit", default="HEAD")
    args = parser.parse_args()
    commit = git(args.git_dir, "rev-parse", args.commit).strip()
    for name, rows in (("schemas.jsonl", schemas(args.git_dir, commit)),
                       ("maskbench.jsonl", maskbench(args.git_dir, commit))):
        (HERE / name).write_text("".join(compact(row) + "\n" for row in rows))
        print(f"{name}: {len(rows)} schemas, {(HERE / name).stat().st_size / 1024:.0f} KiB (commit {commit})")


if __name__ == "__main__":
    main()
