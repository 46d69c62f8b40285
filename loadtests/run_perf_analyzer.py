"""Run perf_analyzer (gRPC streaming) against router_bls or an engine, and summarize its export.

perf_analyzer is the binary from the tritonclient 2.51.0 wheel that setup.sh lays
out in ``.runtime/perf_analyzer`` (STACK.md: PyPI's perf-analyzer needs a newer
glibc). It needs ``LD_LIBRARY_PATH=.runtime/perf_analyzer/lib:<site-packages>/nvidia_pytriton.libs``.

Usage (a server already running)::

    .venv/bin/python -m loadtests.run_perf_analyzer --url 127.0.0.1:8001 --model router_bls \\
        --concurrency 1:4:1 --measurement-interval 10000
    .venv/bin/python -m loadtests.run_perf_analyzer --url 127.0.0.1:8001 --model vllm_backend --request-rate 2:8:2

Writes inputs.json, perf.csv (``-f``), profile_export.json (every request's response
timestamps), perf_analyzer.log and summary.json (TTFT / e2e percentiles per
experiment, computed from the export) into loadtests/results/<run>/.

genai-perf 0.0.16 lives in its own venv (``.runtime/genai-perf``, from
requirements/genai-perf.txt: it needs numpy 2, the server's stub numpy < 2) and drives
the same 2.51 perf_analyzer binary. In 0.0.16 the Triton gRPC service is
``--endpoint-type kserve`` (older releases: ``--service-kind triton``); with
``--backend tensorrtllm`` it speaks the TensorRT-LLM contract that router_bls serves.
``--genai-perf`` runs it and prints TTFT, inter-token latency and throughput from its
export.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from hybrid_llm.contracts.router import RETURN_FLAGS

from .perf_inputs import write_inputs
from .runner import percentile
from .workload import DEFAULT_TOKENIZER, MIXES

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
PA_DIR = ROOT / ".runtime" / "perf_analyzer"
PA_BIN = PA_DIR / "bin" / "perf_analyzer"
RESULTS = ROOT / "loadtests" / "results"
GP_BIN = ROOT / ".runtime" / "genai-perf" / "bin" / "genai-perf"


def perf_analyzer_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the 2.51 perf_analyzer binary needs (its libb64/libcudart symlinks)."""
    env = dict(os.environ if base is None else base)
    site = Path(sysconfig.get_paths(vars={"base": str(VENV), "platbase": str(VENV)})["purelib"])
    libs = [str(PA_DIR / "lib"), str(site / "nvidia_pytriton.libs")]
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(libs)
    return env


#: Runs of one measurement, at most, when perf_analyzer leaves its profile export empty.
EXPORT_ATTEMPTS = 3


def empty_exports(root: Path) -> list[Path]:
    """The zero-length ``profile_export.json`` files under ``root``."""
    return [p for p in Path(root).glob("**/profile_export.json") if p.stat().st_size == 0]


def run_keeping_export(cmd: list[str], cwd: Path, env: dict[str, str], log_path: Path, export_root: Path,
                       timeout_s: float, attempts: int = EXPORT_ATTEMPTS) -> int:
    """Run ``cmd`` (perf_analyzer or genai-perf), output to ``log_path``; run it again while it
    left an empty profile export under ``export_root``; returns the last exit code.

    perf_analyzer 2.51 reads an output tensor that a response leaves out, or sends with no
    elements (the router's FINAL response: no new log probs), from memory it does not own;
    when those bytes read as a float NaN or infinity, its JSON writer stops before its first
    flush and the export is empty (genai-perf then fails parsing it). Asking for every
    optional output (perf_inputs.ask_for_every_output) leaves one such read per request."""
    code = 0
    with open(log_path, "w") as log:
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                log.write(f"\n[run_perf_analyzer] attempt {attempt} of {attempts}: the profile export of the "
                          "previous one was empty (perf_analyzer 2.51 reads a left-out or empty output as "
                          "garbage; a NaN there stops its JSON writer)\n")
                log.flush()
            code = subprocess.run(cmd, cwd=str(cwd), env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout_s).returncode
            empty = empty_exports(export_root)
            if not empty:
                return code
            for path in empty:
                path.unlink()
    return code if code else 1


def perf_analyzer_command(url: str, model: str, input_data: Path, out_dir: Path,
                          concurrency: str | None = "1", request_rate: str | None = None,
                          measurement_interval_ms: int = 10000, stability_pct: float = 30.0,
                          max_trials: int = 5, binary: Path = PA_BIN,
                          extra: list[str] | None = None) -> list[str]:
    """The perf_analyzer command line for a gRPC streaming run (concurrency or request-rate sweep)."""
    cmd = [
        str(binary), "-m", model, "-u", url, "-i", "grpc", "--streaming", "--service-kind", "triton",
        "--input-data", str(input_data), "--measurement-interval", str(measurement_interval_ms),
        "--stability-percentage", str(stability_pct), "--max-trials", str(max_trials),
        "-f", str(out_dir / "perf.csv"), "--profile-export-file", str(out_dir / "profile_export.json"),
    ]
    if request_rate:
        cmd += ["--request-rate-range", request_rate]
    else:
        cmd += ["--concurrency-range", concurrency or "1"]
    return cmd + list(extra or [])


