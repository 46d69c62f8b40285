"""Several router_bls instances (the ``router_instances`` profile value, router_bls's
instance_group count): each is its own stub process, Triton hands requests to both, each
dispatches its share of the engine's capacity, and every series carries ``instance`` so
that gauges do not overwrite each other and sums by engine stay right."""

from __future__ import annotations

import concurrent.futures as cf
import time

import pytest

from hybrid_llm.contracts import GenerationRequest, router_tensors
from client.stream import stream_grpc
from tests.server_fixture import metric_value, running_server, scrape, wait_for

pytestmark = pytest.mark.integration

INSTANCES = 2
SEQS = 4  # vllm_max_num_seqs: each router instance may keep 2 requests in vllm_backend


@pytest.fixture(scope="module")
def server():
    overrides = {"router_instances": str(INSTANCES), "router_policy": "vllm_only", "vllm_max_num_seqs": str(SEQS)}
    with running_server("router_instances", models=["router_bls", "vllm_backend"], overrides=overrides) as s:
        yield s


def routed_by_instance(text: str) -> list[float]:
    """router_requests_total of each router instance."""
    return [metric_value(text, "router_requests_total", instance=str(k)) for k in range(INSTANCES)]


def test_each_instance_is_a_stub_with_its_share_of_the_engine(server):
    log = server.log_path.read_text(errors="replace")
    for k in range(INSTANCES):
        assert f"[router {k}/{INSTANCES}]" in log and f"instance {k} of {INSTANCES} (capacity" in log, log[-3000:]
        assert f"vllm_backend={SEQS // INSTANCES}," in log


def test_requests_are_spread_over_the_instances_and_all_complete(server):
    before = routed_by_instance(scrape(server))
    tensors = router_tensors(GenerationRequest("count to ten", max_tokens=8, temperature=0.0))
    with cf.ThreadPoolExecutor(12) as pool:
        results = list(pool.map(lambda _: stream_grpc(server.grpc_url, "router_bls", tensors, timeout_s=300),
                                range(12)))
    assert all(r.ok and r.text and r.backend == "vllm_backend" for r in results), [r.error for r in results]
    wait_for(lambda: sum(routed_by_instance(scrape(server))) >= sum(before) + 12, timeout=30,
             what="router_requests_total to count the 12 requests")
    after = routed_by_instance(scrape(server))
    per_instance = [a - b for a, b in zip(after, before)]
    assert sum(per_instance) == 12, per_instance
    assert all(n >= 1 for n in per_instance), f"Triton gave every request to one router instance: {per_instance}"


def test_the_instances_together_keep_the_engine_capacity(server):
    """Long requests on both instances: neither keeps more than its 2 slots in vllm_backend, the
    rest wait in the router queues, and router_in_flight summed over instances never exceeds 4."""
    # min_tokens: a random model's greedy path may reach EOS early, and short fills never queue
    fill = router_tensors(GenerationRequest("tell me a long story", max_tokens=600, min_tokens=600, temperature=0.0,
                                            stream=False))
    peak_instance, peak_total = 0.0, 0.0
    before = scrape(server)
    with cf.ThreadPoolExecutor(10) as pool:
        futures = [pool.submit(stream_grpc, server.grpc_url, "router_bls", fill, timeout_s=600) for _ in range(10)]
        while not all(f.done() for f in futures):
            text = scrape(server)
            in_flight = [metric_value(text, "router_in_flight", engine="vllm_backend", instance=str(k))
                         for k in range(INSTANCES)]
            peak_instance = max(peak_instance, *in_flight)
            peak_total = max(peak_total, sum(in_flight), metric_value(text, "vllm:num_requests_running"))
            time.sleep(0.2)
        results = [f.result() for f in futures]
    assert all(r.ok and r.text for r in results), [r.error for r in results]
    assert peak_instance <= SEQS // INSTANCES and peak_total <= SEQS, (peak_instance, peak_total)
    # The queue-depth gauge is written every metrics_poll_ms and was seen missing the queue in
    # CI; the queue-wait histogram is written as each request leaves the queue.
    after = scrape(server)
    waits = {name: metric_value(after, name, **labels) - metric_value(before, name, **labels) for name, labels in
             (("router_queue_wait_seconds_count", {}), ("router_queue_wait_seconds_bucket", {"le": "0.5"}))}
    assert waits["router_queue_wait_seconds_count"] == 10, waits
    assert waits["router_queue_wait_seconds_count"] - waits["router_queue_wait_seconds_bucket"] >= 1, \
        f"no request waited 0.5 s or more in a router queue: the capacity split was not exercised ({waits})"
    wait_for(lambda: metric_value(scrape(server), "router_in_flight") == 0, timeout=30,
             what="router_in_flight of every instance to drop to 0")
