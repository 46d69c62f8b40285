"""Shared Triton glue of the two vLLM-backed engine models.

``vllm_backend`` and the CPU ``trtllm`` stand-in differ only in their tensor
contract and metric families; lifecycle, concurrency, cancellation, engine-death
handling and error reporting live here once.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from . import triton_adapter as ta
from .contracts import InvalidInput
from .engine_host import EngineHost, EngineStatsSink, configure_cpu_environment, use_utf8_locale

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
        self.metrics = ta.Metrics()
        self.sink = self.make_sink()
        self.host = EngineHost(engine_args, self.sink)
        t0 = time.monotonic()
        self.host.start()
        self.log.info(f"{self.model_name}: engine ready in {time.monotonic() - t0:.1f} s")

    def make_sink(self) -> EngineStatsSink:
        """The metrics sink of this model (subclasses override)."""
        raise NotImplementedError

    def parse(self, request: Any) -> Any:
        """Parse one Triton request into a job (raises InvalidInput)."""
        raise NotImplementedError

    async def serve(self, job: Any, sender: Any, request_id: str) -> None:
        """Stream one job's responses (subclasses override)."""
        raise NotImplementedError

    def execute(self, requests: list[Any]) -> None:
        """Hand every request to the engine loop; responses go through each sender."""
        self.metrics.serving()
        for request in requests:
            sender = request.get_response_sender()
            if self.host.errored:
                ta.send_error(sender, f"{self.model_name}: the engine process has died; "
                              "the model is unavailable until it is reloaded", "UNAVAILABLE")
                continue
            try:
                job = self.parse(request)
            except InvalidInput as exc:
                ta.send_error(sender, f"{self.model_name}: {exc}", "INVALID_ARG")
                continue
            request_id = request.request_id() or uuid.uuid4().hex
            self.host.submit(self._guarded(job, sender, request_id))
        return None

    async def _guarded(self, job: Any, sender: Any, request_id: str) -> None:
        try:
            await self.serve(job, sender, request_id)
        except InvalidInput as exc:
            ta.send_error(sender, f"{self.model_name}: {exc}", "INVALID_ARG")
        except Exception as exc:  # noqa: BLE001 - every stream must end with FINAL
            code = "UNAVAILABLE" if self.host.errored else "INTERNAL"
            self.log.error(f"request {request_id} failed: {exc!r}")
            try:
                ta.send_error(sender, f"{self.model_name}: generation failed: {exc}", code)
            except Exception:  # noqa: BLE001 - the client is already gone
                pass

    async def abort(self, request_id: str) -> None:
        """Abort an engine request (client cancelled or a stop request arrived)."""
        try:
            await self.host.abort(request_id)
        except Exception as exc:  # noqa: BLE001 - abort of a finished request is harmless
            self.log.warn(f"abort {request_id}: {exc!r}")

    def finalize(self) -> None:
        """Shut the engine down so that no engine process outlives the model."""
        self.log.info(f"{self.model_name}: shutting the engine down")
        try:
            self.host.shutdown()
        finally:
            self.sink.release()
            self.sink = None
            self.host = None
            self.metrics.close()
