"""Clients that give up before their first token: one whose request waits in the router
queue costs the engine nothing (the router looks at the cancel flag once before dispatch);
one whose request waits in the engine's own queue is noticed by the router's watcher of
quiet attempts, which stops the engine request while it still waits.

The victim's client leaves once the router has counted it (router_requests_total), while
it waits behind long requests (~10 s or more). A fixed 1 s deadline was not enough: on 2
shared cores this test process is sometimes starved (its deadline was seen firing 2-6 s
late), and once (CI) neither the router nor vLLM counted a victim that left after 1 s,
perhaps because its request had not reached the server yet. Earlier versions read late closes as Triton
passing the cancellation on late; probes that timed the client showed the router seeing
the cancellation within ~0.5 s of the client's close whenever the close went out on
time. So a run whose client left late skips, naming that; otherwise the asserts are strict.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import threading
import time
from typing import Callable

import pytest

from hybrid_llm.contracts import URGENT, GenerationRequest, router_tensors, vllm_tensors
from client.stream import StreamResult, stop_grpc, stream_grpc
from tests.server_fixture import metric_value, running_server, scrape, wait_for

pytestmark = pytest.mark.integration

VLLM = {"model": "vllm_backend"}
FILL = GenerationRequest("tell me a long story", max_tokens=1000, min_tokens=1000, temperature=0.0, stream=False)  # ~6 s for 2 at once
# Fills sent straight to vLLM go in URGENT, ahead of the routed NORMAL victim in vLLM's
# priority queue: the victim waits behind all of them, not just behind those that came
# first (seen once in CI: a victim that came in behind only 2 was served, 50 tokens,
# before the test cancelled it).
DIRECT_FILL = dataclasses.replace(FILL, priority=URGENT)
FILLS = 6  # 2 run, 4 wait: "2 running and 2 waiting" holds for ~2 fills' time
# From the test's cancel to the victim's closed stream. The victim waits behind 4 fills
# (~12 s) in both tests, so a close within 5 s still reaches it while it waits. Closes of
# 2.9 s were seen locally: the cancel goes out first, then tritonclient joins its stream
# thread and closes the channel, on a starved process.
LEAVE_WITHIN_S = 5.0


@pytest.fixture(scope="module")
def server():
    # vllm_only with 2 sequences: a third request waits, whatever its shape.
    overrides = {"router_policy": "vllm_only", "vllm_max_num_seqs": "2", "router_cancel_check_ms": "50",
                 "router_max_tokens_limit": "4000"}  # the stop test's stream outlasts a starved test process
    with running_server("queue_cancel", models=["router_bls", "vllm_backend"], overrides=overrides) as s:
        yield s


def engine_requests(text: str) -> float:
    """Requests vLLM finished or aborted."""
    return (metric_value(text, "vllm:request_success_total", **VLLM)
            + metric_value(text, "vllm:request_aborted_total", **VLLM))


def two_run_two_wait(text: str, model: str) -> bool:
    """True when 2 fills hold the engine's 2 sequences and 2 more wait (in the router, or in vLLM)."""
    if model == "router_bls":
        return (metric_value(text, "router_in_flight", engine="vllm_backend") == 2
                and metric_value(text, "router_queue_depth") >= 2)
    return (metric_value(text, "vllm:num_requests_running", **VLLM) == 2
            and metric_value(text, "vllm:num_requests_waiting", **VLLM) >= 2)


def with_fills(server, model: str, check: Callable[[list[cf.Future]], None]) -> list[StreamResult]:
    """Start 6 long requests to ``model`` (2 run, 4 wait), send the victim once the metrics
    show 2 running and 2 or more waiting, then call ``check`` with the fill futures; returns the fills' results.

    The fills do not stream. Streamed, their ~4,000 responses kept this process's threads
    so busy that its main thread stalled for seconds (seen: the victim sent 6 s late, and
    its 1 s deadline firing 7.5 s late), so the victim's client left late or not at all.
    """
    tensors = router_tensors(FILL) if model == "router_bls" else vllm_tensors(DIRECT_FILL)
    routed = metric_value(scrape(server), "router_requests_total") + (FILLS if model == "router_bls" else 0)
    with cf.ThreadPoolExecutor(FILLS) as pool:
        fills = [pool.submit(stream_grpc, server.grpc_url, model, tensors, timeout_s=300) for _ in range(FILLS)]
        while not two_run_two_wait(scrape(server), model):
            if all(f.done() for f in fills):
                # Seen once in CI: the gauges (written off the hot path) never showed it.
                pytest.skip(f"/metrics never showed 2 fills running and 2 waiting while {FILLS} fills ran")
            time.sleep(0.1)
        result, lag_s, routed_s = leave_once_routed(server, routed + 1)
        if result.ttft_s is not None and routed_s >= result.ttft_s:
            # Seen once in CI: the victim waited its ~9 s and was served, and only then did
            # this process's scrape loop see the router count it: the test, not the router, was late.
            pytest.skip(f"this test process was starved (2 shared cores): it saw the victim routed "
                        f"{routed_s:.1f} s after sending it, after its first token ({result.ttft_s:.1f} s)")
        assert result.cancelled and not result.text, (
            f"the victim was not cancelled before its first token: first token at {result.ttft_s} s, "
            f"stream ended at {result.e2e_s:.2f} s, the test saw it routed at {routed_s:.2f} s; {result}")
        if lag_s > LEAVE_WITHIN_S:
            pytest.skip(f"this test process was starved (2 shared cores): the victim's stream closed "
                        f"{lag_s:.1f} s after the test cancelled it (README, Known limits)")
        check(fills)
        results = [f.result() for f in fills]
    assert all(r.ok and r.text for r in results), [r.error for r in results]
    return results


