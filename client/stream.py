"""Stream from Triton over gRPC (and HTTP generate_stream), measuring TTFT, TPOT and tokens."""

from __future__ import annotations

import http.client
import json
import queue
import re
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from .packing import to_infer_inputs

CANCEL_POLL_S = 0.05  # how often stream_grpc looks at its ``cancel`` event while it waits


@dataclass
class StreamResult:
    """Everything a caller needs from one generation: text, timings, counts, error."""

    chunks: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    ttft_s: float | None = None
    e2e_s: float = 0.0
    chunk_times_s: list[float] = field(default_factory=list)
    backend: str | None = None
    num_input_tokens: int | None = None
    num_output_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    error_code: str | None = None
    cancelled: bool = False
    cancel_sent_s: float | None = None  # when the client cancelled, from the stream's start

    @property
    def text(self) -> str:
        """The streamed text, concatenated."""
        return "".join(self.chunks)

    @property
    def ok(self) -> bool:
        """True when the stream ended without an error."""
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (None with fewer than two tokens)."""
        n = self.num_output_tokens or len(self.token_ids) or len(self.chunks)
        if self.ttft_s is None or n < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (n - 1)

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly summary (used by the CLI's --json)."""
        return {
            "text": self.text, "backend": self.backend, "ttft_s": self.ttft_s, "tpot_s": self.tpot_s,
            "e2e_s": self.e2e_s, "num_input_tokens": self.num_input_tokens,
            "num_output_tokens": self.num_output_tokens, "finish_reason": self.finish_reason,
            "error": self.error, "error_code": self.error_code, "cancelled": self.cancelled,
        }


def _first(value: np.ndarray) -> Any:
    flat = value.reshape(-1)
    return flat[0] if flat.size else None


def _absorb(result: StreamResult, outputs: dict[str, np.ndarray]) -> None:
    """Fold one response's outputs into the result."""
    if "text_output" in outputs:
        text = "".join(
            (v.decode("utf-8") if isinstance(v, (bytes, np.bytes_)) else str(v))
            for v in outputs["text_output"].reshape(-1)
        )
        if text:
            result.chunks.append(text)
    if "output_ids" in outputs:
        result.token_ids.extend(int(t) for t in outputs["output_ids"].reshape(-1))
    if "backend" in outputs:
        b = _first(outputs["backend"])
        result.backend = b.decode() if isinstance(b, bytes) else str(b)
    if "finish_reason" in outputs:
        f = _first(outputs["finish_reason"])
        result.finish_reason = f.decode() if isinstance(f, bytes) else str(f)
    if "num_input_tokens" in outputs:
        result.num_input_tokens = int(_first(outputs["num_input_tokens"]))
    if "num_output_tokens" in outputs:
        n = int(_first(outputs["num_output_tokens"]))
        result.num_output_tokens = (result.num_output_tokens or 0) + n


_OUTPUTS = ("text_output", "output_ids", "backend", "finish_reason", "num_input_tokens",
            "num_output_tokens")


_CODE_PREFIX = re.compile(r"^\[([A-Z_]+)\]")


def error_code_of(message: str) -> str | None:
    """The Triton error code this project's models put at the start of error messages."""
    m = _CODE_PREFIX.match(message or "")
    return m.group(1) if m else None


def _message(err: Any) -> str:
    return str(err.message() if hasattr(err, "message") else err)


def _error_code(err: Any) -> str:
    prefixed = error_code_of(_message(err))
    if prefixed:
        return prefixed
    status = str(getattr(err, "status", lambda: "")() or "")
    for code in ("INVALID_ARGUMENT", "UNAVAILABLE", "CANCELLED", "NOT_FOUND", "INTERNAL",
                 "RESOURCE_EXHAUSTED", "UNIMPLEMENTED"):
        if code in status:
            return "INVALID_ARG" if code == "INVALID_ARGUMENT" else code
    return status or "UNKNOWN"


