"""Router overhead: the same streaming workload straight to vllm_backend and through router_bls.

One server (policy ``vllm_only``, so the router always picks vllm_backend), closed
loop at each concurrency level: N streams back to back for ``--duration`` seconds,
first straight to ``vllm_backend`` (the vLLM backend contract), then through
``router_bls`` (the TensorRT-LLM BLS contract), with the same request shape
(``workload.FIXED_MIX`` by default: 128-token prompts, 64 output tokens). The two
targets get different random prompts of the same length, so vLLM's prefix cache
cannot favour the second one.

Each level runs ``--repeats`` rounds, alternating which target goes first (direct,
router / router, direct / ...), and pools each target's rounds, so drift on a shared
machine hits both sides alike.

Prints, per level: throughput (output tokens/s) of each path and their ratio
(router / direct), TTFT p50/p99 of each and the TTFT the router adds (router minus
direct, per percentile), and whether every round pair meets ``--target`` (0.97, issue #3),
every one misses it, or the rounds disagree ("undecided": on a shared 2-core box single
rounds at 64 streams ranged from 0.64 to 2.94). When the tool starts its own server (or is
given the PID of the one at ``--url`` on the same host, ``--server-pid``) it also prints the CPU
time per output token of each process role (server, each model's stub, engines, load
generator) for both paths, from /proc: on a CPU-bound machine the router's CPU is
taken from the engines, so this is the cost that carries over to other machines. From
it, per level: the cores each path kept busy (CPU per token x tokens/s; when both keep
every core busy, the throughput ratio is just the ratio of CPU per token) and the tokens
per second one router stub process relays per core it gets.
With a metrics URL (its own server, or ``--metrics-url``) it also prints where the
time to first token goes: mean Triton queue and execute() time of the model the
client called, the BLS call's queue at vllm_backend, the router's queue wait and
TTFT, and vLLM's own queue time and TTFT, differenced from /metrics around each round.
Writes overhead.json and overhead.md into loadtests/results/<timestamp>-overhead/.

Usage::

    .venv/bin/python -m loadtests.overhead                         # starts its own server
    .venv/bin/python -m loadtests.overhead --url 127.0.0.1:8001    # a running server (policy must be vllm_only)
    .venv/bin/python -m loadtests.overhead --url 127.0.0.1:8001 --metrics-url http://127.0.0.1:8002/metrics \
        --server-pid "$(pgrep -o -x tritonserver)" --repeats 5      # e.g. on a GPU node: all three tables
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from . import proc_cpu, stage_report
from .runner import RequestRecord, Summary, format_table, run_closed_loop, send, summarize
from .workload import FIXED_MIX, MIXES, PromptFactory, WorkloadSampler, get_mix, load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "loadtests" / "results"
DIRECT, ROUTED = "vllm_backend", "router_bls"
CONTRACT = {DIRECT: "vllm", ROUTED: "router"}


def tritonserver_pid(pid: int) -> int:
    """``pid`` when it is a live tritonserver on this host; ValueError saying what to pass otherwise."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        raise ValueError(f"--server-pid {pid}: no such process on this host; pass the PID of the "
                         "tritonserver serving --url (e.g. from `pgrep -o -x tritonserver`)") from None
    if not Path(cmdline).name.startswith("tritonserver"):
        raise ValueError(f"--server-pid {pid} runs '{cmdline}', not tritonserver; pass the tritonserver's PID")
    return pid


@contextmanager
def server_url(url: str | None, overrides: dict[str, str] | None = None, metrics_url: str | None = None,
               server_pid: int | None = None) -> Iterator[tuple[str, Callable[[], list[int]] | None, str | None]]:
    """(gRPC URL, server-tree pids or None, metrics URL or None) of a running server, or of a fresh one (vllm_only)."""
    if url:
        from hybrid_llm.procs import descendants

        tree = None if server_pid is None else (lambda: [server_pid, *descendants(server_pid)])
        yield url, tree, metrics_url
        return
    from tests.server_fixture import running_server

    with running_server("overhead", overrides={**(overrides or {}), "router_policy": "vllm_only"}) as server:
        print(f"[overhead] server ready in {getattr(server, 'start_to_ready_s', 0):.0f} s "
              f"(gRPC {server.grpc_url})", flush=True)
        yield server.grpc_url, lambda: [server.proc.pid, *server.descendants()], server.metrics_url


