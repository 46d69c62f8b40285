"""The GPU benchmark suite (issue 17): router overhead, the peer server, the policy's worth.

Run against a gpu-vllm server (``build_scripts/gpu_offline.py serve``) on one GPU:

    python -m loadtests.gpu_bench p1   --url 127.0.0.1:8001 --metrics-url http://127.0.0.1:8002/metrics
    python -m loadtests.gpu_bench p2   --url 127.0.0.1:8001 --http-url 127.0.0.1:8000 --qps 60
    python -m loadtests.gpu_bench peer --openai-url http://127.0.0.1:8100    # plain `vllm serve`
    python -m loadtests.gpu_bench frontend --openai-url http://127.0.0.1:9000 --model tiny-llama
    python -m loadtests.gpu_bench report --out loadtests/results/h200

* **p1**, router overhead: the same fixed-shape streaming workload (closed loop, N
  concurrent streams, gRPC) through ``router_bls -> vllm_backend`` and straight to
  ``vllm_backend``, rounds alternating: output tok/s, TTFT p50/p99, inter-token latency
  p50/p99, ratio router/direct.
* **peer**: the same workload against plain ``vllm serve`` (same vLLM, model, engine
  args) over its OpenAI completions endpoint, measured by this tool's own client.
* **p2**, the policy's worth: the hybrid mix (short interactive requests with an SLA,
  >= 2048-token prompts, three priority classes; ``loadtests/workload.py``) as an open
  loop at a fixed QPS, through router_bls under each routing policy in turn (each request
  names the policy in the ``routing_policy`` request parameter; the server runs with
  ``policy_override``): short-request TTFT p99, SLA attainment, goodput, urgent TTFT.
* **frontend**: the same streaming workload through the OpenAI frontend
  (``/v1/completions``, SSE) and straight over gRPC to router_bls, rounds alternating:
  throughput ratio and added TTFT (runs on the CPU profile too, as ``make serve`` starts
  both; there the figures are contended by the engines).

The load comes from ``--procs`` processes (threads inside each): one Python client
process tops out near a few thousand streamed responses per second, below what a GPU
engine produces. GPU figures (utilisation, memory, power) are sampled during each
window from Triton's metrics endpoint, or through pynvml for the peer. Each command
writes ``<name>.json`` into ``--out``; ``report`` turns them into ``results.md``.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import multiprocessing as mp
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from hybrid_llm.contracts import GenerationRequest
from client.stream import StreamResult

from .runner import (RequestRecord, format_table, percentile, run_closed_loop, run_open_loop, send,
                     summarize)
from .shapes import Stage, step_arrivals
from .workload import HYBRID_MIX, PromptFactory, RequestClass, SampledRequest, TokenRange, WorkloadMix, \
    WorkloadSampler, load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TOKENIZER = ROOT / "models" / "random-llama-1b"
DEFAULT_OUT = ROOT / "loadtests" / "results" / "h200"
GPU_METRICS = ("nv_gpu_utilization", "nv_gpu_memory_used_bytes", "nv_gpu_power_usage")
ITL_SAMPLE = 20000  # inter-token gaps kept per worker (uniform sample) for the percentiles


# --------------------------------------------------------------------------- clients


def stream_openai(base_url: str, model: str, request: GenerationRequest, timeout_s: float = 300.0) -> StreamResult:
    """Stream one /v1/completions request (SSE) and time it like ``stream_grpc`` does."""
    url = urllib.parse.urlparse(base_url)
    body = {"model": model, "prompt": request.prompt, "max_tokens": request.max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    if request.temperature is not None:
        body["temperature"] = request.temperature
    result = StreamResult()
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=timeout_s)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            result.error, result.error_code = f"HTTP {resp.status}: {resp.read()[:300]!r}", str(resp.status)
            return result
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            event = json.loads(data)
            now = time.monotonic() - t0
            for choice in event.get("choices") or []:
                text = choice.get("text") or ""
                if text:
                    if result.ttft_s is None:
                        result.ttft_s = now
                    result.chunks.append(text)
                    result.chunk_times_s.append(now)
                if choice.get("finish_reason"):
                    result.finish_reason = choice["finish_reason"]
            usage = event.get("usage")
            if usage:
                result.num_input_tokens = usage.get("prompt_tokens")
                result.num_output_tokens = usage.get("completion_tokens")
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as exc:
        result.error, result.error_code = f"client error: {exc!r}", "CLIENT"
    finally:
        conn.close()
        result.e2e_s = time.monotonic() - t0
    return result


@dataclass(frozen=True)
class Target:
    """Where a closed-loop worker sends: a Triton model over gRPC, or an OpenAI server."""

    name: str
    kind: str  # "triton" | "openai"
    url: str
    model: str
    contract: str = "router"
    parameters: tuple[tuple[str, str], ...] = ()  # Triton request parameters of every request

    def send(self, sample: SampledRequest, timeout_s: float) -> StreamResult:
        """Stream one request to this target."""
        if self.kind == "openai":
            return stream_openai(self.url, self.model, sample.request, timeout_s)
        return send(self.url, self.model, sample, self.contract, None, timeout_s,
                    parameters=dict(self.parameters) or None)


def p1_targets(url: str, pin_router: bool) -> list[Target]:
    """P1's two targets; with ``pin_router`` the router's requests name ``routing_policy:
    vllm_only``, so both targets end on the same engine (vllm_backend) and the ratio is the
    router's own cost. Without it the hybrid policy may send them to the trtllm slot."""
    pin = (("routing_policy", "vllm_only"),) if pin_router else ()
    return [Target("router", "triton", url, "router_bls", "router", pin),
            Target("direct", "triton", url, "vllm_backend", "vllm")]


