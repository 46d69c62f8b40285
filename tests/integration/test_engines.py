"""The two engine models served by a real tritonserver: streaming, limits, determinism,
cancellation, non-streaming, metric families."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

from hybrid_llm.contracts import GenerationRequest, trtllm_tensors, vllm_stop_tensors, vllm_tensors
from client.stream import stream_grpc
from tests.server_fixture import SERVER_NICE, metric_value, running_server, scrape, wait_for

pytestmark = pytest.mark.integration
PROMPT_IDS = [101, 2048, 77, 5, 900, 31, 64, 12]


@pytest.fixture(scope="module")
def server():
    with running_server("engines", models=["vllm_backend", "trtllm"]) as s:
        yield s


def vllm(server, prompt="def fibonacci(n):", **kw):
    req = GenerationRequest(prompt, **kw)
    return stream_grpc(server.grpc_url, "vllm_backend", vllm_tensors(req), timeout_s=120)


def trt(server, ids=PROMPT_IDS, **kw):
    req = GenerationRequest("", **kw)
    return stream_grpc(server.grpc_url, "trtllm", trtllm_tensors(ids, req, end_id=2), timeout_s=120)


def test_the_test_server_and_its_engines_yield_cpu_to_the_test_clients(server):
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    pids = [server.proc.pid, *server.descendants()]
    assert len(pids) >= 3  # tritonserver, its stubs, the engines
    niceness = set()
    for pid in pids:
        try:
            niceness.add(os.getpriority(os.PRIO_PROCESS, pid))
        except ProcessLookupError:  # a short-lived helper that has exited
            pass
    assert niceness == {min(mine + SERVER_NICE, 19)}


def test_vllm_streams_real_tokens(server):
    r = vllm(server, max_tokens=24, temperature=0.0)
    assert r.ok, r.error
    assert len(r.chunks) > 1 and r.text.strip()
    assert r.num_input_tokens and r.num_input_tokens > 0
    assert r.num_output_tokens == 24 or r.finish_reason == "stop"
    assert r.ttft_s is not None and r.ttft_s < r.e2e_s


def test_trtllm_streams_new_ids(server):
    r = trt(server, max_tokens=20, temperature=0.0)
    assert r.ok, r.error
    assert 0 < len(r.token_ids) <= 20
    assert len(r.chunk_times_s) > 1  # one response per new id batch, not one blob
    assert not set(PROMPT_IDS[:3]) <= set(r.token_ids[:3])  # streaming never echoes the prompt


@pytest.mark.parametrize("n", [1, 7, 33])
def test_max_tokens_respected(server, n):
    rv = vllm(server, max_tokens=n, temperature=0.0)
    assert rv.num_output_tokens <= n
    assert rv.num_output_tokens == n or rv.finish_reason == "stop"
    rt = trt(server, max_tokens=n, temperature=0.0)
    assert len(rt.token_ids) <= n


def test_greedy_and_seeded_sampling_are_reproducible(server):
    a, b = vllm(server, max_tokens=16, temperature=0.0), vllm(server, max_tokens=16, temperature=0.0)
    assert a.text == b.text and a.text
    c, d = vllm(server, max_tokens=16, temperature=1.0, seed=1234), vllm(server, max_tokens=16, temperature=1.0, seed=1234)
    assert c.text == d.text
    e, f = trt(server, max_tokens=16, temperature=0.0), trt(server, max_tokens=16, temperature=0.0)
    assert e.token_ids == f.token_ids and e.token_ids
    g, h = trt(server, max_tokens=16, temperature=1.0, seed=99), trt(server, max_tokens=16, temperature=1.0, seed=99)
    assert g.token_ids == h.token_ids


def test_non_streaming_requests(server):
    r = vllm(server, max_tokens=12, temperature=0.0, stream=False)
    assert r.ok and len(r.chunks) == 1
    streamed = vllm(server, max_tokens=12, temperature=0.0)
    assert r.text == streamed.text
    full = vllm(server, max_tokens=12, temperature=0.0, stream=False, exclude_input_in_output=False)
    assert full.text == "def fibonacci(n):" + streamed.text
    t = trt(server, max_tokens=10, temperature=0.0, stream=False)
    assert t.ok and len(t.chunk_times_s) == 1 and len(t.token_ids) <= 10
    t_full = trt(server, max_tokens=10, temperature=0.0, stream=False, exclude_input_in_output=False)
    assert t_full.token_ids[:len(PROMPT_IDS)] == PROMPT_IDS


def _wait_stable(server, name, timeout=10.0, **labels):
    """Value of a counter once it stops moving (two equal scrapes 1 s apart)."""
    last = metric_value(scrape(server), name, **labels)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = metric_value(scrape(server), name, **labels)
        if now == last:
            return now
        last = now
    raise AssertionError(f"{name} kept moving")


def test_cancelling_a_vllm_stream_stops_generation(server):
    labels = {"model": "vllm_backend"}
    n = 3000
    attempts = []
    # Triton 2.51's gRPC frontend now and then never reports a stream's cancellation to the
    # model (seen in about 1 of 7 tries; README, Known limits), and the request then runs to
    # max_tokens. The engine model must abort whenever Triton does report it: up to 3 tries.
    for _ in range(3):
        aborted0 = metric_value(scrape(server), "vllm:request_aborted_total", **labels)
        gen0 = _wait_stable(server, "vllm:generation_tokens_total", **labels)
        r = stream_grpc(server.grpc_url, "vllm_backend",
                        vllm_tensors(GenerationRequest("tell me a long story", max_tokens=n, temperature=0.0)),
                        cancel_after_chunks=3, timeout_s=60)
        assert r.cancelled
        gen1 = _wait_stable(server, "vllm:generation_tokens_total", timeout=30.0, **labels)
        aborted = metric_value(scrape(server), "vllm:request_aborted_total", **labels) - aborted0
        # vLLM merges deltas the model has not read yet, so the 3 chunks the client saw may
        # hold many tokens. Asserted: the engine stopped well short of max_tokens, soon after
        # what the client had received, and counted the abort.
        received = r.num_output_tokens or 0
        attempts.append((gen1 - gen0, received, aborted))
        if gen1 - gen0 < min(received + 500, n) and aborted == 1:
            break
    else:
        raise AssertionError(f"no cancellation reached the engine in 3 tries (generated, received, aborted): "
                             f"{attempts}")
    assert metric_value(scrape(server), "vllm:num_requests_running", **labels) == 0


def test_a_request_marked_cancel_via_stop_is_stopped_by_its_stop_request(server):
    # router_bls marks its BLS calls so: the engine model does not poll the caller's cancel
    # flag (an IPC round trip per poll) and waits for the caller's stop request instead.
    labels = {"model": "vllm_backend"}
    aborted0 = metric_value(scrape(server), "vllm:request_aborted_total", **labels)
    success0 = metric_value(scrape(server), "vllm:request_success_total", **labels)
    # As long as max_model_len (4096) allows, and the check comes soon after the cancel: CI's
    # machine once had no request running 0.5 s after the cancel.
    tensors = vllm_tensors(GenerationRequest("tell me a long story", max_tokens=4000, min_tokens=4000, temperature=0.0))
    sampling = json.loads(tensors["sampling_parameters"].reshape(-1)[0])
    tensors["sampling_parameters"] = np.array([json.dumps({**sampling, "ignore_eos": True}).encode()],
                                              dtype=np.object_)
    rid = f"via-stop-{time.monotonic_ns()}"
    r = stream_grpc(server.grpc_url, "vllm_backend", tensors, request_id=rid, cancel_after_chunks=3,
                    timeout_s=60, parameters={"cancel_via_stop": True})
    assert r.cancelled
    time.sleep(0.15)  # three cancellation-check intervals (cancel_check_ms 50): a polled cancel lands by now
    text = scrape(server)
    counts = {name: metric_value(text, name, **labels) for name in
              ("vllm:request_aborted_total", "vllm:num_requests_running", "vllm:request_success_total",
               "vllm:generation_tokens_total")}
    assert counts["vllm:request_aborted_total"] == aborted0, counts
    if counts["vllm:request_success_total"] > success0:
        pytest.skip(f"this test process was starved (2 shared cores, docs/known-limits.md): it sent its cancel "
                    f"at {r.cancel_sent_s:.1f} s, after the 4,000-token request had ended")
    assert counts["vllm:num_requests_running"] == 1, counts  # still generating
    stop = stream_grpc(server.grpc_url, "vllm_backend", vllm_stop_tensors(), request_id=rid, timeout_s=30)
    assert stop.ok, stop.error
    wait_for(lambda: metric_value(scrape(server), "vllm:num_requests_running", **labels) == 0, 10,
             "the stopped request to leave the engine")
    assert metric_value(scrape(server), "vllm:request_aborted_total", **labels) == aborted0 + 1


def test_cancelling_a_trtllm_stream_stops_generation(server):
    r = stream_grpc(server.grpc_url, "trtllm",
                    trtllm_tensors(PROMPT_IDS, GenerationRequest("", max_tokens=1000, min_tokens=1000, temperature=0.0)),
                    cancel_after_chunks=3, timeout_s=60)
    assert r.cancelled and len(r.token_ids) < 1000
    deadline = time.monotonic() + 5
    active = None
    while time.monotonic() < deadline:
        active = metric_value(scrape(server), "nv_trt_llm_request_metrics", model="trtllm", request_type="active")
        if active == 0:
            break
        time.sleep(0.5)
    assert active == 0, "the stand-in engine still has the cancelled request"


def test_engine_metric_families_appear_and_count(server):
    before = scrape(server)
    r = vllm(server, "count these tokens", max_tokens=5, temperature=0.0)
    t = trt(server, max_tokens=5, temperature=0.0)
    assert r.ok and t.ok
    time.sleep(1.5)
    after = scrape(server)
    lab = {"model": "vllm_backend"}
    assert metric_value(after, "vllm:prompt_tokens_total", **lab) - metric_value(before, "vllm:prompt_tokens_total", **lab) >= r.num_input_tokens - 1
    assert metric_value(after, "vllm:generation_tokens_total", **lab) - metric_value(before, "vllm:generation_tokens_total", **lab) == r.num_output_tokens
    for fam in ("vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count",
                "vllm:time_per_output_token_seconds_count"):
        assert metric_value(after, fam, **lab) > metric_value(before, fam, **lab), fam
    for fam in ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert f"{fam}{{" in after, fam
    for kind in ("max", "free", "used", "tokens_per", "fraction"):
        assert f'kv_cache_block_type="{kind}"' in after
    assert metric_value(after, "nv_trt_llm_kv_cache_block_metrics", model="trtllm", kv_cache_block_type="max") > 0
    assert metric_value(after, "nv_trt_llm_kv_cache_block_metrics", model="trtllm", kv_cache_block_type="tokens_per") == 32
    assert metric_value(after, "nv_trt_llm_request_metrics", model="trtllm", request_type="completed") > \
        metric_value(before, "nv_trt_llm_request_metrics", model="trtllm", request_type="completed")


def test_bad_engine_input_is_invalid_arg_and_server_carries_on(server):
    r = stream_grpc(server.grpc_url, "trtllm",
                    trtllm_tensors(PROMPT_IDS, GenerationRequest("", max_tokens=0)), timeout_s=30)
    assert r.error_code == "INVALID_ARG" and "request_output_len" in r.error
    import numpy as np
    tensors = vllm_tensors(GenerationRequest("x", max_tokens=4))
    tensors["sampling_parameters"] = np.array([b"{not json"], dtype=object)
    r = stream_grpc(server.grpc_url, "vllm_backend", tensors, timeout_s=30)
    assert r.error_code == "INVALID_ARG" and "sampling_parameters" in r.error
    assert vllm(server, max_tokens=3).ok
