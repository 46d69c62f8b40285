"""Per-stage P90/P99 table from Triton's /metrics: where the long tail of a request comes from.

Reads one scrape (a URL or a saved text file), or two (``--before`` and the main one)
and uses their difference, so the table covers only the requests in between. Each
stage is a histogram family; quantiles are estimated from the buckets the way
Prometheus's ``histogram_quantile`` does (linear interpolation inside the bucket that
holds the rank), so the numbers match the Grafana panels over the same window.

Stages (rows):
  router queue wait   router_queue_wait_seconds, by priority class
  engine queue        vllm:request_queue_time_seconds, by model (engines that report it)
  engine prefill      vllm:request_prefill_time_seconds, by model
  TTFT                router_ttft_seconds, by engine (arrival at the router to first token)
  decode              vllm:request_decode_time_seconds, by model
  TPOT                router_tpot_seconds, by engine
  end-to-end          router_e2e_seconds, by engine

    .venv/bin/python -m loadtests.stage_report http://127.0.0.1:8002/metrics
    .venv/bin/python -m loadtests.stage_report after.txt --before before.txt
    .venv/bin/python -m loadtests.stage_report http://127.0.0.1:8002/metrics --window-s 60
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

from hybrid_llm.prom import Sample, find, parse_text

PRIORITY_ORDER = {"urgent": 0, "high": 1, "normal": 2}


@dataclass(frozen=True)
class Histogram:
    """One cumulative histogram: (upper bound, cumulative count) pairs sorted by bound, sum, count."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float


@dataclass(frozen=True)
class Stage:
    """A row group of the report: a histogram family and the label that splits it."""

    title: str
    family: str
    group_by: str


@dataclass(frozen=True)
class StageRow:
    """One line of the table (seconds; NaN when the series has no observations)."""

    stage: str
    family: str
    series: str
    count: int
    mean_s: float
    p90_s: float
    p99_s: float