def fixed_mix(prompt_tokens: int, output_tokens: int) -> WorkloadMix:
    """P1's one request shape (NORMAL priority, no SLA)."""
    return WorkloadMix("p1", (RequestClass("fixed", 1.0, TokenRange(prompt_tokens, prompt_tokens),
                                           TokenRange(output_tokens, output_tokens), {3: 1.0}, None),))


@dataclass
class WorkerJob:
    """One load process's share of a closed-loop level (picklable for spawn)."""

    target: Target
    streams: int
    duration_s: float
    prompt_tokens: int
    output_tokens: int
    tokenizer: str
    seed: int
    timeout_s: float = 300.0


@dataclass
class WorkerResult:
    """What a load process measured."""

    records: list[dict[str, Any]]
    gaps_s: list[float]
    wall_s: float


def gaps_of(result: StreamResult) -> list[float]:
    """Inter-token gaps of a stream: time between chunks over the tokens each chunk carried."""
    times = result.chunk_times_s
    return [b - a for a, b in zip(times, times[1:])]


class Reservoir:
    """A uniform sample of at most ``size`` values from a stream of any length (Algorithm R)."""

    def __init__(self, size: int, seed: int = 0) -> None:
        self.size = size
        self.items: list[float] = []
        self.seen = 0
        self._rng = random.Random(seed)

    def extend(self, values: Sequence[float]) -> None:
        """Offer each value: kept with probability size / values seen so far."""
        for value in values:
            self.seen += 1
            if len(self.items) < self.size:
                self.items.append(value)
            else:
                k = self._rng.randrange(self.seen)
                if k < self.size:
                    self.items[k] = value


def closed_loop(job: WorkerJob, next_sample: Callable[[], SampledRequest]) -> WorkerResult:
    """``job.streams`` back-to-back streams for ``job.duration_s`` (runner's closed loop); records and gaps."""
    gaps = Reservoir(ITL_SAMPLE, job.seed)
    t = job.target
    records, wall = run_closed_loop(t.url, t.model, next_sample, t.contract, job.streams, job.duration_s,
                                    timeout_s=job.timeout_s, send_fn=lambda sample: t.send(sample, job.timeout_s),
                                    on_result=lambda record, result: gaps.extend(gaps_of(result)))
    return WorkerResult([r.as_dict() for r in records], gaps.items, wall)


