"""Structured output (JSON schemas through llguidance) on a sample of JSONSchemaBench, in one run.

    python benchmarks/structured.py [--parts compile maskbench] [--served] [--out benchmarks/results]

The sample (benchmarks/data/jsonschemabench/: 96 schemas of 8 splits, MaskBench's instances of 60 schemas)
is compiled against the served model's tokenizer with `zerocheck.grammar.GrammarCompiler`, as the server
does. A schema is sent as its compact JSON text. Parts:
  compile     every schema once on one compiler (each is a cold compile: the cache keeps none of them):
              compile time p50/p99/max of `parse_guide` + `check`, first mask (a matcher copy and its first
              `fill`) p50/p99, and per split the share refused, with the reasons counted
  maskbench   each MaskBench instance re-serialized compactly (json.dumps with separators "," ":", as the
              grammar allows no whitespace between tokens), tokenized, and walked token by token: each
              token's bit in the mask `fill` wrote before it, then an end id at the end. Counts valid
              instances accepted / rejected (with the token where it failed), invalid instances rejected /
              accepted (approximations, with the schema's features), schemas refused; and the time of
              `fill` per row (µs p50/p99) over the valid instances
  compliance  (--served) one chat request per schema to the `generate` model over gRPC (`zerocheck.clients`),
              `--compliance-streams` at a time, T=0.7, max_tokens min(--max-tokens, the server's
              max_output_tokens), the schema in the prompt and as the guide; per split the first
              `--served-per-split` schemas (file order) whose prompt fits the server's limits (the others
              are counted as prompt>limit): answers that stopped (eos / stop) and validate with jsonschema
              (formats not asserted), stopped but do not validate (must be 0: printed), cut by max_tokens,
              refused as unsupported, other refusals, errors
  overhead    (--served) time per output token of the same prompts without and with their guide (the
              schemas that compile; their compiles warmed), at each of `--streams` concurrent streams, in
              rounds until each side has `--overhead-samples` streams: TPOT = (last token time - first token
              time) / (tokens - 1) per stream, medians, and the ratio constrained / unconstrained. max_tokens
              is `--overhead-max-tokens`; a guided answer ends where its document does, an unconstrained one
              may run to max_tokens (no ignore-EOS with a grammar)
The served parts start tritonserver over a copy of the packaged repository with max_slots the largest
stream count, on free ports. Prints a table per part, writes structured.json (with the command, CPU,
commit and the 1-minute load average before and after: other work on the machine moves the timings).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from machine import write_result
from zerocheck import paths
from zerocheck.grammar import GUIDE_INPUT, GrammarCompiler, Guide, GuideError, bitmask_words, parse_guide
from zerocheck.tokenizer import load_tokenizer
from zerocheck.tokenizer.chat import Message

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "jsonschemabench"
OFFLINE, SERVED = ("compile", "maskbench"), ("compliance", "overhead")


def rows(name: str) -> list[dict]:
    """The vendored sample `name` (schemas.jsonl or maskbench.jsonl), one dict per schema."""
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def quantiles(values: list[float]) -> dict[str, float]:
    """p50, p99 and max of `values` (nan when empty)."""
    if not values:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan"), "n": 0}
    return {"p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99)),
            "max": float(max(values)), "n": len(values)}


def refusal_reasons(message: str) -> list[str]:
    """The reasons of a GuideError message, short: one per refused keyword, else its opening words."""
    text = message.split(": ", 1)[1] if message.startswith("guided_decoding_guide:") else message
    if "keyword(s) not supported" in text:
        return [f"keyword {k}" for k in json.loads(text.split("enforced): ", 1)[1])]
    if "must be at most" in text:
        return ["guide over 64 KiB"]
    if "longer than" in text:
        return ["compile over the time limit"]
    return [" ".join(text.replace("JSON schema not supported: ", "").split()[:6])]


def guide_of(compiler: GrammarCompiler, schema) -> tuple[Guide | None, str]:
    """The guide of `schema` (its compact text, parsed and compiled), or None and the GuideError message."""
    try:
        guide = parse_guide("json_schema", compact(schema))
        compiler.check(guide)
        return guide, ""
    except GuideError as error:
        return None, str(error)


def compile_part(compiler: GrammarCompiler) -> dict:
    """Cold compile of every schema of schemas.jsonl, the first mask of those that compile, refusals per split."""
    bitmask = np.zeros((1, bitmask_words(compiler.vocab_size)), np.int32)
    by_split: dict[str, dict] = defaultdict(lambda: {"schemas": 0, "refused": 0, "reasons": Counter(),
                                                     "compile_ms": []})
    compile_ms, first_mask_ms = [], []
    for row in rows("schemas.jsonl"):
        split = by_split[row["split"]]
        split["schemas"] += 1
        began = time.perf_counter()
        guide, message = guide_of(compiler, row["schema"])
        compiled = time.perf_counter()
        if guide is None:
            split["refused"] += 1
            split["reasons"].update(refusal_reasons(message))
            continue
        compiler.matcher(guide).fill(bitmask, 0)
        compile_ms.append(1000 * (compiled - began))
        split["compile_ms"].append(compile_ms[-1])
        first_mask_ms.append(1000 * (time.perf_counter() - compiled))
    splits = {name: {**s, "reasons": dict(s["reasons"].most_common()), "compile_ms": quantiles(s["compile_ms"])}
              for name, s in by_split.items()}
    return {"compile_ms": quantiles(compile_ms), "first_mask_ms": quantiles(first_mask_ms), "splits": splits}


def print_compile(result: dict) -> None:
    c, f = result["compile_ms"], result["first_mask_ms"]
    print(f"compile (cold, {c['n']} schemas that compile): p50 {c['p50']:.1f} ms  p99 {c['p99']:.1f} ms  "
          f"max {c['max']:.1f} ms;  first mask p50 {f['p50']:.2f} ms  p99 {f['p99']:.2f} ms")
    print(f"  {'split':<16}{'schemas':>8}{'refused':>8}{'compile p50':>12}{'max ms':>8}  refusal reasons")
    for name, s in result["splits"].items():
        reasons = ", ".join(f"{r} x{n}" for r, n in s["reasons"].items())
        print(f"  {name:<16}{s['schemas']:>8}{s['refused']:>8}{s['compile_ms']['p50']:>12.1f}"
              f"{s['compile_ms']['max']:>8.1f}  {reasons}")
    schemas = sum(s["schemas"] for s in result["splits"].values())
    refused = sum(s["refused"] for s in result["splits"].values())
    print(f"  {'all':<16}{schemas:>8}{refused:>8}{c['p50']:>12.1f}{c['max']:>8.1f}  ({refused / schemas:.0%} refused)")


def allowed(bitmask: np.ndarray, token: int) -> bool:
    """Whether row 0 of `bitmask` (int32 [1, W]) allows `token`."""
    return bool(int(bitmask[0, token >> 5]) >> (token & 31) & 1)


def walk(compiler: GrammarCompiler, guide: Guide, tokens: list[int], end_ids: tuple[int, ...],
         bitmask: np.ndarray, fill_us: list[float]) -> int | None:
    """Replay `tokens` through a fresh matcher of `guide`, each against the mask `fill` wrote before it:
    the index of the first token not allowed (len(tokens): no end id allowed at the end), None when all
    are. The time of each `fill` is appended to `fill_us`."""
    matcher = compiler.matcher(guide)
    for index, token in enumerate([*tokens, None]):
        began = time.perf_counter_ns()
        matcher.fill(bitmask, 0)
        fill_us.append((time.perf_counter_ns() - began) / 1000)
        if token is None:
            return None if any(allowed(bitmask, e) for e in end_ids) else index
        if not allowed(bitmask, token):
            return index
        matcher.consume([token])
        if matcher.error:
            return index
    return None


def maskbench_part(compiler: GrammarCompiler, tokenizer) -> dict:
    """MaskBench's instances of maskbench.jsonl replayed through the masks of their schema."""
    bitmask = np.zeros((1, bitmask_words(compiler.vocab_size)), np.int32)
    counts = Counter()
    valid_fill_us, invalid_fill_us = [], []
    valid_rejected, invalid_accepted, refused = [], [], []
    for row in rows("maskbench.jsonl"):
        guide, message = guide_of(compiler, row["schema"])
        if guide is None:
            refused.append({"schema": f"{row['group']}/{row['name']}", "reasons": refusal_reasons(message)})
            counts["schemas_refused"] += 1
            counts["instances_of_refused_schemas"] += len(row["tests"])
            continue
        counts["schemas_compiled"] += 1
        for test in row["tests"]:
            tokens = tokenizer.encode(compact(test["data"]))
            failed = walk(compiler, guide, tokens, tokenizer.end_ids, bitmask,
                          valid_fill_us if test["valid"] else invalid_fill_us)
            kind = "valid" if test["valid"] else "invalid"
            counts[f"{kind}_{'accepted' if failed is None else 'rejected'}"] += 1
            where = {"schema": f"{row['group']}/{row['name']}", "description": test["description"]}
            if test["valid"] and failed is not None:
                token = "<end>" if failed == len(tokens) else tokenizer.decode([tokens[failed]])
                valid_rejected.append({**where, "token_index": failed, "tokens": len(tokens), "token": token,
                                       "before": tokenizer.decode(tokens[:failed])[-60:]})
            if not test["valid"] and failed is None:
                invalid_accepted.append({**where, "why_invalid": test["why"], "features": row["features"]})
    return {"counts": dict(counts), "fill_us_valid": quantiles(valid_fill_us),
            "fill_us_invalid": quantiles(invalid_fill_us), "valid_rejected": valid_rejected,
            "invalid_accepted": invalid_accepted, "refused": refused}


