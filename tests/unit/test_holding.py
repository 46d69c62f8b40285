"""DelayedRelease drops what it holds after the hold time, on its own thread, without new traffic."""

from __future__ import annotations

import gc
import threading
import time
import weakref

from hybrid_llm.triton.holding import DelayedRelease


class Stream:
    """Stands for a finished BLS response iterator; records the thread that freed it."""

    freed_on: list[str] = []

    def __del__(self) -> None:
        Stream.freed_on.append(threading.current_thread().name)


def _wait(pred, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def test_held_until_the_hold_time_then_released_by_the_reaper():
    gc.disable()  # the reference count alone must free it
    try:
        holder = DelayedRelease(hold_s=0.3)
        obj = Stream()
        ref = weakref.ref(obj)
        Stream.freed_on.clear()
        holder.keep(obj)
        del obj
        time.sleep(0.1)
        assert ref() is not None and len(holder) == 1  # still held
        assert _wait(lambda: ref() is None), "never released without further keep() calls"
        assert Stream.freed_on == ["bls-release"]
        assert len(holder) == 0
        holder.clear()
    finally:
        gc.enable()


def test_release_order_follows_arrival_and_clear_drops_everything():
    holder = DelayedRelease(hold_s=60)
    objs = [Stream() for _ in range(3)]
    refs = [weakref.ref(o) for o in objs]
    for o in objs:
        holder.keep(o)
    del objs, o
    assert all(r() is not None for r in refs)
    holder.clear()
    assert all(r() is None for r in refs)
    # after clear (model unload) nothing is held any more
    late = Stream()
    late_ref = weakref.ref(late)
    holder.keep(late)
    del late
    assert late_ref() is None and len(holder) == 0


def test_a_late_item_does_not_delay_an_early_one():
    holder = DelayedRelease(hold_s=0.2)
    early = Stream()
    early_ref = weakref.ref(early)
    holder.keep(early)
    del early
    time.sleep(0.1)
    later = Stream()
    later_ref = weakref.ref(later)
    holder.keep(later)
    del later
    assert _wait(lambda: early_ref() is None, 1.0)
    assert _wait(lambda: later_ref() is None, 1.0)
    holder.clear()
