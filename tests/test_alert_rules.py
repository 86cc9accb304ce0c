"""deploy/prometheus/{prometheus.yml,alerts.yml} and deploy/grafana/zerocheck.json: structure, metric names that
exist (server, Triton, load client, recording rules), and `promtool check` when promtool is installed."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from zerocheck.loadtests.client_textfile import CLIENT_METRICS

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
RULES = DEPLOY / "prometheus" / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "zerocheck.json"
SERVER_METRICS = {
    "zerocheck_requests_total", "zerocheck_degraded_total", "zerocheck_request_errors_total",
    "zerocheck_generated_tokens_total", "zerocheck_active_sequences", "zerocheck_kv_slots_in_use",
    "zerocheck_kv_slots_total", "zerocheck_decoder_seconds_total",
    *(f"{h}_{suffix}" for h in ("zerocheck_time_to_first_token_seconds", "zerocheck_time_per_output_token_seconds")
      for suffix in ("bucket", "sum", "count")),
}
# the front end's (zerocheck.frontend.metrics), on its OpenAI / Anthropic port
FRONTEND_METRICS = {"zerocheck_frontend_responses_total", "zerocheck_frontend_client_disconnects_total",
                    "zerocheck_frontend_sampler_path_total", "zerocheck_frontend_streamed_tokens_total",
                    "zerocheck_frontend_active_requests", "zerocheck_frontend_forward_seconds"}
TRITON_METRICS = {"nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
                  "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                  "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
                  "nv_inference_compute_output_duration_us"}
PROMQL_WORDS = {"by", "on", "and", "or", "unless", "bool", "ignoring", "group_left", "group_right", "without",
                "offset", "le", "inf", "nan"}
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")


def metric_names(expr: str) -> set[str]:
    """Metric (and recording-rule) names in a PromQL expression: identifiers that are not functions,
    keywords, label names, label values, durations or Grafana variables."""
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\$\w+", "", expr)
    expr = re.sub(r"\b(by|on|without|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*(?!\s*\()(?![a-zA-Z0-9_:])", expr)
    return {n for n in names if n.lower() not in PROMQL_WORDS}


def load_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def known_names() -> set[str]:
    recorded = {rule["record"] for rule in load_rules() if "record" in rule}
    return SERVER_METRICS | FRONTEND_METRICS | TRITON_METRICS | set(CLIENT_METRICS) | recorded


def test_metric_names_of_an_expression() -> None:
    expr = 'histogram_quantile(0.95, sum by (le, sampler) (rate(x_bucket{a="b"}[5m]))) - on (sampler) y:z > 0.15'
    assert metric_names(expr) == {"x_bucket", "y:z"}


def test_rules_are_well_formed() -> None:
    rules = load_rules()
    alerts = [rule for rule in rules if "alert" in rule]
    assert {a["alert"] for a in alerts} >= {"ZerocheckBypassRateLow", "ZerocheckTimeToFirstTokenHigh",
                                           "ZerocheckErrorRateHigh", "ZerocheckClientServerGap",
                                           "ZerocheckHeaderBypassRateLow", "ZerocheckBetaHeaderNotTakingEffect"}
    for rule in rules:
        assert isinstance(rule["expr"], str) and rule["expr"].strip(), rule
        assert ("alert" in rule) != ("record" in rule), rule
    for alert in alerts:
        assert DURATION.match(str(alert["for"])), alert["alert"]
        assert alert["labels"]["severity"] in ("warning", "critical"), alert["alert"]
        assert alert["annotations"]["summary"].strip() and alert["annotations"]["description"].strip()


def test_rules_and_dashboard_use_existing_metrics() -> None:
    known = known_names()
    exprs = [rule["expr"] for rule in load_rules()]
    exprs += [target["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"] for target in panel["targets"]]
    unknown = {name for expr in exprs for name in metric_names(expr)} - known
    assert not unknown, f"metrics that nothing exports: {sorted(unknown)}"


def test_dashboard_has_the_panels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for needle in ('bypass="true"', "zerocheck_time_to_first_token_seconds_bucket",
                   "zerocheck_time_per_output_token_seconds_bucket", "zerocheck_generated_tokens_total",
                   "nv_inference_queue_duration_us", "zerocheck_kv_slots_in_use", "zerocheck_kv_slots_total",
                   "zerocheck_request_errors_total", "zerocheck_decoder_seconds_total"):
        assert needle in exprs, needle
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)")
@pytest.mark.parametrize("check", [["check", "rules", "alerts.yml"], ["check", "config", "prometheus.yml"]])
def test_promtool_accepts(check: list[str]) -> None:
    result = subprocess.run(["promtool", *check], cwd=DEPLOY / "prometheus", capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)")
def test_alerts_fire_on_their_series_and_stay_quiet_on_a_healthy_server() -> None:
    """alerts_test.yml: promtool feeds each alert the series that should raise it, and a healthy server's."""
    result = subprocess.run(["promtool", "test", "rules", "alerts_test.yml"], cwd=DEPLOY / "prometheus",
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_front_end_exports_the_names_the_rules_know() -> None:
    from zerocheck.frontend.metrics import FrontendMetrics

    exported = set(re.findall(r"^# TYPE (\S+) ", FrontendMetrics().text(), re.M))
    assert exported == FRONTEND_METRICS
