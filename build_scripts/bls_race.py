"""Reproducer of the Python-backend BLS hang: many threads of one stub iterating decoupled BLS streams.

Writes a temporary repository with two Python models and starts tritonserver on free loopback
ports:
  stream  (from stub_smoke) decoupled: COUNT small responses per request
  race    decoupled BLS: each request runs THREADS threads in the stub, each calling
          ``InferenceRequest(...).exec(decoupled=True)`` on ``stream`` in a loop for SECONDS and
          reading every response; one response with the counts at the end
Then sends ROUNDS requests to ``race`` one after another (HTTP generate_stream), each with a
deadline. This is the router's pattern (router_bls relays each client's stream from an
engine through a BLS response iterator on its own thread), without the engines, so it loops
thousands of times a second.

A round that misses its deadline is a hang: the stub's Python stacks (faulthandler, written
by a watchdog thread inside the stub a few seconds before the deadline) are in the server
log, which is kept and named. Exit 0: every round answered with every stream complete;
1: a round hung or came back wrong; 2: the server did not start.

Usage:
  python -m build_scripts.bls_race [--server-root .runtime/tritonserver] [--stub PATH]
      [--threads 48] [--count 8] [--seconds 20] [--rounds 3] [--python-bin-dir DIR]

Standard library and hybrid_llm.server only (the models use numpy inside the stub).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from build_scripts import stub_smoke
from build_scripts.stub_smoke import DEFAULT_SERVER_ROOT, STREAM_CONFIG, STREAM_MODEL, log_lines, stub_and_env
from hybrid_llm.server import TritonServer

RACE_CONFIG = """name: "race"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "THREADS" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "SECONDS" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "WATCHDOG_S" data_type: TYPE_FP32 dims: [ 1 ] }
]
output [
  { name: "CALLS" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "RESPONSES" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "BAD" data_type: TYPE_INT64 dims: [ 1 ] }
]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

