"""Overload and cancellation under load: a burst beyond the router queue gets fast
UNAVAILABLE answers and the server stays ready; cancelled router streams stop the engine."""

from __future__ import annotations

import concurrent.futures as cf
import time

import pytest

from client.packing import GenerationRequest, generate_payload, router_tensors
from client.stream import stream_grpc, stream_http
from tests.server_fixture import metric_value, running_server, scrape

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server():
    # Small capacities so that a burst saturates both engines and the router queue.
    overrides = {"vllm_max_num_seqs": "2", "trtllm_max_batch_size": "2", "router_max_queue": "3"}
    with running_server("overload", overrides=overrides) as s:
        yield s


def long_request(server, i: int, **kw):
    req = GenerationRequest(f"burst {i}: tell me everything", max_tokens=300, temperature=0.0, **kw)
    return stream_grpc(server.grpc_url, "router_bls", router_tensors(req), timeout_s=300)


# Runs before the burst: afterwards vllm_backend's TTFT window is long and the policy
# may send these short requests to trtllm, whose contract has no abort counter.
def test_cancelled_router_streams_stop_the_engine(server):
    lab = {"model": "vllm_backend"}
    aborted0 = metric_value(scrape(server), "vllm:request_aborted_total", **lab)
    req = GenerationRequest("cancel me please", max_tokens=800, temperature=0.0, latency_sla_ms=50.0)
    with cf.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: stream_grpc(server.grpc_url, "router_bls", router_tensors(req),
                                                      cancel_after_chunks=3, timeout_s=120), range(2)))
    assert all(r.cancelled for r in results)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        text = scrape(server)
        if metric_value(text, "vllm:request_aborted_total", **lab) >= aborted0 + 2 and \
                metric_value(text, "vllm:num_requests_running", **lab) == 0:
            break
        time.sleep(0.5)
    text = scrape(server)
    assert metric_value(text, "vllm:request_aborted_total", **lab) >= aborted0 + 2
    assert metric_value(text, "vllm:num_requests_running", **lab) == 0
    assert metric_value(text, "router_cancelled_total", engine="vllm_backend") >= 2  # served by vLLM


def test_burst_beyond_the_queue_gets_fast_unavailable(server):
    n = 40
    with cf.ThreadPoolExecutor(n) as pool:
        results = list(pool.map(lambda i: long_request(server, i), range(n)))
    rejected = [r for r in results if r.error_code == "UNAVAILABLE"]
    served = [r for r in results if r.ok]
    assert len(served) + len(rejected) == n, [r.error for r in results if not r.ok and r not in rejected]
    # Capacity is 2 + 2 in flight plus 3 queued. How many of the burst find the queue full
    # depends on how fast Triton hands them to the router (seen: 2 to 13 of 20), so only
    # "some are refused, none is lost, all refused ones are clean" is asserted.
    assert len(served) >= 7 and len(rejected) >= 1, (len(served), len(rejected))
    assert all("queue is full" in r.error for r in rejected)
    # Refused requests never wait for generation. How fast a refusal reaches a gRPC client
    # is not asserted here: the router sends it within ~10 ms of execute, but Triton 2.51's
    # gRPC frontend delivered some after 4-11 s under this burst (README, Known limits).
    # The HTTP burst below asserts the latency end to end.
    assert all(r.ttft_s is None for r in rejected)
    assert server.is_ready()
    assert metric_value(scrape(server), "router_rejected_total", reason="queue_full") == len(rejected)
    assert stream_grpc(server.grpc_url, "router_bls",
                       router_tensors(GenerationRequest("still alive?", max_tokens=4)), timeout_s=60).ok


def test_burst_refusals_reach_http_clients_at_once(server):
    n = 40
    payload = generate_payload(GenerationRequest("burst: tell me everything", max_tokens=300, temperature=0.0))
    with cf.ThreadPoolExecutor(n) as pool:
        results = list(pool.map(lambda _: stream_http(server.http_url, "router_bls", payload, timeout_s=300),
                                range(n)))
    rejected = [r for r in results if r.error_code == "UNAVAILABLE"]
    served = [r for r in results if r.ok]
    assert len(served) + len(rejected) == n, [r.error for r in results if not r.ok and r not in rejected]
    assert len(served) >= 7 and len(rejected) >= 1, (len(served), len(rejected))
    assert all("queue is full" in r.error for r in rejected)
    # Refused requests never wait for generation: the router refuses them on arrival
    # (1-18 ms after execute). How fast the refusal reaches the client is Triton's frontend
    # and 2 shared cores: the median was 8-45 ms locally but 7.7 s on a CI run, so only the
    # order is asserted: refusals come back well before the served requests finish.
    waits = sorted(r.e2e_s for r in rejected)
    took = sorted(r.e2e_s for r in served)
    assert waits[len(waits) // 2] < took[len(took) // 2], (waits, took)
    assert waits[-1] < took[-1], (waits, took)
    assert server.is_ready()
