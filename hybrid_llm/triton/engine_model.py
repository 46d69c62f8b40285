"""Shared Triton glue of the two vLLM-backed engine models.

``vllm_backend`` and the CPU ``trtllm`` stand-in differ only in their tensor
contract and metric families; lifecycle, concurrency, cancellation, engine-death
handling and error reporting live here once.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from hybrid_llm.triton import adapter as ta
from hybrid_llm.contracts.spec import CANCEL_VIA_STOP, ENGINE_READY, CancelCheck, InvalidInput, check_interval_s
from hybrid_llm.engine.host import EngineHost, EngineStatsSink, configure_cpu_environment, use_cache_root, use_utf8_locale

# Engine args that only mean something on GPU; dropped on the CPU platform.
_GPU_ONLY_ARGS = ("gpu_memory_utilization",)


def _load_engine_args(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "model.json"
    try:
        args = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read engine args from {path}: {exc}") from None
    if not isinstance(args, dict) or "model" not in args:
        raise ValueError(f"{path} must be a JSON object with at least 'model'")
    return args


class EngineModelBase:
    """Lifecycle of a decoupled Python model that serves requests from a vLLM engine."""

    log_prefix = "[engine]"

    def initialize(self, args: dict[str, Any]) -> None:
        """Read config, set the CPU environment, start the engine, declare metrics."""
        ta.enable_crash_traces()
        self.model_config = json.loads(args["model_config"])
        self.model_name = args["model_name"]
        self.model_version = str(args.get("model_version", "1"))
        self.params = ta.model_parameters(self.model_config)
        self.decoupled = ta.is_decoupled(self.model_config)  # false: unary, one response per request
        self.log = ta.Logger(self.log_prefix)
        version_dir = Path(args["model_repository"]) / self.model_version
        engine_args = _load_engine_args(version_dir)
        device = self.params.get("device", "cpu") or "cpu"
        if device not in ("cpu", "cuda"):
            raise ValueError(f"config.pbtxt parameter 'device' = {device!r}: use 'cpu' or 'cuda'")
        if device == "cpu":
            for key in _GPU_ONLY_ARGS:
                engine_args.pop(key, None)
            configure_cpu_environment(
                self.params.get("cpu_threads_bind", ""),
                self.params.get("cpu_kv_cache_gib", ""),
                self.params.get("cache_root", ""),
            )
        else:
            os.environ["VLLM_TARGET_DEVICE"] = "cuda"
            use_utf8_locale()
            use_cache_root(self.params.get("cache_root", ""))
        restart = str(self.params.get("restart_on_engine_death", "true")).strip().lower()
        if restart not in ("true", "false"):
            raise ValueError(f"config.pbtxt parameter 'restart_on_engine_death' = {restart!r}: use true or false")
        self.restart_on_death = restart == "true"
        budget = str(self.params.get("cancel_checks_per_s", "200")).strip() or "200"
        try:
            self._cancel_budget = float(budget)
        except ValueError:
            raise ValueError(f"config.pbtxt parameter 'cancel_checks_per_s' = {budget!r}: use a number "
                             "(0 = every stream checks every 50 ms)") from None
        self.engine_args = self.adapt_engine_args(engine_args)
        self.metrics = ta.Metrics()
        self.sink = self.make_sink()
        self.host = EngineHost(self.engine_args, self.sink)
        self._restart_lock = threading.Lock()
        self._restarting: threading.Thread | None = None
        self._open: dict[str, tuple[EngineHost, Any]] = {}  # submission -> (host, sender) in flight
        t0 = time.monotonic()
        self.host.start()
        self.log.info(f"{self.model_name}: engine ready in {time.monotonic() - t0:.1f} s")
        # Triton keeps a Python model READY while its stub lives, so the engine's own
        # state is exported: 1 while it serves, 0 while it is dead or restarting.
        # The gauge is created at the first request: created now, it would read 0 until
        # then (metric writes wait for serving) and the router would think it down.
        self.metrics.family(ENGINE_READY, "1 while the model's engine process serves, 0 while it is "
                            "dead or restarting.", "gauge")
        self._ready_metric: Any = None
        self._engine_up = True
        self._stop_watch = threading.Event()
        self._watcher = threading.Thread(target=self._watch_engine, name="engine-watch", daemon=True)
        self._watcher.start()

    def _mark_engine(self, up: bool) -> None:
        """Record whether the engine serves; exported once the model has served a request."""
        self._engine_up = up
        if self.metrics.is_serving:
            value = 1.0 if up else 0.0
            if self._ready_metric is None:
                self._ready_metric = self.metrics.metric(ENGINE_READY, {"model": self.model_name}, initial=value)
            else:
                self.metrics.set(self._ready_metric, value)

    def _watch_engine(self, period_s: float = 0.5) -> None:
        """Notice a dead engine without waiting for a request: mark it down and restart it."""
        while not self._stop_watch.wait(period_s):
            host = self.host
            if host is not None and host.errored and not host.closed:
                self._mark_engine(False)
                self._ensure_restart()

    def _restart_engine(self) -> None:
        """Replace a dead engine with a new one (runs on its own thread)."""
        old, t0 = self.host, time.monotonic()
        closer = threading.Thread(target=old.shutdown, name="engine-close", daemon=True)
        closer.start()
        closer.join(timeout=30)  # a dead core must not block the new engine for long
        # Streams still open on the old engine will never finish there: end them now.
        for key, (host, sender) in list(self._open.items()):
            if host is old and self._open.pop(key, None) is not None:
                try:
                    ta.send_error(sender, f"{self.model_name}: the engine process died during this request",
                                  "UNAVAILABLE")
                except Exception:  # noqa: BLE001 - already finished or the client is gone
                    pass
        try:
            new = EngineHost(self.engine_args, self.sink)
            new.start()
        except Exception as exc:  # noqa: BLE001 - stay unavailable; the next request retries
            self.log.error(f"{self.model_name}: engine restart failed: {exc!r}")
            return
        self.host = new
        self._mark_engine(True)
        self.log.info(f"{self.model_name}: engine restarted in {time.monotonic() - t0:.1f} s")

    def _ensure_restart(self) -> bool:
        """Start restarting a dead engine once; True while a restart is under way."""
        if not self.restart_on_death:
            return False
        with self._restart_lock:
            if self._restarting is None or not self._restarting.is_alive():
                self.log.warn(f"{self.model_name}: the engine process died; restarting it")
                self._restarting = threading.Thread(target=self._restart_engine, name="engine-restart",
                                                     daemon=True)
                self._restarting.start()
        return True

    def adapt_engine_args(self, engine_args: dict[str, Any]) -> dict[str, Any]:
        """Engine args as the engine gets them (subclasses take out what they handle themselves)."""
        return engine_args

    def make_sink(self) -> EngineStatsSink:
        """The metrics sink of this model (subclasses override)."""
        raise NotImplementedError

    def parse(self, request: Any) -> Any:
        """Parse one Triton request into a job (raises InvalidInput)."""
        raise NotImplementedError

    async def serve(self, job: Any, sender: Any, request_id: str, cancelled: Callable[[], bool]) -> None:
        """Stream one job's responses (subclasses override); ``cancelled()`` says when to stop."""
        raise NotImplementedError

    def streams(self, job: Any) -> bool:
        """Whether the job asks for a streamed answer (subclasses override)."""
        raise NotImplementedError

    def finish(self, sender: Any) -> None:
        """End a request with nothing more to send, as this model's transaction policy allows."""
        ta.finish(sender, self.decoupled)

    def cancel_check(self, request: Any, sender: Any) -> Callable[[], bool]:
        """How a request's cancellation is noticed.

        Each query of Triton's cancellation flag is a blocking IPC round trip on the engine's
        event loop, so the streams in flight together query at most ``cancel_checks_per_s``
        times a second (each one every 50 ms while few are open). Unbounded, 256 direct
        streams made ~5,000 queries a second and cut the GPU engine's throughput ~5x.
        A caller that sets the request parameter ``cancel_via_stop`` (router_bls on its BLS
        calls: a BLS caller cannot cancel in Triton 2.51) stops the request with a ``stop``
        request instead, so nothing is polled for it.
        """
        if ta.request_parameters(request).get(CANCEL_VIA_STOP) is True:
            return lambda: False
        return CancelCheck(lambda: ta.is_cancelled(sender), self.cancel_interval_s)

    def cancel_interval_s(self) -> float:
        """Seconds between two cancellation queries of one stream, stretched with the streams open."""
        return check_interval_s(0.05, len(self._open), self._cancel_budget)

    def execute(self, requests: list[Any]) -> None:
        """Hand every request to the engine loop; responses go through each sender."""
        self.metrics.serving()
        if self._ready_metric is None:
            self._mark_engine(self._engine_up)
        for request in requests:
            sender = request.get_response_sender()
            if self.host.errored:
                self._mark_engine(False)
                if self._ensure_restart():
                    message = "the engine process has died and is being restarted; retry in about a minute"
                else:
                    message = "the engine process has died; the model is unavailable until it is reloaded"
                ta.send_error(sender, f"{self.model_name}: {message}", "UNAVAILABLE")
                continue
            try:
                job = self.parse(request)
                if not self.decoupled and self.streams(job):
                    raise InvalidInput("Streaming is only supported in decoupled mode. This server renders the "
                                       "models unary (decoupled_mode=false): send the stream input false, or "
                                       "use a server rendered with decoupled_mode=true to stream")
            except InvalidInput as exc:
                ta.send_error(sender, f"{self.model_name}: {exc}", "INVALID_ARG")
                continue
            request_id = request.request_id() or uuid.uuid4().hex
            host, key = self.host, uuid.uuid4().hex
            self._open[key] = (host, sender)
            host.submit(self._guarded(job, sender, request_id, key, self.cancel_check(request, sender)))
        return None

    async def _guarded(self, job: Any, sender: Any, request_id: str, key: str,
                       cancelled: Callable[[], bool]) -> None:
        try:
            await self.serve(job, sender, request_id, cancelled)
        except InvalidInput as exc:
            ta.send_error(sender, f"{self.model_name}: {exc}", "INVALID_ARG")
        except Exception as exc:  # noqa: BLE001 - every stream must end with FINAL
            code = "UNAVAILABLE" if self.host.errored else "INTERNAL"
            self.log.error(f"request {request_id} failed: {exc!r}")
            try:
                ta.send_error(sender, f"{self.model_name}: generation failed: {exc}", code)
            except Exception as send_exc:  # noqa: BLE001 - the client is already gone
                self.log.warn(f"request {request_id}: could not send the error: {send_exc!r}")
        finally:
            self._open.pop(key, None)

    async def abort(self, request_id: str) -> None:
        """Abort an engine request (client cancelled or a stop request arrived)."""
        try:
            await self.host.abort(request_id)
        except Exception as exc:  # noqa: BLE001 - abort of a finished request is harmless
            self.log.warn(f"abort {request_id}: {exc!r}")

    def finalize(self) -> None:
        """Shut the engine down so that no engine process outlives the model."""
        self.log.info(f"{self.model_name}: shutting the engine down")
        self.restart_on_death = False
        self._stop_watch.set()
        self._watcher.join(timeout=5)
        if self._restarting is not None:
            self._restarting.join(timeout=300)
        try:
            self.host.shutdown()
        finally:
            self.sink.release()
            self.sink = None
            self.host = None
            # Every Metric handle goes before close(): one left on this object outlives the
            # stub's instance and crashed the unloaded stub at interpreter exit
            # (Metric::~Metric -> Clear, python_backend 47f9e03 / #433 fixes it upstream).
            self._ready_metric = None
            self.metrics.close()
