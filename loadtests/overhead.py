"""Router overhead: the same streaming workload straight to vllm_backend and through router_bls.

One server (policy ``vllm_only``, so the router always picks vllm_backend), closed
loop at each concurrency level: N streams back to back for ``--duration`` seconds,
first straight to ``vllm_backend`` (the vLLM backend contract), then through
``router_bls`` (the TensorRT-LLM BLS contract), with the same request shape
(``workload.FIXED_MIX`` by default: 128-token prompts, 64 output tokens). The two
targets get different random prompts of the same length, so vLLM's prefix cache
cannot favour the second one.

Prints, per level: throughput (output tokens/s) of each path and their ratio
(router / direct), TTFT p50/p99 of each and the TTFT the router adds (router minus
direct, per percentile). Writes overhead.json and overhead.md into
loadtests/results/<timestamp>-overhead/.

Usage::

    .venv/bin/python -m loadtests.overhead                         # starts its own server
    .venv/bin/python -m loadtests.overhead --url 127.0.0.1:8001    # a running server (policy must be vllm_only)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .runner import RequestRecord, Summary, format_table, run_closed_loop, send, summarize
from .workload import FIXED_MIX, MIXES, PromptFactory, WorkloadSampler, get_mix, load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "loadtests" / "results"
DIRECT, ROUTED = "vllm_backend", "router_bls"
CONTRACT = {DIRECT: "vllm", ROUTED: "router"}


@contextmanager
def server_url(url: str | None) -> Iterator[str]:
    """A running server's gRPC URL, or a fresh one (router_policy=vllm_only) for the duration."""
    if url:
        yield url
        return
    from tests.server_fixture import running_server

    with running_server("overhead", overrides={"router_policy": "vllm_only"}) as server:
        print(f"[overhead] server ready in {getattr(server, 'start_to_ready_s', 0):.0f} s "
              f"(gRPC {server.grpc_url})", flush=True)
        yield server.grpc_url


def measure(url: str, model: str, prompts: PromptFactory, mix_name: str, concurrency: int,
            duration_s: float, seed: int, timeout_s: float) -> tuple[list[RequestRecord], Summary]:
    """Closed-loop run of one target at one concurrency level."""
    sampler = WorkloadSampler(get_mix(mix_name), prompts, seed=seed)
    records, wall = run_closed_loop(url, model, sampler.sample, CONTRACT[model], concurrency, duration_s,
                                    timeout_s=timeout_s)
    return records, summarize(records, wall_s=wall, from_arrival=False)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def row(level: int, direct: Summary, routed: Summary) -> dict[str, Any]:
    """The comparison of one concurrency level."""
    return {
        "concurrency": level,
        "direct": direct.as_dict(), "router": routed.as_dict(),
        "throughput_ratio": (routed.tps / direct.tps) if direct.tps else None,
        "added_ttft_p50_s": _diff(routed.ttft_p50_s, direct.ttft_p50_s),
        "added_ttft_p99_s": _diff(routed.ttft_p99_s, direct.ttft_p99_s),
    }


HEADER = ("streams", "direct tok/s", "router tok/s", "ratio", "direct TTFT p50/p99 ms",
          "router TTFT p50/p99 ms", "added TTFT p50 ms", "added TTFT p99 ms", "errors d/r")


def format_rows(rows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """Table cells for printed and Markdown output."""
    out = []
    for r in rows:
        d, x = r["direct"], r["router"]
        ratio = "-" if r["throughput_ratio"] is None else f"{r['throughput_ratio']:.2f}"
        out.append((str(r["concurrency"]), f"{d['tps']:.0f}", f"{x['tps']:.0f}", ratio,
                    f"{_ms(d['ttft_p50_s'])}/{_ms(d['ttft_p99_s'])}", f"{_ms(x['ttft_p50_s'])}/{_ms(x['ttft_p99_s'])}",
                    _ms(r["added_ttft_p50_s"]), _ms(r["added_ttft_p99_s"]), f"{d['errors']}/{x['errors']}"))
    return out


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description="Throughput and TTFT added by router_bls over vllm_backend.")
    p.add_argument("--url", help="gRPC endpoint of a running server (router_policy vllm_only); default: start one")
    p.add_argument("--concurrency", default="1,16,64", help="comma-separated stream counts")
    p.add_argument("--duration", type=float, default=15.0, help="seconds per target and level")
    p.add_argument("--mix", default=FIXED_MIX.name, choices=sorted(MIXES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("--out", type=Path, help="results folder (default loadtests/results/<timestamp>-overhead)")
    args = p.parse_args(argv)
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
    with server_url(args.url) as url:
        warm = WorkloadSampler(get_mix(args.mix), prompts, seed=args.seed + 99)
        for model in (DIRECT, ROUTED, DIRECT, ROUTED):
            send(url, model, warm.sample(), CONTRACT[model], timeout_s=args.timeout_s)
        for k, level in enumerate(levels):
            # Distinct seeds per target and level: no prompt is seen twice (prefix cache).
            _, direct = measure(url, DIRECT, prompts, args.mix, level, args.duration,
                                args.seed + 1000 + k, args.timeout_s)
            _, routed = measure(url, ROUTED, prompts, args.mix, level, args.duration,
                                args.seed + 2000 + k, args.timeout_s)
            rows.append(row(level, direct, routed))
            print(f"[overhead] {level} streams: direct {direct.tps:.0f} tok/s, router {routed.tps:.0f} tok/s",
                  flush=True)
    cells = format_rows(rows)
    print()
    print(format_table(HEADER, cells))
    (out / "overhead.json").write_text(json.dumps({"settings": vars(args) | {"out": str(out)}, "rows": rows},
                                                  indent=2, default=str))
    (out / "overhead.md").write_text(
        "# Router overhead (router_bls, policy vllm_only, vs vllm_backend directly)\n\n"
        f"Closed loop, {args.duration:g} s per target and level, mix {args.mix}: "
        f"{get_mix(args.mix).describe()}. TTFT from stream start; ratio = router / direct tokens per second.\n\n"
        + format_table(HEADER, cells, markdown=True) + "\n")
    print(f"\n[overhead] results in {out}")
    errors = sum(r["direct"]["errors"] + r["router"]["errors"] for r in rows)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
