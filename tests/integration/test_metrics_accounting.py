"""Metric accounting on a real server: known traffic moves every counter by exactly that much.

One server for the module. A scrape before and after a known set of requests (per
route, per priority class, plus refused ones); each counter's delta, each histogram's
``_count`` delta and the output-token counter must equal what the clients saw. While
a long stream runs the in-flight gauge shows it; after the load every gauge is back
to its idle value. Triton's own per-model counters must agree with the router's.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from pathlib import Path

import numpy as np
import pytest

from hybrid_llm.contracts import GenerationRequest, router_tensors
from client.stream import StreamResult, stream_grpc
from tests.server_fixture import metric_value, running_server, scrape, wait_for

pytestmark = pytest.mark.integration
MODEL = Path(__file__).resolve().parents[2] / "models" / "tiny-llama"
ENGINES = ("vllm_backend", "trtllm")
CLASSES = {1: "urgent", 2: "high", 3: "normal"}


@pytest.fixture(scope="module")
def server():
    with running_server("accounting", overrides={"router_fallback_target": "trtllm"}) as s:
        yield s


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(MODEL))


def prompt_of(tok, n: int) -> str:
    """A prompt of exactly n tokens."""
    ids = tok.encode("a stitch in time saves nine " * (n // 4 + 8), add_special_tokens=False)[:n]
    text = tok.decode(ids)
    assert len(tok.encode(text, add_special_tokens=False)) == n
    return text


def ask(server, prompt: str, **kw) -> StreamResult:
    """One streamed request through router_bls."""
    req = GenerationRequest(prompt, **{"max_tokens": 12, "temperature": 0.0, **kw})
    return stream_grpc(server.grpc_url, "router_bls", router_tensors(req), priority=req.priority, timeout_s=180)


def delta(before: str, after: str, name: str, **labels: str) -> float:
    """How much a metric moved between two scrapes."""
    return metric_value(after, name, **labels) - metric_value(before, name, **labels)


def idle(server, text: str | None = None) -> bool:
    """Every router gauge at its idle value (in ``text``, else in a new scrape)."""
    text = scrape(server) if text is None else text
    busy = [metric_value(text, "router_in_flight", engine=e) for e in ENGINES]
    depth = [metric_value(text, "router_queue_depth", priority=c) for c in CLASSES.values()]
    kv = [metric_value(text, "router_kv_cache_usage", engine=e) for e in ENGINES]
    return not any(busy) and not any(depth) and not any(kv)


def settled(server) -> bool:
    """Every router gauge idle, and every routed request's end-to-end observation written (the
    metric writer flushes gauges, counters and observations in rounds: a scrape between them
    once saw a request's e2e sample missing from the baseline)."""
    text = scrape(server)
    routed = sum(metric_value(text, "router_requests_total", engine=e) for e in ENGINES)
    ended = sum(metric_value(text, "router_e2e_seconds_count", engine=e) for e in ENGINES)
    return idle(server, text) and ended == routed


def test_counters_histograms_and_gauges_account_for_every_request(server, tok):
    # Warm both engines so the poller runs and the families exist before the baseline.
    assert ask(server, prompt_of(tok, 30), latency_sla_ms=100.0).ok
    assert ask(server, prompt_of(tok, 2048)).ok
    wait_for(lambda: settled(server), 30, "idle gauges and every e2e sample written before the baseline")
    before = scrape(server)

    # Known traffic: (prompt tokens, SLA, priority) -> expected engine and rule.
    plan = (
        [(40, 100.0, p, "vllm_backend", "short_interactive") for p in (1, 2, 3, 3)]
        + [(2048, None, p, "trtllm", "long_prompt") for p in (2, 3)]
        + [(500, None, 1, "trtllm", "fallback")]
    )
    with cf.ThreadPoolExecutor(len(plan)) as pool:
        futures = [pool.submit(ask, server, prompt_of(tok, n), latency_sla_ms=sla, priority=p)
                   for n, sla, p, _, _ in plan]
        results = [f.result() for f in futures]
    for (n, _, _, engine, _), r in zip(plan, results):
        assert r.ok, r.error
        assert r.backend == engine and r.num_input_tokens == n

    # Two refused requests: one invalid, one with an out-of-range priority.
    bad = [ask(server, ""), ask(server, "hello", priority=7)]
    assert all(r.error_code == "INVALID_ARG" for r in bad), [r.error for r in bad]

    wait_for(lambda: settled(server), 30, "idle gauges and every e2e sample written after the load")
    after = scrape(server)

    for engine in ENGINES:
        mine = [(spec, r) for spec, r in zip(plan, results) if spec[3] == engine]
        n = len(mine)
        assert delta(before, after, "router_requests_total", engine=engine) == n
        for reason in {spec[4] for spec, _ in mine}:
            want = sum(1 for spec, _ in mine if spec[4] == reason)
            assert delta(before, after, "router_requests_total", engine=engine, reason=reason) == want
        assert delta(before, after, "router_ttft_seconds_count", engine=engine) == n
        assert delta(before, after, "router_e2e_seconds_count", engine=engine) == n
        multi = sum(1 for _, r in mine if (r.num_output_tokens or 0) > 1)
        assert delta(before, after, "router_tpot_seconds_count", engine=engine) == multi
        tokens = sum(r.num_output_tokens or 0 for _, r in mine)
        assert tokens > 0
        assert delta(before, after, "router_output_tokens_total", engine=engine) == tokens
        assert delta(before, after, "router_errors_total", engine=engine) == 0
        # Triton's own view of the engine model agrees with the router's.
        assert delta(before, after, "nv_inference_request_success", model=engine) == n
    for priority, label in CLASSES.items():
        want = sum(1 for spec in plan if spec[2] == priority)
        assert delta(before, after, "router_queue_wait_seconds_count", priority=label) == want
    assert delta(before, after, "router_rejected_total", reason="invalid") == len(bad)
    assert delta(before, after, "router_failovers_total") == 0
    # Histogram sums are real durations: each TTFT is positive and below its e2e.
    for engine in ENGINES:
        ttft = delta(before, after, "router_ttft_seconds_sum", engine=engine)
        e2e = delta(before, after, "router_e2e_seconds_sum", engine=engine)
        assert 0 < ttft <= e2e


def test_in_flight_gauge_rises_during_a_stream_and_returns_to_idle(server, tok):
    wait_for(lambda: idle(server), 30, "idle gauges before the stream")
    box: dict[str, StreamResult] = {}
    worker = threading.Thread(target=lambda: box.setdefault(
        "r", ask(server, prompt_of(tok, 40), latency_sla_ms=100.0, max_tokens=400, min_tokens=400)))
    worker.start()
    try:
        wait_for(lambda: metric_value(scrape(server), "router_in_flight", engine="vllm_backend") == 1,
                 30, "router_in_flight{engine=vllm_backend} == 1 during the stream")
    finally:
        worker.join(180)
    r = box["r"]
    assert r.ok and r.backend == "vllm_backend", r.error
    wait_for(lambda: idle(server), 30, "idle gauges after the stream")
    text = scrape(server)
    assert all(metric_value(text, "router_engine_weight", engine=e) > 0 for e in ENGINES)
    assert all(metric_value(text, "router_breaker_state", engine=e) == 0 for e in ENGINES)
    assert np.isfinite(metric_value(text, "router_kv_cache_usage", engine="vllm_backend"))
