"""Engine metric families: vLLM's ``vllm:*`` and TensorRT-LLM's ``nv_trt_llm_*``.

The sinks receive vLLM scheduler/iteration statistics (``engine_host``) and write
them through a metrics writer (``triton_adapter.Metrics`` in the server, a fake in
unit tests). No Triton imports here.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

from hybrid_llm.engine.host import IterationSnapshot, SchedulerSnapshot

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
# Upstream vllm_backend's buckets (src/utils/metrics.py, 8de0c148) for the families it exports;
# REQUEST_BUCKETS for the phase histograms it does not have (vLLM's own names).
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
E2E_BUCKETS = [1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]
REQUEST_BUCKETS = [0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0]
N_BUCKETS = [1, 2, 5, 10, 20]
ITERATION_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


def buckets_1_2_5(limit: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``limit`` (vLLM's build_1_2_5_buckets)."""
    out, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10 ** exponent
            if value > limit:
                return out
            out.append(value)
        exponent += 1


class MetricWriter(Protocol):
    """What the sinks need from a metrics backend."""

    def family(self, name: str, description: str, kind: str) -> None:
        """Declare a metric family (counter, gauge or histogram)."""

    def metric(self, name: str, labels: Mapping[str, str], buckets: Any = None) -> Any:
        """The handle of one labelled series of family ``name``."""

    def inc(self, metric: Any, value: float = 1.0) -> None:
        """Add ``value`` to a counter."""

    def set(self, metric: Any, value: float) -> None:
        """Set a gauge."""

    def observe(self, metric: Any, value: float) -> None:
        """Record one histogram observation."""


class _ReleasableSink:
    """Base: ``release`` drops every metric handle (the 2.51 stub segfaults on metrics
    that survive until interpreter shutdown); calls after release are ignored."""

    released = False

    def release(self) -> None:
        """Forget all metric handles; later updates are no-ops."""
        self.__dict__.clear()
        self.released = True