def stream_grpc(
    url: str,
    model: str,
    tensors: dict[str, np.ndarray],
    priority: int = 0,
    request_id: str | None = None,
    timeout_s: float = 300.0,
    on_chunk: Callable[[StreamResult], None] | None = None,
    cancel_after_chunks: int | None = None,
    parameters: dict[str, Any] | None = None,
    cancel: threading.Event | None = None,
) -> StreamResult:
    """Send one request on a gRPC stream and collect every response until the final one.

    ``priority`` sets Triton's own request priority (queue order in the server); the
    router's ``priority`` tensor is part of ``tensors``. ``cancel_after_chunks``
    cancels the request after that many non-empty responses (the stream is closed with
    cancel_requests=True, so the server sees a cancellation); setting ``cancel`` does the
    same from another thread. ``parameters`` are Triton request parameters (str, int or
    bool values).
    """
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    responses: "queue.Queue[tuple[Any, Any]]" = queue.Queue()
    client = grpcclient.InferenceServerClient(url=url)
    result = StreamResult()
    t0 = time.monotonic()
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        try:
            client.async_stream_infer(
                model_name=model,
                inputs=to_infer_inputs(tensors, "grpc"),
                request_id=request_id or uuid.uuid4().hex,
                priority=priority,
                enable_empty_final_response=True,
                parameters=parameters,
            )
        except InferenceServerException as exc:
            # The stream broke before the request went out (no server at ``url``, say):
            # its callback has the cause; tritonclient's own message only says "invalid state".
            try:
                _, cause = responses.get(timeout=1.0)
            except queue.Empty:
                cause = None
            err = cause if cause is not None else exc
            result.error, result.error_code = _message(err), _error_code(err)
            return result
        deadline = t0 + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                result.error, result.error_code = f"no final response within {timeout_s:.0f} s", "TIMEOUT"
                result.cancelled = True  # close the stream with cancellation: never wait on a stuck server
                result.cancel_sent_s = time.monotonic() - t0
                break
            if cancel is not None and cancel.is_set():
                result.cancelled = True
                result.cancel_sent_s = time.monotonic() - t0
                break
            try:
                res, err = responses.get(timeout=remaining if cancel is None else min(remaining, CANCEL_POLL_S))
            except queue.Empty:
                continue
            now = time.monotonic() - t0
            if err is not None:
                result.error, result.error_code = _message(err), _error_code(err)
                break
            response = res.get_response()
            outputs = {o.name: res.as_numpy(o.name) for o in response.outputs if o.name in _OUTPUTS}
            before = (len(result.chunks), len(result.token_ids))
            _absorb(result, {k: v for k, v in outputs.items() if v is not None})
            if (len(result.chunks), len(result.token_ids)) != before:
                if result.ttft_s is None:
                    result.ttft_s = now
                result.chunk_times_s.append(now)
                if on_chunk is not None:
                    on_chunk(result)
                if cancel_after_chunks is not None and len(result.chunk_times_s) >= cancel_after_chunks:
                    result.cancel_sent_s = time.monotonic() - t0
                    client.stop_stream(cancel_requests=True)
                    result.cancelled = True
                    break
            final = response.parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                break
    finally:
        result.e2e_s = time.monotonic() - t0
        try:
            client.stop_stream(cancel_requests=result.cancelled)
        except Exception:  # noqa: BLE001 - the stream may already be closed
            pass
        client.close()
    return result


def stop_grpc(url: str, request_id: str, model: str = "router_bls", timeout_s: float = 10.0) -> StreamResult:
    """Send a stop request (input ``stop``) for the in-flight request ``request_id``; the
    result's ``backend`` names the engine it was on ("" when none was in flight)."""
    from hybrid_llm.contracts.router import pack_stop

    return stream_grpc(url, model, pack_stop(), request_id=request_id, timeout_s=timeout_s)


