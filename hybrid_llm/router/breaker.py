"""Per-engine circuit breaker (DESIGN.md rule 8), driven by an injectable clock.

Opens when, over the last ``window_s`` (60 s), at least ``min_requests`` (20) requests
finished and >= ``failure_ratio`` (60%) failed; or when ``burst_failures`` (5) failures
happened within ``burst_window_s`` (30 s) among >= ``burst_min_requests`` (10) requests.
After the recovery window of the rule that opened it (60 s or 30 s) it is half-open:
one trial request is let through; its success closes the breaker, its failure re-opens it.
"""

from __future__ import annotations

import collections
import enum
import threading
import time
from typing import Callable

from hybrid_llm.router.config import RouterConfig


class BreakerState(enum.IntEnum):
    """Exported as a gauge: 0 closed, 1 half-open, 2 open."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class CircuitBreaker:
    """Failure accounting and the closed / open / half-open state machine."""

    def __init__(self, cfg: RouterConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self._clock = clock
        self._events: collections.deque[tuple[float, bool]] = collections.deque()
        self._state = BreakerState.CLOSED
        self._opened_at = 0.0
        self._recovery_s = cfg.breaker_window_s
        self._trial_in_flight = False
        self._lock = threading.Lock()
        self.opened = 0  # how many times it has opened (monotonic; exported as a counter)

    def _trim(self, now: float) -> None:
        horizon = now - max(self.cfg.breaker_window_s, self.cfg.breaker_burst_window_s)
        while self._events and self._events[0][0] < horizon:
            self._events.popleft()

    @property
    def state(self) -> BreakerState:
        """Current state (an open breaker past its recovery window reads as half-open)."""
        with self._lock:
            return self._state_locked(self._clock())

    def _state_locked(self, now: float) -> BreakerState:
        if self._state is BreakerState.OPEN and now - self._opened_at >= self._recovery_s:
            self._state = BreakerState.HALF_OPEN
            self._trial_in_flight = False
        return self._state

    def allow(self) -> bool:
        """May a new request go to this engine? (Half-open: exactly one trial at a time.)"""
        with self._lock:
            state = self._state_locked(self._clock())
            if state is BreakerState.CLOSED:
                return True
            if state is BreakerState.HALF_OPEN and not self._trial_in_flight:
                self._trial_in_flight = True
                return True
            return False

    def available(self) -> bool:
        """Like ``allow`` but without taking the half-open trial slot (for routing decisions)."""
        with self._lock:
            state = self._state_locked(self._clock())
            return state is BreakerState.CLOSED or (state is BreakerState.HALF_OPEN and not self._trial_in_flight)

    def record(self, success: bool) -> None:
        """Account one finished request (success: it produced its stream without an engine error)."""
        with self._lock:
            now = self._clock()
            state = self._state_locked(now)
            if state is BreakerState.HALF_OPEN:
                self._trial_in_flight = False
                if success:
                    self._state = BreakerState.CLOSED
                    self._events.clear()
                else:
                    self._open(now, self._recovery_s)
                return
            if state is BreakerState.OPEN:
                return
            self._events.append((now, success))
            self._trim(now)
            self._evaluate(now)

    def _evaluate(self, now: float) -> None:
        cfg = self.cfg
        window = [ok for t, ok in self._events if t >= now - cfg.breaker_window_s]
        failures = window.count(False)
        if len(window) >= cfg.breaker_min_requests and failures / len(window) >= cfg.breaker_failure_ratio:
            self._open(now, cfg.breaker_window_s)
            return
        burst = [ok for t, ok in self._events if t >= now - cfg.breaker_burst_window_s]
        if len(burst) >= cfg.breaker_burst_min_requests and burst.count(False) >= cfg.breaker_burst_failures:
            self._open(now, cfg.breaker_burst_window_s)

    def _open(self, now: float, recovery_s: float) -> None:
        self.opened += 1
        self._state = BreakerState.OPEN
        self._opened_at = now
        self._recovery_s = recovery_s
        self._trial_in_flight = False