@functools.lru_cache(maxsize=4)
def _prompts(tokenizer: str) -> PromptFactory:
    """One prompt factory per load process and tokenizer (building one scans the vocabulary)."""
    return PromptFactory(load_tokenizer(tokenizer))


def run_worker(job: WorkerJob) -> WorkerResult:
    """Entry point of one load process."""
    prompts = _prompts(job.tokenizer)
    sampler = WorkloadSampler(fixed_mix(job.prompt_tokens, job.output_tokens), prompts, seed=job.seed)
    return closed_loop(job, sampler.sample)


def split_streams(total: int, procs: int) -> list[int]:
    """Streams per process: as even as possible, no process with none."""
    procs = max(1, min(procs, total))
    base, extra = divmod(total, procs)
    return [base + (1 if i < extra else 0) for i in range(procs)]


# --------------------------------------------------------------------------- GPU sampling


def parse_gauges(text: str, names: Sequence[str]) -> dict[str, float]:
    """Sum of each named metric's samples in a Prometheus text page."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            try:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                continue
    return out


# Server processes whose CPU the benchmark reports, by a part of their command line.
SERVER_ROLES = {"router_stub": "/router_bls/1/model.py", "vllm_backend_stub": "/vllm_backend/1/model.py",
                "trtllm_stub": "/trtllm/1/model.py", "tritonserver": "bin/tritonserver",
                "vllm_serve": "vllm.entrypoints.cli.main serve", "engine_cores": "VLLM::EngineCore"}


def server_cpu() -> dict[str, float]:
    """CPU seconds (user + system) used so far by this host's server processes, by role."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            role = next((r for r, part in SERVER_ROLES.items() if part in cmd), None)
            if role is None:
                continue
            fields = stat.read_text().rsplit(")", 1)[1].split()
            out[role] = out.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return out


class GpuSampler:
    """Samples GPU utilisation, memory and power once a second during a window."""

    def __init__(self, metrics_url: str | None, period_s: float = 1.0) -> None:
        self.metrics_url = metrics_url
        self.period_s = period_s
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._nvml: Any = None
        self.source = "triton" if metrics_url else "pynvml"

    def _read(self) -> dict[str, float]:
        if self.metrics_url:
            with urllib.request.urlopen(self.metrics_url, timeout=2) as r:
                return parse_gauges(r.read().decode(), GPU_METRICS)
        if self._nvml is None:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))
        nv, handle = self._nvml
        return {"nv_gpu_utilization": nv.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0,
                "nv_gpu_memory_used_bytes": float(nv.nvmlDeviceGetMemoryInfo(handle).used),
                "nv_gpu_power_usage": nv.nvmlDeviceGetPowerUsage(handle) / 1000.0}

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.samples.append(self._read())
            except Exception:  # noqa: BLE001 - no GPU figures is a report gap, not a failed run
                self.source = "unavailable"
                return

    def __enter__(self) -> "GpuSampler":
        self._cpu0, self._t0 = server_cpu(), time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        wall = time.monotonic() - self._t0
        cpu1 = server_cpu()
        self.cpu_cores = {role: (cpu1[role] - self._cpu0.get(role, 0.0)) / wall
                          for role in cpu1 if wall > 0}

    def summary(self) -> dict[str, Any]:
        """Mean and max of each figure over the window, and the cores each server process used."""
        out: dict[str, Any] = {"source": self.source, "samples": len(self.samples),
                               "cpu_cores": {k: round(v, 3) for k, v in getattr(self, "cpu_cores", {}).items()}}
        for name in GPU_METRICS:
            values = [s[name] for s in self.samples if name in s]
            if values:
                out[name] = {"mean": statistics.fmean(values), "max": max(values)}
        return out


# --------------------------------------------------------------------------- closed-loop levels


