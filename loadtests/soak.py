"""Bounded soak: mixed traffic through router_bls, with periodic real engine faults or none.

Starts its own server, sends a steady mix of short interactive and long requests (three
priority classes, SLAs on the short ones, a ``--cancel-fraction`` of streams cancelled by
the client after a few chunks) from worker threads until ``--duration-s`` has passed or
``--requests`` were sent, and every ``--fault-every-s`` SIGKILLs ``vllm_backend``'s engine
core (the model restarts its engine in place). ``--fault unload`` instead unloads and
reloads the model through the model-control API (explicit mode; on tritonserver 2.51 a
reload under traffic crashed the server, README); ``--fault none`` is the hang soak.

Bounds: a request with no final response within ``--stall-s`` counts as hung (its stream is
cancelled); the router's hang detector (hybrid_llm.watchdog, the one make serve uses) reads
Triton's metrics every 2 s and the soak reports its longest stall and whether it ever turned
unhealthy. Prints requests sent / completed / cancelled / failed-over / errored / hung,
engine restarts, server RSS at start and end; exit 1 on any hung or errored request.
Not part of CI: ``python -m loadtests.soak --fault none --requests 100000``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

from hybrid_llm.contracts import GenerationRequest, router_tensors
from client.stream import stream_grpc
from hybrid_llm.server import RUNTIME
from hybrid_llm.watchdog import HangDetector, progress_of
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
    p.add_argument("--fault", choices=("kill", "unload", "none"), default="kill")
    p.add_argument("--workers", type=int, default=6)
    p.add_argument("--requests", type=int, default=0, help="stop after this many requests (0: duration only)")
    p.add_argument("--cancel-fraction", type=float, default=0.1, help="streams the client cancels mid-way")
    p.add_argument("--stall-s", type=float, default=120.0, help="a request without its final response this long is hung")
    p.add_argument("--hang-bound-s", type=float, default=15.0, help="the hang detector's bound")
    p.add_argument("--server-root", type=Path, default=RUNTIME,
                   help="tritonserver's folder (bin/, backends/), e.g. a copy with another Python backend build")
    a = p.parse_args(argv)
    if not (a.server_root / "bin" / "tritonserver").exists():
        p.error(f"{a.server_root / 'bin' / 'tritonserver'} is missing (--server-root)")
    models = ["router_bls", "vllm_backend", "trtllm"]
    counts = {"sent": 0, "completed": 0, "cancelled": 0, "errored": 0, "hung": 0}
    first_errors: list[str] = []
    watch = {"max_stall_s": 0.0, "unhealthy_scrapes": 0, "scrapes": 0}
    lock = threading.Lock()
    control = {"model_control": "explicit", "load_models": models} if a.fault == "unload" else {}
    record = a.server_root / "backends" / "python" / "triton_python_backend_stub.json"
    built = json.loads(record.read_text()) if record.exists() else {}
    print(f"[soak] server {a.server_root}; Python stub: "
          + (f"built, pin set {built.get('pin_set', 'r24.10')}, {len(built.get('source_fixes', []))} source fixes"
             if built else "the wheel's"), flush=True)
    with running_server("soak", runtime=a.server_root.resolve(), **control) as s:
        rss0 = s.rss_bytes()
        t0 = time.monotonic()
        stop = t0 + a.duration_s
        done = threading.Event()

        def more() -> bool:
            if time.monotonic() >= stop:
                return False
            with lock:
                if a.requests and counts["sent"] >= a.requests:
                    return False
                counts["sent"] += 1
            return True

        def worker(seed: int) -> None:
            rng = random.Random(seed)
            while more():
                long = rng.random() < 0.2
                prompt = ("long context " * 700) if long else f"short question {rng.random()}"
                req = GenerationRequest(prompt, max_tokens=rng.choice([16, 64]), temperature=0.0,
                                        priority=rng.choice([1, 2, 3]), latency_sla_ms=None if long else 100.0)
                cancel_after = rng.choice([1, 2, 4]) if rng.random() < a.cancel_fraction else None
                r = stream_grpc(s.grpc_url, "router_bls", router_tensors(req), priority=req.priority,
                                timeout_s=a.stall_s, cancel_after_chunks=cancel_after)
                outcome = ("hung" if r.error_code == "TIMEOUT" else "cancelled" if r.cancelled and r.error is None
                           else "completed" if r.ok else "errored")
                with lock:
                    counts[outcome] += 1
                    if outcome in ("hung", "errored") and len(first_errors) < 5:
                        first_errors.append(f"{outcome}: {r.error}")

        def watcher() -> None:
            detector = HangDetector(a.hang_bound_s)
            while not done.wait(2.0):
                try:
                    healthy = detector.observe(progress_of(scrape(s)), time.monotonic())
                except OSError:
                    continue
                watch["scrapes"] += 1
                watch["unhealthy_scrapes"] += not healthy
                watch["max_stall_s"] = max(watch["max_stall_s"], detector.stalled_s)
                if watch["scrapes"] % 30 == 0:  # a progress line a minute, so a long run can be followed
                    with lock:
                        line = ", ".join(f"{k} {v}" for k, v in counts.items())
                    print(f"[soak] {time.monotonic() - t0:.0f} s: {line}; detector stall {detector.stalled_s:.0f} s"
                          + ("" if healthy else " (UNHEALTHY)"), flush=True)

        watch_thread = threading.Thread(target=watcher, daemon=True)
        watch_thread.start()

        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(a.workers)]
        for t in threads:
            t.start()
        next_fault = time.monotonic() + a.fault_every_s
        faults = 0
        while time.monotonic() < stop and any(t.is_alive() for t in threads):
            time.sleep(1.0)
            if a.fault != "none" and time.monotonic() >= next_fault:
                faults += 1
                if a.fault == "kill":
                    for pid in s.engine_core_pids("vllm_backend"):
                        os.kill(pid, signal.SIGKILL)
                else:
                    s.control_model("vllm_backend", "unload")
                    s.control_model("vllm_backend", "load")
                next_fault = time.monotonic() + a.fault_every_s
        for t in threads:
            t.join(timeout=a.stall_s + 30)
        elapsed = time.monotonic() - t0
        done.set()
        watch_thread.join(timeout=10)
        text = scrape(s)
        rss1 = s.rss_bytes()
    failovers = metric_value(text, "router_failovers_total")
    finished = sum(counts[k] for k in ("completed", "cancelled", "errored", "hung"))
    print(f"duration {elapsed:.0f} s, faults ({a.fault}) {faults}, {finished / elapsed:.1f} requests/s")
    print(f"requests finished {finished}, completed {counts['completed']}, cancelled by the client "
          f"{counts['cancelled']}, failed over {int(failovers)}, errored {counts['errored']}, "
          f"hung (> {a.stall_s:.0f} s) {counts['hung']}")
    print(f"hang detector (bound {a.hang_bound_s:.0f} s): longest stall {watch['max_stall_s']:.1f} s, "
          f"unhealthy in {watch['unhealthy_scrapes']} of {watch['scrapes']} scrapes")
    for line in first_errors:
        print(f"  {line}")
    restarts = log_count(s.log_path, "engine restarted in")
    print(f"engine restarts completed {restarts}")
    print(f"server RSS start {rss0 / 2**30:.2f} GiB, end {rss1 / 2**30:.2f} GiB")
    return 0 if counts["errored"] == 0 and counts["hung"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