def print_maskbench(result: dict) -> None:
    c, f = result["counts"], result["fill_us_valid"]
    print("maskbench (instances re-serialized compactly: json.dumps separators ',' ':', then tokenized)")
    print(f"  schemas compiled {c.get('schemas_compiled', 0)}, refused {c.get('schemas_refused', 0)} "
          f"({c.get('instances_of_refused_schemas', 0)} instances not replayed)")
    print(f"  valid:   accepted {c.get('valid_accepted', 0):>4}  rejected {c.get('valid_rejected', 0):>4}")
    print(f"  invalid: rejected {c.get('invalid_rejected', 0):>4}  accepted {c.get('invalid_accepted', 0):>4}"
          f"  (approximations)")
    print(f"  fill per row over the valid instances ({f['n']} rows): p50 {f['p50']:.1f} us  p99 {f['p99']:.1f} us"
          f"  max {f['max']:.0f} us")
    for r in result["valid_rejected"]:
        print(f"  valid rejected: {r['schema']} at token {r['token_index']}/{r['tokens']} {r['token']!r} "
              f"after ...{r['before']!r}")
    for r in result["invalid_accepted"]:
        print(f"  invalid accepted: {r['schema']}: {r['why_invalid'][:90]!r} features {r['features']}")
    for r in result["refused"]:
        print(f"  refused: {r['schema']}: {', '.join(r['reasons'])}")