def summarize_export(path: Path) -> list[dict[str, Any]]:
    """TTFT, end-to-end latency and responses per request, per experiment, from a profile export."""
    doc = json.loads(Path(path).read_text())
    out = []
    for exp in doc.get("experiments", []):
        ttft, e2e, responses = [], [], []
        for req in exp.get("requests", []):
            stamps = req.get("response_timestamps") or []
            if not stamps:
                continue
            t0 = req["timestamp"]
            ttft.append((stamps[0] - t0) / 1e9)
            e2e.append((stamps[-1] - t0) / 1e9)
            responses.append(len(stamps))
        bounds = exp.get("window_boundaries") or []
        wall = (bounds[-1] - bounds[0]) / 1e9 if len(bounds) >= 2 else None
        out.append({
            "mode": exp.get("experiment", {}).get("mode"), "value": exp.get("experiment", {}).get("value"),
            "requests": len(e2e), "requests_per_s": (len(e2e) / wall) if wall else None,
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "e2e_p50_s": percentile(e2e, 50), "e2e_p99_s": percentile(e2e, 99),
            "responses_mean": (sum(responses) / len(responses)) if responses else None,
        })
    return out


def run_perf_analyzer(url: str, model: str, out_dir: Path, mix: str = "chat", samples: int = 32,
                      seed: int = 0, concurrency: str | None = "1", request_rate: str | None = None,
                      measurement_interval_ms: int = 10000, stability_pct: float = 30.0,
                      max_trials: int = 5, timeout_s: float = 900.0,
                      extra: list[str] | None = None) -> tuple[int, list[dict[str, Any]]]:
    """Write inputs, run perf_analyzer, summarize its export; returns (exit code, summary)."""
    if not PA_BIN.exists():
        raise FileNotFoundError(f"{PA_BIN} is missing; run build_scripts/setup.sh")
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("profile_export.json", "perf.csv", "summary.json"):
        (out_dir / stale).unlink(missing_ok=True)  # perf_analyzer refuses an existing export path
    inputs = write_inputs(out_dir / "inputs.json", model, mix, samples, seed)
    cmd = perf_analyzer_command(url, model, inputs, out_dir, concurrency, request_rate,
                                measurement_interval_ms, stability_pct, max_trials, extra=extra)
    (out_dir / "command.txt").write_text(" ".join(cmd) + "\n")
    code = run_keeping_export(cmd, ROOT, perf_analyzer_env(), out_dir / "perf_analyzer.log", out_dir, timeout_s)
    summary: list[dict[str, Any]] = []
    export = out_dir / "profile_export.json"
    if export.exists():
        summary = summarize_export(export)
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return code, summary


def genai_perf_available() -> bool:
    """True when setup.sh has installed genai-perf (``.runtime/genai-perf``)."""
    return GP_BIN.exists()


def genai_perf_command(url: str, model: str = "router_bls", out_dir: Path = RESULTS / "genai-perf",
                       concurrency: int = 1, input_tokens: int = 128, output_tokens: int = 64,
                       num_prompts: int = 50, measurement_interval_ms: int = 10000,
                       endpoint_type: str = "kserve", request_count: int | None = None) -> list[str]:
    """The genai-perf command: router_bls through its TensorRT-LLM-compatible contract over gRPC
    (``kserve``), or the OpenAI frontend (``chat`` / ``completions``, ``url`` its http://host:port)."""
    if endpoint_type == "kserve":
        # Every optional output asked for: perf_analyzer reads a left-out one as garbage, and a NaN
        # among it empties the export (perf_inputs.ask_for_every_output).
        target = ["--endpoint-type", "kserve", "--backend", "tensorrtllm",
                  *(a for flag in RETURN_FLAGS for a in ("--extra-inputs", f"{flag}:true"))]
    elif endpoint_type in ("chat", "completions"):
        target = ["--endpoint-type", endpoint_type]
    else:
        raise ValueError(f"endpoint_type must be kserve, chat or completions, not {endpoint_type!r}")
    window = (["--request-count", str(request_count)] if request_count
              else ["--measurement-interval", str(measurement_interval_ms)])
    return [
        str(GP_BIN), "profile", "-m", model, *target,
        "--streaming", "-u", url, "--tokenizer", str(DEFAULT_TOKENIZER), "--concurrency", str(concurrency),
        "--synthetic-input-tokens-mean", str(input_tokens), "--synthetic-input-tokens-stddev", "0",
        "--output-tokens-mean", str(output_tokens), "--num-prompts", str(num_prompts),
        *window, "--artifact-dir", str(out_dir),
    ]


