"""Real fault: unload an engine through Triton's model-control API during load. Requests
that had not received a token complete on the other engine; after a reload the engine
serves again."""

from __future__ import annotations

import concurrent.futures as cf
import time

import pytest

from client.packing import GenerationRequest, router_tensors
from client.stream import stream_grpc
from tests.server_fixture import metric_value, running_server, scrape, wait_for

pytestmark = pytest.mark.integration
MODELS = ["router_bls", "vllm_backend", "trtllm"]


@pytest.fixture(scope="module")
def server():
    overrides = {"router_breaker_window_s": "8", "router_breaker_burst_window_s": "4",
                 "router_metrics_poll_ms": "200"}
    with running_server("resilience", overrides=overrides, model_control="explicit", load_models=MODELS) as s:
        yield s


def short(server, i: int = 0, max_tokens: int = 24):
    req = GenerationRequest(f"request number {i} says hello", max_tokens=max_tokens, temperature=0.0,
                            latency_sla_ms=50.0)
    return stream_grpc(server.grpc_url, "router_bls", router_tensors(req), timeout_s=120)


def breaker(server, engine: str) -> float:
    return metric_value(scrape(server), "router_breaker_state", engine=engine)


def test_unloading_vllm_during_load_loses_no_request(server):
    assert short(server).backend == "vllm_backend"
    before = scrape(server)
    with cf.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(short, server, i) for i in range(6)]
        time.sleep(0.3)
        unload = pool.submit(server.control_model, "vllm_backend", "unload")
        for i in range(6, 30):
            futures.append(pool.submit(short, server, i))
            time.sleep(0.1)
        results = [f.result() for f in futures]
        unload.result()
    errors = [r.error for r in results if not r.ok]
    assert not errors, errors
    backends = {r.backend for r in results}
    assert backends <= {"vllm_backend", "trtllm"} and "trtllm" in backends
    wait_for(lambda: not server.model_ready("vllm_backend"), 60, "vllm_backend unloaded")
    after_unload = [short(server, 100 + i) for i in range(3)]
    assert all(r.ok and r.backend == "trtllm" for r in after_unload)
    moved = (metric_value(scrape(server), "router_failovers_total")
             + metric_value(scrape(server), "router_requests_total", engine="trtllm"))
    assert moved > metric_value(before, "router_failovers_total") + metric_value(before, "router_requests_total", engine="trtllm")
    server.control_model("vllm_backend", "load")
    wait_for(lambda: server.model_ready("vllm_backend"), 300, "vllm_backend reloaded")
    time.sleep(0.5)
    assert short(server).backend == "vllm_backend"
