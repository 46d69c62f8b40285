"""Headless Locust runner: the scenario in ``locustfile.py``, CSV + HTML into loadtests/results/<run>/.

Usage (from the repository root, a server already running)::

    .venv/bin/python -m loadtests.run_locust --host 127.0.0.1:8001 --qps-steps 1,2 --step-s 10
    .venv/bin/python -m loadtests.run_locust --host 127.0.0.1:8001 --model vllm_backend --mix hybrid
    .venv/bin/python -m loadtests.run_locust --host 127.0.0.1:8001 --trace my_trace.jsonl

Writes ``locust_stats.csv``, ``locust_stats_history.csv``, ``locust_failures.csv``,
``locust_exceptions.csv``, ``report.html``, ``locust.log`` and ``run.json`` (the
settings). Exit code: Locust's (1 when any request failed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .shapes import parse_qps_steps, parse_stages, stages_from_steps
from .workload import MIXES, read_trace

ROOT = Path(__file__).resolve().parent.parent
LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
RESULTS = ROOT / "loadtests" / "results"


@dataclass
class LocustRun:
    """Where a finished run left its files, and how it ended."""

    returncode: int
    out_dir: Path

    @property
    def stats_csv(self) -> Path:
        """Locust's aggregate stats CSV."""
        return self.out_dir / "locust_stats.csv"

    @property
    def failures_csv(self) -> Path:
        """Locust's failures CSV."""
        return self.out_dir / "locust_failures.csv"

    @property
    def html(self) -> Path:
        """Locust's HTML report."""
        return self.out_dir / "report.html"


def scenario_env(model: str, mix: str, stages: str | None, qps_steps: str, step_s: float,
                 trace: Path | None, seed: int, drain_s: float, user_interval_s: float,
                 replay_users: int, contract: str | None = None) -> dict[str, str]:
    """The LOADTEST_* variables ``locustfile.py`` reads."""
    env = {
        "LOADTEST_MODEL": model, "LOADTEST_MIX": mix, "LOADTEST_QPS_STEPS": qps_steps,
        "LOADTEST_STEP_S": str(step_s), "LOADTEST_SEED": str(seed), "LOADTEST_DRAIN_S": str(drain_s),
        "LOADTEST_USER_INTERVAL_S": str(user_interval_s), "LOADTEST_REPLAY_USERS": str(replay_users),
    }
    if stages:
        env["LOADTEST_STAGES"] = stages
    if trace is not None:
        env["LOADTEST_TRACE"] = str(Path(trace).resolve())
    if contract:
        env["LOADTEST_CONTRACT"] = contract
    return env


def planned_seconds(stages: str | None, qps_steps: str, step_s: float, trace: Path | None,
                    drain_s: float) -> float:
    """How long the shape runs (validates the stage/trace settings on the way)."""
    if trace is not None:
        return read_trace(trace)[-1].offset_s + drain_s
    plan = parse_stages(stages) if stages else stages_from_steps(parse_qps_steps(qps_steps), step_s)
    return sum(s.duration_s for s in plan) + drain_s


def run_locust(host: str, out_dir: Path, model: str = "router_bls", mix: str = "chat",
               stages: str | None = None, qps_steps: str = "1,2", step_s: float = 10.0,
               trace: Path | None = None, seed: int = 0, drain_s: float = 10.0,
               user_interval_s: float = 2.0, replay_users: int = 32, contract: str | None = None,
               extra_args: list[str] | None = None) -> LocustRun:
    """Run the scenario headless against ``host`` (Triton gRPC host:port); CSV + HTML in ``out_dir``."""
    expected = planned_seconds(stages, qps_steps, step_s, trace, drain_s)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **scenario_env(model, mix, stages, qps_steps, step_s, trace, seed, drain_s,
                                        user_interval_s, replay_users, contract)}
    cmd = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", host,
        "--csv", str(out_dir / "locust"), "--csv-full-history", "--html", str(out_dir / "report.html"),
        "--logfile", str(out_dir / "locust.log"), "--loglevel", "INFO", "--only-summary",
        *(extra_args or []),
    ]
    settings = {"command": cmd, "env": {k: v for k, v in env.items() if k.startswith("LOADTEST_")},
                "expected_s": expected, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    (out_dir / "run.json").write_text(json.dumps(settings, indent=2))
    # Locust loads the tokenizer (~5 s) before the shape starts; allow a margin to drain.
    proc = subprocess.run(cmd, cwd=str(ROOT), env=env, timeout=expected + 180)
    return LocustRun(proc.returncode, out_dir)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description="Run the Locust scenario headless; CSV + HTML into loadtests/results/<run>/.")
    p.add_argument("--host", required=True, help="Triton gRPC endpoint, e.g. 127.0.0.1:8001")
    p.add_argument("--model", default="router_bls", help="router_bls (default), vllm_backend or trtllm")
    p.add_argument("--contract", choices=("router", "vllm", "trtllm"), help="default: from the model name")
    p.add_argument("--mix", default="chat", choices=sorted(MIXES))
    p.add_argument("--stages", help='"QPS:SECONDS,..." (overrides --qps-steps/--step-s)')
    p.add_argument("--qps-steps", default="1,2")
    p.add_argument("--step-s", type=float, default=10.0)
    p.add_argument("--trace", type=Path, help="replay this JSONL trace instead of QPS steps")
    p.add_argument("--replay-users", type=int, default=32)
    p.add_argument("--user-interval-s", type=float, default=2.0)
    p.add_argument("--drain-s", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run", help="results folder name (default: locust-<timestamp>)")
    p.add_argument("--out", type=Path, help="results folder (overrides --run)")
    args, extra = p.parse_known_args(argv)
    out = args.out or RESULTS / (args.run or time.strftime("locust-%Y%m%d-%H%M%S"))
    try:
        run = run_locust(args.host, out, args.model, args.mix, args.stages, args.qps_steps, args.step_s,
                         args.trace, args.seed, args.drain_s, args.user_interval_s, args.replay_users,
                         args.contract, extra)
    except (ValueError, OSError) as exc:
        print(f"run_locust: {exc}", file=sys.stderr)
        return 2
    print(f"[run_locust] exit code {run.returncode}; CSV {run.stats_csv}; HTML {run.html}")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
