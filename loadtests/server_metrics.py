"""Read counters from the server's Prometheus endpoint, to check a load run against what the server counted."""
from __future__ import annotations

import re

import requests

SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(metrics_url: str, timeout: float = 5.0) -> str:
    """The text of `http://<metrics_url>/metrics`."""
    reply = requests.get(f"http://{metrics_url}/metrics", timeout=timeout)
    reply.raise_for_status()
    return reply.text


def counter_by(text: str, name: str, label: str) -> dict[str, float]:
    """Sum of the samples of metric `name` grouped by the value of `label`."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if not match or match["name"] != name:
            continue
        labels = dict(LABEL.findall(match["labels"] or ""))
        key = labels.get(label, "")
        totals[key] = totals.get(key, 0.0) + float(match["value"])
    return totals


def requests_by_sampler(metrics_url: str) -> dict[str, float]:
    """`zerocheck_requests_total` summed over `bypass`, by `sampler`."""
    return counter_by(scrape(metrics_url), "zerocheck_requests_total", "sampler")


def queue_wait(metrics_url: str) -> tuple[float, float]:
    """`zerocheck_queue_wait_seconds`' sum and count: the seconds admitted requests waited for KV-cache slots."""
    text = scrape(metrics_url)
    return (sum(counter_by(text, "zerocheck_queue_wait_seconds_sum", "").values()),
            sum(counter_by(text, "zerocheck_queue_wait_seconds_count", "").values()))
