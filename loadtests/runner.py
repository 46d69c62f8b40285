"""Thread-based load generation shared by the benchmark and the overhead tool (no Locust here).

Every request goes through ``hybrid_llm.contracts`` (the one packing helper) and
``client.stream.stream_grpc``; this module only picks the contract for a model,
schedules requests (open loop: at fixed arrival offsets; closed loop: N streams
back to back) and turns ``StreamResult`` objects into flat records and summaries.

Open-loop timing: a request that starts after its scheduled arrival (all workers
busy) is charged the lag: ``ttft_from_arrival_s = lag_s + ttft_s`` is what SLA
attainment uses, so an overloaded client cannot hide queueing (coordinated omission).
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from hybrid_llm.contracts import GenerationRequest, router_tensors, trtllm_tensors, vllm_tensors
from client.stream import StreamResult, stream_grpc

from .shapes import Arrival
from .workload import SampledRequest

CONTRACTS = ("router", "vllm", "trtllm")
_MODEL_CONTRACTS = {"router_bls": "router", "vllm_backend": "vllm", "trtllm": "trtllm"}


def contract_for(model: str, override: str | None = None) -> str:
    """The tensor contract of ``model`` (router, vllm or trtllm); ``override`` wins when given."""
    if override:
        if override not in CONTRACTS:
            raise ValueError(f"contract must be one of {list(CONTRACTS)}, got {override!r}")
        return override
    try:
        return _MODEL_CONTRACTS[model]
    except KeyError:
        raise ValueError(f"no known contract for model '{model}'; name it ({list(CONTRACTS)})") from None


def pack(contract: str, request: GenerationRequest, tokenizer: Any = None) -> dict[str, np.ndarray]:
    """Tensors for one request in ``contract`` (trtllm needs the tokenizer: it takes token ids)."""
    if contract == "router":
        return router_tensors(request)
    if contract == "vllm":
        return vllm_tensors(request)
    if contract == "trtllm":
        if tokenizer is None:
            raise ValueError("the trtllm contract takes token ids: pass the served model's tokenizer")
        ids = tokenizer.encode(request.prompt, add_special_tokens=True)
        return trtllm_tensors(ids, request, end_id=getattr(tokenizer, "eos_token_id", None))
    raise ValueError(f"contract must be one of {list(CONTRACTS)}, got {contract!r}")


def output_tokens(result: StreamResult) -> int:
    """Output tokens of a stream (counted by the server when it says, else streamed ids)."""
    if result.num_output_tokens is not None:
        return int(result.num_output_tokens)
    return len(result.token_ids)


@dataclass
class RequestRecord:
    """One finished request, flat enough for JSONL and tables."""

    index: int
    stage: int
    klass: str
    priority: int
    prompt_tokens: int
    max_tokens: int
    latency_sla_ms: float | None
    scheduled_s: float  # arrival offset in the schedule (closed loop: start time)
    start_s: float  # when the stream actually started, from the run's start
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float
    output_tokens: int
    backend: str | None
    error: str | None = None
    error_code: str | None = None

    @property
    def lag_s(self) -> float:
        """How late the request started against its schedule."""
        return max(0.0, self.start_s - self.scheduled_s)

    @property
    def ttft_from_arrival_s(self) -> float | None:
        """TTFT counted from the scheduled arrival (includes client-side lag)."""
        return None if self.ttft_s is None else self.lag_s + self.ttft_s

    @property
    def end_s(self) -> float:
        """When the request finished, from the run's start."""
        return self.start_s + self.e2e_s

    @property
    def sla_met(self) -> bool | None:
        """TTFT (from arrival) within the request's SLA; None when it has no SLA."""
        if self.latency_sla_ms is None:
            return None
        ttft = self.ttft_from_arrival_s
        return self.error is None and ttft is not None and ttft * 1000.0 <= self.latency_sla_ms

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form (with the derived fields)."""
        out = asdict(self)
        out.update(lag_s=self.lag_s, ttft_from_arrival_s=self.ttft_from_arrival_s, sla_met=self.sla_met)
        return out


def send(url: str, model: str, sample: SampledRequest, contract: str, tokenizer: Any = None,
         timeout_s: float = 300.0, parameters: dict[str, Any] | None = None) -> StreamResult:
    """Stream one sampled request to ``model`` (Triton request priority = the request's class)."""
    tensors = pack(contract, sample.request, tokenizer)
    return stream_grpc(url, model, tensors, priority=sample.request.priority, timeout_s=timeout_s,
                       parameters=parameters)


def make_record(index: int, stage: int, sample: SampledRequest, scheduled_s: float, start_s: float,
                result: StreamResult) -> RequestRecord:
    """Flatten a stream result with what was asked."""
    r = sample.request
    return RequestRecord(
        index=index, stage=stage, klass=sample.klass, priority=r.priority, prompt_tokens=sample.prompt_tokens,
        max_tokens=r.max_tokens, latency_sla_ms=r.latency_sla_ms, scheduled_s=scheduled_s, start_s=start_s,
        ttft_s=result.ttft_s, tpot_s=result.tpot_s, e2e_s=result.e2e_s, output_tokens=output_tokens(result),
        backend=result.backend, error=result.error, error_code=result.error_code)


def run_open_loop(url: str, model: str, schedule: Sequence[tuple[Arrival, SampledRequest]],
                  contract: str, tokenizer: Any = None, max_in_flight: int = 128,
                  timeout_s: float = 300.0,
                  on_done: Callable[[RequestRecord], None] | None = None,
                  parameters: dict[str, Any] | None = None) -> list[RequestRecord]:
    """Start each request at its arrival offset (threads), wait for all; records in schedule order."""
    records: list[RequestRecord | None] = [None] * len(schedule)
    lock = threading.Lock()
    t0 = time.monotonic()

    def work(i: int, arrival: Arrival, sample: SampledRequest) -> None:
        start = time.monotonic() - t0
        try:
            result = send(url, model, sample, contract, tokenizer, timeout_s, parameters)
        except Exception as exc:  # noqa: BLE001 - a client-side failure is a failed request, not a crash
            result = StreamResult(error=f"client error: {exc!r}", error_code="CLIENT",
                                  e2e_s=time.monotonic() - t0 - start)
        rec = make_record(i, arrival.stage, sample, arrival.offset_s, start, result)
        with lock:
            records[i] = rec
        if on_done is not None:
            on_done(rec)

    with ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="openloop") as pool:
        for i, (arrival, sample) in enumerate(schedule):
            delay = arrival.offset_s - (time.monotonic() - t0)
            if delay > 0:
                time.sleep(delay)
            pool.submit(work, i, arrival, sample)
    return [r for r in records if r is not None]


