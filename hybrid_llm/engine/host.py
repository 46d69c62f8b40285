"""Host a vLLM ``AsyncLLM`` engine on a private event loop thread (no Triton imports).

Both engine models (``vllm_backend`` and the CPU ``trtllm`` stand-in) run one of
these. Triton's Python backend calls ``execute`` on its own thread; every request
becomes a coroutine on this loop, so many streams run at once and nothing blocks
Triton's thread. Engine statistics are forwarded to an ``EngineStatsSink`` (the
Triton model turns them into metric families).
"""

from __future__ import annotations

import asyncio
import locale
import os
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Coroutine, Protocol


@dataclass
class SchedulerSnapshot:
    """Scheduler state after an engine step."""

    kv_cache_usage: float = 0.0
    num_running: int = 0
    num_waiting: int = 0


@dataclass
class IterationSnapshot:
    """Token counts and per-token latencies of one engine step."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    ttfts_s: list[float] = field(default_factory=list)
    inter_token_latencies_s: list[float] = field(default_factory=list)
    finished: list["FinishedSnapshot"] = field(default_factory=list)
    n_params: list[int] = field(default_factory=list)  # the n of each request that started this step
    preemptions: int = 0  # requests preempted in this step


@dataclass
class FinishedSnapshot:
    """Timings of one finished request, as vLLM measured them."""

    e2e_s: float
    queued_s: float
    prefill_s: float
    decode_s: float
    inference_s: float  # scheduled to last token (prefill + decode), vLLM's inference_time
    prompt_tokens: int
    generation_tokens: int
    mean_tpot_s: float


class EngineStatsSink(Protocol):
    """Receives engine statistics (implemented by the Triton glue)."""

    def on_engine_ready(self, num_kv_blocks: int, block_size: int, max_num_seqs: int) -> None:
        """Called once the engine has allocated its KV cache."""

    def on_scheduler(self, snap: SchedulerSnapshot) -> None:
        """Called after each engine step with the scheduler state."""

    def on_iteration(self, snap: IterationSnapshot) -> None:
        """Called after each engine step with token and latency figures."""


def use_utf8_locale() -> None:
    """Switch the process to a UTF-8 locale (the Triton Python stub starts in the C locale).

    Without it, ``open()`` defaults to ASCII and torch's inductor fails reading its
    UTF-8 templates (``UnicodeDecodeError: 'ascii' codec``).
    """
    for name in ("C.UTF-8", "C.utf8", "en_US.UTF-8"):
        try:
            locale.setlocale(locale.LC_ALL, name)
        except locale.Error:
            continue
        os.environ["LC_ALL"] = os.environ["LANG"] = name
        break
    if locale.getpreferredencoding(False).lower().replace("-", "") != "utf8":
        raise RuntimeError("could not switch to a UTF-8 locale; install C.UTF-8 (locales package)")


def configure_cpu_environment(threads_bind: str, kv_cache_gib: str, cache_root: str) -> None:
    """Set the vLLM CPU environment before the engine starts (values from config.pbtxt)."""
    use_utf8_locale()
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    if threads_bind:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = threads_bind
    if kv_cache_gib:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = kv_cache_gib
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
    use_cache_root(cache_root)


def use_cache_root(cache_root: str) -> None:
    """Keep vLLM's and torch's caches (compiled graphs, kernels, RPC sockets) under ``cache_root``."""
    if cache_root:
        root = Path(cache_root)
        for var, sub in (
            ("VLLM_CACHE_ROOT", "vllm"),
            ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
            ("VLLM_RPC_BASE_PATH", "rpc"),
        ):
            path = root / sub
            path.mkdir(parents=True, exist_ok=True)
            os.environ.setdefault(var, str(path))


def _make_stat_logger_factory(sink: EngineStatsSink) -> Callable[..., Any]:
    """Build a vLLM per-engine stat-logger factory that forwards to ``sink``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _SinkLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self._config = vllm_config

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                   engine_idx: int = 0) -> None:
            if scheduler_stats is not None:
                sink.on_scheduler(
                    SchedulerSnapshot(
                        kv_cache_usage=float(scheduler_stats.kv_cache_usage),
                        num_running=int(scheduler_stats.num_running_reqs),
                        num_waiting=int(scheduler_stats.num_waiting_reqs),
                    )
                )
            if iteration_stats is not None:
                finished = [
                    FinishedSnapshot(
                        e2e_s=f.e2e_latency,
                        queued_s=f.queued_time,
                        prefill_s=f.prefill_time,
                        decode_s=f.decode_time,
                        inference_s=float(getattr(f, "inference_time", f.prefill_time + f.decode_time)),
                        prompt_tokens=f.num_prompt_tokens,
                        generation_tokens=f.num_generation_tokens,
                        mean_tpot_s=f.mean_time_per_output_token,
                    )
                    for f in iteration_stats.finished_requests
                ]
                sink.on_iteration(
                    IterationSnapshot(
                        prompt_tokens=int(iteration_stats.num_prompt_tokens),
                        generation_tokens=int(iteration_stats.num_generation_tokens),
                        ttfts_s=list(iteration_stats.time_to_first_tokens_iter),
                        inter_token_latencies_s=list(iteration_stats.inter_token_latencies_iter),
                        finished=finished,
                        n_params=[int(n) for n in getattr(iteration_stats, "n_params_iter", None) or []],
                        preemptions=int(getattr(iteration_stats, "num_preempted_reqs", 0) or 0),
                    )
                )

        def log_engine_initialized(self) -> None:
            cache = self._config.cache_config
            sink.on_engine_ready(
                int(cache.num_gpu_blocks or 0),
                int(cache.block_size),
                int(self._config.scheduler_config.max_num_seqs),
            )

    return _SinkLogger