def prompt(schema_text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": "Reply with one JSON document that matches this JSON schema, and nothing "
                                        f"else.\n\nJSON schema:\n{schema_text}"}]


def served_sample(tokenizer, per_split: int, max_prompt_tokens: int) -> tuple[list[dict], Counter]:
    """The first `per_split` schemas of each split (file order) whose prompt fits `max_prompt_tokens`; the
    schemas passed over for a longer prompt, counted by split."""
    chosen, too_long = [], Counter()
    for row in rows("schemas.jsonl"):
        if sum(r["split"] == row["split"] for r in chosen) == per_split:
            continue
        text = compact(row["schema"])
        tokens = len(tokenizer.encode(tokenizer.apply_chat_template([Message(**m) for m in prompt(text)])))
        if tokens > max_prompt_tokens:
            too_long[row["split"]] += 1
            continue
        chosen.append({**row, "text": text, "prompt_tokens": tokens})
    return chosen, too_long


def validates(schema, document) -> str | None:
    """None when `document` validates against `schema` (jsonschema, formats not asserted), else why not."""
    import jsonschema
    from referencing.exceptions import Unresolvable

    try:
        validator = jsonschema.validators.validator_for(schema)(schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(document))
    except (jsonschema.exceptions.SchemaError, Unresolvable) as failure:
        return f"the validator cannot check it: {str(failure).splitlines()[0][:150]}"
    return None if error is None else error.message[:150]


@dataclass
class Answer:
    """One served request: its outcome and timing."""

    split: str
    name: str
    outcome: str = ""  # valid | invalid | length | unsupported | refused | error
    detail: str = ""
    tokens: int = 0
    tpot_s: float = 0.0


