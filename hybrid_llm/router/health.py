"""The engines' signals: Triton's metrics endpoint (KV usage, each engine model's up
gauge), Triton's readiness, the circuit breakers, and the gauges the router exports
(no Triton imports: readiness and metrics come over HTTP)."""

from __future__ import annotations

import threading
from typing import Any, Callable

from hybrid_llm import prom
from hybrid_llm.contracts.spec import ENGINE_READY
from hybrid_llm.router.breaker import CircuitBreaker
from hybrid_llm.router.config import RouterConfig
from hybrid_llm.router.dispatch import Dispatcher
from hybrid_llm.router.latency import LatencyWindow
from hybrid_llm.router.policy import ENGINE_KEYS, TRTLLM, VLLM, EngineStats, engine_weight, other


class EngineState:
    """Health and load signals of one engine."""

    def __init__(self, cfg: RouterConfig, clock: Callable[[], float]) -> None:
        self.breaker = CircuitBreaker(cfg, clock)
        self.ttft = LatencyWindow(cfg.latency_window_s, clock=clock)
        self.kv_usage = 0.0
        self.ready = True  # Triton says the model is ready and its engine reports itself up
        self.engine_up = True  # the engine model's hybrid_engine_ready gauge (last scrape)


class Health:
    """What the router knows of each engine, kept fresh by ``poll``."""

    def __init__(self, cfg: RouterConfig, dispatcher: Dispatcher, engines: dict[str, EngineState], metrics: Any,
                 log: Callable[[str], None], on_engine_down: Callable[[str], Any]) -> None:
        self.cfg = cfg
        self.dispatcher = dispatcher
        self.engines = engines
        self.metrics = metrics
        self.log = log
        self.on_engine_down = on_engine_down  # an engine reported itself dead: take its streams off
        self._nvml: Any = None  # None: not tried yet; False: unavailable
        self._opened_seen: dict[str, int] = {}  # breaker openings already exported

    @staticmethod
    def new_engines(cfg: RouterConfig, clock: Callable[[], float]) -> dict[str, EngineState]:
        """A fresh state per engine."""
        return {e: EngineState(cfg, clock) for e in ENGINE_KEYS}

    def engine_stats(self) -> dict[str, EngineStats]:
        """A snapshot of what the policy needs per engine."""
        out = {}
        for e, st in self.engines.items():
            out[e] = EngineStats(
                healthy=st.ready and st.breaker.available(),
                kv_usage=st.kv_usage,
                p95_ms=st.ttft.p95(),
                in_flight=self.dispatcher.in_flight[e],
                queued=self.dispatcher.queued(e),
            )
        return out

    def apply_metrics(self, text: str) -> None:
        """Update KV usage from a scrape of Triton's metrics endpoint."""
        samples = prom.parse_text(text)
        vllm_kv = prom.value(samples, "vllm:kv_cache_usage_perc", model=self.cfg.vllm_model)
        trt_kv = prom.value(samples, "nv_trt_llm_kv_cache_block_metrics",
                            model=self.cfg.trtllm_model, kv_cache_block_type="fraction")
        if vllm_kv is not None:
            self.engines[VLLM].kv_usage = vllm_kv
        if trt_kv is not None:
            self.engines[TRTLLM].kv_usage = trt_kv
        for e, st in self.engines.items():
            up = prom.value(samples, ENGINE_READY, model=self.cfg.model_name(e))
            was_up, st.engine_up = st.engine_up, up is None or up > 0.5  # absent: trust readiness
            if was_up and not st.engine_up:
                self.on_engine_down(e)

    def poll(self, stop: threading.Event, serving: threading.Event) -> None:
        """Scrape, refresh readiness and export gauges every ``metrics_poll_ms`` until ``stop``
        (from the first request on: ``serving``)."""
        import urllib.request

        period = self.cfg.metrics_poll_ms / 1000.0
        failures = 0
        serving.wait()
        while not stop.wait(period):
            try:
                with urllib.request.urlopen(self.cfg.metrics_url, timeout=2) as resp:
                    self.apply_metrics(resp.read().decode("utf-8", "replace"))
                failures = 0
            except Exception as exc:  # noqa: BLE001 - keep polling; routing uses the last values
                failures += 1
                if failures in (1, 100):
                    self.log(f"metrics poll of {self.cfg.metrics_url} failed: {exc!r}")
            self.refresh_health()
            self.export_gauges()

    def refresh_health(self) -> None:
        """An engine is ready when Triton says its model is and its engine reports itself up."""
        for e, st in self.engines.items():
            st.ready = st.engine_up and self._model_ready(self.cfg.model_name(e))

    def _model_ready(self, model: str) -> bool:
        """Readiness from Triton's HTTP endpoint.

        Not ``pb_utils.is_model_ready``: called from a background thread while requests
        execute, it aborts tritonserver 2.51 (boost::interprocess::lock_exception).
        """
        import urllib.error
        import urllib.request

        if not self.cfg.server_http_url:
            return True
        try:
            with urllib.request.urlopen(f"{self.cfg.server_http_url}/v2/models/{model}/ready", timeout=2) as r:
                return r.status == 200
        except urllib.error.HTTPError:
            return False
        except OSError:
            return self.engines[VLLM if model == self.cfg.vllm_model else TRTLLM].ready

    def _gpu_memory(self) -> None:
        """Export GPU memory per device through NVML, if a GPU exists (one log line if not)."""
        if self._nvml is False:
            return
        try:
            if self._nvml is None:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
            nv = self._nvml
            for i in range(nv.nvmlDeviceGetCount()):
                info = nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(i))
                self.metrics.gpu_memory(i, float(info.used), float(info.total))
        except Exception as exc:  # noqa: BLE001 - no GPU / no driver: report once, carry on
            self._nvml = False
            self.log(f"GPU memory metrics disabled: no NVIDIA GPU visible through NVML ({exc.__class__.__name__})")

    def export_gauges(self) -> None:
        """Export GPU memory, each engine's weight, breaker, KV usage and load, and the queues."""
        self._gpu_memory()
        stats = self.engine_stats()
        for e, st in stats.items():
            opened = self.engines[e].breaker.opened
            if opened > self._opened_seen.get(e, 0):
                self.metrics.breaker_opened(e, opened - self._opened_seen.get(e, 0))
                self._opened_seen[e] = opened
            self.metrics.engine_gauges(e, weight=engine_weight(st, self.cfg),
                                       breaker=int(self.engines[e].breaker.state),
                                       kv_usage=st.kv_usage, in_flight=st.in_flight)
        self.metrics.queue_depth(self.dispatcher.queued_by_class())

    def other_up(self, engine: str) -> bool:
        """True when the engine other than ``engine`` can take a request now."""
        st = self.engines[other(engine)]
        return st.ready and st.breaker.available()
