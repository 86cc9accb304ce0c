"""The front end's own Prometheus metrics (`/metrics` on its OpenAI port; Triton's stay on its metrics
port). Counters start at 0 for every known label value, so rates and alerts see a series at once."""
from __future__ import annotations

from collections import Counter, deque
from typing import Mapping

from zerocheck.api.headers import ANTHROPIC_BYPASS_HEADER

QUANTILES = (0.5, 0.95, 0.99)

ENDPOINTS = ("chat", "completions", "messages", "count_tokens", "models", "door")
GENERATING = ("chat", "completions", "messages")  # the endpoints whose answers say which sampler path served them
STATUSES = ("200", "400", "401", "404", "408", "413", "429", "499", "500", "503", "504")
FLAGS = ("true", "false")


class FrontendMetrics:
    def __init__(self) -> None:
        self.responses: Counter[tuple[str, str]] = Counter({(e, s): 0 for e in ENDPOINTS for s in STATUSES})
        self.disconnects: Counter[str] = Counter({e: 0 for e in ENDPOINTS})
        # answers by endpoint, whether the request asked for the zero-check path, and the bypass header it carried
        self.paths: Counter[tuple[str, str, str]] = Counter(
            {(e, asked, bypass): 0 for e in GENERATING for asked in FLAGS for bypass in FLAGS})
        self.streamed_tokens = 0
        self.active_streams = 0
        # per streamed piece: seconds from its arrival from Triton to its bytes written to the client
        self.forward_s: dict[str, deque[float]] = {name: deque(maxlen=20000) for name in ("openai", "anthropic", "door")}

    def forwarded(self, endpoint: str, seconds: float) -> None:
        self.forward_s[endpoint].append(seconds)

    def forward_quantiles(self, endpoint: str) -> dict[float, float]:
        """The quantiles of the recent forwarding times of `endpoint` (seconds); {} before any."""
        ordered = sorted(self.forward_s[endpoint])
        return {q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in QUANTILES} if ordered else {}

    def served_path(self, endpoint: str, asked_zero_check: bool, path_headers: Mapping[str, str]) -> None:
        """A generation was answered with `path_headers` (its first response arrived)."""
        self.paths[(endpoint, "true" if asked_zero_check else "false", path_headers[ANTHROPIC_BYPASS_HEADER])] += 1

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
        lines += ["# HELP zerocheck_frontend_sampler_path_total generations answered, by whether the request asked "
                  "for the zero-check path (header zerocheck, anthropic-beta or the API's default) and the "
                  "X-Anthropic-ZeroCheck-Bypass header of the answer (true: the zero-check path served it)",
                  "# TYPE zerocheck_frontend_sampler_path_total counter"]
        lines += [f'zerocheck_frontend_sampler_path_total{{endpoint="{e}",zero_check_requested="{a}",bypass="{b}"}} {n}'
                  for (e, a, b), n in sorted(self.paths.items())]
        lines += ["# HELP zerocheck_frontend_streamed_tokens_total completion tokens sent by the OpenAI and Anthropic APIs",
                  "# TYPE zerocheck_frontend_streamed_tokens_total counter",
                  f"zerocheck_frontend_streamed_tokens_total {self.streamed_tokens}",
                  "# HELP zerocheck_frontend_active_requests OpenAI and Anthropic generation requests being answered now",
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
