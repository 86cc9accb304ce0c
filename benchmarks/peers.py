"""zerocheck against its CPU peers on the same model and machine, in one run.

    python benchmarks/peers.py [--streams 1 8 32] [--tokens 128] [--rounds N] [--llama-server PATH]
                               [--llama-quantize PATH]

One closed-loop load for every system: at each stream count, that many distinct chat prompts at once, each
generating exactly `--tokens` tokens (no early stop) with temperature 0.8, top-k 50, top-p 0.9:
  zerocheck            the shipped repository served with its OpenAI front end (`zerocheck serve`; decoder backend
                       and dtype chosen at load: openvino with int8 weights on a CPU), the zero-check path
  zerocheck checked    the same server's checked chain (softmax, sort, cumulative sums, multinomial): header
                       `zerocheck: off`
  zerocheck fp32       the exact path (`backend: openvino`, `dtype: fp32`)
  zerocheck bf16       the packed bf16 torch path (`dtype: bf16`), where the CPU multiplies bf16 (AVX512-BF16, AMX)
  OpenVINO GenAI       `ContinuousBatchingPipeline` on the packaged GGUF (Q4_1), in-process, its own sampler
                       (paged KV cache, u8, dynamic split-fuse, prefix caching)
  OpenVINO GenAI Q8_0  the same on that GGUF requantized to Q8_0 by llama.cpp's `llama-quantize`, when
                       --llama-quantize names one (GenAI's reading of Q4_1 blocks agrees with their own weights
                       far less often than zerocheck's int8: benchmarks/precision.py, variants genai, genai:q8_0)
  llama.cpp            `llama-server -np <streams> -cb` on the same GGUF through its OpenAI API, when
                       --llama-server names a binary: in the llama-cpp-python sdist's vendor/llama.cpp
                       (`pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`),
                       `cmake -B build -DGGML_NATIVE=ON && cmake --build build --target llama-server llama-quantize`
  transformers fp32    `generate` on the same safetensors weights, one static batch of all streams
With --rounds N every system is measured N times, one system after the other in each round, and each figure is
its median over the rounds (the host's drift lands on every system alike). The served systems (zerocheck,
llama.cpp) get the same client: the OpenAI SDK's streamed chat completions, a thread
per stream, `ignore_eos`. Per stream count: tokens/s (all streams' tokens / wall time from sending to the last
token), TTFT and TPOT p50/p95 over the streams, and the peak PSS of all the system's processes (server, stubs and
front end; in-process systems: this benchmark's process), sampled every 2 s (reading the PSS of a server's ~20
processes takes ~50 ms of CPU, which would otherwise compete with the measured server), and the CPU time per
output token of each of its processes (by role: each Triton model, the front end, tritonserver, llama-server,
the load generator's client threads; an in-process system's and its loop's together). Prints the table, the
CPU split at the most streams, the ratios to OpenVINO GenAI (and to its Q8_0 run) and of peak PSS to
llama-server, writes
benchmarks/results/peers-<CPU kind>.json (with the command, CPU and commit) and its plot peers-<CPU kind>.png, one
pair per kind of CPU (`zerocheck.bench.machine.cpu_kind`: avx2, avx512, avx512-bf16).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from machine import commit, cpu
from zerocheck.bench.machine import cpu_kind
from zerocheck import paths
from zerocheck.build.sources import SMOLLM2

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ["Write a short story about a robot.", "Explain how a CPU works.", "Describe the ocean.",
             "Give me ten tips for learning Python.", "What happened in the French Revolution?",
             "Write a poem about autumn leaves.", "How do airplanes fly?", "Tell me about the history of Rome."]
SAMPLING = {"temperature": 0.8, "top_k": 50, "top_p": 0.9}


def question(i: int) -> str:
    """The i-th stream's prompt: distinct for every stream (prefix caches share only the chat template's opening)."""
    return f"{QUESTIONS[i % len(QUESTIONS)]} (Request {i}.)"


PSS_INTERVAL_S = 2.0
LOAD_GENERATOR = "load generator (this benchmark's client threads)"
IN_PROCESS = "in-process (the pipeline and this benchmark's loop)"


def process_trees(*pids: int) -> list[psutil.Process]:
    """Processes `pids` and their descendants (those that exist)."""
    processes = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            processes += [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
    return processes


class PeakPSS:
    """The peak, sampled every PSS_INTERVAL_S, of the summed PSS of processes `pids` and their descendants (MiB)."""

    def __init__(self, *pids: int) -> None:
        self.pids, self.peak_mib, self._stop = pids, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> float:
        total = 0
        for process in process_trees(*self.pids):
            try:
                total += process.memory_full_info().pss
            except psutil.Error:
                continue
        return total / 2**20

    def _run(self) -> None:
        while not self._stop.wait(PSS_INTERVAL_S):
            self.peak_mib = max(self.peak_mib, self._sample())

    def __enter__(self) -> "PeakPSS":
        self.peak_mib = self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_mib = max(self.peak_mib, self._sample())


class CPUTime:
    """CPU seconds (user + system) spent inside the block by processes `pids` and their descendants, by role (a
    Triton Python backend stub's model, a module Python runs with -m, else the program's name), and with `own`,
    by this process alone under that role (the load generator's threads, or a system run in-process)."""

    def __init__(self, *pids: int, own: str | None = None) -> None:
        self.pids, self.own, self._began, self.seconds = pids, own, {}, {}

    def _sample(self) -> dict[int, tuple[str, float]]:
        members = [(psutil.Process(), self.own)] if self.own else []
        members += [(process, None) for process in process_trees(*self.pids)]
        out = {}
        for process, role in members:
            try:
                times = process.cpu_times()
                out[process.pid] = (role or self._role(process), times.user + times.system)
            except psutil.Error:
                continue
        return out

    @staticmethod
    def _role(process: psutil.Process) -> str:
        command = process.cmdline()
        if command and command[0].endswith("triton_python_backend_stub") and len(command) > 1:
            return Path(command[1]).parts[-3]  # .../<model>/1/model.py
        if command and Path(command[0]).name.startswith("python") and "-m" in command[:-1]:
            return command[command.index("-m") + 1]
        return Path(command[0]).name if command else process.name()

    def __enter__(self) -> "CPUTime":
        self._began = self._sample()
        return self

    def __exit__(self, *exc: object) -> None:
        for pid, (role, seconds) in self._sample().items():
            self.seconds[role] = self.seconds.get(role, 0.0) + seconds - self._began.get(pid, (role, 0.0))[1]


def summary(n: int, tokens: int, wall_s: float, ttfts: list[float], tpots: list[float], pss_mib: float,
            cpu: CPUTime) -> dict:
    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]

    return {"tokens_per_s": n * tokens / wall_s, "ttft_p50_s": pct(ttfts, 0.5), "ttft_p95_s": pct(ttfts, 0.95),
            "tpot_p50_ms": 1000 * pct(tpots, 0.5), "tpot_p95_ms": 1000 * pct(tpots, 0.95), "peak_pss_mib": pss_mib,
            "cpu_ms_per_token": cpu_per_token(cpu, n * tokens)}