def ask(url: str, row: dict, max_tokens: int, seed: int, guided: bool) -> Answer:
    """One streamed chat request for `row`'s schema to `generate` (guided: the schema as its guide)."""
    from zerocheck.clients import Client, InvalidRequest, ZerocheckError

    answer, times, final = Answer(row["split"], row["name"]), [], None
    guide = {"guide_type": "json_schema", "guide": row["text"]} if guided else {}
    client = Client(url, model="generate", timeout=1800.0, retries=0)
    try:
        for event in client.chat_stream(prompt(row["text"]), max_tokens=max_tokens, temperature=0.7, seed=seed,
                                        **guide):
            times += [event.elapsed_s] * len(event.token_ids)
            final = event.final or final
    except InvalidRequest as error:
        answer.outcome = "unsupported" if GUIDE_INPUT in error.message else "refused"
        answer.detail = error.message[:200]
        return answer
    except ZerocheckError as error:
        answer.outcome, answer.detail = "error", f"{type(error).__name__}: {error.message[:200]}"
        return answer
    answer.tokens = final.completion_tokens
    if len(times) > 1:
        answer.tpot_s = (times[-1] - times[0]) / (len(times) - 1)
    if final.finish_reason == "length":
        answer.outcome, answer.detail = "length", f"ends ...{final.text[-80:]!r}"
        return answer
    try:
        document = json.loads(final.text)
    except json.JSONDecodeError as error:
        answer.outcome, answer.detail = "invalid", f"not JSON: {error.msg} at {error.pos}: {final.text[:120]!r}"
        return answer
    why = validates(row["schema"], document) if guided else None
    answer.outcome, answer.detail = ("valid", "") if why is None else ("invalid", f"{why}: {final.text[:120]!r}")
    return answer


def generate_limits(server) -> dict[str, int]:
    """`generate`'s max_prompt_tokens / max_output_tokens / max_context, read from the served config."""
    config = json.loads(urllib.request.urlopen(f"http://{server.http_url}/v2/models/generate/config",
                                               timeout=30).read())
    parameters = config.get("parameters", {})
    return {key: int(parameters[key]["string_value"])
            for key in ("max_prompt_tokens", "max_output_tokens", "max_context") if key in parameters}


def compliance_part(url: str, sample: list[dict], too_long: Counter, max_tokens: int, streams: int) -> dict:
    """One guided request per schema of `sample`, `streams` at a time: the outcomes per split."""
    with ThreadPoolExecutor(streams) as pool:
        answers = list(pool.map(lambda i: ask(url, sample[i], max_tokens, i, True), range(len(sample))))
    splits: dict[str, Counter] = defaultdict(Counter)
    for answer in answers:
        splits[answer.split][answer.outcome] += 1
    for split, count in too_long.items():
        splits[split]["prompt_over_limit"] += count
    return {"max_tokens": max_tokens, "streams": streams, "splits": {k: dict(v) for k, v in splits.items()},
            "answers": [asdict(a) for a in answers]}


def print_compliance(result: dict) -> None:
    columns = (("valid", "stopped+valid"), ("invalid", "stopped+INVALID"), ("length", "cut (length)"),
               ("unsupported", "unsupported"), ("refused", "refused"), ("error", "errors"),
               ("prompt_over_limit", "prompt>limit"))
    print(f"compliance (guided, T=0.7, max_tokens {result['max_tokens']}, {result['streams']} at a time; "
          f"stopped = finish eos/stop)")
    print(f"  {'split':<16}" + "".join(f"{title:>{len(title) + 2}}" for _, title in columns))
    total = Counter()
    for split, count in [*result["splits"].items(), ("all", total)]:
        total.update(count if split != "all" else {})
        print(f"  {split:<16}" + "".join(f"{count.get(o, 0):>{len(title) + 2}}" for o, title in columns))
    for a in result["answers"]:
        if a["outcome"] in ("invalid", "error", "refused", "length"):
            print(f"  {a['outcome']}: {a['split']}/{a['name']}: {a['detail']}")


def overhead_part(url: str, sample: list[dict], max_tokens: int, streams: list[int], samples: int) -> dict:
    """TPOT per stream with and without the guide, the same prompts, at each stream count: rounds of `n`
    streams (request j: sample[j % len]) until each side has `samples` streams, unconstrained and
    constrained in turn, so that a change in the machine's load falls on both."""
    rows_out = []
    for n in streams:
        answers: dict[bool, list[Answer]] = {False: [], True: []}
        for start in range(0, max(n, samples), n):
            for guided in (False, True):
                with ThreadPoolExecutor(n) as pool:
                    answers[guided] += pool.map(
                        lambda j: ask(url, sample[j % len(sample)], max_tokens, 1000 + j, guided),
                        range(start, start + n))
        row = {"streams": n}
        for guided, done in answers.items():
            key = "guided" if guided else "free"
            tpots = [a.tpot_s for a in done if a.tpot_s]
            failed = [a for a in done if a.outcome in ("error", "refused", "unsupported")]
            row.update({f"{key}_tpot_ms": 1000 * statistics.median(tpots) if tpots else float("nan"),
                        f"{key}_streams": len(done), f"{key}_tokens_mean": statistics.mean(a.tokens for a in done),
                        f"{key}_errors": len(failed), f"{key}_first_error": failed[0].detail if failed else ""})
        row["ratio"] = row["guided_tpot_ms"] / row["free_tpot_ms"]
        rows_out.append(row)
        print(f"  x{n:<3} TPOT p50 unconstrained {row['free_tpot_ms']:7.2f} ms ({row['free_tokens_mean']:5.0f} tokens "
              f"mean)  constrained {row['guided_tpot_ms']:7.2f} ms ({row['guided_tokens_mean']:5.0f})  "
              f"ratio {row['ratio']:.2f}  ({row['free_streams']} streams each; errors {row['free_errors']} / "
              f"{row['guided_errors']}) {row['free_first_error'] or row['guided_first_error']}", flush=True)
    return {"max_tokens": max_tokens, "rows": rows_out}


