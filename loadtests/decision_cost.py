"""Cost of one routing decision (policy + enqueue + dispatch) with 10k requests queued.

Pure Python, no server: ``python -m loadtests.decision_cost [--queued 10000] [--n 20000]``.
Prints microseconds per decision for the policy alone, for enqueue+dequeue on a queue
already holding ``--queued`` tickets, and for both together.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from hybrid_llm.router.config import RouterConfig
from hybrid_llm.router.dispatch import Dispatcher
from hybrid_llm.router.policy import TRTLLM, VLLM, EngineStats, RequestFeatures, create_policy


def measure(queued: int, n: int, seed: int = 0) -> dict[str, float]:
    """Microseconds per decide(), per submit+release, and per full admission."""
    rng = random.Random(seed)
    cfg = RouterConfig(max_queue=queued + n + 10)
    policy = create_policy(cfg)
    stats = {TRTLLM: EngineStats(kv_usage=0.5, p95_ms=80.0, in_flight=32),
             VLLM: EngineStats(kv_usage=0.7, p95_ms=40.0, in_flight=64)}
    feats = [RequestFeatures(rng.choice([40, 300, 1000, 2500]), rng.choice([None, 80.0, 500.0]),
                             rng.choice([1, 2, 3])) for _ in range(n)]
    t0 = time.perf_counter()
    decisions = [policy.decide(f, stats) for f in feats]
    t_decide = (time.perf_counter() - t0) / n * 1e6
    disp = Dispatcher(cfg, kv_usage=lambda e: 0.5, p95_ms=lambda e: 80.0, on_release=lambda t: None)
    disp.in_flight = {TRTLLM: cfg.trtllm_capacity, VLLM: cfg.vllm_capacity}  # saturated: all queue
    for i in range(queued):
        disp.submit(rng.choice([TRTLLM, VLLM]), rng.choice([1, 2, 3]), i)
    t0 = time.perf_counter()
    for d, f in zip(decisions, feats):
        disp.submit(d.engine, f.priority, None)
        disp.complete(d.engine)  # frees one slot ...
        disp.run_cycle()  # ... and one queued ticket is released by the ordering rules
    t_queue = (time.perf_counter() - t0) / n * 1e6
    return {"decide_us": t_decide, "queue_us": t_queue, "total_us": t_decide + t_queue,
            "queued_at_end": float(disp.queued())}


def main(argv: list[str] | None = None) -> int:
    """Print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queued", type=int, default=10000)
    p.add_argument("--n", type=int, default=20000)
    a = p.parse_args(argv)
    r = measure(a.queued, a.n)
    print(f"queued={a.queued} decisions={a.n}")
    print(f"policy.decide           {r['decide_us']:8.2f} us")
    print(f"enqueue + dispatch      {r['queue_us']:8.2f} us")
    print(f"total per decision      {r['total_us']:8.2f} us   (queue length at end: {int(r['queued_at_end'])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
