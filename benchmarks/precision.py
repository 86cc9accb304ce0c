"""Reduced precision (openvino int8 and int4 weights; torch bf16, bf16 with int4 weights and an int8 lm_head in
one-row steps) against fp32 on the served model: greedy top-1 agreement over 20 prompts x 64 tokens.

    python benchmarks/precision.py [--artifacts artifacts] [--tokens 64] [--variants openvino:int8 genai]

The fp32 torch decoder generates greedily; each variant (backend:dtype) is fed the same tokens
(teacher forcing), and at every position its top-1 is compared with fp32's. Prints the agreement, the
first position where each prompt's free-running greedy text leaves fp32's, and the largest logit gap;
writes benchmarks/results/precision-<CPU kind>.json (`zerocheck.bench.machine.cpu_kind`: the reduced-precision
kernels differ by kind of CPU). The bar we hold a default dtype to: >= 98 % of positions agree.
Variant `genai` is OpenVINO GenAI's LLMPipeline on the packaged GGUF, run greedily from the same prompt ids:
its API hands out no logits, so it has the free-running figures only.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from machine import commit, cpu
from zerocheck.bench.machine import cpu_kind
from zerocheck import paths
from zerocheck.decoder import StepRequest, load_decoder
from zerocheck.decoder.engine import variant_options
from zerocheck.tokenizer import load_tokenizer
from zerocheck.tokenizer.chat import Message

ROOT = Path(__file__).resolve().parents[1]
PLAIN = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
         "The three primary colors are", "import numpy as np\n\n", "The theory of relativity states that",
         "Water boils at", "class Stack:\n    def __init__(self):", "The best way to learn a language is",
         "In 1969, the first humans"]
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Name three fruits.",
             "What is 2 + 2?", "Explain in one sentence what a CPU does.", "Give me a tip for sleeping well.",
             "What does HTTP stand for?", "Translate 'thank you' into Spanish.", "Why is the sky blue?",
             "Write a Python function that reverses a string."]


def prompts(artifacts: Path) -> list[list[int]]:
    tokenizer = load_tokenizer(artifacts)
    texts = PLAIN + [tokenizer.apply_chat_template([Message("user", q)]) for q in QUESTIONS]
    return [tokenizer.encode(text) for text in texts]


def greedy(engine, prompt: list[int], tokens: int, forced: list[int] | None = None) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy ids (or, with `forced`, the top-1 at each position while feeding `forced`) and the logits."""
    ids, logits = [], []
    step = [StepRequest("p", prompt, start=True, end=False)]
    for i in range(tokens):
        row = engine.step(step).logits[0]
        logits.append(row)
        ids.append(int(row.argmax()))
        step = [StepRequest("p", [forced[i] if forced else ids[-1]], start=False, end=False)]
    engine.release("p")
    return ids, logits


def first_difference(reference: list[int], free: list[int]) -> int | None:
    """The first position where a free-running greedy generation leaves fp32's; None when it never does."""
    return next((i for i, (a, b) in enumerate(zip(reference, free)) if a != b), None)


def free_running(diverges: int | None) -> str:
    return "identical" if diverges is None else f"leaves fp32 at token {diverges}"


def summary(rows: list[dict], tokens: int, top1_agreement: float | None) -> dict:
    """A variant's result: its rows, the top-1 agreement (None: no logits), the prompts generated identically."""
    return {"prompts": len(rows), "tokens": tokens, "top1_agreement": top1_agreement, "rows": rows,
            "identical_free_running": sum(r["free_running_diverges_at"] is None for r in rows)}


def compare(references: list[tuple[list[int], list[torch.Tensor]]], engine, all_prompts: list[list[int]],
            tokens: int) -> dict:
    """`engine` against the fp32 greedy `references` (ids and logits per prompt)."""
    agree = total = 0
    rows = []
    for prompt, (reference, reference_logits) in zip(all_prompts, references):
        forced, forced_logits = greedy(engine, prompt, tokens, forced=reference)
        free, _ = greedy(engine, prompt, tokens)
        same = sum(a == b for a, b in zip(reference, forced))
        agree, total = agree + same, total + len(reference)
        diverges = first_difference(reference, free)
        gap = max(float((a.float() - b.float()).abs().max()) for a, b in zip(reference_logits, forced_logits))
        rows.append({"prompt_tokens": len(prompt), "top1_agree": same, "free_running_diverges_at": diverges,
                     "max_logit_gap": round(gap, 3)})
        print(f"  {same:>3}/{len(reference)} top-1 agree, free-running greedy {free_running(diverges)}, "
              f"max |logit gap| {gap:.3f}")
    return summary(rows, tokens, agree / total)


def genai_free_running(references: list[tuple[list[int], list[torch.Tensor]]], all_prompts: list[list[int]],
                       tokens: int) -> dict:
    """OpenVINO GenAI's greedy tokens from the same prompt ids against the fp32 references (no top-1 figure)."""
    import numpy as np
    import openvino as ov
    import openvino_genai as genai

    from zerocheck.build.sources import SMOLLM2

    pipe = genai.LLMPipeline(str(SMOLLM2.gguf_path()), "CPU", {})
    config = genai.GenerationConfig()
    config.max_new_tokens, config.do_sample, config.ignore_eos = tokens, False, True
    rows = []
    for prompt, (reference, _) in zip(all_prompts, references):
        ids = np.array([prompt], dtype=np.int64)
        free = [int(t) for t in pipe.generate(genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))),
                                              config).tokens[0]]
        diverges = first_difference(reference, free)
        rows.append({"prompt_tokens": len(prompt), "free_running_diverges_at": diverges})
        print(f"  free-running greedy {free_running(diverges)}")
    return summary(rows, tokens, None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=paths.artifacts_dir())
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--variants", nargs="+",
                        default=["openvino:int8", "openvino:int4", "openvino:fp32", "torch:bf16",
                                 "torch:bf16+int4+int8head"],
                        help="backend:dtype, +int4 for int4 layer weights and +int8head for an int8 lm_head in one-row "
                             "steps (all decode steps here are one row); genai: OpenVINO GenAI on the packaged GGUF")
    parser.add_argument("--out", type=Path,
                        default=ROOT / "benchmarks" / "results" / f"precision-{cpu_kind(cpu()['flags'])}.json")
    args = parser.parse_args()
    reference = load_decoder(args.artifacts, backend="torch", dtype="fp32", max_slots=1)
    all_prompts = prompts(args.artifacts)
    references = [greedy(reference, prompt, args.tokens) for prompt in all_prompts]  # once for every variant
    results = {}
    for variant in args.variants:
        print(f"{variant} vs torch:fp32")
        if variant == "genai":
            result = genai_free_running(references, all_prompts, args.tokens)
            print(f"{variant} vs fp32: free-running greedy identical for {result['identical_free_running']}/"
                  f"{result['prompts']} prompts")
            results[variant] = result
            continue
        result = compare(references, load_decoder(args.artifacts, max_slots=1, **variant_options(variant)),
                         all_prompts, args.tokens)
        agree = result["top1_agreement"]
        print(f"{variant} vs fp32: top-1 agrees at {agree:.1%} of {len(all_prompts) * args.tokens} positions; "
              f"free-running greedy identical for {result['identical_free_running']}/{result['prompts']} prompts")
        results[variant] = result
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join(["benchmarks/precision.py", *sys.argv[1:]])
    args.out.write_text(json.dumps({"command": command, "cpu": cpu(), "commit": commit(), "variants": results},
                                   indent=2) + "\n")


if __name__ == "__main__":
    main()