def summarize_genai_perf(out_dir: Path) -> dict[str, Any]:
    """TTFT, inter-token latency, request latency (ms) and throughputs from genai-perf's export."""
    exports = sorted(Path(out_dir).glob("**/profile_export_genai_perf.json"))
    if not exports:
        raise FileNotFoundError(f"no profile_export_genai_perf.json under {out_dir}")
    doc = json.loads(exports[-1].read_text())
    out: dict[str, Any] = {}
    for key in ("time_to_first_token", "inter_token_latency", "request_latency", "output_sequence_length"):
        stats = doc.get(key) or {}
        out[key] = {k: stats.get(k) for k in ("unit", "avg", "p50", "p99")}
    for key in ("request_throughput", "output_token_throughput"):
        out[key] = (doc.get(key) or {}).get("avg")
    out["request_count"] = (doc.get("request_count") or {}).get("avg")
    return out


def run_genai_perf(url: str, out_dir: Path, model: str = "router_bls", concurrency: int = 1,
                   input_tokens: int = 128, output_tokens: int = 64, num_prompts: int = 50,
                   measurement_interval_ms: int = 10000, timeout_s: float = 900.0, endpoint_type: str = "kserve",
                   request_count: int | None = None) -> tuple[int, dict[str, Any]]:
    """Run genai-perf (the 2.51 perf_analyzer first on PATH); returns (exit code, summary)."""
    if not genai_perf_available():
        raise FileNotFoundError(f"{GP_BIN} is missing; run build_scripts/setup.sh")
    env = perf_analyzer_env()
    env["PATH"] = f"{PA_BIN.parent}:{GP_BIN.parent}:{env.get('PATH', '')}"
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = genai_perf_command(url, model, out_dir / "artifacts", concurrency, input_tokens, output_tokens,
                             num_prompts, measurement_interval_ms, endpoint_type, request_count)
    (out_dir / "command.txt").write_text(" ".join(cmd) + "\n")
    code = run_keeping_export(cmd, out_dir, env, out_dir / "genai_perf.log", out_dir / "artifacts", timeout_s)
    summary: dict[str, Any] = {}
    if code == 0:
        summary = summarize_genai_perf(out_dir / "artifacts")
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return code, summary


def _fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description="perf_analyzer gRPC streaming runs against router_bls or an engine.")
    p.add_argument("--url", required=True, help="Triton gRPC endpoint, e.g. 127.0.0.1:8001")
    p.add_argument("--model", default="router_bls", help="router_bls, vllm_backend or trtllm")
    p.add_argument("--mix", default="chat", choices=sorted(MIXES))
    p.add_argument("--samples", type=int, default=32, help="distinct requests in the input data")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--concurrency", default="1", help="perf_analyzer --concurrency-range start:end:step")
    p.add_argument("--request-rate", help="perf_analyzer --request-rate-range start:end:step (instead of concurrency)")
    p.add_argument("--measurement-interval", type=int, default=10000, help="ms per measurement window")
    p.add_argument("--stability", type=float, default=30.0, help="perf_analyzer -s (use >= 30 on 2 cores)")
    p.add_argument("--max-trials", type=int, default=5)
    p.add_argument("--run", help="results folder name (default: perf-<model>-<timestamp>)")
    p.add_argument("--genai-perf", action="store_true",
                   help="run genai-perf instead (--concurrency N, synthetic 128-token prompts, 64 output tokens)")
    args, extra = p.parse_known_args(argv)
    out = RESULTS / (args.run or time.strftime(f"perf-{args.model}-%Y%m%d-%H%M%S"))
    if args.genai_perf:
        try:
            code, gp = run_genai_perf(args.url, out, args.model, concurrency=int(args.concurrency.split(":")[0]),
                                      measurement_interval_ms=args.measurement_interval)
        except (ValueError, OSError) as exc:
            print(f"run_perf_analyzer: {exc}", file=sys.stderr)
            return 2
        if gp:
            ttft, itl = gp["time_to_first_token"], gp["inter_token_latency"]
            print(f"genai-perf: {gp['request_throughput'] or 0:.2f} req/s, {gp['output_token_throughput'] or 0:.0f} "
                  f"tok/s, TTFT p50 {ttft['p50']:.1f} ms p99 {ttft['p99']:.1f} ms, "
                  f"inter-token p50 {itl['p50']:.2f} ms")
        print(f"[run_perf_analyzer] genai-perf exit code {code}; files in {out}")
        return code
    try:
        code, summary = run_perf_analyzer(args.url, args.model, out, args.mix, args.samples, args.seed,
                                          args.concurrency, args.request_rate, args.measurement_interval,
                                          args.stability, args.max_trials, extra=extra)
    except (ValueError, OSError) as exc:
        print(f"run_perf_analyzer: {exc}", file=sys.stderr)
        return 2
    for row in summary:
        print(f"{row['mode']}={row['value']}: {row['requests']} requests, "
              f"{row['requests_per_s'] or 0:.2f} req/s, TTFT p50 {_fmt_ms(row['ttft_p50_s'])} ms "
              f"p99 {_fmt_ms(row['ttft_p99_s'])} ms, e2e p50 {_fmt_ms(row['e2e_p50_s'])} ms "
              f"p99 {_fmt_ms(row['e2e_p99_s'])} ms")
    print(f"[run_perf_analyzer] exit code {code}; files in {out}")
    return code


if __name__ == "__main__":
    sys.exit(main())
