"""Where a model stub's CPU goes under streaming load: ``perf`` on one Python-backend stub.

Starts a server (policy ``vllm_only``), runs ``--streams`` closed-loop streams through
``--model`` (router_bls by default; or vllm_backend directly), and while they run records
the stub of ``--stub`` (default: the entry model) with ``perf record -g`` for
``--seconds``. Prints CPU samples by shared object (kernel, libpython, the stub's C++,
libc, numpy, ...) and the top symbols, and writes ``perf.data`` and ``report.txt`` to
loadtests/results/<timestamp>-profile/. Needs Linux ``perf`` with permission to attach
(root, or kernel.perf_event_paranoid <= 1). Not part of the tests.

    .venv/bin/python -m loadtests.profile_stub --streams 64 --seconds 15
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from .proc_cpu import role_of, sample
from .runner import run_closed_loop
from .workload import FIXED_MIX, PromptFactory, WorkloadSampler, load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "loadtests" / "results"
CONTRACTS = {"router_bls": "router", "vllm_backend": "vllm"}


def perf_report(data: Path, sort: str, limit: int) -> list[str]:
    """``perf report`` lines (percent and name) sorted by ``sort`` (dso or symbol), no call graphs."""
    out = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", sort, "--stdio",
                          "-g", "none"], capture_output=True, text=True, check=False).stdout
    rows = []
    for line in out.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        text = " ".join(line.split())
        if text.endswith(" - -"):
            text = text[:-4]
        rows.append(text[:140])
    return rows[:limit]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description="perf profile of one model stub under streaming load.")
    p.add_argument("--model", default="router_bls", choices=sorted(CONTRACTS), help="model the clients call")
    p.add_argument("--stub", help="stub to profile (router_bls, vllm_backend, trtllm); default: --model")
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--seconds", type=float, default=15.0, help="perf recording time")
    p.add_argument("--frequency", type=int, default=499, help="perf samples per second")
    p.add_argument("--out", type=Path, help="results folder (default loadtests/results/<timestamp>-profile)")
    args = p.parse_args(argv)
    if shutil.which("perf") is None:
        print("profile_stub: Linux 'perf' is not on PATH", file=sys.stderr)
        return 2
    if args.streams < 1 or args.seconds <= 0:
        print("profile_stub: --streams must be >= 1 and --seconds > 0", file=sys.stderr)
        return 2
    stub = args.stub or args.model
    out = args.out or RESULTS / time.strftime("%Y%m%d-%H%M%S-profile")
    out.mkdir(parents=True, exist_ok=True)
    prompts = PromptFactory(load_tokenizer())
    from tests.server_fixture import running_server

    with running_server("profile", overrides={"router_policy": "vllm_only"}) as server:
        found = [pid for pid, (_, cmd) in sample(server.descendants()).items() if role_of(cmd) == f"stub:{stub}"]
        if not found:
            print(f"profile_stub: no stub process for {stub}", file=sys.stderr)
            return 1
        sampler = WorkloadSampler(FIXED_MIX, prompts, seed=7)
        contract = CONTRACTS[args.model]
        run_closed_loop(server.grpc_url, args.model, sampler.sample, contract, min(args.streams, 8), 5.0)  # warm
        load_s = args.seconds + 15.0
        load = threading.Thread(target=run_closed_loop, daemon=True,
                                args=(server.grpc_url, args.model, sampler.sample, contract, args.streams, load_s))
        load.start()
        time.sleep(5.0)  # let every stream start
        data = out / "perf.data"
        rec = subprocess.run(["perf", "record", "-F", str(args.frequency), "-g", "-p", str(found[0]),
                              "-o", str(data), "--", "sleep", str(args.seconds)],
                             capture_output=True, text=True, check=False)
        load.join()
    if rec.returncode != 0 or not data.exists():
        print(f"profile_stub: perf record failed: {rec.stderr.strip()[-500:]}", file=sys.stderr)
        return 1
    dso, symbols = perf_report(data, "dso", 12), perf_report(data, "symbol", 25)
    text = (f"stub:{stub}, {args.streams} streams into {args.model}, {args.seconds:g} s at {args.frequency} Hz\n\n"
            "CPU samples by shared object:\n" + "\n".join(dso)
            + "\n\nTop symbols ([k] kernel, [.] user):\n" + "\n".join(symbols) + "\n")
    (out / "report.txt").write_text(text)
    print(text)
    print(f"[profile] {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