STAGES = (
    Stage("router queue wait", "router_queue_wait_seconds", "priority"),
    Stage("engine queue", "vllm:request_queue_time_seconds", "model"),
    Stage("engine prefill", "vllm:request_prefill_time_seconds", "model"),
    Stage("TTFT", "router_ttft_seconds", "engine"),
    Stage("decode", "vllm:request_decode_time_seconds", "model"),
    Stage("TPOT", "router_tpot_seconds", "engine"),
    Stage("end-to-end", "router_e2e_seconds", "engine"),
)


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """The q-quantile of cumulative (upper bound, count) buckets, as Prometheus computes it.

    Same rules as Prometheus's ``bucketQuantile``: NaN without a +Inf bucket or without
    observations; a rank in the +Inf bucket returns the highest finite bound; the
    first bucket interpolates from 0 (or returns its bound if that is <= 0); bucket
    counts are made monotonic first (scrapes of a live histogram can be torn).
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    merged: dict[float, float] = {}
    for bound, count in buckets:
        merged[bound] = merged.get(bound, 0.0) + count
    bs = sorted(merged.items())
    if len(bs) < 2 or not math.isinf(bs[-1][0]) or bs[-1][0] < 0:
        return math.nan
    running = -math.inf
    for i, (bound, count) in enumerate(bs):
        running = max(running, count)
        bs[i] = (bound, running)
    total = bs[-1][1]
    if total <= 0:
        return math.nan
    rank = q * total
    b = next((i for i in range(len(bs) - 1) if bs[i][1] >= rank), len(bs) - 1)
    if b == len(bs) - 1:
        return bs[-2][0]
    if b == 0 and bs[0][0] <= 0:
        return bs[0][0]
    start, end, count = 0.0, bs[b][0], bs[b][1]
    if b > 0:
        start = bs[b - 1][0]
        count -= bs[b - 1][1]
        rank -= bs[b - 1][1]
    return start + (end - start) * (rank / count)


def load_scrape(source: str, timeout_s: float = 10.0) -> str:
    """Exposition text from a URL (http:// or https://) or from a saved file."""
    if source.startswith(("http://", "https://")):
        with urllib.request.urlopen(source, timeout=timeout_s) as resp:
            return resp.read().decode("utf-8")
    return Path(source).read_text(encoding="utf-8")


def _le(sample: Sample) -> float:
    text = sample.label("le")
    return math.inf if text in ("+Inf", "Inf") else float(text)


def series_histograms(samples: Iterable[Sample], family: str) -> dict[tuple[tuple[str, str], ...], Histogram]:
    """Every series of a histogram family, keyed by its labels without ``le``."""
    samples = list(samples)
    buckets: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    for s in find(samples, f"{family}_bucket"):
        key = tuple(sorted((k, v) for k, v in s.labels if k != "le"))
        buckets.setdefault(key, []).append((_le(s), s.value))
    sums = {tuple(sorted(s.labels)): s.value for s in find(samples, f"{family}_sum")}
    counts = {tuple(sorted(s.labels)): s.value for s in find(samples, f"{family}_count")}
    out = {}
    for key, pairs in buckets.items():
        pairs.sort()
        total = counts.get(key, pairs[-1][1] if pairs else 0.0)
        out[key] = Histogram(tuple(pairs), sums.get(key, math.nan), total)
    return out


def subtract(after: Histogram, before: Histogram | None) -> Histogram:
    """Observations made between two scrapes (``after`` alone if the series was reset or new)."""
    if before is None or before.count > after.count:
        return after
    prior = dict(before.buckets)
    return Histogram(tuple((b, c - prior.get(b, 0.0)) for b, c in after.buckets),
                     after.sum - before.sum, after.count - before.count)


def merge(histograms: Iterable[Histogram]) -> Histogram:
    """Sum histograms bucket by bucket (``sum by (le)`` in PromQL)."""
    counts: dict[float, float] = {}
    total_sum = total_count = 0.0
    for h in histograms:
        for bound, count in h.buckets:
            counts[bound] = counts.get(bound, 0.0) + count
        total_sum += h.sum
        total_count += h.count
    return Histogram(tuple(sorted(counts.items())), total_sum, total_count)


def stage_histograms(after: Sequence[Sample], before: Sequence[Sample] | None,
                     stage: Stage) -> dict[str, Histogram]:
    """The stage's histograms per value of its group label, over the window between the scrapes."""
    now = series_histograms(after, stage.family)
    prior = series_histograms(before, stage.family) if before is not None else {}
    groups: dict[str, list[Histogram]] = {}
    for key, h in now.items():
        group = dict(key).get(stage.group_by, "")
        groups.setdefault(group, []).append(subtract(h, prior.get(key)))
    return {g: merge(hs) for g, hs in groups.items()}


def _order(stage: Stage, series: str) -> tuple[int, str]:
    return (PRIORITY_ORDER.get(series, 9) if stage.group_by == "priority" else 0, series)


def stage_table(after_text: str, before_text: str | None = None,
                stages: Sequence[Stage] = STAGES) -> list[StageRow]:
    """One row per stage and series: count, mean, P90 and P99 (seconds)."""
    after = parse_text(after_text)
    before = parse_text(before_text) if before_text is not None else None
    rows = []
    for stage in stages:
        per_group = stage_histograms(after, before, stage)
        for series in sorted(per_group, key=lambda s: _order(stage, s)):
            h = per_group[series]
            n = int(round(h.count))
            mean = h.sum / h.count if h.count > 0 else math.nan
            rows.append(StageRow(stage.title, stage.family, series, n, mean,
                                 histogram_quantile(0.90, h.buckets), histogram_quantile(0.99, h.buckets)))
    return rows


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.1f}"


def format_markdown(rows: Sequence[StageRow]) -> str:
    """The table as Markdown (milliseconds)."""
    lines = ["| stage | series | n | mean ms | P90 ms | P99 ms | family |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r.stage} | {r.series or '-'} | {r.count} | {_ms(r.mean_s)} | {_ms(r.p90_s)} "
                     f"| {_ms(r.p99_s)} | `{r.family}` |")
    if not rows:
        lines.append("| (no stage histograms in the scrape) | | | | | | |")
    lines += ["", "Quantiles are interpolated inside histogram buckets (as histogram_quantile does), so they "
              "are only as fine as each family's bucket bounds; the mean is exact."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: print the per-stage table for a scrape (or the window between two)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="metrics URL (http://host:8002/metrics) or a saved scrape file")
    ap.add_argument("--before", help="an earlier scrape (URL or file): report only what happened since")
    ap.add_argument("--window-s", type=float, default=0.0,
                    help="with a URL and no --before: scrape, wait this long, scrape again, report the window")
    ap.add_argument("--save", type=Path, help="write the (after) scrape text here")
    ap.add_argument("--json", action="store_true", help="print JSON rows instead of Markdown")
    args = ap.parse_args(argv)

    before_text = load_scrape(args.before) if args.before else None
    if before_text is None and args.window_s > 0:
        before_text = load_scrape(args.source)
        time.sleep(args.window_s)
    after_text = load_scrape(args.source)
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(after_text, encoding="utf-8")
    rows = stage_table(after_text, before_text)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2, default=str))
    else:
        print(format_markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
