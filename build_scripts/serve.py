"""``make serve``: render the CPU profile and run tritonserver until Ctrl-C / SIGTERM.

Binds to 127.0.0.1 only (override the ports with HTTP_PORT / GRPC_PORT / METRICS_PORT
or the flags). Model control stays in "none" mode: no load/unload API is exposed.
On shutdown no stub, engine process or shared-memory region is left behind.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from build_scripts.render import parse_overrides, render
from hybrid_llm.server import ROOT, TritonServer


def main(argv: list[str] | None = None) -> int:
    """Serve the hybrid repository on the CPU profile."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-port", type=int, default=int(os.environ.get("HTTP_PORT", 8000)))
    parser.add_argument("--grpc-port", type=int, default=int(os.environ.get("GRPC_PORT", 8001)))
    parser.add_argument("--metrics-port", type=int, default=int(os.environ.get("METRICS_PORT", 8002)))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a profile value (e.g. router_policy=round_robin)")
    parser.add_argument("--repository", type=Path, default=ROOT / "build" / "repository")
    args = parser.parse_args(argv)
    values = {
        "metrics_url": f"http://127.0.0.1:{args.metrics_port}/metrics",
        "server_http_url": f"http://127.0.0.1:{args.http_port}",
        **parse_overrides(args.overrides),
    }
    repo = render("cpu", args.repository, values)
    log = ROOT / "build" / "logs" / "server.log"
    server = TritonServer(repo, log, args.http_port, args.grpc_port, args.metrics_port)
    print(f"[serve] starting tritonserver on 127.0.0.1 (log: {log}); the two engines take ~1 minute",
          flush=True)
    stopping = {"flag": False}

    def on_signal(signum: int, frame: object) -> None:
        stopping["flag"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    t0 = time.monotonic()
    server.start()
    try:
        while not server.is_ready():
            if stopping["flag"]:
                return 130
            if server.proc is not None and server.proc.poll() is not None:
                print(f"[serve] tritonserver exited:\n{server.log_tail()}", file=sys.stderr)
                return 1
            time.sleep(0.5)
        server.wait_ready(5)
        print(f"[serve] ready in {time.monotonic() - t0:.0f} s: HTTP {server.http_url}, gRPC {server.grpc_url}, "
              f"metrics {server.metrics_url}; RSS {server.rss_bytes() / 2**30:.1f} GiB", flush=True)
        print(f"[serve] try: .venv/bin/python -m client --url {server.grpc_url} \"Hello, Triton\"", flush=True)
        print(f"[serve]  or: curl -s -X POST {server.http_url}/v2/models/router_bls/generate "
              "-d '{\"text_input\": \"Hello\", \"max_tokens\": 16}'", flush=True)
        print("[serve] Ctrl-C to stop", flush=True)
        while not stopping["flag"]:
            if server.proc is not None and server.proc.poll() is not None:
                print(f"[serve] tritonserver exited:\n{server.log_tail()}", file=sys.stderr)
                return 1
            time.sleep(0.5)
    finally:
        print("[serve] stopping ...", flush=True)
        server.stop()
        left = [p for p in server.leftover_pids]
        print(f"[serve] stopped; leftover processes: {left or 'none'}; "
              f"shared-memory regions left: {len(server.shm_regions())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
