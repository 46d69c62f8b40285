"""The one module that imports ``triton_python_backend_utils`` (pb_utils).

Everything outside ``hybrid_llm/triton/`` is plain Python; the model classes here use
these helpers for tensors, responses, errors, metrics and BLS calls.
"""

from __future__ import annotations

import faulthandler
import json
import sys
import threading
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import triton_python_backend_utils as pb_utils

from hybrid_llm.contracts.spec import InvalidInput, TensorSpec, parse_inputs
from hybrid_llm.metric_queue import MetricQueue
from hybrid_llm.triton.holding import DelayedRelease



class EngineCallError(RuntimeError):
    """A BLS call to an engine returned an error response."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code



def enable_crash_traces() -> None:
    """On a fatal signal in the stub, write every thread's Python stack to the server log.

    No signal-triggered dump (faulthandler.register) on purpose: on the H100 a SIGUSR1 that
    landed on the stub's main thread, inside Stub::PopMessage without the GIL, segfaulted in
    _Py_DumpTracebackThreads and killed the stub (Python 3.12; 3.11 here survived it).
    """
    if faulthandler.is_enabled():
        return
    try:
        faulthandler.enable(file=sys.stderr, all_threads=True)
    except (AttributeError, ValueError, OSError):  # no usable stderr in this stub
        pass

def _code(name: str) -> Any:
    return getattr(pb_utils.TritonError, name, pb_utils.TritonError.INTERNAL)


def model_parameters(model_config: Mapping[str, Any]) -> dict[str, str]:
    """``config.pbtxt`` parameters as a flat str -> str dict."""
    params = model_config.get("parameters", {}) or {}
    return {k: str(v.get("string_value", "")) for k, v in params.items()}


def is_decoupled(model_config: Mapping[str, Any]) -> bool:
    """Whether ``config.pbtxt`` makes the model decoupled (``decoupled_mode`` of the profile)."""
    return bool((model_config.get("model_transaction_policy") or {}).get("decoupled", False))


def read_request(request: Any, specs: Sequence[TensorSpec]) -> dict[str, Any]:
    """Parse a Triton request's inputs with a contract spec (raises InvalidInput)."""
    raw: dict[str, np.ndarray] = {}
    for spec in specs:
        tensor = pb_utils.get_input_tensor_by_name(request, spec.name)
        if tensor is not None:
            raw[spec.name] = tensor.as_numpy()
    return parse_inputs(raw, specs)


def request_parameters(request: Any) -> dict[str, Any]:
    """The request's Triton parameters (JSON in this Python backend)."""
    try:
        return json.loads(request.parameters() or "{}")
    except (ValueError, TypeError):
        return {}


def make_response(outputs: Mapping[str, np.ndarray]) -> Any:
    """Build an InferenceResponse from name -> numpy array."""
    return pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor(name, value) for name, value in outputs.items()]
    )


def error_response(message: str, code: str = "INTERNAL") -> Any:
    """Build an error InferenceResponse with a Triton error code name.

    The message starts with ``[CODE]``: Triton's gRPC stream carries only the message
    of an error response, so this is how streaming clients learn the code too.
    """
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"[{code}] {message}", _code(code)))


def send(sender: Any, outputs: Mapping[str, np.ndarray] | None, final: bool = False) -> None:
    """Send one streamed response (or just the FINAL flag when outputs is None)."""
    final_flag = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    if outputs is None:
        sender.send(flags=final_flag)
    else:
        sender.send(make_response(outputs), flags=final_flag if final else 0)


def finish(sender: Any, decoupled: bool) -> None:
    """End a request that has nothing (more) to send: the FINAL flag alone when decoupled, one
    empty response when not (a non-decoupled model must answer each request once)."""
    send(sender, None if decoupled else {}, final=True)


