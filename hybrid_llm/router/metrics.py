"""Router metric families (prefix ``router_``, base units) over a metrics writer.

The writer is ``triton_adapter.Metrics`` in the server (Triton's /metrics endpoint)
and a fake in unit tests; no Triton imports here. Bucket bounds are config.pbtxt parameters
(``latency_buckets_s``, ``tpot_buckets_s``, ``queue_buckets_s``).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from hybrid_llm.contracts.spec import PRIORITY_LABELS
from hybrid_llm.router.config import LATENCY_BUCKETS_S, QUEUE_BUCKETS_S, TPOT_BUCKETS_S

DEFAULT_LATENCY_BUCKETS = LATENCY_BUCKETS_S
DEFAULT_TPOT_BUCKETS = TPOT_BUCKETS_S
DEFAULT_QUEUE_BUCKETS = QUEUE_BUCKETS_S

FAMILIES = (
    ("router_requests_total", "Requests routed, by engine and the rule that chose it.", "counter"),
    ("router_rejected_total", "Requests refused before routing, by reason.", "counter"),
    ("router_failovers_total", "Requests moved to the other engine before their first token.", "counter"),
    ("router_cancelled_total", "Requests cancelled by the client while streaming or queued in the router.", "counter"),
    ("router_stop_requests_total", "Stop requests (input stop), by whether they found their request in flight.",
     "counter"),
    ("router_errors_total", "Requests that ended with an engine error, by engine and code.", "counter"),
    ("router_queue_wait_seconds", "Time in the router queue before dispatch, by priority class.", "histogram"),
    ("router_ttft_seconds", "Time from arrival at the router to the first streamed token.", "histogram"),
    ("router_tpot_seconds", "Mean time per output token after the first, per request.", "histogram"),
    ("router_e2e_seconds", "Time from arrival at the router to the final response.", "histogram"),
    ("router_output_tokens_total", "Output tokens streamed (TPS is the rate of this).", "counter"),
    ("router_in_flight", "Requests dispatched to an engine and not finished.", "gauge"),
    ("router_queue_depth", "Requests waiting in the router queue, by priority class.", "gauge"),
    ("router_engine_weight", "Engine weight (0 unhealthy .. 100).", "gauge"),
    ("router_breaker_state", "Circuit breaker state: 0 closed, 1 half-open, 2 open.", "gauge"),
    ("router_breaker_opened_total", "Times the circuit breaker opened (re-opens after a failed trial too).",
     "counter"),
    ("router_kv_cache_usage", "KV-cache block usage of the engine (0..1), from Triton's metrics.", "gauge"),
    ("router_gpu_memory_used_bytes", "GPU memory used per device (NVML; absent without a GPU).", "gauge"),
    ("router_gpu_memory_total_bytes", "GPU memory per device (NVML; absent without a GPU).", "gauge"),
)


class RouterMetrics:
    """Typed helpers over the router's metric families."""

    def __init__(self, writer: Any, model: str = "router_bls",
                 latency_buckets: Sequence[float] = DEFAULT_LATENCY_BUCKETS,
                 tpot_buckets: Sequence[float] = DEFAULT_TPOT_BUCKETS,
                 queue_buckets: Sequence[float] = DEFAULT_QUEUE_BUCKETS, instance: str | None = None) -> None:
        self.w = writer
        # With several router instances every series carries ``instance``: gauges that two
        # stubs set under the same labels would overwrite each other (sum them by engine).
        self.base = {"model": model} if instance is None else {"model": model, "instance": instance}
        self.latency_buckets = list(latency_buckets)
        self.tpot_buckets = list(tpot_buckets)
        self.queue_buckets = list(queue_buckets)
        for name, desc, kind in FAMILIES:
            writer.family(name, desc, kind)

    def _m(self, name: str, labels: Mapping[str, str], buckets: Sequence[float] | None = None) -> Any:
        return self.w.metric(name, {**self.base, **labels}, buckets)

    def routed(self, engine: str, reason: str) -> None:
        """A request was routed to ``engine`` by rule ``reason``."""
        self.w.inc(self._m("router_requests_total", {"engine": engine, "reason": reason}))

    def rejected(self, reason: str) -> None:
        """A request was refused (invalid, queue_full)."""
        self.w.inc(self._m("router_rejected_total", {"reason": reason}))

    def failover(self, src: str, dst: str) -> None:
        """A request moved from ``src`` to ``dst``."""
        self.w.inc(self._m("router_failovers_total", {"from_engine": src, "to_engine": dst}))

    def cancelled(self, engine: str) -> None:
        """A client cancelled a stream served by ``engine``."""
        self.w.inc(self._m("router_cancelled_total", {"engine": engine}))

    def stop_requested(self, result: str) -> None:
        """A stop request arrived (``result``: found, not_found)."""
        self.w.inc(self._m("router_stop_requests_total", {"result": result}))

    def errored(self, engine: str, code: str) -> None:
        """A request on ``engine`` ended with an error."""
        self.w.inc(self._m("router_errors_total", {"engine": engine, "code": code}))

    def queue_wait(self, priority: int, seconds: float) -> None:
        """Observe a queue wait."""
        label = PRIORITY_LABELS.get(priority, str(priority))
        self.w.observe(self._m("router_queue_wait_seconds", {"priority": label}, self.queue_buckets), seconds)

    def ttft(self, engine: str, seconds: float) -> None:
        """Observe a time to first token."""
        self.w.observe(self._m("router_ttft_seconds", {"engine": engine}, self.latency_buckets), seconds)

    def finished(self, engine: str, output_tokens: int, e2e_s: float, tpot_s: float | None) -> None:
        """A request completed: tokens, end-to-end time, TPOT."""
        self.w.inc(self._m("router_output_tokens_total", {"engine": engine}), output_tokens)
        self.w.observe(self._m("router_e2e_seconds", {"engine": engine}, self.latency_buckets), e2e_s)
        if tpot_s is not None:
            self.w.observe(self._m("router_tpot_seconds", {"engine": engine}, self.tpot_buckets), tpot_s)

    def breaker_opened(self, engine: str, times: int) -> None:
        """The engine's breaker opened ``times`` more times."""
        self.w.inc(self._m("router_breaker_opened_total", {"engine": engine}), times)

    def engine_gauges(self, engine: str, weight: float, breaker: int, kv_usage: float, in_flight: int) -> None:
        """Per-engine gauges (exported by the poller)."""
        labels = {"engine": engine}
        self.w.set(self._m("router_engine_weight", labels), weight)
        self.w.set(self._m("router_breaker_state", labels), breaker)
        self.w.set(self._m("router_kv_cache_usage", labels), kv_usage)
        self.w.set(self._m("router_in_flight", labels), in_flight)

    def gpu_memory(self, device: int, used: float, total: float) -> None:
        """GPU memory residency of one device (secondary signal; routing uses KV usage)."""
        labels = {"gpu": str(device)}
        self.w.set(self._m("router_gpu_memory_used_bytes", labels), used)
        self.w.set(self._m("router_gpu_memory_total_bytes", labels), total)

    def queue_depth(self, by_class: Mapping[int, int]) -> None:
        """Queue depth per priority class."""
        for priority, n in by_class.items():
            self.w.set(self._m("router_queue_depth", {"priority": PRIORITY_LABELS[priority]}), n)
