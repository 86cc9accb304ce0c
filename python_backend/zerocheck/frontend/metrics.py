"""The front end's own Prometheus metrics (`/metrics` on its OpenAI port; Triton's stay on its metrics
port). Counters start at 0 for every known label value, so rates and alerts see a series at once."""
from __future__ import annotations

from collections import Counter

ENDPOINTS = ("chat", "completions", "models", "door")
STATUSES = ("200", "400", "404", "408", "413", "429", "499", "500", "503", "504")


class FrontendMetrics:
    def __init__(self) -> None:
        self.responses: Counter[tuple[str, str]] = Counter({(e, s): 0 for e in ENDPOINTS for s in STATUSES})
        self.disconnects: Counter[str] = Counter({e: 0 for e in ENDPOINTS})
        self.streamed_tokens = 0
        self.active_streams = 0

    def answered(self, endpoint: str, status: int) -> None:
        self.responses[(endpoint, str(status))] += 1

    def text(self) -> str:
        lines = ["# HELP zerocheck_frontend_responses_total HTTP answers of the front end by endpoint and status",
                 "# TYPE zerocheck_frontend_responses_total counter"]
        lines += [f'zerocheck_frontend_responses_total{{endpoint="{e}",status="{s}"}} {n}'
                  for (e, s), n in sorted(self.responses.items())]
        lines += ["# HELP zerocheck_frontend_client_disconnects_total requests whose client left before the answer "
                  "ended (each cancels its generation)", "# TYPE zerocheck_frontend_client_disconnects_total counter"]
        lines += [f'zerocheck_frontend_client_disconnects_total{{endpoint="{e}"}} {n}'
                  for e, n in sorted(self.disconnects.items())]
        lines += ["# HELP zerocheck_frontend_streamed_tokens_total completion tokens sent by the OpenAI API",
                  "# TYPE zerocheck_frontend_streamed_tokens_total counter",
                  f"zerocheck_frontend_streamed_tokens_total {self.streamed_tokens}",
                  "# HELP zerocheck_frontend_active_requests OpenAI requests being answered now",
                  "# TYPE zerocheck_frontend_active_requests gauge",
                  f"zerocheck_frontend_active_requests {self.active_streams}"]
        return "\n".join(lines) + "\n"
