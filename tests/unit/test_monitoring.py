"""Monitoring assets (deploy/): promtool checks, metric names in every expression, stage report.

The helpers at the top (expressions of the alert rules and the dashboard, metric names
in a PromQL expression, the known metric families) are also used by
tests/integration/test_prometheus.py, which runs every expression on a real Prometheus.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from hybrid_llm.engine.stats import TrtllmMetricsSink, VllmMetricsSink
from hybrid_llm.router.metrics import FAMILIES as ROUTER_FAMILIES
from loadtests import stage_report

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "hybrid-router.json"
ROUTER_CONFIG = ROOT / "model_repository" / "router_bls" / "config.pbtxt"
PROFILES = ROOT / "build_scripts" / "profiles"

# Triton 2.51's own families (server/src/metrics.cc, core/src/metrics.cc): per-model
# counters, the optional latency histogram, the response cache, CPU and GPU gauges.
TRITON_FAMILIES = (
    ("nv_inference_request_success", "counter"), ("nv_inference_request_failure", "counter"),
    ("nv_inference_count", "counter"), ("nv_inference_exec_count", "counter"),
    ("nv_inference_request_duration_us", "counter"), ("nv_inference_queue_duration_us", "counter"),
    ("nv_inference_compute_input_duration_us", "counter"),
    ("nv_inference_compute_infer_duration_us", "counter"),
    ("nv_inference_compute_output_duration_us", "counter"),
    ("nv_inference_pending_request_count", "gauge"),
    ("nv_inference_first_response_histogram_ms", "histogram"),
    ("nv_cache_num_hits_per_model", "counter"), ("nv_cache_num_misses_per_model", "counter"),
    ("nv_cache_hit_duration_per_model", "counter"), ("nv_cache_miss_duration_per_model", "counter"),
    ("nv_cpu_utilization", "gauge"), ("nv_cpu_memory_total_bytes", "gauge"),
    ("nv_cpu_memory_used_bytes", "gauge"), ("nv_gpu_utilization", "gauge"),
    ("nv_gpu_memory_total_bytes", "gauge"), ("nv_gpu_memory_used_bytes", "gauge"),
    ("nv_gpu_power_usage", "gauge"), ("nv_gpu_power_limit", "gauge"), ("nv_energy_consumption", "counter"),
    ("nv_pinned_memory_pool_total_bytes", "gauge"), ("nv_pinned_memory_pool_used_bytes", "gauge"),
)
# Families the router creates on the first event (errors, failovers...): no series before that.
EVENT_FAMILIES = frozenset({"router_rejected_total", "router_failovers_total", "router_cancelled_total",
                            "router_errors_total", "router_stop_requests_total"})
# Stand-ins for Grafana's variables when an expression runs outside Grafana.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "15s", "$__range": "1h"}

_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
                       "or", "unless", "offset", "inf", "nan", "atan2"})
_TOKEN = re.compile(r"""
    (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<braces>\{[^}]*\})
  | (?P<brackets>\[[^\]]*\])
  | (?P<grouping>\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\))
  | (?P<number>(?:0x[0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(?:ms|[smhdwy])?)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<other>\S)
""", re.VERBOSE)

_CALL = re.compile(r"\s*(?:(?:by|without)\s*\([^)]*\)\s*)?\(")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, labels excluded)."""
    names: set[str] = set()
    for m in _TOKEN.finditer(expr):
        if m.lastgroup != "ident":
            continue
        word = m.group("ident")
        if word.lower() in _KEYWORDS:
            continue
        if _CALL.match(expr, m.end()):  # a function, or an aggregation (its `by (...)` may come first)
            continue
        names.add(word)
    # `{__name__="x"}` selectors name metrics too.
    names |= set(re.findall(r'__name__\s*=\s*"([^"]+)"', expr))
    return names


def family_of(name: str) -> str:
    """The family a sample name belongs to (histogram suffixes stripped)."""
    return re.sub(r"_(bucket|sum|count)$", "", name)


def known_metric_names() -> set[str]:
    """Every sample name the server can export: router, engine and Triton families, histograms expanded."""
    fams: list[tuple[str, str]] = [(name, kind) for name, _, kind in ROUTER_FAMILIES]
    fams += [(name, kind) for name, _, kind in VllmMetricsSink.FAMILIES]
    fams += [(getattr(TrtllmMetricsSink, a), "gauge") for a in ("REQUEST", "KV", "GENERAL", "BATCHER")]
    fams += list(TRITON_FAMILIES)
    names = set()
    for name, kind in fams:
        names.add(name)
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


def alert_rules() -> list[dict]:
    """The alert rules of deploy/prometheus/alerts.yml, flattened over groups."""
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def alert_expressions() -> list[tuple[str, str]]:
    """(alert name, expression) for every alert rule."""
    return [(rule["alert"], " ".join(str(rule["expr"]).split())) for rule in alert_rules()]


def _panels(panels: list[dict]) -> list[dict]:
    out = []
    for p in panels:
        out.append(p)
        out.extend(_panels(p.get("panels", [])))
    return out


def dashboard() -> dict:
    """The Grafana dashboard JSON."""
    return json.loads(DASHBOARD.read_text())


def dashboard_expressions() -> list[tuple[str, str]]:
    """(panel title / refId, expression) for every Prometheus target of the dashboard."""
    out = []
    for panel in _panels(dashboard()["panels"]):
        for target in panel.get("targets", []):
            if target.get("expr"):
                out.append((f"{panel['title']} / {target.get('refId', '?')}", target["expr"]))
    return out


def runnable(expr: str) -> str:
    """The expression with Grafana's variables replaced by fixed durations."""
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    return expr


_FINAL_COMPARISON = re.compile(r"\s*(==|!=|>=|<=|>|<)\s*(-?[0-9.]+(?:[eE][+-]?\d+)?)\s*$")


def as_bool(expr: str) -> str:
    """An alert expression with its final ``<op> <number>`` turned into ``<op> bool <number>``.

    The result has a series wherever the alert's left side has data (value 0 or 1), so a
    test can tell "not firing" from "selects nothing".
    """
    m = _FINAL_COMPARISON.search(expr)
    if not m:
        raise ValueError(f"alert expression does not end in '<op> <number>': {expr}")
    return f"{expr[:m.start()]} {m.group(1)} bool {m.group(2)}"


# --- promtool ---------------------------------------------------------------------------

def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus, or "
                    "HYBRID_WITH_PROMETHEUS=1 build_scripts/setup.sh)")
    return path


