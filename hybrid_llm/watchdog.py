"""Tell a router that stopped making progress, from outside it: Triton's metrics endpoint.

A router stub that hangs (Triton 2.51's BLS deadlock, docs/known-limits.md) cannot report
itself; its gauges freeze. Seen from the metrics endpoint, "hung" is: work is admitted
(Triton has requests pending for router_bls, or the router's last in-flight / queue
gauges are above 0) while nothing moves (no request of the router finishes, fails or is
cancelled, and neither engine steps: vLLM's generation tokens and the tensorrtllm
iteration counter stand still) for ``bound_s``. An engine that stops responding looks
the same and is just as fatal to the requests it holds. No Triton imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from hybrid_llm import prom

# Counters whose sum moves whenever the router or an engine makes progress.
PROGRESS = (
    ("router_e2e_seconds_count", {}), ("router_errors_total", {}), ("router_cancelled_total", {}),
    ("router_rejected_total", {}), ("vllm:generation_tokens_total", {}),
    ("nv_trt_llm_general_metrics", {"general_type": "iteration_counter"}),
)


@dataclass(frozen=True)
class Progress:
    """One scrape's view: is work admitted, and the progress counters' sum."""

    busy: bool
    counter: float
    admitted: int


def progress_of(text: str, router: str = "router_bls") -> Progress:
    """Read a scrape of Triton's metrics endpoint."""
    samples = prom.parse_text(text)
    total = lambda name, **labels: sum(s.value for s in prom.find(samples, name, **labels))  # noqa: E731
    pending = total("nv_inference_pending_request_count", model=router)
    admitted = total("router_in_flight", model=router) + total("router_queue_depth", model=router)
    counter = sum(total(name, **labels) for name, labels in PROGRESS)
    return Progress(pending + admitted > 0, counter, int(pending + admitted))


class HangDetector:
    """``observe`` each scrape; ``healthy`` turns False after ``bound_s`` busy without progress."""

    def __init__(self, bound_s: float = 15.0) -> None:
        self.bound_s = bound_s
        self._last_counter: float | None = None
        self._since: float | None = None  # when progress was last seen (or work last absent)
        self.stalled_s = 0.0
        self.admitted = 0

    def observe(self, p: Progress, now: float) -> bool:
        """Fold one scrape in; returns ``healthy``."""
        if not p.busy or p.counter != self._last_counter or self._since is None:
            self._since = now
        self._last_counter = p.counter
        self.admitted = p.admitted
        self.stalled_s = now - self._since
        return self.healthy

    @property
    def healthy(self) -> bool:
        """False once the router was busy without progress for ``bound_s``."""
        return self.stalled_s < self.bound_s


def observe_all(detector: HangDetector, scrapes: Iterable[tuple[float, str]]) -> list[bool]:
    """Feed timed scrapes (``(t, text)``) to a detector; the health after each (tests, replays)."""
    return [detector.observe(progress_of(text), t) for t, text in scrapes]