RACE_MODEL = '''import faulthandler
import sys
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def scalar(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            args = (request.get_response_sender(), int(scalar(request, "THREADS")), int(scalar(request, "COUNT")),
                    float(scalar(request, "SECONDS")), float(scalar(request, "WATCHDOG_S")))
            threading.Thread(target=self.round, args=args, daemon=True).start()
        return None

    def round(self, sender, threads, count, seconds, watchdog_s):
        # If this round hangs, a C watchdog thread writes every thread's stack to the log.
        faulthandler.dump_traceback_later(watchdog_s, repeat=False, file=sys.stderr)
        totals = {"calls": 0, "responses": 0, "bad": 0}
        lock = threading.Lock()
        end = time.monotonic() + seconds

        def worker(index):
            inputs = [pb_utils.Tensor("TEXT", np.array([b"w%d" % index], dtype=np.object_)),
                      pb_utils.Tensor("COUNT", np.array([count], dtype=np.int32)),
                      pb_utils.Tensor("SCALE", np.array([1.0], dtype=np.float32))]
            while time.monotonic() < end:
                call = pb_utils.InferenceRequest(model_name="stream", inputs=inputs,
                                                 requested_output_names=["INDEX"])
                got, bad = 0, 0
                for response in call.exec(decoupled=True):
                    if response.has_error():
                        bad += 1
                        continue
                    index = pb_utils.get_output_tensor_by_name(response, "INDEX")
                    if index is not None:
                        bad += int(index.as_numpy().reshape(-1)[0]) != got
                        got += 1
                with lock:
                    totals["calls"] += 1
                    totals["responses"] += got
                    totals["bad"] += bad + (got != count)

        pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        faulthandler.cancel_dump_traceback_later()
        out = [pb_utils.Tensor(name.upper(), np.array([value], dtype=np.int64)) for name, value in totals.items()]
        sender.send(pb_utils.InferenceResponse(output_tensors=out),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''


@dataclass
class RoundResult:
    """What one round of the race model answered (or that it did not)."""

    seconds: float
    calls: int = 0
    responses: int = 0
    bad: int = 0
    error: str = ""

    def line(self) -> str:
        """One human-readable line."""
        if self.error:
            return f"{self.error} after {self.seconds:.1f} s"
        rate = self.calls / self.seconds if self.seconds else 0.0
        return f"{self.calls} BLS streams ({rate:.0f}/s), {self.responses} responses, {self.bad} wrong, {self.seconds:.1f} s"


def write_repository(folder: Path, stub: Path | None = None) -> Path:
    """``stream`` and ``race``; with ``stub``, a copy in each model's folder (the backend prefers it)."""
    return stub_smoke.write_repository(folder, stub, {"stream": (STREAM_CONFIG, STREAM_MODEL),
                                                      "race": (RACE_CONFIG, RACE_MODEL)})


def run_round(url: str, threads: int, count: int, seconds: float, deadline_s: float) -> RoundResult:
    """One request to ``race``; its answer, or a hang if nothing came within ``deadline_s``."""
    body = {"THREADS": threads, "COUNT": count, "SECONDS": seconds, "WATCHDOG_S": max(seconds, deadline_s - 5.0)}
    req = urllib.request.Request(f"{url}/v2/models/race/generate_stream", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=deadline_s) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                event: dict[str, Any] = json.loads(line[5:])
                if "error" in event:
                    return RoundResult(time.monotonic() - t0, error=f"error: {event['error']}")
                if "CALLS" in event:
                    return RoundResult(time.monotonic() - t0, int(event["CALLS"]), int(event["RESPONSES"]),
                                       int(event["BAD"]))
    except (TimeoutError, urllib.error.URLError, OSError) as exc:
        if isinstance(exc, TimeoutError) or "timed out" in str(exc):
            return RoundResult(time.monotonic() - t0, error=f"HUNG: no answer within {deadline_s:.0f} s")
        return RoundResult(time.monotonic() - t0, error=f"request failed: {exc}")
    return RoundResult(time.monotonic() - t0, error="the stream ended without the counts")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server-root", type=Path, default=DEFAULT_SERVER_ROOT)
    p.add_argument("--python-bin-dir", type=Path, default=Path(sys.executable).parent,
                   help="first on PATH: the stub uses that Python's site-packages")
    p.add_argument("--ld-library-path", action="append", default=None, metavar="DIR")
    p.add_argument("--stub", type=Path, help="test this stub instead of the runtime's")
    p.add_argument("--threads", type=int, default=48, help="BLS threads in the race model's stub")
    p.add_argument("--count", type=int, default=8, help="responses per BLS stream")
    p.add_argument("--seconds", type=float, default=20.0, help="length of one round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--grace", type=float, default=30.0, help="seconds past a round's length before it counts as hung")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the server")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    args = parse_args(argv)
    root, stub, env = stub_and_env(args)
    work = Path(tempfile.mkdtemp(prefix="bls-race-"))
    server = TritonServer(write_repository(work / "models", stub if args.stub else None), work / "tritonserver.log",
                          runtime=root, env=env, extra_args=("--exit-timeout-secs=5",),
                          shm_prefix=f"blsrace_{uuid.uuid4().hex[:8]}_")
    print(f"[bls-race] stub {stub}; {args.threads} threads x BLS streams of {args.count} responses, "
          f"{args.rounds} rounds of {args.seconds:.0f} s")
    results: list[RoundResult] = []
    try:
        server.start()
        server.wait_ready(args.timeout)
        url = f"http://{server.http_url}"
        for i in range(args.rounds):
            result = run_round(url, args.threads, args.count, args.seconds, args.seconds + args.grace)
            results.append(result)
            print(f"[bls-race] round {i + 1}: {result.line()}", flush=True)
            if result.error:
                break
    except (RuntimeError, TimeoutError) as exc:
        print(f"[bls-race] the server did not start: {exc}", file=sys.stderr)
        server.stop()
        return 2
    finally:
        server.stop()
    failed = [r for r in results if r.error or r.bad]
    if failed:
        print(f"[bls-race] FAILED; server log kept: {server.log_path}", file=sys.stderr)
        for line in log_lines(server.log_path, ("Thread 0x", "File ", "Timeout", "what():", "Error"), limit=40):
            print(f"[bls-race]   | {line}", file=sys.stderr)
        return 1
    total = sum(r.calls for r in results)
    print(f"[bls-race] OK: {total} BLS streams in {len(results)} rounds, none hung or wrong")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
