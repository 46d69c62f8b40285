"""The metric writer's queue: gauges keep their latest value, counters sum, observations stay in order."""

from __future__ import annotations

import threading

from hybrid_llm.metric_queue import MetricQueue


class Fake:
    """A metric that records what the writer applied."""

    def __init__(self) -> None:
        self.value = 0.0
        self.observed: list[float] = []

    def set(self, value: float) -> None:
        self.value = value

    def increment(self, value: float) -> None:
        self.value += value

    def observe(self, value: float) -> None:
        self.observed.append(value)


def apply(q: MetricQueue) -> list[tuple[str, float]]:
    """Take one round and apply it; returns (op, value) pairs in order."""
    done = q.take(timeout_s=0)
    for metric, op, value in done.writes:
        getattr(metric, op)(value)
    for event in done.flushes:
        event.set()
    return [(op, value) for _, op, value in done.writes]


def test_a_gauge_written_many_times_costs_one_write_of_its_latest_value() -> None:
    q, gauge = MetricQueue(), Fake()
    for v in range(1000):
        q.set(gauge, float(v))
    assert apply(q) == [("set", 999.0)]
    assert gauge.value == 999.0


def test_increments_are_summed_and_an_increment_after_a_set_adds_to_it() -> None:
    q, counter, gauge = MetricQueue(), Fake(), Fake()
    gauge.value = 7.0
    for _ in range(10):
        q.increment(counter, 2.0)
    q.set(gauge, 3.0)
    q.increment(gauge, 1.5)
    assert sorted(apply(q)) == [("increment", 20.0), ("set", 4.5)]
    assert (counter.value, gauge.value) == (20.0, 4.5)
    q.increment(counter, 1.0)
    apply(q)
    assert counter.value == 21.0


def test_gauges_are_current_after_one_round_however_many_observations_wait() -> None:
    q, gauge, hist = MetricQueue(batch=10), Fake(), Fake()
    for v in range(55):
        q.observe(hist, float(v))
    q.set(gauge, 0.42)
    first = apply(q)
    assert gauge.value == 0.42 and len(first) == 11  # the gauge, then the first 10 observations
    rounds = 1
    while len(hist.observed) < 55:
        apply(q)
        rounds += 1
    assert hist.observed == [float(v) for v in range(55)]  # order kept, nothing lost
    assert rounds == 6


def test_a_flush_completes_only_once_older_observations_are_written() -> None:
    q, hist = MetricQueue(batch=2), Fake()
    for v in range(5):
        q.observe(hist, float(v))
    done = q.flush_event()
    apply(q)
    apply(q)
    assert not done.is_set()
    apply(q)
    assert done.is_set() and len(hist.observed) == 5


def test_observations_beyond_the_bound_drop_the_oldest_and_are_counted() -> None:
    q, hist = MetricQueue(batch=100, max_observations=3), Fake()
    for v in range(5):
        q.observe(hist, float(v))
    apply(q)
    assert hist.observed == [2.0, 3.0, 4.0] and q.dropped == 2


def test_close_wakes_the_writer_and_ends_after_the_pending_writes() -> None:
    q, gauge = MetricQueue(), Fake()
    rounds: list[bool] = []

    def writer() -> None:
        while True:
            r = q.take()
            for metric, op, value in r.writes:
                getattr(metric, op)(value)
            rounds.append(r.closing)
            if r.closing:
                return

    t = threading.Thread(target=writer)
    t.start()
    q.set(gauge, 5.0)
    q.close()
    t.join(timeout=5)
    assert not t.is_alive() and gauge.value == 5.0 and rounds[-1] is True
