"""Rules 5-6: dispatch batch sizes and priority ordering under saturation."""

from __future__ import annotations

import pytest

from hybrid_llm.router.config import RouterConfig
from hybrid_llm.router.dispatch import HIGH, NORMAL, URGENT, Dispatcher, dispatch_batch_size
from hybrid_llm.router.policy import TRTLLM, VLLM

CFG = RouterConfig()


@pytest.mark.parametrize("queue,p95,free,expected", [
    (0, None, 10, 0), (5, None, 0, 0), (1, None, 32, 1), (9, None, 32, 1), (9, 500.0, 32, 1),
    (10, None, 32, 5), (10, 250.0, 32, 8), (100, 250.0, 32, 8), (10, 200.0, 32, 5),
    (12, None, 32, 6), (7 * 2 + 20, None, 32, 17), (100, None, 32, 32), (100, None, 7, 7),
    (11, None, 32, 5),
])
def test_rule5_batch_sizes(queue, p95, free, expected):
    assert dispatch_batch_size(queue, p95, free, CFG) == expected


def test_rule5_minimum_four_when_queue_is_long():
    assert dispatch_batch_size(10, None, 32, RouterConfig()) == 5
    # queue/2 < 4 never happens for queue >= 10, but the max(4, .) floor is the rule
    assert dispatch_batch_size(10, 10.0, 3, CFG) == 3  # capped by free capacity


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make(cfg=CFG, kv=None):
    clock = Clock()
    kv = kv or {}
    d = Dispatcher(cfg, kv_usage=lambda e: kv.get(e, 0.0), p95_ms=lambda e: None,
                   on_release=lambda t: None, clock=clock)
    return d, clock


def saturate(d, engine=VLLM):
    d.in_flight[engine] = d.cfg.capacity(engine)


def release_one(d, engine=VLLM):
    d.complete(engine)
    out = d.run_cycle()
    return out


def test_urgent_overtakes_queued_normal():
    d, clock = make()
    saturate(d)
    for i in range(20):
        d.submit(VLLM, NORMAL, f"n{i}")
    clock.t = 0.001
    d.submit(VLLM, URGENT, "u")
    out = release_one(d)
    assert [t.payload for t in out] == ["u"]


def test_normal_past_max_wait_goes_next():
    d, clock = make()
    saturate(d)
    d.submit(VLLM, NORMAL, "old-normal")
    clock.t = 0.150
    for i in range(5):
        d.submit(VLLM, URGENT, f"u{i}")
    clock.t = 0.201  # old-normal has waited 201 ms > 200 ms; urgents only 51 ms > 10 ms...
    # ...but the normal is furthest past its limit (1 ms vs 41 ms for urgent): urgent first
    assert release_one(d)[0].payload == "u0"
    clock.t = 0.1505  # rewind not possible in reality; use a fresh case below
    d2, c2 = make()
    saturate(d2)
    d2.submit(VLLM, NORMAL, "old-normal")
    c2.t = 0.205
    for i in range(5):
        d2.submit(VLLM, URGENT, f"u{i}")
    assert release_one(d2)[0].payload == "old-normal"


def test_weights_share_slots_5_3_1():
    d, clock = make()
    saturate(d)
    for cls in (URGENT, HIGH, NORMAL):
        for i in range(30):
            d.submit(VLLM, cls, cls)
    picks = []
    for _ in range(18):
        picks += [t.payload for t in release_one(d)]
    assert picks.count(URGENT) == 10 and picks.count(HIGH) == 6 and picks.count(NORMAL) == 2


def test_fifo_within_class_and_capacity_bound():
    d, clock = make()
    for i in range(5):
        d.submit(TRTLLM, HIGH, i)
    got = []
    for _ in range(10):
        got += [t.payload for t in d.run_cycle()]
    assert got == [0, 1, 2, 3, 4]
    assert d.in_flight[TRTLLM] == 5


def test_capacity_is_never_exceeded():
    d, clock = make()
    for i in range(100):
        d.submit(TRTLLM, NORMAL, i)
    released = 0
    for _ in range(50):
        released += len(d.run_cycle())
    assert released == CFG.trtllm_capacity == d.in_flight[TRTLLM]
    assert d.queued(TRTLLM) == 100 - CFG.trtllm_capacity


def test_kv_watermark_holds_low_priority_but_not_urgent():
    kv = {VLLM: 0.95}
    d, clock = make(kv=kv)
    d.submit(VLLM, NORMAL, "n")
    d.submit(VLLM, HIGH, "h")
    d.submit(VLLM, URGENT, "u")
    got = [t.payload for _ in range(5) for t in d.run_cycle()]
    assert got == ["u"]
    kv[VLLM] = 0.5
    got = [t.payload for _ in range(5) for t in d.run_cycle()]
    assert sorted(got) == ["h", "n"]


def test_queue_bound():
    d, clock = make(cfg=RouterConfig(max_queue=3))
    assert all(d.submit(VLLM, NORMAL, i) for i in range(3))
    assert d.submit(VLLM, URGENT, "x") is None


def test_threaded_dispatch_releases_everything():
    import threading
    released = []
    done = threading.Event()
    cfg = RouterConfig()
    def on_release(t):
        released.append(t.payload)
        d.complete(t.engine)
        if len(released) == 200:
            done.set()
    d = Dispatcher(cfg, kv_usage=lambda e: 0.0, p95_ms=lambda e: None, on_release=on_release)
    d.start()
    try:
        for i in range(200):
            d.submit(VLLM if i % 2 else TRTLLM, (i % 3) + 1, i)
        assert done.wait(10)
    finally:
        d.stop()
    assert sorted(released) == list(range(200))