class VllmMetricsSink(_ReleasableSink):
    """The vLLM backend's ``vllm:*`` families plus KV usage and running/waiting gauges."""

    FAMILIES = (
        ("vllm:prompt_tokens_total", "Number of prefill tokens processed.", "counter"),
        ("vllm:generation_tokens_total", "Number of generation tokens processed.", "counter"),
        ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "histogram"),
        ("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", "histogram"),
        ("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", "histogram"),
        ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", "histogram"),
        ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", "histogram"),
        ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", "histogram"),
        ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", "histogram"),
        ("vllm:request_generation_tokens", "Number of generation tokens processed.", "histogram"),
        ("vllm:request_params_n", "Histogram of the n request parameter.", "histogram"),
        ("vllm:request_success_total", "Number of requests that finished in the engine.", "counter"),
        ("vllm:request_aborted_total", "Number of requests aborted (client cancel or stop).", "counter"),
        ("vllm:num_requests_running", "Number of requests currently running.", "gauge"),
        ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "gauge"),
        ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "gauge"),
        # The rest of upstream vllm_backend's families (src/utils/metrics.py), under its names.
        ("vllm:num_preemptions_total", "Number of preemption tokens processed.", "counter"),
        ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", "histogram"),
        ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
         "histogram"),
        ("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", "gauge"),
    )

    def __init__(self, writer: MetricWriter, labels: Mapping[str, str], max_model_len: int = 4096) -> None:
        self.w = writer
        for name, desc, kind in self.FAMILIES:
            writer.family(name, desc, kind)
        m = lambda name, buckets=None: writer.metric(name, labels, buckets)  # noqa: E731
        self.prompt_tokens = m("vllm:prompt_tokens_total")
        self.generation_tokens = m("vllm:generation_tokens_total")
        self.ttft = m("vllm:time_to_first_token_seconds", TTFT_BUCKETS)
        self.tpot = m("vllm:time_per_output_token_seconds", TPOT_BUCKETS)
        self.e2e = m("vllm:e2e_request_latency_seconds", E2E_BUCKETS)
        self.prompt_hist = m("vllm:request_prompt_tokens", buckets_1_2_5(max_model_len))
        self.generation_hist = m("vllm:request_generation_tokens", buckets_1_2_5(max_model_len))
        self.n_hist = m("vllm:request_params_n", N_BUCKETS)
        self.queue = m("vllm:request_queue_time_seconds", REQUEST_BUCKETS)
        self.prefill = m("vllm:request_prefill_time_seconds", REQUEST_BUCKETS)
        self.decode = m("vllm:request_decode_time_seconds", REQUEST_BUCKETS)
        self.success = m("vllm:request_success_total")
        self.aborted = m("vllm:request_aborted_total")
        self.running = m("vllm:num_requests_running")
        self.waiting = m("vllm:num_requests_waiting")
        self.kv_usage = m("vllm:kv_cache_usage_perc")
        self.preemptions = m("vllm:num_preemptions_total")
        self.iteration_tokens = m("vllm:iteration_tokens_total", ITERATION_TOKEN_BUCKETS)
        self.inference = m("vllm:request_inference_time_seconds", REQUEST_BUCKETS)
        self.cache_usage = m("vllm:gpu_cache_usage_perc")  # upstream's name for the same KV usage
        self.last_scheduler = SchedulerSnapshot()

    def on_engine_ready(self, num_kv_blocks: int, block_size: int, max_num_seqs: int) -> None:
        """Nothing to record for vLLM at start-up."""
        if self.released:
            return

    def on_scheduler(self, snap: SchedulerSnapshot) -> None:
        """Update the scheduler gauges."""
        if self.released:
            return
        self.last_scheduler = snap
        self.w.set(self.running, snap.num_running)
        self.w.set(self.waiting, snap.num_waiting)
        self.w.set(self.kv_usage, snap.kv_cache_usage)
        self.w.set(self.cache_usage, snap.kv_cache_usage)

    def on_iteration(self, snap: IterationSnapshot) -> None:
        """Count tokens and observe latencies of one engine step."""
        if self.released:
            return
        self.w.inc(self.prompt_tokens, snap.prompt_tokens)
        self.w.inc(self.generation_tokens, snap.generation_tokens)
        if snap.preemptions:
            self.w.inc(self.preemptions, snap.preemptions)
        if snap.prompt_tokens + snap.generation_tokens:
            self.w.observe(self.iteration_tokens, snap.prompt_tokens + snap.generation_tokens)
        for v in snap.ttfts_s:
            self.w.observe(self.ttft, v)
        for v in snap.inter_token_latencies_s:
            self.w.observe(self.tpot, v)
        for n in snap.n_params:
            self.w.observe(self.n_hist, n)
        for f in snap.finished:
            self.w.inc(self.success)
            self.w.observe(self.e2e, f.e2e_s)
            self.w.observe(self.prompt_hist, f.prompt_tokens)
            self.w.observe(self.generation_hist, f.generation_tokens)
            self.w.observe(self.queue, f.queued_s)
            self.w.observe(self.prefill, f.prefill_s)
            self.w.observe(self.decode, f.decode_s)
            self.w.observe(self.inference, f.inference_s)

    def request_started(self) -> None:
        """A request entered the model."""

    def request_cancelled(self) -> None:
        """A request was aborted in the engine."""
        if self.released:
            return
        self.w.inc(self.aborted)

    def request_finished(self, seconds: float) -> None:
        """A request left the model."""