def served_parts(args, tokenizer, parts: list[str]) -> dict:
    """Start the served model (a repository copy sized to the largest stream count) and run the served parts."""
    from zerocheck.serve import TritonServer
    from zerocheck.serve.repository import copy_repository

    repository = copy_repository(Path(tempfile.mkdtemp(prefix="zerocheck-bench-")) / "model_repository",
                                 {"decoder": {"max_slots": str(max(args.streams))}})
    results = {}
    try:
        with TritonServer(repository, env={paths.ARTIFACTS_ENV: str(args.artifacts)}) as server:
            limits = generate_limits(server)
            max_tokens = min(args.max_tokens, limits["max_output_tokens"])
            sample, too_long = served_sample(tokenizer, args.served_per_split,
                                             min(limits["max_prompt_tokens"], limits["max_context"] - max_tokens))
            print(f"served: {len(sample)} schemas ({args.served_per_split} per split whose prompt fits), limits "
                  f"{limits}", flush=True)
            ask(server.grpc_url, sample[0], 8, 0, False)  # warm-up
            if "compliance" in parts:
                results["compliance"] = compliance_part(server.grpc_url, sample, too_long, max_tokens,
                                                        args.compliance_streams)
                print_compliance(results["compliance"])
            if "overhead" in parts:
                compiled = [row for row in sample if ask(server.grpc_url, row, 1, 0, True).outcome
                            not in ("unsupported", "refused", "error")]  # also warms their compiles
                overhead_tokens = min(args.overhead_max_tokens, max_tokens)
                print(f"overhead ({len(compiled)} schemas that compile, max_tokens {overhead_tokens}; constrained "
                      f"answers stop at their end, unconstrained ones may run on)")
                results["overhead"] = overhead_part(server.grpc_url, compiled, overhead_tokens, args.streams,
                                                    args.overhead_samples)
    finally:
        shutil.rmtree(repository.parent, ignore_errors=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=paths.artifacts_dir())
    parser.add_argument("--parts", nargs="+", choices=[*OFFLINE, *SERVED], default=list(OFFLINE))
    parser.add_argument("--served", action="store_true", help="add the served parts (compliance, overhead)")
    parser.add_argument("--served-per-split", type=int, default=3, help="schemas per split sent to the server")
    parser.add_argument("--max-tokens", type=int, default=1024, help="capped at the server's max_output_tokens")
    parser.add_argument("--overhead-max-tokens", type=int, default=256, help="max_tokens of the overhead part")
    parser.add_argument("--overhead-samples", type=int, default=8,
                        help="streams per side and stream count at least (rounds of n streams)")
    parser.add_argument("--compliance-streams", type=int, default=8, help="compliance requests at a time")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32], help="overhead's stream counts")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    parts = [*args.parts, *(p for p in SERVED if args.served and p not in args.parts)]

    tokenizer = load_tokenizer(args.artifacts)
    load_before = os.getloadavg()[0]
    results = {}
    if "compile" in parts:
        results["compile"] = compile_part(GrammarCompiler(tokenizer.json(), tokenizer.end_ids, tokenizer.vocab_size))
        print_compile(results["compile"])
    if "maskbench" in parts:
        results["maskbench"] = maskbench_part(
            GrammarCompiler(tokenizer.json(), tokenizer.end_ids, tokenizer.vocab_size), tokenizer)
        print_maskbench(results["maskbench"])
    if any(part in parts for part in SERVED):
        results.update(served_parts(args, tokenizer, parts))
    load = {"before": load_before, "after": os.getloadavg()[0]}  # other work on the machine moves the timings
    print(f"1-minute load average: {load['before']:.2f} before, {load['after']:.2f} after")
    write_result(args.out, "structured.json", {"load_average": load,
                                               "data": (DATA / "README.md").relative_to(ROOT).as_posix(), **results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
