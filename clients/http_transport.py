"""One attempt over HTTP (`requests`, Triton's `generate_stream` SSE endpoint), read on its own thread."""
from __future__ import annotations

import contextlib
import threading

import requests

from zerocheck.clients.endpoint import Endpoint
from zerocheck.clients.errors import Timeout, Unavailable, ZerocheckError, error_from_http
from zerocheck.clients.request import GenerateRequest
from zerocheck.clients.response import Chunk, Sink
from zerocheck.clients.sse import ends_stream, error_text, parse_event_line


def stream_url(endpoint: Endpoint) -> str:
    return f"{endpoint.http_base}/v2/models/{endpoint.model}/generate_stream"


class HttpAttempt:
    """Starts on construction; `cancel()` shuts the connection down, which cancels the request on the server."""

    def __init__(self, endpoint: Endpoint, request: GenerateRequest, parameters: dict[str, str],
                 timeout_s: float, sink: Sink) -> None:
        self._sink = sink
        self._cancelled = threading.Event()
        self._response: requests.Response | None = None
        self._session = requests.Session()
        args = {"json": {**request.values(), **parameters}, "headers": endpoint.headers(), "stream": True,
                "timeout": (endpoint.connect_timeout_s, timeout_s)}
        threading.Thread(target=self._run, args=(stream_url(endpoint), args), daemon=True).start()

    def _run(self, url: str, args: dict) -> None:
        try:
            self._read(url, args)
        except requests.ConnectTimeout as error:
            self._report(Unavailable(f"could not connect to {url}: {error}"))
        except requests.Timeout as error:
            self._report(Timeout(f"no data from {url} in time: {error}"))
        except requests.ConnectionError as error:  # refused, reset, or shut down by cancel()
            self._report(Unavailable(f"connection to {url} failed: {error}"))
        except Exception as error:  # reading a connection that cancel() shut down may raise anything
            self._report(ZerocheckError(f"reading {url} failed: {type(error).__name__}: {error}"))

    def _read(self, url: str, args: dict) -> None:
        with self._session.post(url, **args) as response:
            self._response = response
            try:
                if response.status_code != 200:
                    self._report(error_from_http(response.status_code, error_text(response.text),
                                                 response.headers.get("Retry-After")))
                    return
                response.encoding = "utf-8"
                for line in response.iter_lines(chunk_size=None, decode_unicode=True):
                    item = parse_event_line(line) if line else None
                    if item is not None:
                        self._report(item)
                    if ends_stream(item):
                        return
            finally:
                self._response = None
        self._report(None)

    def _report(self, item: Chunk | ZerocheckError | None) -> None:
        if not self._cancelled.is_set():
            self._sink(item)

    def cancel(self) -> None:
        self._cancelled.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(RuntimeError, OSError):  # the reader released or closed it meanwhile
                response.raw.shutdown()  # interrupts a read blocked on the reader thread
            response.close()
        self._session.close()
