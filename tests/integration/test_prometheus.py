"""A real Prometheus scrapes a real server; every PromQL expression of deploy/ runs against it.

One tritonserver and one Prometheus (Debian's package) for the module. Traffic goes
through router_bls in two waves with Prometheus scraping every second in between, so
rates and quantiles over the window have real increases. Skipped without a
``prometheus`` binary (build_scripts/setup.sh installs it when it can).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml

from hybrid_llm.server import free_ports
from hybrid_llm.contracts import GenerationRequest, router_tensors
from client.stream import StreamResult, stream_grpc
from loadtests import stage_report
from tests.server_fixture import BUILD, running_server, scrape, wait_for
from tests.unit.test_monitoring import (ALERTS, EVENT_FAMILIES, alert_expressions, alert_rules, as_bool,
                                        dashboard_expressions, family_of, metric_names, runnable)

PROMETHEUS = os.environ.get("PROMETHEUS_BIN") or shutil.which("prometheus")
if PROMETHEUS is None:
    pytest.skip("no prometheus binary (Debian: apt-get install prometheus, or HYBRID_WITH_PROMETHEUS=1 "
                "build_scripts/setup.sh; or set PROMETHEUS_BIN)", allow_module_level=True)

pytestmark = pytest.mark.integration
MODEL = Path(__file__).resolve().parents[2] / "models" / "tiny-llama"
OUT = BUILD / "prometheus"
SHORT_TOKENS, LONG_TOKENS = 40, 2048
PRIORITIES = (1, 2, 3)
# The cancelled stream's length: ~7 s here, so it is still generating when the client's cancel
# lands even if the kernel ran no client process for ~2 s meanwhile (seen on 2 shared cores,
# where an 800-token stream once ended before its cancel: CI, router_cancelled_total stayed 0).
CANCEL_TOKENS = 3000


def _die_with_parent() -> None:
    """In the child: SIGTERM when pytest dies, so no Prometheus outlives the run."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class Prometheus:
    """A Prometheus process on a free loopback port with a private TSDB; queries via its HTTP API."""

    def __init__(self, workdir: Path, metrics_port: int) -> None:
        self.workdir = workdir
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [{"job_name": "triton", "metrics_path": "/metrics",
                                "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]}],
        }
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log = workdir / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        """Launch and wait until /-/ready answers."""
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={self.config}", f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"prometheus not ready after {timeout_s:.0f} s:\n{self.log.read_text()}")

    def stop(self) -> None:
        """SIGTERM this process only, SIGKILL if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def api(self, path: str, **params: str) -> dict[str, Any]:
        """GET an HTTP API endpoint; the decoded JSON (error responses included)."""
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as err:  # 400/422 carry a JSON body with the error
            return json.loads(err.read())

    def query(self, expr: str) -> dict[str, Any]:
        """An instant query at the current time."""
        return self.api("/api/v1/query", query=expr)

    def wait_for(self, expr: str, ok: Callable[[list[dict]], bool], timeout_s: float = 60.0) -> list[dict]:
        """Poll a query until ``ok(result)``; the result."""
        deadline = time.monotonic() + timeout_s
        result: list[dict] = []
        while time.monotonic() < deadline:
            reply = self.query(expr)
            result = reply.get("data", {}).get("result", [])
            if reply.get("status") == "success" and ok(result):
                return result
            time.sleep(0.5)
        raise TimeoutError(f"{expr!r} never satisfied the condition; last result {result}")


def _values(result: list[dict]) -> list[float]:
    return [float(r["value"][1]) for r in result]


def _server_total(text: str, family: str) -> float:
    """The sum of a counter family's samples in one /metrics scrape."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(family) and line[len(family):len(family) + 1] in ("{", " "))


@pytest.fixture(scope="module")
def server():
    # router_max_tokens_limit: the cancelled stream must outlast a starved test process
    with running_server("prometheus", overrides={"router_max_tokens_limit": str(CANCEL_TOKENS)}) as s:
        yield s


@pytest.fixture(scope="module")
def prom(server: Any) -> Iterator[Prometheus]:
    p = Prometheus(OUT / "prometheus", server.metrics_port)
    try:
        p.start()
        p.wait_for('up{job="triton"}', lambda r: _values(r) == [1.0])
        yield p
    finally:
        p.stop()


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(MODEL))