def run_closed_loop(url: str, model: str, next_sample: Callable[[], SampledRequest], contract: str,
                    concurrency: int, duration_s: float, tokenizer: Any = None,
                    timeout_s: float = 300.0,
                    send_fn: Callable[[SampledRequest], StreamResult] | None = None,
                    on_result: Callable[[RequestRecord, StreamResult], None] | None = None,
                    ) -> tuple[list[RequestRecord], float]:
    """``concurrency`` streams back to back for ``duration_s``; returns records and the wall time.

    Requests started before the deadline run to completion; the wall time spans from
    the start to the last completion, so throughput is tokens / wall. ``send_fn``
    replaces the gRPC send to ``url``/``model`` (another protocol); ``on_result`` sees
    each record with its stream, under the loop's lock.
    """
    records: list[RequestRecord] = []
    lock = threading.Lock()
    t0 = time.monotonic()
    deadline = t0 + duration_s
    counter = itertools.count()

    def loop() -> None:
        while time.monotonic() < deadline:
            with lock:
                i, sample = next(counter), next_sample()
            start = time.monotonic() - t0
            try:
                result = (send_fn(sample) if send_fn is not None
                          else send(url, model, sample, contract, tokenizer, timeout_s))
            except Exception as exc:  # noqa: BLE001 - count it as a failed request
                result = StreamResult(error=f"client error: {exc!r}", error_code="CLIENT")
            rec = make_record(i, 0, sample, start, start, result)
            with lock:
                records.append(rec)
                if on_result is not None:
                    on_result(rec, result)

    threads = [threading.Thread(target=loop, name=f"closed-{k}", daemon=True) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(records, key=lambda r: r.index), time.monotonic() - t0


def percentile(values: Iterable[float | None], q: float) -> float | None:
    """The q-th percentile (0-100, linear interpolation) of the non-None values; None if empty."""
    data = [float(v) for v in values if v is not None and not math.isnan(v)]
    if not data:
        return None
    return float(np.percentile(np.array(data), q))


@dataclass
class Summary:
    """Aggregate figures of a set of requests."""

    requests: int
    errors: int
    output_tokens: int
    wall_s: float
    tps: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p99_s: float | None
    sla_requests: int
    sla_met: int

    @property
    def sla_attainment(self) -> float | None:
        """Share of SLA-bound requests whose TTFT met the SLA (None without such requests)."""
        return None if self.sla_requests == 0 else self.sla_met / self.sla_requests

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        out = asdict(self)
        out["sla_attainment"] = self.sla_attainment
        return out


def summarize(records: Sequence[RequestRecord], wall_s: float | None = None,
              from_arrival: bool = True) -> Summary:
    """TPS, TTFT/TPOT/e2e percentiles, errors and SLA attainment of ``records``.

    ``wall_s`` defaults to first scheduled arrival -> last completion. TTFT is counted
    from the scheduled arrival when ``from_arrival`` (open loop), else from the stream
    start. Percentiles cover successful requests only; errors are counted apart.
    """
    ok = [r for r in records if r.error is None]
    tokens = sum(r.output_tokens for r in ok)
    if wall_s is None:
        wall_s = (max(r.end_s for r in records) - min(r.scheduled_s for r in records)) if records else 0.0
    ttfts = [r.ttft_from_arrival_s if from_arrival else r.ttft_s for r in ok]
    sla = [r for r in records if r.latency_sla_ms is not None]
    return Summary(
        requests=len(records), errors=len(records) - len(ok), output_tokens=tokens, wall_s=wall_s,
        tps=tokens / wall_s if wall_s > 0 else 0.0,
        ttft_p50_s=percentile(ttfts, 50), ttft_p99_s=percentile(ttfts, 99),
        tpot_p50_s=percentile((r.tpot_s for r in ok), 50), tpot_p99_s=percentile((r.tpot_s for r in ok), 99),
        e2e_p50_s=percentile((r.e2e_s for r in ok), 50), e2e_p99_s=percentile((r.e2e_s for r in ok), 99),
        sla_requests=len(sla), sla_met=sum(1 for r in sla if r.sla_met),
    )


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool = False) -> str:
    """A fixed-width (or Markdown) table."""
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), fmt.format(*("-" * w for w in widths))] + [fmt.format(*r) for r in rows])