def test_promtool_check_rules():
    out = subprocess.run([_promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in out.stdout


def test_promtool_check_config():
    out = subprocess.run([_promtool(), "check", "config", str(PROMETHEUS_CONFIG)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


# --- the assets -------------------------------------------------------------------------

def test_scrape_config_targets_triton_every_5s():
    cfg = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    assert cfg["global"]["scrape_interval"] == "5s"
    assert cfg["rule_files"] == ["alerts.yml"]
    (job,) = cfg["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["localhost:8002"]


def test_metric_name_parser():
    assert metric_names('histogram_quantile(0.95, sum by (engine, le) (rate(router_ttft_seconds_bucket'
                        '{engine="a", le=~"x"}[5m]))) > 0.12') == {"router_ttft_seconds_bucket"}
    assert metric_names("max by (model) (vllm:kv_cache_usage_perc) > 0.92") == {"vllm:kv_cache_usage_perc"}
    assert metric_names("sum(rate(a_total[$__rate_interval] offset 5m)) by (x) / clamp_min(b, 1e-9)") \
        == {"a_total", "b"}
    assert metric_names('(x or 0 * y) / on (engine) group_left (code) z{c="sum(q)"} > bool 2') == {"x", "y", "z"}
    assert metric_names('{__name__="nv_inference_count"}') == {"nv_inference_count"}


def test_every_metric_in_alerts_and_dashboard_is_a_real_family():
    known = known_metric_names()
    exprs = alert_expressions() + dashboard_expressions()
    assert len(exprs) > 30
    unknown = {(where, name) for where, expr in exprs for name in metric_names(expr) if name not in known}
    assert not unknown, f"metric names not exported by the server: {sorted(unknown)}"
    assert all(metric_names(expr) for _, expr in exprs), "an expression selects no metric"


def test_alerts_cover_the_required_conditions():
    used = {n for _, e in alert_expressions() for n in metric_names(e)}
    for needed in ("router_queue_depth", "router_queue_wait_seconds_bucket", "router_breaker_state",
                   "router_kv_cache_usage", "router_ttft_seconds_bucket", "router_errors_total"):
        assert needed in used, needed
    for rule in alert_rules():
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        as_bool(" ".join(str(rule["expr"]).split()))  # ends in one comparison (the integration test relies on it)


def _router_parameters() -> dict[str, str]:
    text = ROUTER_CONFIG.read_text()
    return dict(re.findall(r'key:\s*"([^"]+)"\s*value\s*\{\s*string_value:\s*"([^"]*)"', text))


def test_alert_thresholds_match_the_router_configuration():
    params = _router_parameters()
    for profile in ("cpu", "gpu"):
        values = json.loads((PROFILES / f"{profile}.json").read_text())["values"]
        watermark = params["kv_watermark"].replace("${router_kv_watermark}", values["router_kv_watermark"])
        kv_rules = [e for _, e in alert_expressions() if "kv_cache" in e]
        assert kv_rules and all(e.endswith(f"> {float(watermark):g}") for e in kv_rules), (profile, kv_rules)
    waits = dict(zip(("urgent", "high", "normal"), params["priority_max_wait_ms"].split(",")))
    for name, expr in alert_expressions():
        if name == "RouterQueueWaitOverBudget":
            cls = re.search(r'priority="(\w+)"', expr).group(1)
            assert expr.endswith(f"> {float(waits[cls]) / 1000:g}"), (cls, expr)
        if name == "RouterTtftP95OverSla" and 'engine="vllm_backend"' in expr:
            assert expr.endswith(f"> {float(params['interactive_sla_ms']) / 1000:g}")


def test_dashboard_covers_the_required_panels():
    dash = dashboard()
    panels = [p for p in _panels(dash["panels"]) if p["type"] != "row"]
    assert len({p["id"] for p in _panels(dash["panels"])}) == len(_panels(dash["panels"]))
    text = " ".join(e for _, e in dashboard_expressions())
    for q in ("0.5", "0.95", "0.99"):
        for fam in ("router_ttft_seconds_bucket", "router_tpot_seconds_bucket", "router_e2e_seconds_bucket"):
            assert f"histogram_quantile({q}, sum by (engine, le) (rate({fam}" in text, (q, fam)
    for needle in ("rate(router_output_tokens_total", "router_requests_total", "router_queue_depth",
                   "router_queue_wait_seconds_bucket", "router_kv_cache_usage", "router_engine_weight",
                   "router_breaker_state", "router_in_flight", "router_failovers_total", "router_errors_total"):
        assert needle in text, needle
    for p in panels:
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p.get("description"), p["title"]
    assert [v["name"] for v in dash["templating"]["list"]] == ["datasource"]
    # nothing but known Grafana variables: the integration test substitutes exactly these
    assert not re.findall(r"\$\w+", runnable(text))


def test_as_bool_rewrites_the_final_comparison_only():
    assert as_bool("max by (e) (x > 1) > 0.92") == "max by (e) (x > 1) > bool 0.92"
    assert as_bool("max by (e) (x) == 2") == "max by (e) (x) == bool 2"
    with pytest.raises(ValueError):
        as_bool("rate(x[5m])")


# --- stage report -----------------------------------------------------------------------

INF = math.inf


def test_histogram_quantile_interpolates_like_prometheus():
    # 10 observations: 2 in (0, 0.1], 6 in (0.1, 0.2], 2 in (0.2, 0.5].
    b = [(0.1, 2), (0.2, 8), (0.5, 10), (INF, 10)]
    assert stage_report.histogram_quantile(0.5, b) == pytest.approx(0.1 + 0.1 * (5 - 2) / 6)
    assert stage_report.histogram_quantile(0.9, b) == pytest.approx(0.2 + 0.3 * (9 - 8) / 2)
    assert stage_report.histogram_quantile(0.1, b) == pytest.approx(0.05)  # first bucket starts at 0
    assert stage_report.histogram_quantile(1.0, b) == pytest.approx(0.5)
    assert stage_report.histogram_quantile(0.8, b) == pytest.approx(0.2)  # rank on a bucket edge


def test_histogram_quantile_edge_cases():
    q = stage_report.histogram_quantile
    assert q(0.99, [(0.1, 1), (1.0, 1), (INF, 5)]) == 1.0  # rank in +Inf: highest finite bound
    assert math.isnan(q(0.5, [(0.1, 0), (INF, 0)]))  # no observations
    assert math.isnan(q(0.5, [(0.1, 3), (1.0, 4)]))  # no +Inf bucket
    assert math.isnan(q(0.5, [(INF, 4)]))  # fewer than two buckets
    assert q(-0.1, [(0.1, 1), (INF, 1)]) == -INF and q(1.1, [(0.1, 1), (INF, 1)]) == INF
    assert q(0.5, [(-1.0, 3), (0.0, 4), (INF, 4)]) == -1.0  # first bound <= 0
    # torn scrape: non-monotonic counts are raised to the running maximum first
    assert q(0.5, [(0.1, 4), (0.2, 3), (0.5, 8), (INF, 8)]) == pytest.approx(0.1)
    # duplicate bounds (series summed) are merged
    assert q(0.5, [(0.1, 1), (0.1, 1), (1.0, 4), (1.0, 4), (INF, 4), (INF, 4)]) == pytest.approx(0.1 + 0.9 * 2 / 6)


def _scrape(ttft: dict[str, list[int]], queue_urgent: list[int]) -> str:
    bounds = ["0.05", "0.1", "0.5", "+Inf"]
    lines = ["# HELP router_ttft_seconds x", "# TYPE router_ttft_seconds histogram"]
    for engine, counts in ttft.items():
        for le, c in zip(bounds, counts):
            lines.append(f'router_ttft_seconds_bucket{{model="router_bls",engine="{engine}",le="{le}"}} {c}')
        lines.append(f'router_ttft_seconds_sum{{model="router_bls",engine="{engine}"}} {0.08 * counts[-1]}')
        lines.append(f'router_ttft_seconds_count{{model="router_bls",engine="{engine}"}} {counts[-1]}')
    for le, c in zip(bounds, queue_urgent):
        lines.append(f'router_queue_wait_seconds_bucket{{model="router_bls",priority="urgent",le="{le}"}} {c}')
    lines.append(f'router_queue_wait_seconds_count{{model="router_bls",priority="urgent"}} {queue_urgent[-1]}')
    lines.append(f'router_queue_wait_seconds_sum{{model="router_bls",priority="urgent"}} 0.001')
    for le, c in zip(bounds, [1, 1, 1, 1]):
        lines.append(f'vllm:request_queue_time_seconds_bucket{{model="vllm_backend",version="1",le="{le}"}} {c}')
    return "\n".join(lines) + "\n"


def test_stage_table_from_one_scrape_and_from_a_difference():
    before = _scrape({"vllm_backend": [1, 2, 2, 2], "trtllm": [0, 0, 1, 1]}, [3, 3, 3, 3])
    after = _scrape({"vllm_backend": [1, 6, 12, 12], "trtllm": [0, 0, 1, 1]}, [3, 3, 3, 3])
    rows = {(r.stage, r.series): r for r in stage_report.stage_table(after)}
    v = rows[("TTFT", "vllm_backend")]
    assert v.count == 12 and v.p90_s == pytest.approx(0.1 + 0.4 * (10.8 - 6) / 6)
    assert rows[("router queue wait", "urgent")].p99_s == pytest.approx(0.05 * 0.99)
    assert rows[("engine queue", "vllm_backend")].count == 1

    window = {(r.stage, r.series): r for r in stage_report.stage_table(after, before)}
    v = window[("TTFT", "vllm_backend")]  # 10 new: 4 in (0.05, 0.1], 6 in (0.1, 0.5]
    assert v.count == 10 and v.mean_s == pytest.approx(0.08)
    assert v.p90_s == pytest.approx(0.1 + 0.4 * (9 - 4) / 6)
    assert window[("TTFT", "trtllm")].count == 0 and math.isnan(window[("TTFT", "trtllm")].p99_s)
    assert window[("router queue wait", "urgent")].count == 0
    md = stage_report.format_markdown(list(window.values()))
    assert "| TTFT | vllm_backend | 10 | 80.0 |" in md


def test_stage_table_treats_a_reset_series_as_new():
    before = _scrape({"vllm_backend": [5, 9, 9, 9]}, [3, 3, 3, 3])
    after = _scrape({"vllm_backend": [1, 2, 2, 2]}, [3, 3, 3, 3])  # server restarted in between
    rows = {(r.stage, r.series): r for r in stage_report.stage_table(after, before)}
    assert rows[("TTFT", "vllm_backend")].count == 2


def test_stage_report_cli_reads_files(tmp_path, capsys):
    (tmp_path / "a.txt").write_text(_scrape({"trtllm": [0, 1, 3, 4]}, [1, 2, 2, 2]))
    assert stage_report.main([str(tmp_path / "a.txt"), "--save", str(tmp_path / "copy.txt")]) == 0
    out = capsys.readouterr().out
    assert "| TTFT | trtllm | 4 |" in out and "| router queue wait | urgent | 2 |" in out
    assert (tmp_path / "copy.txt").read_text() == (tmp_path / "a.txt").read_text()
    assert stage_report.main([str(tmp_path / "a.txt"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["stage"] for r in rows} == {"TTFT", "router queue wait", "engine queue"}
