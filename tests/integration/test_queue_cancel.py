"""A client that gives up while its request waits in the router queue costs the engine nothing:
the router looks at the cancel flag once before dispatch and ends the request there."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import pytest

from client.packing import GenerationRequest, router_tensors
from client.stream import stream_grpc
from tests.server_fixture import metric_value, running_server, scrape, wait_for

pytestmark = pytest.mark.integration

VLLM = {"model": "vllm_backend"}


@pytest.fixture(scope="module")
def server():
    # vllm_only with 2 sequences: a third request waits in the router queue, whatever its shape.
    overrides = {"router_policy": "vllm_only", "vllm_max_num_seqs": "2", "router_cancel_check_ms": "50"}
    with running_server("queue_cancel", models=["router_bls", "vllm_backend"], overrides=overrides) as s:
        yield s


def engine_requests(text: str) -> float:
    """Requests vLLM finished or aborted."""
    return (metric_value(text, "vllm:request_success_total", **VLLM)
            + metric_value(text, "vllm:request_aborted_total", **VLLM))


def test_a_request_cancelled_while_queued_never_reaches_the_engine(server):
    before = scrape(server)
    seen0, cancelled0 = engine_requests(before), metric_value(before, "router_cancelled_total", engine="vllm_backend")
    started = [threading.Event(), threading.Event()]
    fill = GenerationRequest("tell me a long story", max_tokens=1000, temperature=0.0)

    def run_fill(i: int):
        return stream_grpc(server.grpc_url, "router_bls", router_tensors(fill), timeout_s=300,
                           on_chunk=lambda _r: started[i].set())

    with cf.ThreadPoolExecutor(2) as pool:
        fills = [pool.submit(run_fill, i) for i in range(2)]
        assert all(e.wait(120) for e in started), "the two fill requests did not start streaming"
        # Both vLLM slots are taken: this one waits in the router queue until its client
        # gives up (the stream is closed with cancellation after 2 s).
        victim = stream_grpc(server.grpc_url, "router_bls",
                             router_tensors(GenerationRequest("never mind", max_tokens=50)), timeout_s=2)
        assert victim.cancelled and victim.text == ""
        results = [f.result() for f in fills]
    assert all(r.ok and r.text for r in results), [r.error for r in results]
    wait_for(lambda: metric_value(scrape(server), "router_cancelled_total", engine="vllm_backend") >= cancelled0 + 1,
             timeout=30, what="router_cancelled_total to count the request cancelled while queued")
    wait_for(lambda: engine_requests(scrape(server)) >= seen0 + 2, timeout=30,
             what="vLLM to count the two fill requests")
    after = scrape(server)
    assert engine_requests(after) == seen0 + 2  # the two fills; the cancelled one never got there
    assert metric_value(after, "router_cancelled_total", engine="vllm_backend") == cancelled0 + 1
    wait_for(lambda: metric_value(scrape(server), "router_in_flight", engine="vllm_backend") == 0, timeout=30,
             what="router_in_flight to drop to 0 (every slot given back)")
