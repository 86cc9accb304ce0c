"""Reduced precision (openvino int8 and int4 weights; torch bf16, bf16 with int4 weights and an int8 lm_head in
one-row steps) against fp32 on the served model: greedy top-1 agreement over 20 prompts x 64 tokens.

    python benchmarks/precision.py [--artifacts artifacts] [--tokens 64] [--variants openvino:int8 genai llama.cpp]
                                   [--llama-server PATH] [--llama-quantize PATH]

The fp32 torch decoder generates greedily; each variant (backend:dtype) is fed the same tokens
(teacher forcing), and at every position its top-1 is compared with fp32's. Prints the agreement, the
first position where each prompt's free-running greedy text leaves fp32's, and the largest logit gap;
writes benchmarks/results/precision-<CPU kind>.json (`zerocheck.bench.machine.cpu_kind`: the reduced-precision
kernels differ by kind of CPU). The bar we hold a default dtype to: >= 98 % of positions agree.
Peers on the packaged GGUF (their own reading of its Q4_1 blocks): `genai`, OpenVINO GenAI: free-running, its
LLMPipeline greedy from the same prompt ids; top-1, the model it converts the GGUF into (saved with
`enable_save_ov_model`, compiled with the CPU plugin's defaults as the pipeline compiles it), fed each prompt and
the fp32 tokens in one forward; `genai:q8_0`, the same on the GGUF requantized to Q8_0 by llama.cpp's
`llama-quantize` (--llama-quantize PATH). `llama.cpp` (needs --llama-server PATH): `llama-server`, one slot;
top-1, its greedy token after the prompt and the fp32 tokens so far (the slot's cache reused from call to call);
free-running, its greedy tokens (`ignore_eos`). Neither hands out logits here: no logit gap for them.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from machine import commit, cpu
from peers import llama_server, requantized
from zerocheck.bench.machine import cpu_kind
from zerocheck import paths
from zerocheck.build.sources import SMOLLM2
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


def summary(rows: list[dict], tokens: int, top1_agreement: float) -> dict:
    """A variant's result: its rows, the top-1 agreement, the prompts generated identically."""
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


def genai(source: Path, references: list[tuple[list[int], list[torch.Tensor]]], all_prompts: list[list[int]],
          tokens: int) -> dict:
    """OpenVINO GenAI on the GGUF `source` against the fp32 references: its pipeline's free-running greedy tokens
    and its converted model's teacher-forced top-1."""
    import numpy as np
    import openvino as ov
    import openvino_genai

    config = openvino_genai.GenerationConfig()
    config.max_new_tokens, config.do_sample, config.ignore_eos = tokens, False, True
    agree = total = 0
    rows = []
    with tempfile.TemporaryDirectory() as folder:  # the converted model is saved beside the GGUF it reads
        gguf = Path(folder) / source.name
        gguf.symlink_to(source.resolve())
        pipe = openvino_genai.LLMPipeline(str(gguf), "CPU", enable_save_ov_model=True)
        request = ov.Core().compile_model(str(Path(folder) / "openvino_model.xml"), "CPU").create_infer_request()
        for prompt, (reference, _) in zip(all_prompts, references):
            ids = np.array([prompt], dtype=np.int64)
            inputs = openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
            free = [int(t) for t in pipe.generate(inputs, config).tokens[0]]
            forced = np.array([prompt + reference[:-1]], dtype=np.int64)
            request.reset_state()
            logits = request.infer({"input_ids": forced, "attention_mask": np.ones_like(forced),
                                    "position_ids": np.arange(forced.shape[1])[None], "beam_idx": np.zeros(1, np.int32)},
                                   share_outputs=True)["logits"]
            same = int((logits[0, len(prompt) - 1:].argmax(-1) == np.array(reference)).sum())
            agree, total = agree + same, total + len(reference)
            rows.append(row(prompt, same, reference, free))
    return summary(rows, tokens, agree / total)