# Where a request's time to first token goes, from Triton's /metrics (sums and counts
# differenced around each round, so the means are exact): (label, family, labels, kind).
# "counter_us": a Triton per-model duration counter in microseconds over its request count.
ATTRIBUTION = (
    ("Triton queue, entry model", "nv_inference_queue_duration_us", "entry", "counter_us"),
    ("Triton execute(), entry model", "nv_inference_compute_infer_duration_us", "entry", "counter_us"),
    ("Triton queue, vllm_backend (BLS)", "nv_inference_queue_duration_us", DIRECT, "counter_us"),
    ("router queue wait", "router_queue_wait_seconds", None, "histogram"),
    ("router TTFT (arrival at router -> first token sent)", "router_ttft_seconds", None, "histogram"),
    ("engine queue (vLLM WAITING)", "vllm:request_queue_time_seconds", DIRECT, "histogram"),
    ("engine TTFT (vLLM arrival -> first token)", "vllm:time_to_first_token_seconds", DIRECT, "histogram"),
)


def attribution_deltas(before: str, after: str, entry: str) -> dict[str, tuple[float, float]]:
    """(sum of seconds, count) per ATTRIBUTION stage between two scrapes, for one entry model."""
    from hybrid_llm.prom import parse_text, value

    a, b = parse_text(after), parse_text(before)
    out: dict[str, tuple[float, float]] = {}
    for label, family, which, kind in ATTRIBUTION:
        model = entry if which == "entry" else which
        if kind == "counter_us":
            if which != "entry" and model == entry:
                continue  # a fixed-model row naming the entry model repeats the entry row
            sel = {"model": model}
            dur = (value(a, family, 0.0, **sel) or 0.0) - (value(b, family, 0.0, **sel) or 0.0)
            n = (value(a, "nv_inference_count", 0.0, **sel) or 0.0) - (value(b, "nv_inference_count", 0.0, **sel) or 0.0)
            out[label] = (dur / 1e6, n)
        else:
            hist = stage_report.stage_histograms(a, b, stage_report.Stage(label, family, "model"))
            merged = stage_report.merge(h for g, h in hist.items() if model is None or g == model)
            if merged.count > 0:
                out[label] = (merged.sum, merged.count)
    return out


