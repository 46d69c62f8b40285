"""router_bls over Triton's gRPC endpoint, asynchronously: one channel, one gRPC stream per
request, no thread per request or token (tritonclient.grpc.aio)."""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

import numpy as np

from client.packing import to_infer_inputs
from client.stream import error_code_of
from hybrid_llm.contracts import GenerationRequest, router_tensors
from hybrid_llm.contracts.router import pack_stop

ROUTER = "router_bls"


class RouterError(Exception):
    """router_bls answered with an error (code: the Triton code from the message's prefix)."""

    def __init__(self, message: str, code: str | None) -> None:
        super().__init__(message)
        self.message, self.code = message, code


@dataclass
class Piece:
    """One router response: new text, and on the last one the engine and the counts."""

    text: str
    backend: str | None = None
    num_input_tokens: int | None = None
    num_output_tokens: int | None = None

    @property
    def last(self) -> bool:
        """The router's final response carries num_output_tokens (always asked for here)."""
        return self.num_output_tokens is not None


def _first(array: np.ndarray | None) -> Any:
    if array is None:
        return None
    flat = array.reshape(-1)
    return flat[0] if flat.size else None


def piece_of(result: Any) -> Piece:
    """A Piece from a tritonclient InferResult of router_bls."""
    text = b"".join(v if isinstance(v, bytes) else str(v).encode() for v in
                    (result.as_numpy("text_output") if result.as_numpy("text_output") is not None
                     else np.array([], dtype=object)).reshape(-1)).decode("utf-8", "replace")
    backend = _first(result.as_numpy("backend"))
    n_in, n_out = _first(result.as_numpy("num_input_tokens")), _first(result.as_numpy("num_output_tokens"))
    return Piece(text, backend.decode() if isinstance(backend, bytes) else backend,
                 None if n_in is None else int(n_in), None if n_out is None else int(n_out))


class TritonRouter:
    """Requests to router_bls and Triton's readiness, over one async gRPC client."""

    def __init__(self, url: str, model: str = ROUTER) -> None:
        self.url, self.model = url, model
        self._client: Any = None
        self._stops: set[asyncio.Task] = set()  # stop requests in flight (kept from garbage collection)

    @property
    def client(self) -> Any:
        """The async gRPC client, made on first use inside the serving event loop (a grpc.aio
        channel belongs to the loop it was made in)."""
        if self._client is None:
            import tritonclient.grpc.aio as grpcclient

            self._client = grpcclient.InferenceServerClient(url=self.url)
        return self._client

    async def live(self) -> bool:
        """Triton answers and is live."""
        try:
            return bool(await self.client.is_server_live())
        except Exception:  # noqa: BLE001 - down or unreachable
            return False

    async def ready(self) -> bool:
        """Triton is ready and so is router_bls."""
        try:
            return bool(await self.client.is_server_ready()) and bool(await self.client.is_model_ready(self.model))
        except Exception:  # noqa: BLE001 - down or unreachable
            return False

    def _one_request(self, tensors: dict[str, np.ndarray], request_id: str) -> tuple[Any, asyncio.Event]:
        """A gRPC stream carrying one router_bls request, held open until the returned event is
        set (after the final response, or when the caller gives up); returns (call, event)."""
        done = asyncio.Event()

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": self.model, "inputs": to_infer_inputs(tensors, "grpc"), "request_id": request_id}
            await done.wait()

        return self.client.stream_infer(requests()), done

    async def generate(self, gen: GenerationRequest, request_id: str) -> AsyncIterator[Piece]:
        """Yield router_bls's responses until its final one; RouterError on an error response.

        Leaving the iteration early (the HTTP client went away, or the caller stopped)
        cancels the gRPC stream, which router_bls sees as a cancellation and stops the
        engine request, and sends a stop request for ``request_id`` on its own task (Triton
        2.51 does not always pass a stream's cancellation on to the model).
        """
        tensors = router_tensors(GenerationRequest(**{**gen.__dict__, "return_num_input_tokens": True,
                                                      "return_num_output_tokens": True}))
        call, done = self._one_request(tensors, request_id)
        finished = False
        try:
            async for result, error in call:
                if error is not None:
                    finished = True
                    message = str(error.message() if hasattr(error, "message") else error)
                    raise RouterError(message, error_code_of(message))
                piece = piece_of(result)
                # Marked before the yield: a caller that stops iterating after the final piece
                # (and closes this generator there) has left nothing to stop.
                finished = finished or piece.last
                yield piece
                if piece.last:
                    return
            finished = True
        finally:
            done.set()
            if not finished:
                call.cancel()
                # Its own task: this generator may be closing inside a cancelled scope.
                task = asyncio.get_running_loop().create_task(self._stop_left(request_id))
                self._stops.add(task)
                task.add_done_callback(self._stops.discard)

    async def _stop_left(self, request_id: str) -> None:
        """Stop the request of a client that left, and log what the stop found."""
        t0 = time.monotonic()
        engine = await self.stop(request_id)
        found = "failed" if engine is None else (f"stopped on {engine}" if engine else "not in flight")
        print(f"[frontend] request {request_id}: the client left; stream cancelled, stop request "
              f"{found} ({time.monotonic() - t0:.2f} s)", file=sys.stderr, flush=True)

    async def stop(self, request_id: str, timeout_s: float = 10.0) -> str | None:
        """Stop router_bls's in-flight request ``request_id`` (input ``stop``); the engine it
        was on, "" when none was in flight, None when the stop request failed."""
        call, done = self._one_request(pack_stop(), request_id)
        try:
            async with asyncio.timeout(timeout_s):
                async for result, error in call:
                    return None if error is not None else (piece_of(result).backend or "")
        except Exception:  # noqa: BLE001 - best effort (a timeout too): the stream's cancel went out too
            return None
        finally:
            done.set()
            call.cancel()
        return None

    async def close(self) -> None:
        """Close the channel (after the stop requests in flight)."""
        if self._stops:
            await asyncio.wait(set(self._stops), timeout=5.0)
        if self._client is not None:
            await self._client.close()
