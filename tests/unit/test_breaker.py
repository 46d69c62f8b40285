"""Rule 8: circuit breaker with a fake clock."""

from __future__ import annotations

from hybrid_llm.router.breaker import BreakerState, CircuitBreaker
from hybrid_llm.router.config import RouterConfig


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def make():
    clock = Clock()
    return CircuitBreaker(RouterConfig(), clock), clock


def test_ratio_rule_needs_20_requests_and_60_percent():
    b, c = make()
    for i in range(19):
        b.record(False)  # 19 failures, but < 20 requests... burst rule: 5 failures among >= 10
    # the burst rule opens first (>= 5 failures within 30 s among >= 10 requests)
    assert b.state is BreakerState.OPEN


def test_ratio_rule_alone():
    b, c = make()
    # spread over > 30 s so that the burst window never holds 10 requests with 5 failures
    for i in range(20):
        c.t = i * 3.1
        b.record(i % 5 < 3)  # 60% success -> 40% failures: stays closed
    assert b.state is BreakerState.CLOSED
    b2, c2 = make()
    states = []
    for i in range(20):
        c2.t = i * 2.0  # 20 requests within 40 s
        b2.record(i % 5 >= 3)  # 40% success -> 60% failures
        states.append(b2.state)
    assert BreakerState.OPEN in states


def test_burst_rule_needs_10_requests():
    b, c = make()
    for _ in range(5):
        b.record(False)
    assert b.state is BreakerState.CLOSED  # 5 failures but only 5 requests
    for _ in range(4):
        b.record(True)
    assert b.state is BreakerState.CLOSED  # 9 requests
    b.record(True)
    assert b.state is BreakerState.OPEN  # 10 requests, 5 failures within 30 s


def test_half_open_trial_then_close_or_reopen():
    b, c = make()
    for _ in range(5):
        b.record(False)
    for _ in range(5):
        b.record(True)
    assert b.state is BreakerState.OPEN and not b.allow() and b.opened == 1
    c.t = 29.9
    assert not b.allow()
    c.t = 30.0  # burst rule's recovery window
    assert b.state is BreakerState.HALF_OPEN
    assert b.allow() and not b.allow()  # one trial at a time
    b.record(False)
    assert b.state is BreakerState.OPEN and b.opened == 2  # a failed trial re-opens it
    c.t = 60.0
    assert b.allow()
    b.record(True)
    assert b.state is BreakerState.CLOSED and b.allow() and b.opened == 2


def test_old_failures_leave_the_window():
    b, c = make()
    for _ in range(4):
        b.record(False)
    c.t = 31.0
    for _ in range(9):
        b.record(True)
    b.record(False)
    assert b.state is BreakerState.CLOSED
