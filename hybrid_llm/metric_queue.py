"""Metric updates waiting for the writer thread, coalesced so that gauges stay current.

Each metric write from a Python-backend stub is an IPC round trip to tritonserver. An
engine step makes several (gauges, counters, one latency observation per running
request), so under load a plain FIFO of writes falls behind the engine: CI once saw
``vllm:kv_cache_usage_perc`` and ``vllm:num_requests_running`` scraped at 0.0 for 30 s
while three long requests ran, and the router reads those gauges to route. Here a
gauge keeps only its latest value and a counter the sum of its pending increments, so
one round of the writer brings every gauge and counter up to date however far behind
the histogram observations are; observations keep their order and are written at most
``batch`` per round, and beyond ``max_observations`` waiting the oldest are dropped
(counted) so that memory stays bounded.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Any

Write = tuple[Any, str, float]  # (metric, "set" | "increment" | "observe", value)


@dataclass
class Round:
    """What the writer applies in one round, and the flushes that complete after it."""

    writes: list[Write] = field(default_factory=list)
    flushes: list[threading.Event] = field(default_factory=list)
    closing: bool = False


class MetricQueue:
    """Thread-safe pending metric writes: latest value per gauge, summed increments, ordered observations."""

    def __init__(self, batch: int = 256, max_observations: int = 100_000) -> None:
        self.batch = batch
        self.max_observations = max_observations
        self.dropped = 0  # observations dropped because the writer was too far behind
        self._cond = threading.Condition()
        # id(metric) -> [metric, value set (or None), increment on top]
        self._scalars: dict[int, list[Any]] = {}
        self._observations: collections.deque[tuple[Any, float]] = collections.deque()
        self._flushes: list[threading.Event] = []
        self._closing = False

    def set(self, metric: Any, value: float) -> None:
        """A gauge's new value (replaces any pending write of it)."""
        with self._cond:
            self._scalars[id(metric)] = [metric, float(value), 0.0]
            self._cond.notify()

    def increment(self, metric: Any, value: float) -> None:
        """Add ``value`` to a counter or gauge (summed with its pending writes)."""
        with self._cond:
            entry = self._scalars.setdefault(id(metric), [metric, None, 0.0])
            entry[2] += float(value)
            self._cond.notify()

    def observe(self, metric: Any, value: float) -> None:
        """One histogram observation (kept in order)."""
        with self._cond:
            if len(self._observations) >= self.max_observations:
                self._observations.popleft()
                self.dropped += 1
            self._observations.append((metric, float(value)))
            self._cond.notify()

    def flush_event(self) -> threading.Event:
        """An event set once everything queued before this call has been taken and written."""
        done = threading.Event()
        with self._cond:
            self._flushes.append(done)
            self._cond.notify()
        return done

    def close(self) -> None:
        """Ask the writer to write what is pending and stop."""
        with self._cond:
            self._closing = True
            self._cond.notify()

    def take(self, timeout_s: float | None = None) -> Round:
        """Wait for work, then take every pending gauge and counter and up to ``batch``
        observations. Flushes are handed out once nothing older is left to write."""
        with self._cond:
            self._cond.wait_for(lambda: self._scalars or self._observations or self._flushes or self._closing,
                                timeout_s)
            writes: list[Write] = []
            for metric, value, delta in self._scalars.values():
                if value is None:
                    writes.append((metric, "increment", delta))
                else:
                    writes.append((metric, "set", value + delta))
            self._scalars.clear()
            for _ in range(min(self.batch, len(self._observations))):
                metric, value = self._observations.popleft()
                writes.append((metric, "observe", value))
            done = not self._observations
            flushes, self._flushes = (self._flushes, []) if done else ([], self._flushes)
            return Round(writes, flushes, self._closing and done)


__all__ = ["MetricQueue", "Round", "Write"]
