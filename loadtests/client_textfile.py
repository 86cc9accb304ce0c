"""`client_latency.prom`: the load run's client-side quantiles in Prometheus' text format, for node_exporter's
textfile collector (`--collector.textfile.directory`); deploy/prometheus/alerts.yml compares them with the
server's histograms (ZerocheckClientServerGap)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from zerocheck.loadtests.summary import ALL, QUANTILES

CLIENT_METRICS = {  # metric name -> (summary field, help)
    "zerocheck_client_request_latency_seconds": ("latency_ms", "end-to-end request latency seen by the load client"),
    "zerocheck_client_time_to_first_token_seconds": ("ttft_ms", "time to first token seen by the load client"),
    "zerocheck_client_time_per_output_token_seconds": ("tpot_ms", "time per output token seen by the load client"),
}


def client_latency_text(summary: dict[str, Any]) -> str:
    """Gauges `<metric>{sampler, quantile}` in seconds, one per path (not "all") and quantile."""
    lines: list[str] = []
    for metric, (field, help_text) in CLIENT_METRICS.items():
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
        for path, stats in summary["paths"].items():
            if path == ALL:
                continue
            for q in QUANTILES:
                value = stats[field][f"p{q}"]
                if value is not None:
                    lines.append(f'{metric}{{sampler="{path}",quantile="{q / 100:g}"}} {value / 1000:.6f}')
    return "\n".join(lines) + "\n"


def write_client_latency(summary: dict[str, Any], path: Path) -> Path:
    """Write atomically (the collector may read at any time)."""
    temporary = path.with_suffix(".prom.tmp")
    temporary.write_text(client_latency_text(summary))
    temporary.replace(path)
    return path