def prompt_of(tok: Any, n: int) -> str:
    """A prompt of exactly n tokens."""
    ids = tok.encode("the quick brown fox jumps over the lazy dog " * (n // 4 + 8), add_special_tokens=False)[:n]
    text = tok.decode(ids)
    assert len(tok.encode(text, add_special_tokens=False)) == n
    return text


def ask(server: Any, prompt: str, **kw: Any) -> StreamResult:
    """One streamed request through router_bls."""
    req = GenerationRequest(prompt, **{"max_tokens": 8, "temperature": 0.0, **kw})
    return stream_grpc(server.grpc_url, "router_bls", router_tensors(req), priority=req.priority, timeout_s=180)


def wave(server: Any, tok: Any) -> dict[str, int]:
    """Short interactive requests (vllm_backend) and long ones (trtllm) in every priority class,
    one cancelled stream and one invalid request; returns how many each route completed."""
    served = {"vllm_backend": 0, "trtllm": 0}
    short, long_ = prompt_of(tok, SHORT_TOKENS), prompt_of(tok, LONG_TOKENS)
    for priority in PRIORITIES:
        for prompt, engine in ((short, "vllm_backend"), (long_, "trtllm")):
            r = ask(server, prompt, priority=priority, latency_sla_ms=50.0)
            assert r.ok and r.backend == engine, (engine, r.backend, r.error)
            served[engine] += 1
    # long enough that the router sees the cancel before the engine finishes (it checks every 50 ms);
    # min_tokens, because a random model's greedy path may reach EOS early, and a prefix-cache hit
    # in the second wave can change that path
    req = GenerationRequest(short, max_tokens=CANCEL_TOKENS, min_tokens=CANCEL_TOKENS, temperature=0.0,
                            latency_sla_ms=50.0)
    cancelled = stream_grpc(server.grpc_url, "router_bls", router_tensors(req), timeout_s=180,
                            cancel_after_chunks=1)
    assert cancelled.cancelled
    bad = ask(server, short, priority=7)
    assert bad.error_code == "INVALID_ARG"
    return served


@pytest.fixture(scope="module")
def traffic(server: Any, prom: Prometheus, tok: Any) -> dict[str, Any]:
    """Two waves of traffic, each waited for until Prometheus has scraped its result."""
    OUT.mkdir(parents=True, exist_ok=True)
    before = scrape(server)
    served = {"vllm_backend": 0, "trtllm": 0}
    for waves in (1, 2):
        for engine, n in wave(server, tok).items():
            served[engine] += n
        routed = sum(served.values()) + waves  # + the cancelled stream of each wave
        prom.wait_for("sum(router_requests_total)", lambda r: bool(r) and _values(r)[0] >= routed)
        # The router counts a cancel after it has stopped the engine request (a BLS round trip),
        # so the count may follow the client's cancel by a moment.
        wait_for(lambda: _server_total(scrape(server), "router_cancelled_total") >= waves, timeout=30,
                 what=f"router_cancelled_total to count the {waves} cancelled stream(s)")
        counted = _server_total(scrape(server), "router_cancelled_total")
        prom.wait_for("sum(router_cancelled_total)", lambda r: bool(r) and _values(r)[0] >= counted)
    time.sleep(3)  # a few more scrapes and rule evaluations over the settled gauges
    after = scrape(server)
    (OUT / "before.prom").write_text(before)
    (OUT / "after.prom").write_text(after)
    rows = stage_report.stage_table(after, before)
    report = stage_report.format_markdown(rows)
    size = len(after.encode())
    (OUT / "stage_report.md").write_text(f"{report}\n\n/metrics scrape: {size} bytes\n")
    return {"before": before, "after": after, "served": served, "rows": rows, "scrape_bytes": size}


def _must_have_data(expr: str) -> bool:
    """False when every family the expression reads is created only by rare events (errors, failovers)."""
    fams = {family_of(n) for n in metric_names(expr)}
    return not fams <= EVENT_FAMILIES


def test_prometheus_scrapes_the_server(prom, traffic):
    assert _values(prom.query('up{job="triton"}')["data"]["result"]) == [1.0]
    result = prom.query("scrape_samples_scraped")["data"]["result"]
    assert _values(result)[0] > 100
    assert 0 < traffic["scrape_bytes"] < 2_000_000
    print(f"\n/metrics scrape: {traffic['scrape_bytes']} bytes, {_values(result)[0]:.0f} samples")


def test_every_alert_expression_runs_and_reads_data(prom, traffic):
    problems = []
    for name, expr in alert_expressions():
        reply = prom.query(expr)
        if reply.get("status") != "success":
            problems.append((name, expr, reply.get("error")))
            continue
        probe = prom.query(as_bool(expr))
        if probe.get("status") != "success":
            problems.append((name, as_bool(expr), probe.get("error")))
        elif _must_have_data(expr) and not probe["data"]["result"]:
            problems.append((name, as_bool(expr), "no data"))
    assert not problems, problems


def test_alert_rules_are_loaded_and_evaluate_cleanly(prom, traffic):
    groups = prom.api("/api/v1/rules")["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == len(alert_rules())
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad, bad
    # an idle, healthy CPU server: no breaker open, no engine at weight 0, no KV alarm
    firing = {a["labels"]["alertname"] for a in prom.api("/api/v1/alerts")["data"]["alerts"]}
    assert not firing & {"RouterBreakerOpen", "RouterEngineUnhealthy", "RouterErrorRateHigh",
                         "RouterKvCacheOverWatermark", "EngineKvCacheOverWatermark"}, firing


def test_every_dashboard_expression_runs_and_returns_data(prom, traffic):
    problems = []
    for where, expr in dashboard_expressions():
        reply = prom.query(runnable(expr))
        if reply.get("status") != "success":
            problems.append((where, expr, reply.get("error")))
            continue
        result = reply["data"]["result"]
        if not _must_have_data(expr):
            continue
        if not result:
            problems.append((where, expr, "no data"))
        elif "histogram_quantile" in expr and not any(math.isfinite(v) for v in _values(result)):
            problems.append((where, expr, f"no finite quantile: {result}"))
    assert not problems, problems


def test_every_referenced_metric_is_in_the_real_scrape(traffic):
    exported = {s.name for s in stage_report.parse_text(traffic["after"])}
    referenced = {n for _, e in alert_expressions() + dashboard_expressions() for n in metric_names(e)}
    missing = {n for n in referenced if n not in exported and family_of(n) not in EVENT_FAMILIES}
    assert not missing, sorted(missing)
    # the traffic created the event families it can (a cancel, an invalid request)
    assert {"router_cancelled_total", "router_rejected_total"} <= exported


def test_stage_report_over_the_run(traffic):
    rows = {(r.stage, r.series): r for r in traffic["rows"]}
    served = traffic["served"]
    print("\n" + stage_report.format_markdown(traffic["rows"]))
    for engine in ("vllm_backend", "trtllm"):
        for stage in ("TTFT", "end-to-end"):
            r = rows[(stage, engine)]
            assert r.count >= served[engine], (stage, engine, r.count)
            assert 0 < r.p90_s <= r.p99_s and math.isfinite(r.p99_s), r
    for cls in ("urgent", "high", "normal"):
        assert rows[("router queue wait", cls)].count >= 2 * 2, cls
    assert rows[("engine queue", "vllm_backend")].count >= served["vllm_backend"]
    assert rows[("decode", "vllm_backend")].count >= served["vllm_backend"]


def test_stage_report_quantiles_match_prometheus(prom, traffic):
    """stage_report's bucket interpolation gives what histogram_quantile gives on the same counts."""
    rows = stage_report.stage_table(traffic["after"])  # cumulative since start = Prometheus's last scrape
    checked = 0
    for stage in stage_report.STAGES:
        for q, attr in ((0.9, "p90_s"), (0.99, "p99_s")):
            expr = f"histogram_quantile({q}, sum by ({stage.group_by}, le) ({stage.family}_bucket))"
            result = prom.query(expr)["data"]["result"]
            got = {r["metric"].get(stage.group_by, ""): float(r["value"][1]) for r in result}
            for row in (r for r in rows if r.family == stage.family and r.count):
                assert got[row.series] == pytest.approx(getattr(row, attr), rel=1e-9), (expr, row)
                checked += 1
    assert checked >= 20