def cpu_split(per_token: dict[str, float], roles: int = 5) -> str:
    """`cpu_per_token`'s dict as text: the total, then the largest `roles` roles (ms per token)."""
    largest = [(role, ms) for role, ms in per_token.items() if role != "total"][:roles]
    return f"{per_token['total']:.2f} = " + ", ".join(f"{role} {ms:.2f}" for role, ms in largest)


def cpu_per_token(cpu: CPUTime, tokens: int) -> dict[str, float]:
    """CPU milliseconds per output token by role, the largest first, and their `total`."""
    spent = {role: 1000 * seconds / tokens for role, seconds in sorted(cpu.seconds.items(), key=lambda kv: -kv[1])}
    return {**spent, "total": sum(spent.values())}


def closed_loop(one: Callable[[int], tuple[float, float]], streams: list[int], tokens: int, *pids: int) -> dict:
    """Each stream count in turn (the smallest first once more: the first run warms the server up): `n` threads
    call `one(i)` -> (TTFT s, TPOT s) once each; the rates by stream count, with the peak PSS of `pids`' trees and
    the CPU time of those trees and of this process (the clients' threads)."""
    rates = {}
    for n in [min(streams), *streams]:
        with PeakPSS(*pids) as memory, CPUTime(*pids, own=LOAD_GENERATOR) as cpu:
            began = time.perf_counter()
            with ThreadPoolExecutor(n) as pool:
                timings = list(pool.map(one, range(n)))
            wall = time.perf_counter() - began
        rates[n] = summary(n, tokens, wall, [t for t, _ in timings], [t for _, t in timings], memory.peak_mib, cpu)
    return rates


