"""HTTP and gRPC abuse sweep: after every hostile request, is the server alive, ready and generating?

    python benchmarks/http_sweep.py                 # through zerocheck's door (what `zerocheck serve` exposes)
    python benchmarks/http_sweep.py --direct        # straight at Triton 2.51's own HTTP endpoint (the "before")

Cases: bodies from 0 B to 64 MB to `generate` and `infer` (Content-Length and chunked, JSON and junk),
a truncated body, a body that never finishes, 1 MB of headers, 200 headers, unknown routes and methods
(HTTP), and `text_input` messages of 5 to 256 MB (gRPC). One server of the tiny model; `--direct`
restarts it when a request killed it. Prints a table (case -> status -> alive) and writes JSON
(`--json`). Exit status 1 when, through the door, the server died or a body above the limit got
anything but 413.
"""
from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

ROOT = Path(__file__).resolve().parents[1]
from zerocheck import paths
from zerocheck.frontend.limits import HttpLimits  # noqa: E402
from zerocheck.serve.server import TritonServer  # noqa: E402
from zerocheck.serve.stack import ServingStack  # noqa: E402

MB = 1024 * 1024
LIMITS = HttpLimits(body_timeout_s=2.0, header_timeout_s=3.0)
SIZES_MB = (0, 0.5, 1, 2, 3, 4, 5, 8, 10, 20, 35, 50, 64)
SCRATCH = Path(tempfile.gettempdir()) / "zerocheck-http-sweep-body.json"


@dataclass
class Row:
    case: str
    bytes: int
    status: str  # the HTTP status, or what happened instead
    alive: bool
    restarted: bool = False


def json_body(size: int) -> bytes:
    """A JSON generate body of `size` bytes (the prompt pads it)."""
    head, tail = b'{"text_input": "', b'", "max_tokens": 4}'
    return head + b"a" * max(0, size - len(head) - len(tail)) + tail


def http_case(url: str, path: str, body: bytes, chunked: bool) -> str:
    data = (body[i:i + 65536] for i in range(0, len(body), 65536)) if chunked else body
    try:
        return str(requests.post(f"http://{url}{path}", data=data, timeout=60).status_code)
    except requests.RequestException as error:
        return f"no answer ({type(error).__name__})"


def curl_case(url: str, path: str, body: bytes, scratch: Path) -> str:
    """POST `body` with curl, as a user would: for bodies over 1 MB curl sends `Expect: 100-continue`."""
    scratch.write_bytes(body)
    done = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "60", "--data-binary",
                           f"@{scratch}", f"http://{url}{path}"], capture_output=True, text=True)
    return done.stdout or f"no answer (curl {done.returncode})"


def raw_case(url: str, payload: bytes, wait_s: float) -> str:
    host, port = url.split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(payload)
            sock.settimeout(wait_s)
            try:
                answer = sock.recv(4096)
            except (TimeoutError, ConnectionResetError):
                return "closed" if wait_s < 1 else "no answer"
        return answer.split(b"\r\n", 1)[0].decode(errors="replace").split(" ", 2)[1] if answer else "closed"
    except OSError as error:
        return f"no answer ({type(error).__name__})"


