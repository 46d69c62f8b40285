"""Priority-aware dispatch (DESIGN.md rules 4-6): per-engine queues, classes, batches.

Ordering rules, in this order (tested in tests/unit/test_dispatch.py):
1. A request waiting longer than its class's maximum wait (10/50/200 ms by default)
   goes next; among several, the one furthest past its limit, ties to the more urgent
   class, then to the earlier arrival.
2. Otherwise classes share dispatch slots by weight (5/3/1) with smooth weighted
   round-robin over the non-empty classes; ties go to the more urgent class.
3. Within a class, first come first served.
4. While an engine's KV usage is over the watermark, classes with priority number >=
   ``kv_guard_min_priority`` stay queued for it (held, never dropped).
Each dispatch cycle releases ``dispatch_batch_size`` requests per engine, bounded by
the engine's free capacity (TRT-LLM max_batch_size, vLLM max_num_seqs).
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from hybrid_llm.contracts.spec import HIGH, NORMAL, URGENT
from hybrid_llm.router.config import RouterConfig
from hybrid_llm.router.policy import ENGINE_KEYS

CLASSES = (URGENT, HIGH, NORMAL)


@dataclass
class Ticket:
    """A request waiting in the router for a dispatch slot on its engine."""

    engine: str
    priority: int
    enqueued_at: float
    payload: Any = None
    seq: int = 0
    released_at: float | None = None

    @property
    def wait_s(self) -> float:
        """Time spent queued (0 until released)."""
        return 0.0 if self.released_at is None else self.released_at - self.enqueued_at


def dispatch_batch_size(queue_len: int, p95_ms: float | None, free_slots: int, cfg: RouterConfig) -> int:
    """Rule 5: queue < 10 -> 1; p95 > 200 ms -> min(8, queue); else min(32, max(4, queue/2)); capped by free slots."""
    if queue_len <= 0 or free_slots <= 0:
        return 0
    if queue_len < 10:
        n = 1
    elif p95_ms is not None and p95_ms > cfg.dispatch_p95_slow_ms:
        n = min(8, queue_len)
    else:
        n = min(32, max(4, queue_len // 2))
    return min(n, free_slots, queue_len)


@dataclass
class ClassQueues:
    """Three FIFO queues (URGENT, HIGH, NORMAL) with the ordering rules above."""

    weights: tuple[int, int, int]
    max_wait_s: tuple[float, float, float]
    queues: dict[int, collections.deque] = field(
        default_factory=lambda: {c: collections.deque() for c in CLASSES}
    )
    credit: dict[int, float] = field(default_factory=lambda: {c: 0.0 for c in CLASSES})

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def push(self, ticket: Ticket) -> None:
        """Queue a ticket at the back of its class."""
        self.queues[ticket.priority].append(ticket)

    def pop(self, now: float, max_class: int = NORMAL) -> Ticket | None:
        """Next ticket by the ordering rules, considering only classes <= max_class."""
        eligible = [c for c in CLASSES if c <= max_class and self.queues[c]]
        if not eligible:
            return None
        overdue = []
        for c in eligible:
            head = self.queues[c][0]
            late = now - head.enqueued_at - self.max_wait_s[c - 1]
            if late > 0:
                overdue.append((-late, c, head.seq))
        if overdue:
            _, c, _ = min(overdue)
            return self.queues[c].popleft()
        total = sum(self.weights[c - 1] for c in eligible)
        for c in eligible:
            self.credit[c] += self.weights[c - 1]
        pick = max(eligible, key=lambda c: (self.credit[c], -c))
        self.credit[pick] -= total
        return self.queues[pick].popleft()


class Dispatcher:
    """Holds queued tickets per engine and releases them as capacity frees up.

    ``run_cycle`` is the pure step (unit-tested with a fake clock); ``start`` runs it
    on a thread whenever something changes, and every ``tick_s`` while work is queued.
    """

    def __init__(
        self,
        cfg: RouterConfig,
        kv_usage: Callable[[str], float],
        p95_ms: Callable[[str], float | None],
        on_release: Callable[[Ticket], None],
        clock: Callable[[], float] = time.monotonic,
        tick_s: float = 0.002,
    ) -> None:
        self.cfg = cfg
        self._kv_usage = kv_usage
        self._p95_ms = p95_ms
        self._on_release = on_release
        self._clock = clock
        self._tick_s = tick_s
        self._seq = itertools.count()
        self._lock = threading.Condition()
        self._stop = False
        self._dirty = False
        self._thread: threading.Thread | None = None
        max_wait = tuple(ms / 1000.0 for ms in cfg.priority_max_wait_ms)
        self.queues = {e: ClassQueues(cfg.priority_weights, max_wait) for e in ENGINE_KEYS}  # type: ignore[arg-type]
        self.in_flight = {e: 0 for e in ENGINE_KEYS}

    def queued(self, engine: str | None = None) -> int:
        """Tickets waiting (for one engine or in total)."""
        if engine is not None:
            return len(self.queues[engine])
        return sum(len(q) for q in self.queues.values())

    def queued_by_class(self) -> dict[int, int]:
        """Tickets waiting per priority class, over both engines."""
        return {c: sum(len(q.queues[c]) for q in self.queues.values()) for c in CLASSES}

    def submit(self, engine: str, priority: int, payload: Any = None) -> Ticket | None:
        """Queue a request; None when the router queue is full (the caller answers UNAVAILABLE)."""
        with self._lock:
            if self.queued() >= self.cfg.max_queue:
                return None
            ticket = Ticket(engine, priority, self._clock(), payload, next(self._seq))
            self.queues[engine].push(ticket)
            self._dirty = True
            self._lock.notify()
        return ticket

    def acquire(self, engine: str) -> None:
        """Count a request that bypasses the queue (a failover attempt) as in flight."""
        with self._lock:
            self.in_flight[engine] += 1

    def complete(self, engine: str) -> None:
        """A dispatched request finished; its slot is free again."""
        with self._lock:
            self.in_flight[engine] = max(self.in_flight[engine] - 1, 0)
            self._dirty = True
            self._lock.notify()

    def run_cycle(self) -> list[Ticket]:
        """One dispatch cycle: release a batch per engine (call with or without the lock)."""
        now = self._clock()
        released: list[Ticket] = []
        for engine in ENGINE_KEYS:
            queue = self.queues[engine]
            if not len(queue):
                continue
            free = self.cfg.capacity(engine) - self.in_flight[engine]
            n = dispatch_batch_size(len(queue), self._p95_ms(engine), free, self.cfg)
            max_class = NORMAL
            if self._kv_usage(engine) > self.cfg.kv_watermark:
                max_class = self.cfg.kv_guard_min_priority - 1
            for _ in range(n):
                ticket = queue.pop(now, max_class)
                if ticket is None:
                    break
                ticket.released_at = now
                self.in_flight[engine] += 1
                released.append(ticket)
        return released

    def start(self) -> None:
        """Run dispatch cycles on a background thread."""
        self._thread = threading.Thread(target=self._loop, name="router-dispatch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the dispatch thread."""
        with self._lock:
            self._stop = True
            self._lock.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        # One cycle per event (an arrival or a completion notifies) or per tick while
        # work is queued, so a cycle's batch size is what rule 5 says it is.
        while True:
            with self._lock:
                if self._stop:
                    return
                self._dirty = False
                released = self.run_cycle()
            for ticket in released:
                self._on_release(ticket)
            with self._lock:
                if self._stop:
                    return
                if not self._dirty:
                    self._lock.wait(self._tick_s if self.queued() else None)
