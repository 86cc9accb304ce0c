"""The front end's own Prometheus metrics (`/metrics` on its OpenAI port; Triton's stay on its metrics
port). Counters start at 0 for every known label value, so rates and alerts see a series at once."""
from __future__ import annotations

from collections import Counter, deque

QUANTILES = (0.5, 0.95, 0.99)

ENDPOINTS = ("chat", "completions", "models", "door")
STATUSES = ("200", "400", "404", "408", "413", "429", "499", "500", "503", "504")


class FrontendMetrics:
    def __init__(self) -> None:
        self.responses: Counter[tuple[str, str]] = Counter({(e, s): 0 for e in ENDPOINTS for s in STATUSES})
        self.disconnects: Counter[str] = Counter({e: 0 for e in ENDPOINTS})
        self.streamed_tokens = 0
        self.active_streams = 0
        # per streamed piece: seconds from its arrival from Triton to its bytes written to the client
        self.forward_s: dict[str, deque[float]] = {"openai": deque(maxlen=20000), "door": deque(maxlen=20000)}

    def forwarded(self, endpoint: str, seconds: float) -> None:
        self.forward_s[endpoint].append(seconds)

    def forward_quantiles(self, endpoint: str) -> dict[float, float]:
        """The quantiles of the recent forwarding times of `endpoint` (seconds); {} before any."""
        ordered = sorted(self.forward_s[endpoint])
        return {q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in QUANTILES} if ordered else {}

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
                  f"zerocheck_frontend_active_requests {self.active_streams}",
                  "# HELP zerocheck_frontend_forward_seconds per streamed piece, arrival from Triton to written to "
                  "the client (the latency the front end adds), over the last 20000 pieces",
                  "# TYPE zerocheck_frontend_forward_seconds summary"]
        for endpoint in self.forward_s:
            lines += [f'zerocheck_frontend_forward_seconds{{endpoint="{endpoint}",quantile="{q}"}} {v:.9f}'
                      for q, v in self.forward_quantiles(endpoint).items()]
            lines.append(f'zerocheck_frontend_forward_seconds_count{{endpoint="{endpoint}"}} {len(self.forward_s[endpoint])}')
        return "\n".join(lines) + "\n"