def leave_once_routed(server, routed: float) -> tuple[StreamResult, float, float]:
    """Send a routed request and cancel it once router_requests_total reaches ``routed``
    (the router has it); returns its result, how long its stream took to close after the
    cancel, and when (after sending) the test saw it routed."""
    cancel = threading.Event()
    tensors = router_tensors(GenerationRequest("never mind", max_tokens=50))
    with cf.ThreadPoolExecutor(1) as pool:
        t_send = time.monotonic()
        victim = pool.submit(stream_grpc, server.grpc_url, "router_bls", tensors, timeout_s=120, cancel=cancel)
        wait_for(lambda: metric_value(scrape(server), "router_requests_total") >= routed, timeout=30,
                 what="the router to count the victim")
        t_cancel = time.monotonic()
        cancel.set()
        result = victim.result()  # stream_grpc returns once its stream is closed
        return result, time.monotonic() - t_cancel, t_cancel - t_send


def test_a_request_cancelled_while_queued_never_reaches_the_engine(server):
    before = scrape(server)
    seen0, cancelled0 = engine_requests(before), metric_value(before, "router_cancelled_total", engine="vllm_backend")
    with_fills(server, "router_bls", lambda fills: None)
    wait_for(lambda: engine_requests(scrape(server)) >= seen0 + FILLS, timeout=60, what="vLLM to count the fills")
    time.sleep(1.0)
    after = scrape(server)
    counts = {name: metric_value(after, name, engine="vllm_backend") for name in
              ("router_requests_total", "router_cancelled_total", "router_e2e_seconds_count")}
    assert metric_value(after, "router_cancelled_total", engine="vllm_backend") == cancelled0 + 1, counts
    assert engine_requests(after) == seen0 + FILLS  # the fills; the cancelled one never got there
    wait_for(lambda: metric_value(scrape(server), "router_in_flight", engine="vllm_backend") == 0, timeout=30,
             what="router_in_flight to drop to 0 (every slot given back)")


def test_a_request_cancelled_while_waiting_in_the_engine_queue_is_stopped_there(server):
    # Fills sent straight to vllm_backend take its 2 sequences and its queue without the
    # router knowing, so the routed victim waits in vLLM's own queue: quiet, no response
    # to look at the cancel flag on. The router's watcher must stop it while it waits;
    # without the watcher it would be stopped only after its first token, once all the
    # fills have ended.
    aborted0 = metric_value(scrape(server), "vllm:request_aborted_total", **VLLM)
    cancelled0 = metric_value(scrape(server), "router_cancelled_total", engine="vllm_backend")
    outcome: dict[str, bool] = {}

    def check(fills: list[cf.Future]) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(f.done() for f in fills):
            if metric_value(scrape(server), "vllm:request_aborted_total", **VLLM) >= aborted0 + 1:
                outcome["while_waiting"] = True
                return
            time.sleep(0.2)
        outcome["while_waiting"] = False

    with_fills(server, "vllm_backend", check)
    assert outcome["while_waiting"], "vLLM did not abort the victim while it waited behind the fills"
    wait_for(lambda: metric_value(scrape(server), "router_cancelled_total", engine="vllm_backend") >= cancelled0 + 1,
             timeout=30, what="router_cancelled_total to count the request")
    text = scrape(server)
    assert metric_value(text, "vllm:request_aborted_total", **VLLM) == aborted0 + 1
    assert metric_value(text, "router_cancelled_total", engine="vllm_backend") == cancelled0 + 1


def test_a_stop_request_ends_a_stream_and_its_engine_request(server):
    before = scrape(server)
    aborted0 = metric_value(before, "vllm:request_aborted_total", **VLLM)
    found0 = metric_value(before, "router_stop_requests_total", result="found")
    missed0 = metric_value(before, "router_stop_requests_total", result="not_found")
    streaming = threading.Event()
    # 4,000 tokens (~16 s or more here): a full-suite run once saw the stop find nothing in flight
    # with 1,000; the likeliest reading is that the stream had ended, the test process starved
    # for seconds on 2 shared cores (the failure message now shows what the stream got).
    req = GenerationRequest("tell me a long story", max_tokens=4000, min_tokens=4000, temperature=0.0)
    with cf.ThreadPoolExecutor(1) as pool:
        victim = pool.submit(stream_grpc, server.grpc_url, "router_bls", router_tensors(req), request_id="stop-me",
                             timeout_s=120, on_chunk=lambda r: len(r.chunks) >= 3 and streaming.set())
        assert streaming.wait(60), victim.result() if victim.done() else "no chunks within 60 s"
        assert stop_grpc(server.grpc_url, "no-such-request").backend == ""
        stopped = stop_grpc(server.grpc_url, "stop-me")
        if stopped.backend != "vllm_backend":
            result = victim.result(timeout=120)
            raise AssertionError(f"stop request: {stopped.as_dict()}; the stopped stream: {result.as_dict()}, "
                                 f"{len(result.chunks)} chunks; router: "
                                 f"{[l for l in scrape(server).splitlines() if l.startswith('router_stop')]}")
        result = victim.result(timeout=30)
    assert result.ok and not result.cancelled, result.as_dict()  # the stream ended with its FINAL
    assert len(result.chunks) < 4000, len(result.chunks)
    wait_for(lambda: metric_value(scrape(server), "vllm:request_aborted_total", **VLLM) >= aborted0 + 1, 30,
             "vLLM to abort the stopped request")
    counts = lambda: (metric_value(t := scrape(server), "router_stop_requests_total", result="found") - found0,  # noqa: E731
                      metric_value(t, "router_stop_requests_total", result="not_found") - missed0)
    wait_for(lambda: counts() == (1, 1), 15, "router_stop_requests_total to count one found and one not found")