def send_error(sender: Any, message: str, code: str = "INTERNAL") -> None:
    """End a stream with an error response carrying the right Triton code."""
    sender.send(error_response(message, code), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def is_cancelled(sender: Any) -> bool:
    """True when the client cancelled or disconnected."""
    try:
        return bool(sender.is_cancelled())
    except Exception:  # noqa: BLE001 - a finished sender cannot be queried; treat as gone
        return True


class Logger:
    """pb_utils.Logger with a fixed prefix."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._log = pb_utils.Logger

    def info(self, msg: str) -> None:
        """Log at INFO."""
        self._log.log_info(f"{self._prefix} {msg}")

    def warn(self, msg: str) -> None:
        """Log at WARNING."""
        self._log.log_warn(f"{self._prefix} {msg}")

    def error(self, msg: str) -> None:
        """Log at ERROR."""
        self._log.log_error(f"{self._prefix} {msg}")


class Metrics:
    """Creates Triton metric families and updates them off the hot path (a writer thread)."""

    def __init__(self) -> None:
        self._families: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.write_errors = 0
        self._metrics: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        self._queue = MetricQueue()  # coalesced: see metric_queue.py for why
        # Writes wait until the model serves its first request: a metric IPC from this
        # thread while initialize() is returning hung the 2.51 stub once (model never
        # became ready). Updates queued before that are applied then.
        self._serving = threading.Event()
        self._thread = threading.Thread(target=self._drain, name="metrics-writer", daemon=True)
        self._thread.start()

    def serving(self) -> None:
        """Allow metric writes (call from execute)."""
        if not self._serving.is_set():
            self._serving.set()

    @property
    def is_serving(self) -> bool:
        """True once ``serving`` was called (metric writes are applied from then on)."""
        return self._serving.is_set()

    def family(self, name: str, description: str, kind: str) -> None:
        """Declare a metric family (counter, gauge or histogram)."""
        if name not in self._families:
            kinds = {
                "counter": pb_utils.MetricFamily.COUNTER,
                "gauge": pb_utils.MetricFamily.GAUGE,
                "histogram": pb_utils.MetricFamily.HISTOGRAM,
            }
            self._families[name] = pb_utils.MetricFamily(
                name=name, description=description, kind=kinds[kind]
            )

    def metric(self, name: str, labels: Mapping[str, str], buckets: Sequence[float] | None = None,
               initial: float | None = None) -> Any:
        """Get (or create) the metric of a family for a label set; a new gauge is set to
        ``initial`` at once (never scraped at 0 before a queued write lands)."""
        key = (name, tuple(sorted(labels.items())))
        metric = self._metrics.get(key)
        if metric is None:
            with self._lock:
                metric = self._metrics.get(key)
                if metric is None:
                    family = self._families[name]
                    if buckets is not None:
                        metric = family.Metric(labels=dict(labels), buckets=list(buckets))
                    else:
                        metric = family.Metric(labels=dict(labels))
                        if initial is not None:
                            metric.set(initial)
                    self._metrics[key] = metric
        return metric

    def inc(self, metric: Any, value: float = 1.0) -> None:
        """Increment a counter or gauge (asynchronously)."""
        if value:
            self._queue.increment(metric, value)

    def set(self, metric: Any, value: float) -> None:
        """Set a gauge (asynchronously)."""
        self._queue.set(metric, value)

    def observe(self, metric: Any, value: float) -> None:
        """Observe a histogram sample (asynchronously)."""
        self._queue.observe(metric, value)

    def flush(self, timeout_s: float = 2.0) -> None:
        """Wait until queued updates are written (best effort)."""
        self._queue.flush_event().wait(timeout_s)

    def _drain(self) -> None:
        self._serving.wait()
        while True:
            batch = self._queue.take()
            for target, op, value in batch.writes:
                try:
                    getattr(target, op)(value)
                except Exception as exc:  # noqa: BLE001 - a metric write must never kill the writer
                    self.write_errors += 1
                    if self.write_errors == 1:
                        Logger("[metrics]").error(f"metric {op}({value!r}) failed: {exc!r}")
            for done in batch.flushes:
                done.set()
            if batch.closing:
                if self._queue.dropped:
                    Logger("[metrics]").warn(f"{self._queue.dropped} histogram observations were dropped: "
                                             "the metric writer fell behind")
                return

    def close(self) -> None:
        """Stop the writer thread and release every metric while the stub is alive.

        Metric objects left for interpreter shutdown crash the 2.51 stub (segfault in
        ``Metric::Clear``), so they are dropped here, in ``finalize``.
        """
        self._queue.close()
        self._serving.set()
        self._thread.join(timeout=5)
        self._metrics.clear()
        self._families.clear()
        import gc

        gc.collect()


def bls_stream(
    model_name: str,
    inputs: Mapping[str, np.ndarray],
    request_id: str,
    output_names: Sequence[str],
    timeout_us: int = 0,
    parameters: Mapping[str, Any] | None = None,
    decoupled: bool = True,
) -> Iterator[dict[str, np.ndarray]]:
    """Call an engine model through BLS and yield each response's outputs (one response when
    the engine is not ``decoupled``).

    This iterator blocks: run it on a worker thread, never on an event loop.
    """
    kwargs: dict[str, Any] = dict(
        model_name=model_name,
        inputs=[pb_utils.Tensor(k, v) for k, v in inputs.items()],
        requested_output_names=list(output_names),
        request_id=request_id,
    )
    if timeout_us:
        kwargs["timeout"] = timeout_us
    if parameters:
        kwargs["parameters"] = dict(parameters)
    call = pb_utils.InferenceRequest(**kwargs)
    responses = call.exec(decoupled=True) if decoupled else [call.exec()]
    try:
        for response in responses:
            if response.has_error():
                err = response.error()
                raise EngineCallError(err.message(), _error_code_name(err))
            outputs: dict[str, np.ndarray] = {}
            for tensor in response.output_tensors():
                outputs[tensor.name()] = tensor.as_numpy()
            if outputs:
                yield outputs
    finally:
        _GRAVEYARD.keep(responses)


_GRAVEYARD = DelayedRelease(hold_s=5.0)  # see holding.py: why finished BLS streams are held


def release_bls_streams() -> None:
    """Drop the finished BLS streams still held (call from ``finalize``)."""
    _GRAVEYARD.clear()


def _error_code_name(err: Any) -> str:
    try:
        code = err.code()
    except Exception:  # noqa: BLE001 - older stubs have no code()
        return "INTERNAL"
    for name in ("INVALID_ARG", "UNAVAILABLE", "CANCELLED", "NOT_FOUND", "UNSUPPORTED"):
        if code == getattr(pb_utils.TritonError, name, object()):
            return name
    return "INTERNAL"


__all__ = [
    "EngineCallError",
    "InvalidInput",
    "Logger",
    "Metrics",
    "bls_stream",
    "release_bls_streams",
    "enable_crash_traces",
    "error_response",
    "finish",
    "is_cancelled",
    "is_decoupled",
    "make_response",
    "model_parameters",
    "read_request",
    "request_parameters",
    "send",
    "send_error",
]