class TrtllmMetricsSink(_ReleasableSink):
    """The tensorrtllm backend's ``nv_trt_llm_*`` families, with the real backend's labels."""

    REQUEST = "nv_trt_llm_request_metrics"
    KV = "nv_trt_llm_kv_cache_block_metrics"
    GENERAL = "nv_trt_llm_general_metrics"
    BATCHER = "nv_trt_llm_inflight_batcher_metrics"

    def __init__(self, writer: MetricWriter, labels: Mapping[str, str]) -> None:
        self.w = writer
        writer.family(self.REQUEST, "TRT LLM request metrics", "gauge")
        writer.family(self.KV, "TRT LLM KV cache block metrics", "gauge")
        writer.family(self.GENERAL, "General TRT LLM metrics", "gauge")
        writer.family(self.BATCHER, "TRT LLM inflight_batcher-specific metrics", "gauge")
        self.labels = dict(labels)
        self.req = {t: self._g(self.REQUEST, "request_type", t)
                    for t in ("active", "max", "scheduled", "context", "waiting", "completed")}
        self.kv = {t: self._g(self.KV, "kv_cache_block_type", t)
                   for t in ("max", "free", "used", "tokens_per", "fraction")}
        self.general = {t: self._g(self.GENERAL, "general_type", t)
                        for t in ("iteration_counter", "timestamp")}
        self.batcher = {t: self._g(self.BATCHER, "inflight_batcher_specific_metric", t)
                        for t in ("total_context_tokens", "generation_requests", "micro_batch_id",
                                  "paused_requests")}
        self.num_blocks = 0
        self.block_size = 0
        self.iterations = 0
        self.completed = 0
        self.cancelled = 0
        self.last_scheduler = SchedulerSnapshot()

    def _g(self, family: str, label: str, value: str) -> Any:
        return self.w.metric(family, {**self.labels, label: value})

    def on_engine_ready(self, num_kv_blocks: int, block_size: int, max_num_seqs: int) -> None:
        """Record the KV-cache geometry and the request capacity."""
        if self.released:
            return
        self.num_blocks = num_kv_blocks
        self.block_size = block_size
        self.w.set(self.kv["max"], num_kv_blocks)
        self.w.set(self.kv["free"], num_kv_blocks)
        self.w.set(self.kv["used"], 0)
        self.w.set(self.kv["tokens_per"], block_size)
        self.w.set(self.kv["fraction"], 0.0)
        self.w.set(self.req["max"], max_num_seqs)

    def on_scheduler(self, snap: SchedulerSnapshot) -> None:
        """KV blocks and request counts after a step."""
        if self.released:
            return
        self.last_scheduler = snap
        used = int(round(snap.kv_cache_usage * self.num_blocks))
        self.w.set(self.kv["used"], used)
        self.w.set(self.kv["free"], max(self.num_blocks - used, 0))
        self.w.set(self.kv["fraction"], snap.kv_cache_usage)
        self.w.set(self.req["active"], snap.num_running + snap.num_waiting)
        self.w.set(self.req["scheduled"], snap.num_running)
        self.w.set(self.req["waiting"], snap.num_waiting)

    def on_iteration(self, snap: IterationSnapshot) -> None:
        """Per-iteration counters, as the inflight batcher reports them."""
        if self.released:
            return
        import time

        self.iterations += 1
        self.completed += len(snap.finished)
        context = len(snap.ttfts_s)
        self.w.set(self.req["context"], context)
        self.w.set(self.req["completed"], self.completed)
        self.w.set(self.general["iteration_counter"], self.iterations)
        self.w.set(self.general["timestamp"], time.time_ns() // 1000)
        self.w.set(self.batcher["total_context_tokens"], snap.prompt_tokens)
        self.w.set(self.batcher["generation_requests"],
                   max(self.last_scheduler.num_running - context, 0))
        self.w.set(self.batcher["micro_batch_id"], 0)
        self.w.set(self.batcher["paused_requests"], 0)

    def request_started(self) -> None:
        """A request entered the model."""

    def request_cancelled(self) -> None:
        """A request was aborted in the engine."""
        if self.released:
            return
        self.cancelled += 1

    def request_finished(self, seconds: float) -> None:
        """A request left the model."""
