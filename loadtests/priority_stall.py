"""Probe for the ~500 ms stall seen with Triton ``priority_levels`` (STACK.md).

Sends N sequential tiny requests (max_tokens 1) to router_bls at each Triton request
priority (1, 2, 3) and prints latency percentiles and the count of requests slower
than a threshold. Run against a running server: ``python -m loadtests.priority_stall
--url 127.0.0.1:8001``; or without --url to start one.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from hybrid_llm.contracts import GenerationRequest, router_tensors
from client.stream import stream_grpc


def probe(url: str, n: int, priority: int, slow_ms: float) -> dict[str, float]:
    """Run n sequential requests at one Triton priority; return latency figures (ms)."""
    times = []
    for i in range(n):
        req = GenerationRequest(f"probe {i}", max_tokens=1, temperature=0.0, priority=priority,
                                latency_sla_ms=50.0)
        r = stream_grpc(url, "router_bls", router_tensors(req), priority=priority, timeout_s=30)
        if not r.ok:
            raise RuntimeError(r.error)
        times.append(r.e2e_s * 1000.0)
    times.sort()
    return {
        "p50": statistics.median(times), "p99": times[int(0.99 * (len(times) - 1))], "max": times[-1],
        "slow": float(sum(t > slow_ms for t in times)),
    }


def main(argv: list[str] | None = None) -> int:
    """Print a table per priority."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url")
    p.add_argument("-n", type=int, default=300)
    p.add_argument("--slow-ms", type=float, default=250.0)
    a = p.parse_args(argv)
    if a.url:
        return _report(a.url, a.n, a.slow_ms)
    from tests.server_fixture import running_server

    with running_server("priority-stall") as s:
        return _report(s.grpc_url, a.n, a.slow_ms)


def _report(url: str, n: int, slow_ms: float) -> int:
    print(f"{'priority':>8} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'> ' + str(int(slow_ms)) + ' ms':>9}")
    for priority in (1, 2, 3):
        f = probe(url, n, priority, slow_ms)
        print(f"{priority:>8} {n:>5} {f['p50']:>8.1f} {f['p99']:>8.1f} {f['max']:>8.1f} {int(f['slow']):>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
