"""Rolling latency percentiles per engine (feeds rules 5 and 7)."""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable


class LatencyWindow:
    """Samples (ms) of the last ``window_s`` seconds, at most ``max_samples``; cached p95."""

    def __init__(self, window_s: float, max_samples: int = 4096,
                 clock: Callable[[], float] = time.monotonic, cache_s: float = 0.05) -> None:
        self.window_s = window_s
        self._samples: collections.deque[tuple[float, float]] = collections.deque(maxlen=max_samples)
        self._clock = clock
        self._cache_s = cache_s
        self._cached: tuple[float, float | None] = (-1e18, None)
        self._lock = threading.Lock()

    def add(self, ms: float) -> None:
        """Record one sample now."""
        with self._lock:
            self._samples.append((self._clock(), ms))

    def percentile(self, q: float) -> float | None:
        """The q-quantile (0..1) of the window, None when empty (nearest-rank)."""
        with self._lock:
            now = self._clock()
            while self._samples and self._samples[0][0] < now - self.window_s:
                self._samples.popleft()
            values = sorted(ms for _, ms in self._samples)
        if not values:
            return None
        rank = max(int(round(q * len(values) + 0.5)) - 1, 0)
        return values[min(rank, len(values) - 1)]

    def p95(self) -> float | None:
        """The cached p95 (recomputed at most every ``cache_s``)."""
        now = self._clock()
        at, value = self._cached
        if now - at >= self._cache_s:
            value = self.percentile(0.95)
            self._cached = (now, value)
        return value
