"""The client CLI, a 20-second headless Locust run and a short perf_analyzer streaming
measurement, all against one real server."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from hybrid_llm.server import ROOT
from tests.server_fixture import running_server

pytestmark = pytest.mark.integration
PY = sys.executable


@pytest.fixture(scope="module")
def server():
    with running_server("tools") as s:
        yield s


def run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([PY, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_cli_streams_text_and_prints_json(server):
    p = run(["-m", "client", "--url", server.grpc_url, "--max-tokens", "12", "--sla-ms", "100",
             "--temperature", "0", "Hello, Triton"], 120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() and "[vllm_backend]" in p.stderr and "ttft" in p.stderr
    j = run(["-m", "client", "--url", server.grpc_url, "--max-tokens", "6", "--json", "--priority", "urgent", "Hi"], 120)
    data = json.loads(j.stdout)
    assert data["error"] is None and data["num_output_tokens"] <= 6 and data["ttft_s"] > 0
    h = run(["-m", "client", "--protocol", "http", "--http-url", server.http_url, "--max-tokens", "5", "--json", "Hi"], 120)
    assert json.loads(h.stdout)["error"] is None
    bad = run(["-m", "client", "--url", server.grpc_url, "--max-tokens", "0", "Hi"], 60)
    assert bad.returncode == 1 and "INVALID_ARG" in bad.stderr


def test_headless_locust_run_has_no_failures(server):
    p = run(["-m", "loadtests.run_locust", "--host", server.grpc_url, "--qps-steps", "1,2",
             "--step-s", "10", "--run", "ci-locust"], 240)
    out = ROOT / "loadtests" / "results" / "ci-locust"
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rows = list(csv.DictReader(open(out / "locust_stats.csv")))
    total = [r for r in rows if r["Name"] == "Aggregated"]
    assert total and int(total[0]["Request Count"]) > 0 and int(total[0]["Failure Count"]) == 0
    assert (out / "report.html").exists()


def test_perf_analyzer_streams_one_measurement_against_router_bls(server):
    from loadtests.run_perf_analyzer import PA_BIN, run_perf_analyzer

    if not PA_BIN.exists():
        pytest.fail(f"{PA_BIN} is missing: build_scripts/setup.sh installs it")
    out = ROOT / "loadtests" / "results" / "ci-perf-analyzer"
    # Concurrency 1 and a loose stability bound: on 2 shared cores, tighter bounds fail to settle.
    code, summary = run_perf_analyzer(server.grpc_url, "router_bls", out, mix="chat", samples=8,
                                      concurrency="1", measurement_interval_ms=6000, stability_pct=100.0,
                                      max_trials=5, timeout_s=300)
    log = (out / "perf_analyzer.log").read_text()
    assert code == 0, log[-2000:]
    assert len(summary) == 1 and summary[0]["requests"] > 0, summary
    row = summary[0]
    assert row["ttft_p50_s"] > 0 and row["e2e_p50_s"] >= row["ttft_p50_s"]
    assert row["responses_mean"] > 1  # streamed: several responses per request
    assert "Request concurrency: 1" in log


def test_genai_perf_profiles_router_bls_with_the_tensorrtllm_backend(server):
    from loadtests.run_perf_analyzer import GP_BIN, run_genai_perf

    if not GP_BIN.exists():
        pytest.fail(f"{GP_BIN} is missing: build_scripts/setup.sh installs it")
    out = ROOT / "loadtests" / "results" / "ci-genai-perf"
    code, summary = run_genai_perf(server.grpc_url, out, concurrency=1, input_tokens=64, output_tokens=16,
                                   num_prompts=10, measurement_interval_ms=6000, timeout_s=300)
    log = (out / "genai_perf.log").read_text()
    assert code == 0, log[:3000] + "\n...\n" + log[-2000:]
    # Every response carries the optional outputs genai-perf was told to ask for (a left-out one
    # is garbage in perf_analyzer's export, and a NaN there empties it).
    export = json.loads(next((out / "artifacts").glob("**/profile_export.json")).read_text())
    responses = [o for r in export["experiments"][0]["requests"] for o in r["response_outputs"]]
    assert responses and all(o["num_input_tokens"] == 64 and o["acceptance_rate"] == 0.0
                             and o["backend"] in ("trtllm", "vllm_backend") for o in responses), responses[:3]
    ttft = summary["time_to_first_token"]
    assert summary["request_count"] and summary["request_count"] > 0, summary
    assert ttft["unit"] == "ms" and 0 < ttft["p50"] <= summary["request_latency"]["p99"]
    assert summary["output_token_throughput"] > 0