class Side:
    """Pooled rounds of one target at one level: records, wall time, CPU per role, stage sums."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []
        self.wall_s = 0.0
        self.cpu: dict[str, float] = {}
        self.stages: dict[str, list[float]] = {}  # label -> [seconds, count]
        self.round_tps: list[float] = []  # tokens per second of each round, in order

    def stage_means(self) -> dict[str, float]:
        """Mean seconds per request of each attribution stage (plus the client's TTFT)."""
        out = {label: total / n for label, (total, n) in self.stages.items() if n > 0}
        ttfts = [r.ttft_s for r in self.records if r.ttft_s is not None]
        if ttfts:
            out["client TTFT"] = sum(ttfts) / len(ttfts)
        return out

    def summary(self) -> Summary:
        """Summary over every round (throughput = all tokens / summed wall time)."""
        return summarize(self.records, wall_s=self.wall_s, from_arrival=False)

    def cpu_us_per_token(self) -> dict[str, float]:
        """CPU microseconds per output token, per process role."""
        tokens = self.summary().output_tokens
        return {role: 1e6 * sec / tokens for role, sec in self.cpu.items()} if tokens else {}


def measure(url: str, model: str, prompts: PromptFactory, mix_name: str, concurrency: int,
            duration_s: float, seed: int, timeout_s: float, side: Side,
            pids: Callable[[], list[int]] | None, metrics_url: str | None = None) -> None:
    """One closed-loop round of one target at one level, pooled into ``side``."""
    sampler = WorkloadSampler(get_mix(mix_name), prompts, seed=seed)
    scrape = stage_report.load_scrape(metrics_url) if metrics_url else None
    before = proc_cpu.sample(pids()) if pids else None
    records, wall = run_closed_loop(url, model, sampler.sample, CONTRACT[model], concurrency, duration_s,
                                    timeout_s=timeout_s)
    after = proc_cpu.sample(pids()) if pids else None  # the same window as ``wall``
    if scrape is not None and metrics_url:
        time.sleep(1.0)  # router metric writes are queued off the hot path
        for label, (sec, n) in attribution_deltas(scrape, stage_report.load_scrape(metrics_url), model).items():
            acc = side.stages.setdefault(label, [0.0, 0.0])
            acc[0] += sec
            acc[1] += n
    if before is not None and after is not None:
        for role, sec in proc_cpu.by_role(before, after).items():
            side.cpu[role] = side.cpu.get(role, 0.0) + sec
    side.records.extend(records)
    side.wall_s += wall
    side.round_tps.append(summarize(records, wall_s=wall, from_arrival=False).tps)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def round_ratios(direct_tps: Sequence[float], routed_tps: Sequence[float]) -> list[float]:
    """Router / direct throughput of each round pair (rounds run back to back), to show the spread."""
    return [r / d for d, r in zip(direct_tps, routed_tps) if d > 0]


TARGET_RATIO = 0.97  # issue #3: router throughput >= 0.97x direct at 64 streams


def verdict(ratios: Sequence[float], target: float = TARGET_RATIO) -> str:
    """Whether every round pair is at or above ``target`` ("meets"), every one below ("below"),
    or the rounds disagree ("undecided": the spread is wider than the question); "-" under 2 rounds."""
    if len(ratios) < 2:
        return "-"
    if all(r >= target for r in ratios):
        return "meets"
    if all(r < target for r in ratios):
        return "below"
    return "undecided"


def row(level: int, direct: Summary, routed: Summary, cpu: dict[str, dict[str, float]] | None = None,
        stages: dict[str, dict[str, float]] | None = None,
        ratios: Sequence[float] = (), target: float = TARGET_RATIO) -> dict[str, Any]:
    """The comparison of one concurrency level."""
    return {
        "concurrency": level,
        "direct": direct.as_dict(), "router": routed.as_dict(),
        "cpu_us_per_token": cpu or {},
        "stage_means_s": stages or {},
        "throughput_ratio": (routed.tps / direct.tps) if direct.tps else None,
        "round_ratios": list(ratios),
        "target_ratio": target,
        "verdict": verdict(ratios, target),
        "added_ttft_p50_s": _diff(routed.ttft_p50_s, direct.ttft_p50_s),
        "added_ttft_p99_s": _diff(routed.ttft_p99_s, direct.ttft_p99_s),
    }


HEADER = ("streams", "direct tok/s", "router tok/s", "ratio", "per round", "rounds vs target", "direct TTFT p50/p99 ms",
          "router TTFT p50/p99 ms", "added TTFT p50 ms", "added TTFT p99 ms", "errors d/r")


def format_rows(rows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """Table cells for printed and Markdown output."""
    out = []
    for r in rows:
        d, x = r["direct"], r["router"]
        ratio = "-" if r["throughput_ratio"] is None else f"{r['throughput_ratio']:.2f}"
        rounds = "/".join(f"{v:.2f}" for v in r.get("round_ratios") or ()) or "-"
        out.append((str(r["concurrency"]), f"{d['tps']:.0f}", f"{x['tps']:.0f}", ratio, rounds, r.get("verdict", "-"),
                    f"{_ms(d['ttft_p50_s'])}/{_ms(d['ttft_p99_s'])}", f"{_ms(x['ttft_p50_s'])}/{_ms(x['ttft_p99_s'])}",
                    _ms(r["added_ttft_p50_s"]), _ms(r["added_ttft_p99_s"]), f"{d['errors']}/{x['errors']}"))
    return out


def format_stage_rows(rows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """Mean ms per request of each attribution stage, direct vs router, per level."""
    out = []
    labels = [a[0] for a in ATTRIBUTION] + ["client TTFT"]
    for r in rows:
        st = r.get("stage_means_s") or {}
        if not st:
            continue
        for label in labels:
            d, x = st.get("direct", {}).get(label), st.get("router", {}).get(label)
            if d is None and x is None:
                continue
            out.append((str(r["concurrency"]), label, _ms(d), _ms(x)))
    return out


CPU_ROLES = ("server", "stub:router_bls", "stub:vllm_backend", "engines", "load generator")


def format_cpu_rows(rows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """CPU µs per output token by role, direct vs router, per level."""
    out = []
    for r in rows:
        cpu = r.get("cpu_us_per_token") or {}
        if not cpu:
            continue
        for side in ("direct", "router"):
            per = cpu.get(side, {})
            total = sum(per.values())
            out.append((str(r["concurrency"]), side, *(f"{per.get(role, 0.0):.0f}" for role in CPU_ROLES),
                        f"{total:.0f}"))
    return out


CPU_BUSY_TITLE = ("CPU kept busy (when both paths keep every core busy, the throughput ratio is the ratio of "
                  "CPU per token: the router's cost is its CPU, by role above)")


def cpu_bound_lines(rows: list[dict[str, Any]], cores: int) -> list[str]:
    """Per level: cores kept busy on each path (CPU per token x tokens/s) and the tokens per
    second one router stub relays per core it gets."""
    out = []
    for r in rows:
        cpu = r.get("cpu_us_per_token") or {}
        busy = {side: sum(cpu.get(side, {}).values()) * r[side]["tps"] / 1e6 for side in ("direct", "router")}
        if not all(busy.values()):
            continue
        line = f"{r['concurrency']} streams: cores busy direct {busy['direct']:.2f} / router {busy['router']:.2f} of {cores}"
        stub = cpu.get("router", {}).get("stub:router_bls", 0.0)
        if stub > 0:
            line += f"; router stub {stub:.0f} µs per token = {1e6 / stub:,.0f} tokens/s per core"
        out.append(line)
    return out


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description="Throughput and TTFT added by router_bls over vllm_backend.")
    p.add_argument("--url", help="gRPC endpoint of a running server (router_policy vllm_only); default: start one")
    p.add_argument("--metrics-url", help="with --url: its /metrics, for the per-stage attribution table")
    p.add_argument("--server-pid", type=int,
                   help="with --url: the PID of that tritonserver on this host, for the CPU table (e.g. on a GPU node)")
    p.add_argument("--concurrency", default="1,16,64", help="comma-separated stream counts")
    p.add_argument("--duration", type=float, default=15.0, help="seconds per target and level")
    p.add_argument("--mix", default=FIXED_MIX.name, choices=sorted(MIXES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("--repeats", type=int, default=2, help="rounds per target and level, order alternating")
    p.add_argument("--target", type=float, default=TARGET_RATIO,
                   help="throughput ratio each round pair is held against (the 'rounds vs target' column)")
    p.add_argument("--out", type=Path, help="results folder (default loadtests/results/<timestamp>-overhead)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="profile value for the server it starts, e.g. router_stream_interval_ms=20 (repeatable)")
    args = p.parse_args(argv)
    bad = [kv for kv in args.set if "=" not in kv]
    if bad:
        print(f"overhead: --set takes KEY=VALUE, got {bad}", file=sys.stderr)
        return 2
    overrides = dict(kv.split("=", 1) for kv in args.set)  # a repeated KEY: the last one wins
    if args.server_pid is not None:
        if not args.url:
            print("overhead: --server-pid goes with --url (without --url the tool starts its own server and "
                  "knows its processes)", file=sys.stderr)
            return 2
        try:
            tritonserver_pid(args.server_pid)
        except ValueError as exc:
            print(f"overhead: {exc}", file=sys.stderr)
            return 2
    try:
        levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
        if not levels or any(c < 1 for c in levels):
            raise ValueError
    except ValueError:
        print(f"overhead: bad --concurrency '{args.concurrency}': positive integers, e.g. 1,16,64", file=sys.stderr)
        return 2
    out = args.out or RESULTS / time.strftime("%Y%m%d-%H%M%S-overhead")
    out.mkdir(parents=True, exist_ok=True)
    prompts = PromptFactory(load_tokenizer())
    rows: list[dict[str, Any]] = []
    if args.repeats < 1:
        print(f"overhead: --repeats must be >= 1, got {args.repeats}", file=sys.stderr)
        return 2
    with server_url(args.url, overrides, args.metrics_url, args.server_pid) as (url, pids, metrics_url):
        warm = WorkloadSampler(get_mix(args.mix), prompts, seed=args.seed + 99)
        for model in (DIRECT, ROUTED, DIRECT, ROUTED):
            send(url, model, warm.sample(), CONTRACT[model], timeout_s=args.timeout_s)
        for k, level in enumerate(levels):
            sides = {DIRECT: Side(), ROUTED: Side()}
            for rep in range(args.repeats):
                order = (DIRECT, ROUTED) if rep % 2 == 0 else (ROUTED, DIRECT)
                for model in order:
                    # Distinct seeds per target, level and round: no prompt is seen twice (prefix cache).
                    seed = args.seed + (1000 if model == DIRECT else 2000) + 100 * k + rep
                    measure(url, model, prompts, args.mix, level, args.duration, seed, args.timeout_s,
                            sides[model], pids, metrics_url)
            direct, routed = sides[DIRECT].summary(), sides[ROUTED].summary()
            cpu = {"direct": sides[DIRECT].cpu_us_per_token(), "router": sides[ROUTED].cpu_us_per_token()} \
                if pids else None
            stages = {"direct": sides[DIRECT].stage_means(), "router": sides[ROUTED].stage_means()}
            rows.append(row(level, direct, routed, cpu, stages,
                            round_ratios(sides[DIRECT].round_tps, sides[ROUTED].round_tps), args.target))
            print(f"[overhead] {level} streams: direct {direct.tps:.0f} tok/s, router {routed.tps:.0f} tok/s",
                  flush=True)
    cells = format_rows(rows)
    cpu_cells = format_cpu_rows(rows)
    cpu_header = ("streams", "path", *CPU_ROLES, "total")
    stage_cells = format_stage_rows(rows)
    stage_header = ("streams", "stage (mean per request)", "direct ms", "router ms")
    print()
    print(format_table(HEADER, cells))
    if stage_cells:
        print("\nWhere the time to first token goes (means from /metrics; the entry model is the one the "
              "client called):")
        print(format_table(stage_header, stage_cells))
    bound = cpu_bound_lines(rows, len(os.sched_getaffinity(0)))
    if cpu_cells:
        print("\nCPU time per output token (µs), by process role:")
        print(format_table(cpu_header, cpu_cells))
        print(f"\n{CPU_BUSY_TITLE}:")
        print("\n".join(bound))
    (out / "overhead.json").write_text(json.dumps({"settings": vars(args) | {"out": str(out)}, "rows": rows},
                                                  indent=2, default=str))
    (out / "overhead.md").write_text(
        "# Router overhead (router_bls, policy vllm_only, vs vllm_backend directly)\n\n"
        f"Closed loop, {args.repeats} x {args.duration:g} s per target and level, mix {args.mix}: "
        f"{get_mix(args.mix).describe()}. TTFT from stream start; ratio = router / direct tokens per second "
        "(pooled; 'per round': each pair of rounds run back to back; 'rounds vs target': every pair at or "
        f"above {args.target:g} = meets, every pair below = below, some of each = undecided).\n\n"
        + (f"Server profile values set: {', '.join(f'{k}={v}' for k, v in sorted(overrides.items()))}.\n\n"
           if overrides and not args.url else "")
        + format_table(HEADER, cells, markdown=True) + "\n"
        + ("\n## Where the time to first token goes (means per request from /metrics)\n\n"
           + format_table(stage_header, stage_cells, markdown=True) + "\n" if stage_cells else "")
        + ("\n## CPU time per output token (µs), by process role\n\n"
           + format_table(cpu_header, cpu_cells, markdown=True) + "\n\n"
           + f"{CPU_BUSY_TITLE}:\n\n"
           + "".join(f"- {line}\n" for line in bound) if cpu_cells else ""))
    print(f"\n[overhead] results in {out}")
    errors = sum(r["direct"]["errors"] + r["router"]["errors"] for r in rows)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