class EngineHost:
    """Owns one vLLM AsyncLLM and the event loop thread it runs on."""

    def __init__(self, engine_args: dict[str, Any], sink: EngineStatsSink) -> None:
        self._engine_args = dict(engine_args)
        self._sink = sink
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="engine-loop", daemon=True)
        self.engine: Any = None
        self._guard: Any = None
        self._shm: list[str] = []
        self.closed = False

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def start(self, timeout_s: float = 600.0) -> None:
        """Start the loop thread and build the engine on it (blocks until ready)."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(**engine_args_for(AsyncEngineArgs, self._engine_args))
        factory = _make_stat_logger_factory(self._sink)
        self._thread.start()
        from hybrid_llm.engine.orphan_guard import start_guard
        from hybrid_llm.procs import children_named, shm_paths

        # Guarded from before it exists: the guard adopts this stub's VLLM:: children as they
        # appear, so an engine still starting (a restart) dies with a stub that dies.
        self._guard = start_guard([], discover="VLLM::")

        async def build() -> Any:
            return AsyncLLM.from_engine_args(args, stat_loggers=[factory])

        self.engine = self.submit(build()).result(timeout=timeout_s)
        cores = children_named(os.getpid(), "VLLM::")
        # vLLM removes its shared-memory queues only on a clean shutdown; remember them so
        # that a killed engine leaves nothing in /dev/shm once this host is shut down.
        self._shm = shm_paths(cores)

    def submit(self, coro: Coroutine[Any, Any, Any]) -> Future:
        """Schedule a coroutine on the engine loop from any thread."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def generate(self, prompt: Any, params: Any, request_id: str, priority: int) -> AsyncIterator[Any]:
        """Stream vLLM ``RequestOutput`` deltas for one request (call on the loop)."""
        return self.engine.generate(prompt, params, request_id=request_id, priority=priority)

    async def abort(self, request_id: str) -> None:
        """Abort a request in the engine (no more tokens are computed for it)."""
        await self.engine.abort(request_id)

    @property
    def errored(self) -> bool:
        """True once the engine core has died or the host was shut down; requests then fail fast."""
        return self.closed or bool(self.engine is not None and getattr(self.engine, "errored", False))

    def shutdown(self) -> None:
        """Shut the engine (and its processes) down, then stop the loop."""
        self.closed = True
        if self.engine is not None:
            try:
                self.engine.shutdown()
            finally:
                self.engine = None
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if self._guard is not None:
            self._guard.kill()
            self._guard.wait(timeout=5)
            self._guard = None
        from hybrid_llm.procs import unlink_all

        unlink_all(self._shm)


def engine_arg_names(args_class: Any = None) -> set[str]:
    """Names of the engine arguments of ``args_class`` (default: the installed vLLM's AsyncEngineArgs)."""
    import dataclasses

    if args_class is None:
        from vllm.engine.arg_utils import AsyncEngineArgs as args_class
    return {f.name for f in dataclasses.fields(args_class)}


def engine_args_for(args_class: Any, engine_args: dict[str, Any]) -> dict[str, Any]:
    """The model.json engine args, checked against the installed vLLM's engine-argument class."""
    unknown = sorted(set(engine_args) - engine_arg_names(args_class))
    if unknown:
        raise ValueError(f"model.json has keys that are not engine arguments of this vLLM: {unknown}")
    return dict(engine_args)