def openai_stream(base_url: str, model: str, tokens: int,
                  headers: dict[str, str] | None = None) -> Callable[[int], tuple[float, float]]:
    """One stream of a served system: a streamed chat completion of `tokens` tokens through the OpenAI SDK ->
    (TTFT s, TPOT s)."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=900.0, default_headers=headers)

    def one(i: int) -> tuple[float, float]:
        began = time.perf_counter()
        first = None
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": question(i)}], max_tokens=tokens, stream=True,
            temperature=SAMPLING["temperature"], top_p=SAMPLING["top_p"], seed=i,
            extra_body={"top_k": SAMPLING["top_k"], "ignore_eos": True})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter()
        end = time.perf_counter()
        first = first or end
        return first - began, (end - first) / max(1, tokens - 1)

    return one


def zerocheck_rates(artifacts: Path, streams: list[int], tokens: int, decoder: dict[str, str] | None,
                    zerocheck: bool = True) -> dict:
    from zerocheck.api.headers import SWITCH_HEADER
    from zerocheck.bench.e2e import sized_repository
    from zerocheck.serve.stack import ServingStack

    repository = sized_repository(max(streams), decoder)
    try:
        with ServingStack(repository, env={"ZEROCHECK_ARTIFACTS": str(artifacts)}) as server:
            one = openai_stream(server.openai_url, server.frontend_served_model, tokens,
                                {SWITCH_HEADER: "on" if zerocheck else "off"})
            return closed_loop(one, streams, tokens, server.pid, server.frontend_pid)
    finally:
        shutil.rmtree(repository.parent, ignore_errors=True)


def requantized(llama_quantize: Path, folder: Path, kind: str) -> Path:
    """The packaged GGUF requantized to `kind` (a ggml type, e.g. Q8_0) by llama.cpp's `llama-quantize`, in
    `folder`."""
    out = folder / f"{SMOLLM2.gguf_path().stem.rsplit('.', 1)[0]}.{kind}.gguf"
    subprocess.run([str(llama_quantize), "--allow-requantize", str(SMOLLM2.gguf_path()), str(out), kind],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


def openvino_genai_rates(streams: list[int], tokens: int, gguf: Path) -> dict:
    """Every stream's request added at once, then `step()` until all finish; TTFT per request from its first
    readable token, TPOT from there to its end."""
    import openvino_genai as genai

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
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": question(i)}], add_generation_prompt=True)
                   for i in range(n)]
        with PeakPSS(os.getpid()) as memory, CPUTime(own=IN_PROCESS) as cpu:
            began = time.perf_counter()
            handles = [pipe.add_request(i, prompt, config) for i, prompt in enumerate(prompts)]
            first: dict[int, float] = {}
            last: dict[int, float] = {}
            while pipe.has_non_finished_requests():
                pipe.step()
                now = time.perf_counter()
                for i, handle in enumerate(handles):
                    if i not in first and handle.can_read():
                        first[i] = now
                    if i not in last and handle.get_status() == genai.GenerationStatus.FINISHED:
                        last[i] = now
            wall = time.perf_counter() - began
        ends = {i: last.get(i, began + wall) for i in range(n)}
        rates[n] = summary(n, tokens, wall, [first[i] - began for i in range(n)],
                           [(ends[i] - first[i]) / max(1, tokens - 1) for i in range(n)], memory.peak_mib, cpu)
        rates[n]["gguf"] = gguf.name
    return rates


@contextlib.contextmanager
def llama_server(binary: Path, slots: int, context_per_slot: int = 512) -> Iterator[tuple[str, int]]:
    """`llama-server` on the packaged GGUF, `slots` parallel slots (continuous batching), on a free loopback port;
    yields its base URL and process id once it answers, stops it afterwards."""
    import socket

    from openai import OpenAI

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([str(binary), "-m", str(SMOLLM2.gguf_path()), "--host", "127.0.0.1", "--port", str(port),
                               "-np", str(slots), "-cb", "-c", str(slots * context_per_slot),
                               "-t", str(os.cpu_count())], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        deadline = time.monotonic() + 120
        while True:
            try:
                client.models.list()
                break
            except Exception:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("llama-server did not start")
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}", server.pid
    finally:
        server.terminate()
        server.wait(30)


def llama_server_rates(binary: Path, streams: list[int], tokens: int) -> dict:
    """`llama-server` with as many parallel slots as the most streams, through the OpenAI SDK's streamed chat
    completions (`ignore_eos` so every stream makes `tokens` tokens)."""
    with llama_server(binary, max(streams)) as (url, pid):
        return closed_loop(openai_stream(f"{url}/v1", "gguf", tokens), streams, tokens, pid)


def genai_q8_0_rates(llama_quantize: Path, streams: list[int], tokens: int) -> dict:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        return openvino_genai_rates(streams, tokens, requantized(llama_quantize, Path(folder), "Q8_0"))


def transformers_rates(artifacts: Path, streams: list[int], tokens: int) -> dict:
    """`generate` on one static batch: tokens/s and memory (no per-stream TTFT or TPOT: the batch ends as one)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zerocheck.tokenizer.text_tokenizer import MODEL_SUBDIR

    model_dir = artifacts / MODEL_SUBDIR
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rates = {}
    for n in [min(streams), *streams]:
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": question(i)}], tokenize=False,
                                               add_generation_prompt=True) for i in range(n)]
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        torch.manual_seed(0)
        with PeakPSS(os.getpid()) as memory, CPUTime(own=IN_PROCESS) as cpu:
            began = time.perf_counter()
            with torch.inference_mode():
                model.generate(**batch, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=True,
                               pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id, **SAMPLING)
            wall = time.perf_counter() - began
        rates[n] = {"tokens_per_s": n * tokens / wall, "peak_pss_mib": memory.peak_mib,
                    "cpu_ms_per_token": cpu_per_token(cpu, n * tokens)}
    return rates


