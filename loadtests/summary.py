"""`summarize(records)`: P50/P95/P99 of TTFT, ITL, TPOT and end-to-end latency, throughput, errors and bypass
rate per sampler path (and over all requests), from the request log; `format_table` renders it for a terminal."""
from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

QUANTILES = (50, 95, 99)
TIMINGS_MS = {"ttft_ms": "ttft_s", "itl_ms": "itls_s", "tpot_ms": "tpot_s", "latency_ms": "latency_s"}
ALL = "all"


def quantiles_ms(values_s: list[float]) -> dict[str, float | None]:
    """{"p50", "p95", "p99", "mean"} in ms of `values_s` (None each when empty)."""
    if not values_s:
        return {**{f"p{q}": None for q in QUANTILES}, "mean": None}
    ms = np.asarray(values_s, dtype=float) * 1000.0
    return {**{f"p{q}": round(float(np.percentile(ms, q)), 3) for q in QUANTILES}, "mean": round(float(ms.mean()), 3)}


def _values(records: list[dict[str, Any]], field: str) -> list[float]:
    values: list[float] = []
    for record in records:
        value = record.get(field)
        if isinstance(value, list):
            values += value
        elif value is not None:
            values.append(value)
    return values


def summarize_path(records: list[dict[str, Any]], window_s: float) -> dict[str, Any]:
    """The summary of the records of one path over a run of `window_s` seconds."""
    ok = [r for r in records if not r["error"]]
    failed = [r for r in records if r["error"]]
    tokens = sum(r["output_tokens"] for r in ok)
    return {
        "requests": len(ok),
        "errors": len(failed),
        "error_messages": dict(Counter(r["error"][:200] for r in failed).most_common(5)),
        **{name: quantiles_ms(_values(ok, field)) for name, field in TIMINGS_MS.items()},
        "requests_per_s": round(len(ok) / window_s, 3) if window_s else 0.0,
        "output_tokens_per_s": round(tokens / window_s, 3) if window_s else 0.0,
        "output_tokens": tokens,
        "bypass_rate": round(sum(r["bypass"] for r in ok) / len(ok), 4) if ok else None,
        "served_by": dict(Counter(r["sampler"] for r in ok)),
        "protocols": dict(Counter(r["protocol"] for r in records)),
    }


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """{"duration_s", "paths": {path: summary, ..., "all": summary}}; throughput over the first send to the last end."""
    window_s = max((r["end"] for r in records), default=0.0) - min((r["start"] for r in records), default=0.0)
    paths = sorted({r["path"] for r in records})
    summary = {path: summarize_path([r for r in records if r["path"] == path], window_s) for path in paths}
    summary[ALL] = summarize_path(records, window_s)
    return {"duration_s": round(window_s, 3), "paths": summary}


ROWS = [("requests", "requests"), ("errors", "errors"), ("req/s", "requests_per_s"),
        ("output tok/s", "output_tokens_per_s"), ("bypass rate", "bypass_rate")]


def format_table(summary: dict[str, Any]) -> str:
    """Metrics as rows, paths as columns."""
    paths = summary["paths"]
    lines = [("", *paths)]
    lines += [(label, *(_cell(paths[p][key]) for p in paths)) for label, key in ROWS]
    for name in TIMINGS_MS:
        for stat in ("p50", "p95", "p99"):
            label = f"{name.removesuffix('_ms').upper()} {stat} ms"
            lines.append((label, *(_cell(paths[p][name][stat]) for p in paths)))
    widths = [max(len(row[i]) for row in lines) for i in range(len(lines[0]))]
    rendered = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
                for row in lines]
    return f"{len(paths) - 1} path(s) over {summary['duration_s']:.1f} s\n" + "\n".join(rendered)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)
