"""Real fault: unload an engine through Triton's model-control API during load. Requests
that had not received a token complete on the other engine, and the server serves on.

The model is not loaded again here: on tritonserver 2.51 a reload after an unload under
traffic crashes the server (SIGSEGV in the Python backend's thread pool at the first
request after the reload; 3 of 5 runs). Recovery of an engine, and the breaker closing
after it, are tested with the engine restart of test_engine_death.py."""

from __future__ import annotations

import concurrent.futures as cf
import time

import pytest

from tests.server_fixture import FAST_BREAKER, metric_value, running_server, scrape, wait_for
from tests.server_fixture import short_request as short

pytestmark = pytest.mark.integration
MODELS = ["router_bls", "vllm_backend", "trtllm"]


@pytest.fixture(scope="module")
def server():
    overrides = FAST_BREAKER
    with running_server("resilience", overrides=overrides, model_control="explicit", load_models=MODELS) as s:
        yield s


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
    assert server.model_ready("router_bls") and server.model_ready("trtllm")


def test_the_unloaded_engine_stub_exits_without_a_crash(server):
    """Runs after the unload above: the stub's exit released its metric handles in time."""
    log = lambda: server.log_path.read_text(errors="replace")  # noqa: E731
    wait_for(lambda: "successfully unloaded 'vllm_backend'" in log(), 60, "vllm_backend's stub exited")
    # A Metric handle that outlived finalize() crashed the stub in Py_Finalize (Metric::~Metric).
    assert "Segfault encountered" not in log(), log()[-4000:]
