"""Delayed release of objects on a Python thread of our own (no Triton imports).

Triton 2.51's stub keeps each BLS response iterator (and every response, with its
numpy-backed tensors) in a map that a background C++ thread clears after the stream
ends. If that thread drops the last reference, the tensors are freed without the GIL
and the stub's heap is corrupted. Holding our own reference for a few seconds makes
the final release happen here, on a thread that holds the GIL.

Release must not wait for the next stream: a reference kept across an unload and a
reload of the engine model it came from crashed tritonserver (SIGSEGV in the Python
backend) at the first request after the reload. So a reaper thread releases what has
been held for ``hold_s``, whether or not traffic continues.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable


class DelayedRelease:
    """Holds objects for ``hold_s`` seconds, then drops them on its own reaper thread."""

    def __init__(self, hold_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.hold_s = hold_s
        self._clock = clock
        self._items: "collections.deque[tuple[float, Any]]" = collections.deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    def keep(self, obj: Any) -> None:
        """Hold ``obj`` until ``hold_s`` has passed (starts the reaper on first use)."""
        with self._cond:
            if self._stopped:
                return  # shutting down: the caller's reference is the last one
            self._items.append((self._clock() + self.hold_s, obj))
            if self._thread is None:
                self._thread = threading.Thread(target=self._reap, name="bls-release", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _reap(self) -> None:
        while True:
            expired = []
            with self._cond:
                if self._stopped:
                    return
                now = self._clock()
                while self._items and self._items[0][0] <= now:
                    expired.append(self._items.popleft()[1])
                wait_s = (self._items[0][0] - now) if self._items else None
                if not expired:
                    self._cond.wait(timeout=None if wait_s is None else max(wait_s, 0.05))
            del expired  # the last references go here, with the GIL held

    def clear(self) -> None:
        """Drop everything held now and stop the reaper (model unload)."""
        with self._cond:
            self._stopped = True
            items, self._items = self._items, collections.deque()
            self._cond.notify_all()
            thread = self._thread
        del items
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2)