def llama_cpp(binary: Path, references: list[tuple[list[int], list[torch.Tensor]]], all_prompts: list[list[int]],
              tokens: int) -> dict:
    """llama.cpp's `llama-server` on the packaged GGUF against the fp32 references: greedy tokens through its
    /completion endpoint (prompts as token ids), teacher-forced one token at a time and free-running."""
    import httpx

    agree = total = 0
    rows = []
    with llama_server(binary, 1, context_per_slot=1024) as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        def greedy_tokens(ids: list[int], count: int) -> list[int]:
            response = client.post("/completion", json={"prompt": ids, "n_predict": count, "temperature": 0,
                                                         "ignore_eos": True, "cache_prompt": True, "return_tokens": True})
            response.raise_for_status()
            return response.json()["tokens"]

        for prompt, (reference, _) in zip(all_prompts, references):
            same = sum(greedy_tokens(prompt + reference[:i], 1) == [reference[i]] for i in range(len(reference)))
            agree, total = agree + same, total + len(reference)
            rows.append(row(prompt, same, reference, greedy_tokens(prompt, tokens)))
    return summary(rows, tokens, agree / total)


def row(prompt: list[int], same: int, reference: list[int], free: list[int]) -> dict:
    """A peer's figures for one prompt (no logits: no gap)."""
    diverges = first_difference(reference, free)
    print(f"  {same:>3}/{len(reference)} top-1 agree, free-running greedy {free_running(diverges)}")
    return {"prompt_tokens": len(prompt), "top1_agree": same, "free_running_diverges_at": diverges}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=paths.artifacts_dir())
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--variants", nargs="+",
                        default=["openvino:int8", "openvino:int4", "openvino:fp32", "torch:bf16",
                                 "torch:bf16+int4+int8head"],
                        help="backend:dtype, +int4 for int4 layer weights and +int8head for an int8 lm_head in one-row "
                             "steps (all decode steps here are one row); genai: OpenVINO GenAI on the packaged GGUF; "
                             "genai:q8_0: on it requantized to Q8_0 (--llama-quantize); llama.cpp: llama-server on it "
                             "(--llama-server)")
    parser.add_argument("--llama-server", type=Path, default=None, help="a llama-server binary, for variant llama.cpp")
    parser.add_argument("--llama-quantize", type=Path, default=None,
                        help="llama.cpp's llama-quantize, for variant genai:q8_0 (GenAI on the GGUF requantized to Q8_0)")
    parser.add_argument("--out", type=Path,
                        default=ROOT / "benchmarks" / "results" / f"precision-{cpu_kind(cpu()['flags'])}.json")
    args = parser.parse_args()
    if "llama.cpp" in args.variants and args.llama_server is None:
        parser.error("variant llama.cpp needs --llama-server PATH")
    if "genai:q8_0" in args.variants and args.llama_quantize is None:
        parser.error("variant genai:q8_0 needs --llama-quantize PATH")
    reference = load_decoder(args.artifacts, backend="torch", dtype="fp32", max_slots=1)
    all_prompts = prompts(args.artifacts)
    references = [greedy(reference, prompt, args.tokens) for prompt in all_prompts]  # once for every variant
    results = {}
    for variant in args.variants:
        print(f"{variant} vs torch:fp32")
        if variant == "genai":
            result = genai(SMOLLM2.gguf_path(), references, all_prompts, args.tokens)
        elif variant == "genai:q8_0":
            with tempfile.TemporaryDirectory() as folder:
                result = genai(requantized(args.llama_quantize, Path(folder), "Q8_0"), references, all_prompts,
                               args.tokens)
        elif variant == "llama.cpp":
            result = llama_cpp(args.llama_server, references, all_prompts, args.tokens)
        else:
            result = compare(references, load_decoder(args.artifacts, max_slots=1, **variant_options(variant)),
                             all_prompts, args.tokens)
        print(f"{variant} vs fp32: top-1 agrees at {result['top1_agreement']:.1%} of {len(all_prompts) * args.tokens} "
              f"positions; free-running greedy identical for {result['identical_free_running']}/{result['prompts']} "
              "prompts")
        results[variant] = result
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join(["benchmarks/precision.py", *sys.argv[1:]])
    args.out.write_text(json.dumps({"command": command, "cpu": cpu(), "commit": commit(), "variants": results},
                                   indent=2) + "\n")


if __name__ == "__main__":
    main()