def measure(system: str, args: argparse.Namespace) -> dict:
    """One system's rates, in a subprocess of its own (each runtime's threads and memory start clean)."""
    command = [sys.executable, __file__, "--measure", system, "--artifacts", str(args.artifacts),
               "--tokens", str(args.tokens), "--streams", *map(str, args.streams)]
    if args.llama_server:
        command += ["--llama-server", str(args.llama_server)]
    if args.llama_quantize:
        command += ["--llama-quantize", str(args.llama_quantize)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1][:300]}
    return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


SYSTEMS = {
    "zerocheck": lambda a: zerocheck_rates(a.artifacts, a.streams, a.tokens, None),
    "zerocheck checked": lambda a: zerocheck_rates(a.artifacts, a.streams, a.tokens, None, zerocheck=False),
    "zerocheck fp32": lambda a: zerocheck_rates(a.artifacts, a.streams, a.tokens, {"backend": "openvino", "dtype": "fp32"}),
    "zerocheck bf16": lambda a: zerocheck_rates(a.artifacts, a.streams, a.tokens, {"dtype": "bf16"}),
    "OpenVINO GenAI": lambda a: openvino_genai_rates(a.streams, a.tokens, SMOLLM2.gguf_path()),
    "OpenVINO GenAI Q8_0": lambda a: genai_q8_0_rates(a.llama_quantize, a.streams, a.tokens),
    "llama.cpp": lambda a: llama_server_rates(a.llama_server, a.streams, a.tokens),
    "transformers fp32": lambda a: transformers_rates(a.artifacts, a.streams, a.tokens),
}


def chart(results: dict, streams: list[int], path: Path, title: str) -> None:
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
    axis.set_title(title, fontsize=9)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def _median(values: Iterable) -> object:
    """The median of numbers; of dicts of numbers, key by key (a key a round lacks counts as 0); else the first."""
    values = list(values)
    if isinstance(values[0], dict):
        return {key: statistics.median(v.get(key, 0.0) for v in values) for key in values[0]}
    return statistics.median(values) if isinstance(values[0], (int, float)) else values[0]


def median_rates(rounds: list[dict], streams: list[int]) -> dict:
    """One system's rounds as one result: per stream count, each figure's median over the rounds that measured it
    (with `tokens_per_s_rounds`, every round's tokens/s; `failed_rounds`, the errors of the others); the first
    error when no round did."""
    done = [rates for rates in rounds if "error" not in rates]
    if not done:
        return rounds[0]
    merged: dict = {}
    if len(done) < len(rounds):
        merged["failed_rounds"] = [rates["error"] for rates in rounds if "error" in rates]
    for n in streams:
        measured = [rates[n] for rates in done if n in rates]
        if measured:
            merged[n] = {key: _median(r[key] for r in measured) for key in measured[0]}
            merged[n]["tokens_per_s_rounds"] = [r["tokens_per_s"] for r in measured]
    return merged


