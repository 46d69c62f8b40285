"""``make serve``: render the CPU profile and run tritonserver and the OpenAI frontend until
Ctrl-C / SIGTERM.

Binds to 127.0.0.1 only (override the ports with HTTP_PORT / GRPC_PORT / METRICS_PORT /
OPENAI_PORT or the flags; --openai-port 0 runs no frontend). Model control stays in
"none" mode: no load/unload API is exposed. On shutdown no stub, engine process or
shared-memory region is left behind.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

from build_scripts.render import load_profile, parse_overrides, render
from frontend.launch import FrontendProcess
from hybrid_llm.server import ROOT, TritonServer
from hybrid_llm.watchdog import HangDetector, progress_of


def scrape(url: str) -> str | None:
    """Triton's metrics text, or None when it does not answer."""
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.read().decode("utf-8", "replace")
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    """Serve the hybrid repository on the CPU profile."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-port", type=int, default=int(os.environ.get("HTTP_PORT", 8000)))
    parser.add_argument("--grpc-port", type=int, default=int(os.environ.get("GRPC_PORT", 8001)))
    parser.add_argument("--metrics-port", type=int, default=int(os.environ.get("METRICS_PORT", 8002)))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a profile value (e.g. router_policy=round_robin)")
    parser.add_argument("--repository", type=Path, default=ROOT / "build" / "repository")
    parser.add_argument("--log-dir", type=Path, default=ROOT / "build" / "logs",
                        help="server and frontend logs, and the run's state file")
    parser.add_argument("--openai-port", type=int, default=int(os.environ.get("OPENAI_PORT", 9000)),
                        help="port of the OpenAI-compatible frontend (0: none)")
    parser.add_argument("--hang-bound-s", type=float, default=15.0,
                        help="router_bls busy without progress this long: readiness off, and the server restarts")
    parser.add_argument("--no-restart-on-hang", dest="restart_on_hang", action="store_false",
                        help="report a hung router, do not restart the server")
    parser.add_argument("--served-model-name", default=os.environ.get("SERVED_MODEL_NAME", "tiny-llama"),
                        help="the model name OpenAI clients send")
    args = parser.parse_args(argv)
    values = {
        "metrics_url": f"http://127.0.0.1:{args.metrics_port}/metrics",
        "server_http_url": f"http://127.0.0.1:{args.http_port}",
        **parse_overrides(args.overrides),
    }
    repo = render("cpu", args.repository, values)
    log = args.log_dir / "server.log"
    # The state file lets a later start clean up after a run that was killed (its processes,
    # its /dev/shm files); one per HTTP port, so two servers on other ports do not meet.
    server = TritonServer(repo, log, args.http_port, args.grpc_port, args.metrics_port,
                          state_path=args.log_dir / f"serve-{args.http_port}.state.json")
    frontend = None
    if args.openai_port:
        frontend = FrontendProcess(f"127.0.0.1:{args.grpc_port}", args.openai_port, args.served_model_name,
                                   ROOT / "models" / load_profile("cpu").get("model_folder", "tiny-llama"),
                                   args.log_dir / "frontend.log",
                                   metrics_url=f"http://127.0.0.1:{args.metrics_port}/metrics",
                                   hang_bound_s=args.hang_bound_s)
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
        server.record_state()  # the whole tree now: stubs and engines started while loading
        if frontend is not None:
            frontend.start()
            frontend.wait_ready()
        print(f"[serve] ready in {time.monotonic() - t0:.0f} s: HTTP {server.http_url}, gRPC {server.grpc_url}, "
              f"metrics {server.metrics_url}; RSS {server.rss_bytes() / 2**30:.1f} GiB", flush=True)
        print(f"[serve] try: .venv/bin/python -m client --url {server.grpc_url} \"Hello, Triton\"", flush=True)
        print(f"[serve]  or: curl -s -X POST {server.http_url}/v2/models/router_bls/generate "
              "-d '{\"text_input\": \"Hello\", \"max_tokens\": 16}'", flush=True)
        if frontend is not None:
            print(f"[serve] OpenAI API: {frontend.url}/v1 (model '{args.served_model_name}'), e.g. "
                  f"curl -s {frontend.url}/v1/completions -H 'Content-Type: application/json' "
                  f"-d '{{\"model\": \"{args.served_model_name}\", \"prompt\": \"Hello\"}}'", flush=True)
        print("[serve] Ctrl-C to stop", flush=True)
        recorded = watched = time.monotonic()
        recorder: threading.Thread | None = None
        detector = HangDetector(args.hang_bound_s)
        while not stopping["flag"]:
            if time.monotonic() - recorded > 5 and not (recorder and recorder.is_alive()):
                # engine restarts start new processes; on its own thread, since reading busy
                # processes' /proc maps took seconds under load and a SIGTERM waited for it
                recorder = threading.Thread(target=server.record_state, name="record-state", daemon=True)
                recorder.start()
                recorded = time.monotonic()
            if time.monotonic() - watched >= 1.0:
                watched = time.monotonic()
                text = scrape(server.metrics_url)
                if text is not None and not detector.observe(progress_of(text), watched):
                    print(f"[serve] router_bls has been busy ({detector.admitted} requests admitted) without "
                          f"progress for {detector.stalled_s:.0f} s: "
                          + ("restarting the server" if args.restart_on_hang else "not restarting (asked)"),
                          flush=True)
                    if args.restart_on_hang:
                        took = server.stop()
                        print(f"[serve] stopped in {took:.1f} s; starting again", flush=True)
                        server.start()
                        server.wait_ready(600)
                        print(f"[serve] ready again: HTTP {server.http_url}, gRPC {server.grpc_url}", flush=True)
                    detector = HangDetector(args.hang_bound_s)
            if server.proc is not None and server.proc.poll() is not None:
                print(f"[serve] tritonserver exited:\n{server.log_tail()}", file=sys.stderr)
                return 1
            if frontend is not None and frontend.proc is not None and frontend.proc.poll() is not None:
                print(f"[serve] the frontend exited:\n{frontend.log_tail()}", file=sys.stderr)
                return 1
            time.sleep(0.5)
    finally:
        print("[serve] stopping ...", flush=True)
        t_stop = time.monotonic()
        if frontend is not None:
            frontend.terminate()  # it stops while the server does
        server.stop()
        if frontend is not None:
            frontend.stop(grace_s=1.0)
        left = [p for p in server.leftover_pids]
        print(f"[serve] stopped in {time.monotonic() - t_stop:.1f} s; leftover processes: {left or 'none'}; "
              f"shared-memory regions left: {len(server.shm_regions())} ({server.stop_report})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