def grpc_case(grpc_url: str, size: int) -> str:
    tensor = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"a" * size]], dtype=object))
    client = grpcclient.InferenceServerClient(grpc_url, channel_args=[
        ("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1)])
    try:
        client.infer("preprocessing", [tensor], client_timeout=120)
        return "OK"
    except InferenceServerException as error:
        return str(error.status() or "error").removeprefix("StatusCode.")
    finally:
        client.close()


def healthy(server: TritonServer) -> bool:
    """Alive, ready, and a short generation works (over gRPC)."""
    if not server.is_alive():
        return False
    try:
        ready = requests.get(f"http://{server.http_url}/v2/health/ready", timeout=10).status_code == 200
        tensor = grpcclient.InferInput("text_input", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[b"def f():"]], dtype=object))
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            client.infer("preprocessing", [tensor])
        return ready
    except Exception:  # noqa: BLE001 - any failure here means "not serving"
        return False


def cases(sizes_mb: tuple[float, ...] = SIZES_MB) -> list[tuple[str, int, callable]]:
    """(case, bytes, send(server) -> status): every hostile request of the sweep."""
    out = []
    for mb in sizes_mb:
        size = int(mb * MB)
        for path, label in (("/v2/models/ensemble/generate", "generate"), ("/v2/models/ensemble/infer", "infer")):
            out.append((f"{label} JSON {mb:g} MB", size,
                        lambda server, p=path, s=size: http_case(server.http_url, p, json_body(s), False)))
            out.append((f"{label} junk {mb:g} MB", size,
                        lambda server, p=path, s=size: http_case(server.http_url, p, b"\xff\x00junk" * (s // 6), False)))
        out.append((f"generate JSON {mb:g} MB chunked", size, lambda server, s=size: http_case(
            server.http_url, "/v2/models/ensemble/generate", json_body(s), True)))
        if shutil.which("curl"):
            out.append((f"generate JSON {mb:g} MB with curl", size, lambda server, s=size: curl_case(
                server.http_url, "/v2/models/ensemble/generate", json_body(s), SCRATCH)))
    head = b"POST /v2/models/ensemble/generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{\"text_"
    get = b"GET /v2/health/ready HTTP/1.1\r\n"
    out += [("truncated body (client leaves)", 100000, lambda server: raw_case(server.http_url, head, 0.3)),
            ("body that never finishes", 100000,
             lambda server: raw_case(server.http_url, head, LIMITS.body_timeout_s + 5)),
            ("headers that never finish", 0, lambda server: raw_case(server.http_url, get, LIMITS.header_timeout_s + 5)),
            ("1 MB header", MB, lambda server: raw_case(server.http_url, get + b"Host: x\r\nX-A: " + b"z" * MB
                                                        + b"\r\n\r\n", 10)),
            ("200 headers", 0, lambda server: raw_case(server.http_url, get + b"".join(
                b"X-%d: v\r\n" % i for i in range(200)) + b"\r\n", 10)),
            ("GET /admin", 0, lambda server: http_status("GET", server, "/admin")),
            ("PUT /v2/health/ready", 0, lambda server: http_status("PUT", server, "/v2/health/ready")),
            ("DELETE /v2/models/ensemble", 0, lambda server: http_status("DELETE", server, "/v2/models/ensemble")),
            ("GET /v2/nonsense", 0, lambda server: http_status("GET", server, "/v2/nonsense"))]
    for mb in (5, 20, 200, 256):
        out.append((f"gRPC text_input {mb} MB", mb * MB, lambda server, s=mb * MB: grpc_case(server.grpc_url, s)))
    return out


def http_status(method: str, server: TritonServer, path: str) -> str:
    try:
        return str(requests.request(method, f"http://{server.http_url}{path}", timeout=10).status_code)
    except requests.RequestException as error:
        return f"no answer ({type(error).__name__})"


def start(direct: bool, artifacts: Path) -> TritonServer:
    kind = TritonServer if direct else ServingStack
    extra = {} if direct else {"limits": LIMITS, "openai": False}
    server = kind(paths.model_repository(), env={"ZEROCHECK_ARTIFACTS": str(artifacts)}, **extra)
    server.start()
    server.wait_ready(600)
    return server


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--direct", action="store_true", help="hit Triton's own HTTP endpoint, not the door")
    parser.add_argument("--artifacts", type=Path, default=ROOT / "artifacts-test")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=SIZES_MB, help="body sizes to sweep")
    args = parser.parse_args()
    server = start(args.direct, args.artifacts.resolve())
    rows: list[Row] = []
    try:
        for case, size, send in cases(tuple(args.sizes_mb)):
            status = send(server)
            time.sleep(0.3)  # a crash takes a moment to show
            alive = healthy(server)
            rows.append(Row(case, size, status, alive, restarted=not alive))
            print(f"{case:38s} {status:24s} {'alive' if alive else 'DEAD (restarted)'}", flush=True)
            if not alive:
                server.stop()
                server = start(args.direct, args.artifacts.resolve())
    finally:
        server.stop()
    if args.json:
        args.json.write_text(json.dumps([asdict(row) for row in rows], indent=1) + "\n")
    limit = LIMITS.max_body_bytes
    bad = [row for row in rows if not row.alive or (row.bytes > limit and row.case.startswith(("generate", "infer"))
                                                    and row.status != "413")]
    print(f"{len(rows)} cases, {sum(not r.alive for r in rows)} killed the server")
    return 1 if bad and not args.direct else 0


if __name__ == "__main__":
    sys.exit(main())