def peer_ratios(results: dict, streams: list[int]) -> dict[str, float]:
    """The targets as ratios: tokens/s of both zerocheck paths and TTFT p50 at the most streams against OpenVINO
    GenAI (and zerocheck's tokens/s against GenAI on the Q8_0 GGUF), peak PSS against llama-server (when
    measured)."""
    ratios = {}
    genai, llama = results.get("OpenVINO GenAI", {}), results.get("llama.cpp", {})
    for system in ("zerocheck", "zerocheck checked"):
        for n in streams:
            if n in results.get(system, {}) and n in genai:
                ratios[f"{system} / OpenVINO GenAI, tokens/s, {n} streams"] = (
                    results[system][n]["tokens_per_s"] / genai[n]["tokens_per_s"])
    for n in streams:
        if n in results.get("zerocheck", {}) and n in results.get("OpenVINO GenAI Q8_0", {}):
            ratios[f"zerocheck / OpenVINO GenAI Q8_0, tokens/s, {n} streams"] = (
                results["zerocheck"][n]["tokens_per_s"] / results["OpenVINO GenAI Q8_0"][n]["tokens_per_s"])
    top = max(streams)
    if top in results.get("zerocheck", {}) and top in genai:
        ratios[f"zerocheck / OpenVINO GenAI, TTFT p50, {top} streams"] = (
            results["zerocheck"][top]["ttft_p50_s"] / genai[top]["ttft_p50_s"])
    for n in streams:
        if n in results.get("zerocheck", {}) and n in llama:
            ratios[f"zerocheck / llama-server, peak PSS, {n} streams"] = (
                results["zerocheck"][n]["peak_pss_mib"] / llama[n]["peak_pss_mib"])
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=paths.artifacts_dir())
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--llama-server", type=Path, default=None, help="a llama-server binary (else not measured)")
    parser.add_argument("--llama-quantize", type=Path, default=None,
                        help="llama.cpp's llama-quantize (the same build), for OpenVINO GenAI on a Q8_0 GGUF")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure every system this many times, round-robin; each figure is the median")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS), help="which to measure")
    parser.add_argument("--measure", choices=SYSTEMS, help=argparse.SUPPRESS)  # subprocess mode: print JSON
    args = parser.parse_args()
    args.artifacts = args.artifacts.resolve()
    if args.measure:
        print(json.dumps(SYSTEMS[args.measure](args)))
        return 0
    machine = cpu()
    kind = cpu_kind(machine["flags"])
    results: dict[str, dict] = {}
    for system in args.systems:
        if system == "llama.cpp" and args.llama_server is None:
            results[system] = {"error": "not measured: no --llama-server binary"}
        elif system == "OpenVINO GenAI Q8_0" and args.llama_quantize is None:
            results[system] = {"error": "not measured: no --llama-quantize binary"}
        elif system == "zerocheck bf16" and kind != "avx512-bf16":
            results[system] = {"error": "not measured: the CPU does not multiply bf16"}
    rounds: dict[str, list[dict]] = {system: [] for system in args.systems if system not in results}
    for round_ in range(args.rounds):  # every system once a round: a drift of the host spreads over all of them
        for system, measured in rounds.items():
            print(f"measuring {system} (round {round_ + 1} of {args.rounds}) ...", flush=True)
            measured.append(measure(system, args))
    for system in args.systems:
        if system in rounds:
            results[system] = median_rates(rounds[system], args.streams)
    width = max(len(system) for system in results) + 2
    print(f"\n{'tokens/s (TTFT p50 s, TPOT p50 ms, peak PSS MiB)':<{width}}")
    for system, rates in results.items():
        cells = []
        for n in args.streams:
            r = rates.get(n)
            cells.append("-" if r is None else f"{r['tokens_per_s']:.1f} ({r.get('ttft_p50_s', float('nan')):.2f}, "
                         f"{r.get('tpot_p50_ms', float('nan')):.1f}, {r['peak_pss_mib']:.0f})")
        print(f"{system:<{width}}" + " | ".join(cells) + (f"  ({rates['error']})" if "error" in rates else "")
              + (f"  (failed rounds: {rates['failed_rounds']})" if "failed_rounds" in rates else ""))
    top = max(args.streams)
    print(f"\nCPU ms per output token at {top} streams (all processes; the largest roles)")
    for system, rates in results.items():
        if top in rates and "cpu_ms_per_token" in rates[top]:
            print(f"{system:<{width}}" + cpu_split(rates[top]["cpu_ms_per_token"]))
    ratios = peer_ratios(results, args.streams)
    for name, ratio in ratios.items():
        print(f"{name}: {ratio:.2f}x")
    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["benchmarks/peers.py", *sys.argv[1:]])
    name = f"peers-{kind}"
    (args.out / f"{name}.json").write_text(json.dumps(
        {"command": command, "cpu": machine, "commit": commit(), "tokens": args.tokens, "streams": args.streams,
         "rounds": args.rounds, "sampling": SAMPLING, "results": results, "ratios": ratios}, indent=2, default=str) + "\n")
    chart(results, args.streams, args.out / f"{name}.png",
          f"SmolLM2-135M-Instruct, {machine['model']}, {machine['cores']} cores ({machine['flags']})")
    print(f"wrote {args.out / name}.json and {args.out / name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
