"""Bounded soak: mixed traffic through router_bls with periodic real engine faults.

Starts its own server, sends a steady mix of short interactive and long requests from
worker threads for ``--duration-s`` (default 600), and every ``--fault-every-s`` SIGKILLs
``vllm_backend``'s engine core (the model restarts its engine in place). ``--fault
unload`` instead unloads and reloads the model through the model-control API (explicit
mode); on tritonserver 2.51 a reload under traffic crashed the server (README). Prints
requests sent / completed / failed-over / errored, engine restarts and server RSS at start
and end. Not part of CI: ``python -m loadtests.soak --duration-s 600``.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
import time

from hybrid_llm.contracts import GenerationRequest, router_tensors
from client.stream import stream_grpc
from tests.server_fixture import metric_value, running_server, scrape


def log_count(path: "os.PathLike[str]", needle: str) -> int:
    """Lines of the server log that contain ``needle``."""
    try:
        with open(path, errors="replace") as f:
            return sum(needle in line for line in f)
    except OSError:
        return 0


def main(argv: list[str] | None = None) -> int:
    """Run the soak and print its figures."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument("--fault-every-s", type=float, default=120.0)
    p.add_argument("--fault", choices=("kill", "unload"), default="kill")
    p.add_argument("--workers", type=int, default=6)
    a = p.parse_args(argv)
    models = ["router_bls", "vllm_backend", "trtllm"]
    counts = {"sent": 0, "completed": 0, "errored": 0}
    lock = threading.Lock()
    control = {"model_control": "explicit", "load_models": models} if a.fault == "unload" else {}
    with running_server("soak", **control) as s:
        rss0 = s.rss_bytes()
        stop = time.monotonic() + a.duration_s

        def worker(seed: int) -> None:
            rng = random.Random(seed)
            while time.monotonic() < stop:
                long = rng.random() < 0.2
                prompt = ("long context " * 700) if long else f"short question {rng.random()}"
                req = GenerationRequest(prompt, max_tokens=rng.choice([16, 64]), temperature=0.0,
                                        priority=rng.choice([1, 2, 3]), latency_sla_ms=None if long else 100.0)
                r = stream_grpc(s.grpc_url, "router_bls", router_tensors(req), priority=req.priority, timeout_s=300)
                with lock:
                    counts["sent"] += 1
                    counts["completed" if r.ok else "errored"] += 1

        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(a.workers)]
        for t in threads:
            t.start()
        next_fault = time.monotonic() + a.fault_every_s
        faults = 0
        while time.monotonic() < stop:
            time.sleep(1.0)
            if time.monotonic() >= next_fault:
                faults += 1
                if a.fault == "kill":
                    for pid in s.engine_core_pids("vllm_backend"):
                        os.kill(pid, signal.SIGKILL)
                else:
                    s.control_model("vllm_backend", "unload")
                    s.control_model("vllm_backend", "load")
                next_fault = time.monotonic() + a.fault_every_s
        for t in threads:
            t.join(timeout=330)
        text = scrape(s)
        rss1 = s.rss_bytes()
    failovers = metric_value(text, "router_failovers_total")
    print(f"duration {a.duration_s:.0f} s, faults ({a.fault}) {faults}")
    print(f"requests sent {counts['sent']}, completed {counts['completed']}, failed over {int(failovers)}, "
          f"errored {counts['errored']}")
    restarts = log_count(s.log_path, "engine restarted in")
    print(f"engine restarts completed {restarts}")
    print(f"server RSS start {rss0 / 2**30:.2f} GiB, end {rss1 / 2**30:.2f} GiB")
    return 0 if counts["errored"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