def level_figures(results: Sequence[WorkerResult]) -> dict[str, Any]:
    """Pool the workers of one round: tok/s over the longest wall, TTFT and ITL percentiles."""
    records = [r for res in results for r in res.records]
    ok = [r for r in records if r["error"] is None]
    wall = max((res.wall_s for res in results), default=0.0)
    tokens = sum(r["output_tokens"] for r in ok)
    gaps = [g for res in results for g in res.gaps_s]
    return {
        "requests": len(records), "errors": len(records) - len(ok), "output_tokens": tokens, "wall_s": wall,
        "tok_s": tokens / wall if wall else 0.0,
        "ttft_p50_ms": _ms(percentile((r["ttft_s"] for r in ok), 50)),
        "ttft_p99_ms": _ms(percentile((r["ttft_s"] for r in ok), 99)),
        "itl_p50_ms": _ms(percentile(gaps, 50)), "itl_p99_ms": _ms(percentile(gaps, 99)),
        "first_errors": sorted({r["error"][:200] for r in records if r["error"]})[:3],
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def run_level(pool: Any, target: Target, streams: int, args: argparse.Namespace, seed: int,
              duration_s: float | None = None) -> dict[str, Any]:
    """One closed-loop round at ``streams`` concurrent streams, spread over the pool's processes."""
    jobs = [WorkerJob(target, n, duration_s or args.duration, args.prompt_tokens, args.output_tokens,
                      str(args.tokenizer), seed * 1000 + i, args.timeout_s)
            for i, n in enumerate(split_streams(streams, args.procs))]
    with GpuSampler(getattr(args, "metrics_url", None)) as gpu:
        results = pool.map(run_worker, jobs, chunksize=1)
    figures = level_figures(results)
    figures["gpu"] = gpu.summary()
    return figures


def closed_loop_suite(targets: Sequence[Target], args: argparse.Namespace) -> dict[str, Any]:
    """Every level x repeat x target, the targets' order alternating between repeats.

    One pool of load processes serves every round (each loads the tokenizer once); a
    short warm-up per target first, so CUDA graphs, caches and connections are warm.
    """
    out: dict[str, Any] = {"settings": {k: str(v) for k, v in vars(args).items() if k != "func"},
                           "levels": {}}
    with mp.get_context("spawn").Pool(args.procs) as pool:
        for t in targets:
            run_level(pool, t, min(args.procs * 2, 16), args, seed=99, duration_s=3.0)
        _levels_loop(pool, targets, args, out)
    return out


def _levels_loop(pool: Any, targets: Sequence[Target], args: argparse.Namespace, out: dict[str, Any]) -> None:
    for level in args.levels:
        rounds: dict[str, list[dict[str, Any]]] = {t.name: [] for t in targets}
        for rep in range(args.repeats):
            order = targets if rep % 2 == 0 else list(reversed(targets))
            for t in order:
                fig = run_level(pool, t, level, args, seed=rep)
                rounds[t.name].append(fig)
                print(f"[gpu-bench] {t.name} {level} streams round {rep + 1}: {fig['tok_s']:.0f} tok/s, "
                      f"TTFT p50 {fig['ttft_p50_ms'] or 0:.1f} ms, ITL p50 {fig['itl_p50_ms'] or 0:.2f} ms, "
                      f"errors {fig['errors']}", flush=True)
        out["levels"][str(level)] = rounds
        # Saved after every level: a run cut short keeps what it measured.
        (args.out / f"{args.cmd}.json").write_text(json.dumps(out, indent=1))


# --------------------------------------------------------------------------- p2: policies


def router_policy_override(http_url: str, model: str = "router_bls") -> bool:
    """True when the running router accepts the routing_policy request parameter."""
    with urllib.request.urlopen(f"http://{http_url}/v2/models/{model}/config", timeout=10) as resp:
        config = json.loads(resp.read())
    value = config.get("parameters", {}).get("policy_override", {}).get("string_value", "false")
    return value.strip().lower() in ("true", "1", "yes")


def p2_figures(records: Sequence[RequestRecord], wall_s: float) -> dict[str, Any]:
    """The policy comparison's figures of one open-loop round."""
    short = [r for r in records if r.klass == "short"]
    urgent = [r for r in records if r.priority == 1]
    ok_short = [r for r in short if r.error is None]
    good = [r for r in records if r.error is None and (r.sla_met is None or r.sla_met)]
    s = summarize(records, wall_s=wall_s)
    backends: dict[str, int] = {}
    for r in records:
        backends[r.backend or "-"] = backends.get(r.backend or "-", 0) + 1
    return {
        "requests": len(records), "errors": s.errors, "tok_s": s.tps,
        "short_ttft_p50_ms": _ms(percentile((r.ttft_from_arrival_s for r in ok_short), 50)),
        "short_ttft_p99_ms": _ms(percentile((r.ttft_from_arrival_s for r in ok_short), 99)),
        "sla_attainment": (sum(1 for r in short if r.sla_met) / len(short)) if short else None,
        "goodput_rps": len(good) / wall_s if wall_s else 0.0,
        "urgent_ttft_p50_ms": _ms(percentile((r.ttft_from_arrival_s for r in urgent if r.error is None), 50)),
        "urgent_ttft_p99_ms": _ms(percentile((r.ttft_from_arrival_s for r in urgent if r.error is None), 99)),
        "long_e2e_p50_ms": _ms(percentile((r.e2e_s for r in records if r.klass == "long" and r.error is None), 50)),
        "backends": backends,
    }


def p2_suite(args: argparse.Namespace) -> dict[str, Any]:
    """Each policy in turn (request parameter routing_policy), ``repeats`` open-loop rounds of the hybrid mix.

    The policies share one running server: no reload (tritonserver 2.51 has crashed on
    reloading a Python model), the engines and their caches stay as they are.
    """
    if not router_policy_override(args.http_url):
        raise SystemExit("p2: router_bls does not accept per-request policies; serve with "
                         "--set router_policy_override=true")
    prompts = PromptFactory(load_tokenizer(args.tokenizer))
    # Policies measured by an earlier call into the same folder are kept (one call per policy
    # fits a short call limit); a policy measured again replaces its entry.
    earlier = _load(args.out / "p2.json") or {}
    out: dict[str, Any] = {"settings": {k: str(v) for k, v in vars(args).items() if k != "func"},
                           "mix": HYBRID_MIX.describe(), "policies": dict(earlier.get("policies", {}))}
    for policy in args.policies:
        rounds = []
        for rep in range(args.repeats):
            sampler = WorkloadSampler(HYBRID_MIX, prompts, seed=rep)
            arrivals = step_arrivals([Stage(args.duration, args.qps)], "poisson", seed=rep)
            schedule = [(a, sampler.sample()) for a in arrivals]
            with GpuSampler(args.metrics_url) as gpu:
                t0 = time.monotonic()
                records = run_open_loop(args.url, "router_bls", schedule, "router", max_in_flight=args.max_in_flight,
                                        timeout_s=args.timeout_s, parameters={"routing_policy": policy})
                wall = time.monotonic() - t0
            fig = p2_figures(records, wall)
            fig["gpu"] = gpu.summary()
            rounds.append(fig)
            print(f"[gpu-bench] p2 {policy} round {rep + 1}: short TTFT p99 {fig['short_ttft_p99_ms'] or 0:.0f} ms, "
                  f"SLA {fig['sla_attainment'] or 0:.0%}, goodput {fig['goodput_rps']:.1f}/s, "
                  f"errors {fig['errors']}, backends {fig['backends']}", flush=True)
        out["policies"][policy] = {"rounds": rounds}
        (args.out / "p2.json").write_text(json.dumps(out, indent=1))  # saved after every policy
    return out


# --------------------------------------------------------------------------- report


def med(values: Sequence[float | None]) -> float | None:
    """Median of the non-None values."""
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def spread(values: Sequence[float | None]) -> str:
    """'min-max' of the non-None values."""
    vals = [v for v in values if v is not None]
    return f"{min(vals):.4g}-{max(vals):.4g}" if vals else "-"


def _f(v: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def closed_loop_rows(data: dict[str, Any], base: str, other: str) -> list[tuple[str, ...]]:
    """One row per level: medians (and spread) of both targets and the ratio other/base."""
    rows = []
    for level, rounds in data["levels"].items():
        a, b = rounds.get(base, []), rounds.get(other, [])
        if not a or not b:
            continue
        ratios = [y["tok_s"] / x["tok_s"] for x, y in zip(a, b) if x["tok_s"]]
        ttft_a, ttft_b = med([r["ttft_p50_ms"] for r in a]), med([r["ttft_p50_ms"] for r in b])
        rows.append((
            level,
            f"{_f(med([r['tok_s'] for r in a]), '{:.0f}')} ({spread([r['tok_s'] for r in a])})",
            f"{_f(med([r['tok_s'] for r in b]), '{:.0f}')} ({spread([r['tok_s'] for r in b])})",
            f"{_f(med(ratios), '{:.2f}')} ({spread(ratios)})",
            f"{_f(ttft_a)} / {_f(med([r['ttft_p99_ms'] for r in a]))}",
            f"{_f(ttft_b)} / {_f(med([r['ttft_p99_ms'] for r in b]))}",
            _f(None if ttft_a is None or ttft_b is None else ttft_b - ttft_a, "{:+.1f}"),
            f"{_f(med([r['itl_p50_ms'] for r in a]), '{:.2f}')} / {_f(med([r['itl_p99_ms'] for r in a]), '{:.2f}')}",
            f"{_f(med([r['itl_p50_ms'] for r in b]), '{:.2f}')} / {_f(med([r['itl_p99_ms'] for r in b]), '{:.2f}')}",
            str(sum(r["errors"] for r in a + b)),
        ))
    return rows


def closed_loop_header(base: str, other: str) -> tuple[str, ...]:
    """Header of ``closed_loop_rows``."""
    return ("streams", f"{base} tok/s", f"{other} tok/s", f"ratio {other}/{base}",
            f"{base} TTFT p50/p99 ms", f"{other} TTFT p50/p99 ms", "added TTFT p50 ms",
            f"{base} ITL p50/p99 ms", f"{other} ITL p50/p99 ms", "errors")


def p2_rows(data: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per policy (medians over rounds) with ratios against round_robin."""
    pols = data["policies"]
    base = pols.get("round_robin", {}).get("rounds", [])
    base_p99 = med([r["short_ttft_p99_ms"] for r in base])
    base_sla = med([r["sla_attainment"] for r in base])
    rows = []
    for name, entry in pols.items():
        rs = entry["rounds"]
        p99 = med([r["short_ttft_p99_ms"] for r in rs])
        sla = med([r["sla_attainment"] for r in rs])
        rows.append((
            name, f"{_f(p99, '{:.0f}')} ({spread([r['short_ttft_p99_ms'] for r in rs])})",
            _f(None if not base_p99 or p99 is None else p99 / base_p99, "{:.2f}"),
            f"{_f(None if sla is None else sla * 100, '{:.0f}')}%",
            _f(None if not base_sla or sla is None else sla / base_sla, "{:.2f}"),
            _f(med([r["goodput_rps"] for r in rs])),
            f"{_f(med([r['urgent_ttft_p50_ms'] for r in rs]), '{:.0f}')} / "
            f"{_f(med([r['urgent_ttft_p99_ms'] for r in rs]), '{:.0f}')}",
            _f(med([r["long_e2e_p50_ms"] for r in rs]), "{:.0f}"),
            _f(med([r["tok_s"] for r in rs]), "{:.0f}"), str(sum(r["errors"] for r in rs)),
        ))
    return rows


P2_HEADER = ("policy", "short TTFT p99 ms (spread)", "vs round_robin", "SLA met", "vs round_robin",
             "goodput req/s", "urgent TTFT p50/p99 ms", "long e2e p50 ms", "tok/s", "errors")


def gpu_line(figs: Sequence[dict[str, Any]]) -> str:
    """Mean GPU utilisation / memory / power over the rounds given."""
    util = med([f["gpu"].get("nv_gpu_utilization", {}).get("mean") for f in figs if "gpu" in f])
    mem = med([f["gpu"].get("nv_gpu_memory_used_bytes", {}).get("max") for f in figs if "gpu" in f])
    power = med([f["gpu"].get("nv_gpu_power_usage", {}).get("mean") for f in figs if "gpu" in f])
    cores = {}
    for f in figs:
        for role, value in f.get("gpu", {}).get("cpu_cores", {}).items():
            cores.setdefault(role, []).append(value)
    busy = ", ".join(f"{role} {med(v):.2f}" for role, v in sorted(cores.items()) if med(v))
    return (f"GPU util {_f(None if util is None else util * 100, '{:.0f}')}%, memory "
            f"{_f(None if mem is None else mem / 2**30)} GiB, power {_f(power, '{:.0f}')} W; "
            f"CPU cores busy: {busy or '-'}")


def report(out: Path) -> str:
    """results.md from the suite's JSON files in ``out``."""
    p1 = _load(out / "p1.json")
    fe = _load(out / "frontend.json")
    peer = _load(out / "peer.json")
    p2 = _load(out / "p2.json")
    device = next((d["device"] for d in (p1, p2, peer, fe) if d and d.get("device")), "")
    title = (f"# GPU benchmark results ({device or 'GPU'}, gpu-vllm profile)" if p1 or p2 or peer or not fe
             else "# Frontend benchmark results")
    lines = [title, ""]
    if p1:
        lines += ["## P1: router overhead (router_bls -> vllm_backend vs vllm_backend, gRPC streaming)", "",
                  f"Settings: {p1['settings'].get('prompt_tokens')} prompt tokens, {p1['settings'].get('output_tokens')} "
                  f"output tokens, {p1['settings'].get('duration')} s per round, {p1['settings'].get('repeats')} rounds "
                  f"per target and level (order alternating), {p1['settings'].get('procs')} load processes. Medians, "
                  "spread in brackets.", "",
                  format_table(closed_loop_header("direct", "router"), closed_loop_rows(p1, "direct", "router"),
                               markdown=True), ""]
        for level, rounds in p1["levels"].items():
            lines.append(f"- {level} streams: router {gpu_line(rounds.get('router', []))}; "
                         f"direct {gpu_line(rounds.get('direct', []))}")
        lines.append("")
    if p1 and peer:
        merged = {"levels": {lvl: {"router": p1["levels"].get(lvl, {}).get("router", []),
                                   "vllm serve": peer["levels"][lvl].get("vllm serve", [])}
                             for lvl in peer["levels"]}}
        lines += ["## Peer: plain `vllm serve` (same vLLM, model, engine args; OpenAI completions, SSE)", "",
                  format_table(closed_loop_header("vllm serve", "router"),
                               closed_loop_rows(merged, "vllm serve", "router"), markdown=True), ""]
    if p2:
        s = p2["settings"]
        lines += ["## P2: the policy's worth (hybrid mix, open loop)", "",
                  f"Load: Poisson {s.get('qps')} req/s for {s.get('duration')} s per round, {s.get('repeats')} rounds "
                  "per policy; the mix:", "", *[f"- {m}" for m in p2["mix"].splitlines()], "",
                  format_table(P2_HEADER, p2_rows(p2), markdown=True), ""]
    if fe:
        s = fe["settings"]
        lines += ["## Frontend: OpenAI /v1/completions (SSE) vs gRPC straight to router_bls", "",
                  f"Settings: {s.get('prompt_tokens')} prompt tokens, {s.get('output_tokens')} output tokens, "
                  f"{s.get('duration')} s per round, {s.get('repeats')} rounds per target and level (order "
                  f"alternating), {s.get('procs')} load processes. Medians, spread in brackets.", "",
                  format_table(closed_loop_header("grpc", "frontend"), closed_loop_rows(fe, "grpc", "frontend"),
                               markdown=True), "", f"Command: `{fe.get('command', '')}`", ""]
    text = "\n".join(lines)
    (out / "results.md").write_text(text)
    return text


def device_name() -> str:
    """The GPU's name as nvidia-smi prints it (e.g. 'NVIDIA H200'), or 'CPU' where there is none."""
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=20, check=True).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return "CPU"
    names = [n.strip() for n in names if n.strip()]
    return f"{len(names)} x {names[0]}" if len(names) > 1 else (names[0] if names else "CPU")


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


# --------------------------------------------------------------------------- CLI


def _levels(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--out", type=Path, default=DEFAULT_OUT)
    common.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    common.add_argument("--duration", type=float, default=10.0, help="seconds per round")
    common.add_argument("--repeats", type=int, default=3)
    common.add_argument("--timeout-s", type=float, default=120.0)
    loop = argparse.ArgumentParser(add_help=False)
    loop.add_argument("--levels", type=_levels, default=[1, 16, 64, 256])
    loop.add_argument("--prompt-tokens", type=int, default=256)
    loop.add_argument("--output-tokens", type=int, default=128)
    loop.add_argument("--procs", type=int, default=8, help="load processes")
    p1 = sub.add_parser("p1", parents=[common, loop], help="router_bls vs vllm_backend")
    p1.add_argument("--url", default="127.0.0.1:8001")
    p1.add_argument("--http-url", default="127.0.0.1:8000",
                    help="where to read router_bls's config (is routing_policy accepted?)")
    p1.add_argument("--metrics-url", default="http://127.0.0.1:8002/metrics")
    peer = sub.add_parser("peer", parents=[common, loop], help="plain vllm serve (OpenAI API)")
    peer.add_argument("--openai-url", default="http://127.0.0.1:8100")
    peer.add_argument("--model", default=str(DEFAULT_TOKENIZER), help="the served model name")
    p2 = sub.add_parser("p2", parents=[common], help="routing policies under the hybrid mix")
    p2.add_argument("--url", default="127.0.0.1:8001")
    p2.add_argument("--http-url", default="127.0.0.1:8000")
    p2.add_argument("--metrics-url", default="http://127.0.0.1:8002/metrics")
    p2.add_argument("--qps", type=float, default=60.0)
    p2.add_argument("--policies", type=lambda s: s.split(","), default=["hybrid", "round_robin", "vllm_only",
                                                                         "trtllm_only"])
    p2.add_argument("--max-in-flight", type=int, default=512)
    fe = sub.add_parser("frontend", parents=[common, loop], help="the OpenAI frontend vs gRPC to router_bls")
    fe.add_argument("--url", default="127.0.0.1:8001")
    fe.add_argument("--openai-url", default="http://127.0.0.1:9000")
    fe.add_argument("--model", default="tiny-llama", help="the served model name")
    rep = sub.add_parser("report", help="results.md from the JSON files")
    rep.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.cmd == "report":
        print(report(args.out))
        return 0
    t0 = time.monotonic()
    if args.cmd == "p1":
        pin = router_policy_override(args.http_url)
        if not pin:
            print("p1: router_bls refuses the routing_policy parameter (policy_override is off): its "
                  "requests go where the hybrid policy sends them, maybe not to vllm_backend", file=sys.stderr)
        data = closed_loop_suite(p1_targets(args.url, pin), args)
        data["router_pinned_to_vllm_backend"] = pin
    elif args.cmd == "frontend":
        data = closed_loop_suite([Target("grpc", "triton", args.url, "router_bls", "router"),
                                  Target("frontend", "openai", args.openai_url, args.model)], args)
    elif args.cmd == "peer":
        data = closed_loop_suite([Target("vllm serve", "openai", args.openai_url, args.model)], args)
    else:
        data = p2_suite(args)
    data["wall_s"] = time.monotonic() - t0
    data["device"] = device_name()
    data["command"] = " ".join(["python -m loadtests.gpu_bench", *(argv if argv is not None else sys.argv[1:])])
    (args.out / f"{args.cmd}.json").write_text(json.dumps(data, indent=1))
    print(report(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
