"""The front end's process: the OpenAI and Anthropic APIs on one port, the guarded door to Triton's HTTP on
another, both under the same `HttpLimits` (body size and time, header size, idle connections)."""
from __future__ import annotations

import asyncio
import json
import logging
import signal
from dataclasses import dataclass
from pathlib import Path

import tritonclient.grpc.aio as aiogrpc
from aiohttp import web

from zerocheck.clients.aio_grpc_transport import close_when_done
from zerocheck.clients.endpoint import MAX_MESSAGE_BYTES
from zerocheck.frontend.anthropic_routes import AnthropicRoutes
from zerocheck.frontend.auth import client_key_middleware
from zerocheck.frontend.door import TritonDoor
from zerocheck.frontend.limits import HttpLimits
from zerocheck.frontend.errors import FrontendError
from zerocheck.frontend.metrics import FrontendMetrics
from zerocheck.frontend.openai_routes import OpenAIRoutes

log = logging.getLogger("zerocheck.frontend")


@dataclass(frozen=True)
class FrontendOptions:
    grpc_url: str  # Triton's gRPC endpoint: the OpenAI API calls `model` there
    host: str = "127.0.0.1"
    openai_port: int | None = 9000  # the OpenAI and Anthropic APIs; None: neither
    door_port: int | None = None  # with triton_http_url: the public HTTP port
    triton_http_url: str | None = None  # Triton's internal HTTP endpoint (http://127.0.0.1:PORT)
    model: str = "generate"  # every door runs there; calling it directly saves a forwarding hop
    served_model: str = "zerocheck"
    artifacts: Path | None = None  # the tokenizer, for log-probability token texts
    limits: HttpLimits = HttpLimits()
    api_key: str | None = None  # the key clients of the OpenAI and Anthropic APIs must send (None: open)


@web.middleware
async def json_errors(request: web.Request, handler):
    """Any failure a handler did not answer itself: a JSON error in the API's shape (Anthropic's under
    /v1/messages, else OpenAI's), never a traceback."""
    def answer(error: FrontendError) -> web.Response:
        return AnthropicRoutes.error_response(error) if request.path.startswith("/v1/messages") else error.response()

    try:
        return await handler(request)
    except web.HTTPException as error:  # aiohttp's own (404 route, 405 method): as JSON errors
        if error.status < 400:
            raise
        return answer(FrontendError(error.status, error.reason or "error"))
    except FrontendError as error:
        return answer(error)
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unexpected error answering %s %s", request.method, request.path)
        return answer(FrontendError(500, "internal error; see the front end's log"))


def load_tokenizer_of(artifacts: Path | None):
    """The served model's tokenizer (token texts of log-probabilities), None when the artifacts hold none."""
    from zerocheck.tokenizer import load_tokenizer

    try:
        return load_tokenizer(artifacts) if artifacts is not None else None
    except FileNotFoundError as error:
        log.warning("no tokenizer (%s): requests for logprobs will be refused", error)
        return None


class Frontend:
    """Both listeners and the shared gRPC client; `start()` binds, `stop()` closes."""

    def __init__(self, options: FrontendOptions) -> None:
        self.options = options
        self.metrics = FrontendMetrics()
        self.client = aiogrpc.InferenceServerClient(options.grpc_url, channel_args=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES), ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
        self.runners: list[web.AppRunner] = []

    def openai_app(self) -> web.Application:
        """The OpenAI and the Anthropic APIs, on one port."""
        options = self.options
        middlewares = [json_errors]  # outermost: it renders the key check's refusals too
        if options.api_key is not None:
            middlewares.append(client_key_middleware(options.api_key, self.metrics))
        app = web.Application(middlewares=middlewares)
        tokenizer = load_tokenizer_of(options.artifacts)
        OpenAIRoutes(self.client, options.model, options.served_model, tokenizer, self.metrics,
                     options.limits).add_to(app)
        AnthropicRoutes(self.client, options.model, options.served_model, tokenizer, self.metrics,
                        options.limits).add_to(app)
        return app

    def door_app(self) -> web.Application:
        app = web.Application(middlewares=[json_errors])
        TritonDoor(self.options.triton_http_url, self.options.limits, self.metrics).add_to(app)
        return app

    async def start(self) -> dict[str, int]:
        """Bind the listeners; returns {"openai": port, "door": port} as bound (0 picks a free port)."""
        apps = {}
        if self.options.openai_port is not None:
            apps["openai"] = (self.openai_app(), self.options.openai_port)
        if self.options.door_port is not None and self.options.triton_http_url:
            apps["door"] = (self.door_app(), self.options.door_port)
        bound = {}
        for name, (app, port) in apps.items():
            runner = web.AppRunner(app, handler_cancellation=True, access_log=None, **self.options.limits.handler_args())
            await runner.setup()
            site = web.TCPSite(runner, self.options.host, port, reuse_address=True)
            await site.start()
            self.runners.append(runner)
            bound[name] = runner.addresses[0][1]
        return bound

    async def stop(self) -> None:
        for runner in self.runners:
            await runner.cleanup()
        await close_when_done(self.client)


async def serve_forever(options: FrontendOptions, ready_file: Path | None = None) -> None:
    """Run until SIGTERM/SIGINT; writes the bound ports as JSON to `ready_file` once listening."""
    frontend = Frontend(options)
    bound = await frontend.start()
    message = json.dumps({"ports": bound, "served_model": options.served_model})
    if ready_file is not None:
        ready_file.write_text(message)
    log.info("zerocheck front end listening: %s", message)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await frontend.stop()


__all__ = ["Frontend", "FrontendOptions", "serve_forever"]
