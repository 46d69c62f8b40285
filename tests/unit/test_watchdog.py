"""The hang detector: busy without progress for the bound means unhealthy; progress or idleness heals."""

from __future__ import annotations

from hybrid_llm.watchdog import HangDetector, observe_all, progress_of


def scrape(pending=0, in_flight=0, finished=0, vllm_tokens=0, trt_iters=0) -> str:
    return "\n".join([
        f'nv_inference_pending_request_count{{model="router_bls",version="1"}} {pending}',
        f'router_in_flight{{model="router_bls",engine="vllm_backend"}} {in_flight}',
        f'router_queue_depth{{model="router_bls",priority="normal"}} 0',
        f'router_e2e_seconds_count{{model="router_bls",engine="trtllm"}} {finished}',
        f'vllm:generation_tokens_total{{model="vllm_backend",version="1"}} {vllm_tokens}',
        f'nv_trt_llm_general_metrics{{general_type="iteration_counter",model="trtllm",version="1"}} {trt_iters}',
        f'nv_trt_llm_general_metrics{{general_type="timestamp",model="trtllm",version="1"}} {trt_iters * 7}',
    ]) + "\n"


def test_progress_reads_admitted_work_and_the_counters():
    p = progress_of(scrape(pending=2, in_flight=3, finished=5, vllm_tokens=100, trt_iters=7))
    assert p.busy and p.admitted == 5 and p.counter == 112  # the timestamp gauge is not progress


def test_busy_without_progress_for_the_bound_is_unhealthy_and_progress_heals():
    d = HangDetector(bound_s=10)
    health = observe_all(d, [(0, scrape(in_flight=1, vllm_tokens=5)), (5, scrape(in_flight=1, vllm_tokens=5)),
                             (9.9, scrape(in_flight=1, vllm_tokens=5)), (10, scrape(in_flight=1, vllm_tokens=5))])
    assert health == [True, True, True, False] and d.stalled_s == 10
    assert d.observe(progress_of(scrape(in_flight=1, vllm_tokens=6)), 11)  # a token: healthy again


def test_idle_is_never_a_hang():
    d = HangDetector(bound_s=1)
    assert all(observe_all(d, [(t, scrape()) for t in range(10)]))


def test_requests_pending_in_triton_for_a_hung_stub_count_as_busy():
    d = HangDetector(bound_s=3)
    assert observe_all(d, [(t, scrape(pending=4, finished=9)) for t in range(5)]) == [True] * 3 + [False] * 2


def test_a_finished_request_or_an_engine_step_is_progress():
    d = HangDetector(bound_s=2)
    seq = [(0, scrape(in_flight=1)), (1.5, scrape(in_flight=1, finished=1)), (3, scrape(in_flight=1, finished=1,
                                                                                      trt_iters=1)),
           (4.5, scrape(in_flight=1, finished=1, trt_iters=1))]
    assert observe_all(d, seq) == [True, True, True, True]
