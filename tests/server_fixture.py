"""Start a real tritonserver on a freshly rendered repository (one per test module)."""

from __future__ import annotations

import re
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from build_scripts.render import render
from hybrid_llm.server import ROOT, RUNTIME, TritonServer, free_ports
from client.stream import StreamResult

BUILD = ROOT / "build" / "tests"


# The CPU engines keep both cores busy; at equal niceness this process (the clients whose
# cancel times and deadlines the tests check) was seen starved for 2-6 s.
SERVER_NICE = 5


@contextmanager
def running_server(name: str, models: Sequence[str] | None = None,
                   overrides: Mapping[str, str] | None = None, model_control: str = "none",
                   load_models: Sequence[str] = (), timeout_s: float = 420.0,
                   runtime: Path = RUNTIME) -> Iterator[TritonServer]:
    """Render the CPU profile into build/tests/<name>, start tritonserver (from ``runtime``),
    yield it, stop it.

    Ports are free when picked but may be taken before tritonserver binds them (seen once
    in CI: "Socket ... already in use"); such a start is retried with new ports, twice.
    """
    for attempt in range(3):
        http, grpc, metrics = free_ports(3)
        values = {"metrics_url": f"http://127.0.0.1:{metrics}/metrics",
                  "server_http_url": f"http://127.0.0.1:{http}", **(overrides or {})}
        repo = render("cpu", BUILD / name / "repository", values, models)
        log = BUILD / name / "server.log"
        if log.exists():
            log.unlink()
        server = TritonServer(repo, log, http, grpc, metrics, model_control=model_control,
                              load_models=load_models, nice=SERVER_NICE, runtime=runtime)
        t0 = time.monotonic()
        server.start()
        try:
            server.wait_ready(timeout_s)
            break
        except RuntimeError as exc:
            server.stop()
            if "already in use" not in str(exc) or attempt == 2:
                raise
        except BaseException:
            server.stop()
            raise
    try:
        server.start_to_ready_s = time.monotonic() - t0  # type: ignore[attr-defined]
        yield server
    finally:
        server.stop()


def scrape(server: TritonServer) -> str:
    """Triton's /metrics text."""
    with urllib.request.urlopen(server.metrics_url, timeout=5) as resp:
        return resp.read().decode()


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0 when absent)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        m = re.match(r"([^{\s]+)(\{[^}]*\})?\s+(\S+)", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` every 0.2 s; fail the test naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


# Breaker windows short enough for a test to watch them open and close.
FAST_BREAKER = {"router_breaker_window_s": "8", "router_breaker_burst_window_s": "4",
                "router_metrics_poll_ms": "200"}


def short_request(server: TritonServer, i: int = 0, max_tokens: int = 24) -> StreamResult:
    """One short interactive request through router_bls (routed to vllm_backend when healthy)."""
    from hybrid_llm.contracts import GenerationRequest, router_tensors
    from client.stream import stream_grpc

    req = GenerationRequest(f"request number {i} says hello", max_tokens=max_tokens, temperature=0.0,
                            latency_sla_ms=50.0)
    return stream_grpc(server.grpc_url, "router_bls", router_tensors(req), timeout_s=120)


def breaker_state(server: TritonServer, engine: str) -> float:
    """The router's breaker state gauge for ``engine`` (0 closed, 1 half-open, 2 open)."""
    return metric_value(scrape(server), "router_breaker_state", engine=engine)
