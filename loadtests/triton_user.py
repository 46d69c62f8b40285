"""A reusable Locust user that streams requests over Triton gRPC and reports them to Locust.

Kept apart from any scenario (``locustfile.py`` is one). ``TritonStreamUser.stream``
packs a ``GenerationRequest`` with ``hybrid_llm.contracts`` for the target model's
contract, streams it with ``client.stream.stream_grpc`` and fires Locust's
``events.request`` twice:

- ``request_type="grpc-stream"``: response_time = end-to-end ms, response_length =
  output tokens, exception on error; ``context`` carries ttft_ms, tpot_ms, backend,
  priority, class and prompt tokens (for event listeners).
- ``request_type="ttft"``: response_time = time to first token (successful streams
  with a token only), so Locust's CSV/HTML show TTFT percentiles next to e2e.

Entry names are ``<model>/<backend> [<class>]`` (backend: the engine the router
chose, or the model itself when called directly). Host: ``--host 127.0.0.1:<grpc
port>`` (a ``grpc://`` prefix is accepted). gRPC runs cooperatively under Locust's
gevent through ``grpc.experimental.gevent.init_gevent()``, done here at import.
"""

from __future__ import annotations

import os
import time
from typing import Any

import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()

from locust import User  # noqa: E402  (gRPC must be gevent-ready before Locust users run)

from client.stream import StreamResult, stream_grpc  # noqa: E402

from .runner import contract_for, output_tokens, pack  # noqa: E402
from .workload import SampledRequest  # noqa: E402

STREAM_TYPE = "grpc-stream"
TTFT_TYPE = "ttft"


def grpc_target(host: str | None) -> str:
    """``host:port`` for tritonclient from Locust's ``--host`` (scheme prefixes stripped)."""
    if not host:
        raise ValueError("no host: pass --host 127.0.0.1:<grpc port> (Triton's gRPC endpoint)")
    for prefix in ("grpc://", "http://", "https://"):
        if host.startswith(prefix):
            host = host[len(prefix):]
    return host.rstrip("/")


class TritonStreamUser(User):
    """Abstract Locust user: one gRPC stream per ``stream()`` call, reported as request events.

    Class attributes (env vars by default): ``model`` (LOADTEST_MODEL, default
    router_bls), ``contract`` (LOADTEST_CONTRACT: router, vllm or trtllm; default from
    the model name), ``timeout_s`` (LOADTEST_TIMEOUT_S), ``tokenizer`` (needed for the
    trtllm contract, which takes token ids).
    """

    abstract = True
    model: str = os.environ.get("LOADTEST_MODEL", "router_bls")
    contract: str | None = os.environ.get("LOADTEST_CONTRACT") or None
    timeout_s: float = float(os.environ.get("LOADTEST_TIMEOUT_S", "300"))
    tokenizer: Any = None

    def stream(self, sample: SampledRequest, context: dict[str, Any] | None = None) -> StreamResult:
        """Stream one request to ``self.model`` and fire the request events; returns the result."""
        contract = contract_for(self.model, self.contract)
        req = sample.request
        start_time = time.time()
        try:
            tensors = pack(contract, req, self.tokenizer)
            result = stream_grpc(grpc_target(self.host), self.model, tensors, priority=req.priority,
                                 timeout_s=self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - report as a failed request, keep the user alive
            result = StreamResult(error=f"client error: {exc!r}", error_code="CLIENT",
                                  e2e_s=time.time() - start_time)
        self.report(sample, result, start_time, context)
        return result

    def report(self, sample: SampledRequest, result: StreamResult, start_time: float,
               context: dict[str, Any] | None = None) -> None:
        """Fire ``events.request`` for the stream (and its TTFT) with the tokens as length."""
        tokens = output_tokens(result)
        backend = result.backend or (self.model if result.ok else "error")
        name = f"{self.model}/{backend} [{sample.klass}]"
        ctx = {
            "ttft_ms": None if result.ttft_s is None else result.ttft_s * 1000.0,
            "tpot_ms": None if result.tpot_s is None else result.tpot_s * 1000.0,
            "backend": result.backend, "priority": sample.request.priority, "klass": sample.klass,
            "prompt_tokens": sample.prompt_tokens, "latency_sla_ms": sample.request.latency_sla_ms,
            **(context or {}),
        }
        exception = None if result.ok else RuntimeError(f"{result.error_code}: {result.error}")
        events = self.environment.events.request
        events.fire(request_type=STREAM_TYPE, name=name, response_time=result.e2e_s * 1000.0,
                    response_length=tokens, exception=exception, context=ctx, start_time=start_time,
                    url=self.host, response=None)
        if result.ok and result.ttft_s is not None:
            events.fire(request_type=TTFT_TYPE, name=name, response_time=result.ttft_s * 1000.0,
                        response_length=tokens, exception=None, context=ctx, start_time=start_time,
                        url=self.host, response=None)