def infer(url: str, model: str, tensors: dict[str, np.ndarray], protocol: str = "grpc", priority: int = 0,
          request_id: str | None = None, timeout_s: float = 300.0,
          parameters: dict[str, Any] | None = None) -> StreamResult:
    """One unary call: gRPC ``ModelInfer`` or HTTP ``/v2/models/<model>/infer`` (a server
    rendered with ``decoupled_mode=false``; Triton refuses both on decoupled models)."""
    from tritonclient.utils import InferenceServerException

    if protocol == "grpc":
        import tritonclient.grpc as mod
    elif protocol == "http":
        import tritonclient.http as mod
    else:
        raise ValueError(f"protocol must be 'grpc' or 'http', not {protocol!r}")
    kwargs: dict[str, Any] = {"network_timeout": timeout_s} if protocol == "http" else {}
    client = mod.InferenceServerClient(url=url, **kwargs)
    result = StreamResult()
    t0 = time.monotonic()
    try:
        res = client.infer(model, to_infer_inputs(tensors, protocol), request_id=request_id or uuid.uuid4().hex,
                           priority=priority, parameters=parameters,
                           **({"client_timeout": timeout_s} if protocol == "grpc" else {}))
        result.ttft_s = time.monotonic() - t0
        names = ([o.name for o in res.get_response().outputs] if protocol == "grpc"
                 else [o["name"] for o in res.get_response().get("outputs", [])])
        outputs = {n: res.as_numpy(n) for n in names if n in _OUTPUTS}
        _absorb(result, {k: v for k, v in outputs.items() if v is not None})
        result.chunk_times_s.append(result.ttft_s)
    except InferenceServerException as exc:
        result.error, result.error_code = _message(exc), _error_code(exc)
    finally:
        result.e2e_s = time.monotonic() - t0
        client.close()
    return result


def stream_http(base_url: str, model: str, payload: dict[str, Any], timeout_s: float = 300.0,
                stream: bool = True) -> StreamResult:
    """POST to Triton's ``generate_stream`` (SSE) or ``generate`` endpoint and collect the result."""
    endpoint = "generate_stream" if stream else "generate"
    request = urllib.request.Request(
        f"http://{base_url}/v2/models/{model}/{endpoint}",
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    result = StreamResult()
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            for event in _events(resp) if stream else [json.loads(resp.read())]:
                now = time.monotonic() - t0
                if "error" in event:
                    result.error = event["error"]
                    result.error_code = error_code_of(result.error) or "ERROR"
                    break
                outputs = {k: np.array([v.encode() if isinstance(v, str) else v], dtype=object)
                           for k, v in event.items() if k in _OUTPUTS}
                n = len(result.chunks)
                _absorb(result, outputs)
                if len(result.chunks) != n:
                    result.ttft_s = now if result.ttft_s is None else result.ttft_s
                    result.chunk_times_s.append(now)
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace").strip()
        if body.startswith("data:"):
            body = body[5:].strip()
        try:
            result.error = json.loads(body).get("error", body)
        except ValueError:
            result.error = body
        result.error_code = error_code_of(result.error) or str(exc.code)
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        # No server at ``base_url``, or the connection broke or timed out mid-stream.
        reason = getattr(exc, "reason", exc)
        timed_out = isinstance(reason, TimeoutError)
        if timed_out:
            result.error = f"no response within {timeout_s:g} s"
        elif isinstance(exc, http.client.HTTPException) or result.chunks:
            result.error = f"the stream from {base_url} broke after {len(result.chunks)} chunks: {reason!r}"
        else:
            result.error = f"connection to {base_url} failed: {reason}"
        result.error_code = "TIMEOUT" if timed_out else "UNAVAILABLE"
    result.e2e_s = time.monotonic() - t0
    return result


def _events(resp: Any) -> Iterator[dict[str, Any]]:
    """Parse a server-sent-events body into JSON objects; a body cut short raises IncompleteRead.

    Reads with ``read1``: iterating the response line by line would end quietly on a
    connection that broke mid-stream, and a truncated stream would pass for a whole one.
    """
    buf = b""
    while True:
        data = resp.read1(65536)
        if not data:
            break
        buf += data
        *lines, buf = buf.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8").strip()
            if line.startswith("data:"):
                yield json.loads(line[5:].strip())
    if resp.length:  # a Content-Length body that ended early
        raise http.client.IncompleteRead(buf, resp.length)
