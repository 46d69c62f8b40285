"""One attempt of a request on one engine: the BLS stream loop, detokenizing, stop words,
cancel checks, and the responses to the client (no Triton imports: the Triton side is a
``Transport``, injected by ``hybrid_llm.triton.router_model``; unit tests inject fakes)."""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

import numpy as np

from hybrid_llm.contracts import router as router_contract
from hybrid_llm.contracts import trtllm, vllm
from hybrid_llm.contracts.spec import CancelCheck, check_interval_s
from hybrid_llm.router.config import RouterConfig
from hybrid_llm.router.detok import IncrementalDetokenizer
from hybrid_llm.router.health import Health
from hybrid_llm.router.job import RouterJob, engine_request, find_stop
from hybrid_llm.router.policy import TRTLLM, Decision


class EngineError(RuntimeError):
    """An engine answered with an error (code: a Triton error code name)."""

    def __init__(self, message: str, code: str = "INTERNAL") -> None:
        super().__init__(message)
        self.code = code


class Transport(Protocol):
    """What the router needs from Triton."""

    def stream(self, model: str, inputs: Mapping[str, np.ndarray], request_id: str,
               outputs: Sequence[str]) -> Iterator[dict[str, np.ndarray]]:
        """Yield each engine response's outputs; raise EngineError on an error response."""

    def send(self, sender: Any, outputs: Mapping[str, np.ndarray] | None, final: bool) -> None:
        """Send a response to the client (outputs None: only the FINAL flag)."""

    def send_error(self, sender: Any, message: str, code: str) -> None:
        """End the client's stream with an error."""

    def is_cancelled(self, sender: Any) -> bool:
        """Has the client cancelled or gone away?"""


@dataclass
class Pending:
    """A dispatched or queued request and where its responses go."""

    job: RouterJob
    sender: Any
    decision: Decision
    arrived: float
    # ``ended``: the stream got its FINAL (or error); later responses are dropped.
    # ``current``: the engine whose attempt may still answer; an attempt that is no longer
    # current (its engine died and the request moved on) is dropped the same way.
    # ``released``: engines whose slot was already given back.
    ended: bool = False
    current: str | None = None
    sent: bool = False  # something reached the client: failing over would duplicate it
    failed_over: bool = False
    released: set = field(default_factory=set)
    emitted: int = 0
    # When the current attempt last heard from its engine (its start, or a response), and
    # the engines on which the quiet-attempt watcher stopped the request (client gone).
    last_heard: float = 0.0
    stopped_on: set = field(default_factory=set)
    # A stop request (input ``stop``) named this request: it ends as if its client cancelled.
    stop_asked: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def cancel_seen(self) -> bool:
        """True once the watcher found the client gone (and stopped the engine request)."""
        return bool(self.stopped_on)

    def stale(self, engine: str) -> bool:
        """True when an attempt on ``engine`` may no longer answer the client."""
        return self.ended or self.current != engine


class Relay:
    """Streams attempts and answers clients; knows which attempts are streaming now."""

    def __init__(self, cfg: RouterConfig, transport: Transport, tokenizer: Any, health: Health, metrics: Any,
                 clock: Callable[[], float], log: Callable[[str], None], end_id: int) -> None:
        self.cfg = cfg
        self.transport = transport
        self.tokenizer = tokenizer
        self.health = health
        self.metrics = metrics
        self.clock = clock
        self.log = log
        self.end_id = end_id
        self._live: dict[tuple[int, str], Pending] = {}  # (id(pending), engine) -> pending, streaming
        self._live_lock = threading.Lock()

    def live(self, engine: str | None = None) -> list[Pending]:
        """The requests streaming now (on ``engine``, or on any)."""
        with self._live_lock:
            return [p for (_, e), p in self._live.items() if engine is None or e == engine]

    def serve(self, p: Pending, engine: str, allow_failover: bool = True) -> str:
        """Stream one attempt; returns 'done', 'cancelled', 'error', 'failover' or 'abandoned'."""
        with p.lock:
            if p.ended:
                return "abandoned"
            p.current = engine
        try:
            return self._attempt(p, engine, allow_failover)
        finally:
            with self._live_lock:
                self._live.pop((id(p), engine), None)

    def _attempt(self, p: Pending, engine: str, allow_failover: bool) -> str:
        job, st = p.job, self.health.engines[engine]
        model = self.cfg.model_name(engine)
        if p.cancel_seen or self._left_while_queued(p):
            self.metrics.cancelled(engine)
            self.send(p, engine, None, final=True)
            return "cancelled"
        if not st.breaker.allow() or not st.ready:
            return "failover" if allow_failover and self.health.other_up(engine) else self.fail(
                p, engine, f"engine {model} is unavailable (circuit open or not ready)", "UNAVAILABLE")
        request_id = attempt_id(job, engine)
        inputs = engine_request(job, engine, self.end_id, stream=self.cfg.decoupled)
        if engine == TRTLLM:
            outputs, detok = trtllm.OUTPUTS, IncrementalDetokenizer(self.tokenizer)
        else:
            outputs, detok = vllm.OUTPUTS, None
        t_start = self.clock()
        extras = Extras(job.return_log_probs, job.return_perf_metrics,
                        arrival_ns=time.time_ns() - int((self.clock() - p.arrived) * 1e9), scheduled_ns=time.time_ns())
        full = ""  # text generated so far (after any stop-word cut)
        emitted = 0  # characters already sent to the client
        n_out = 0
        first = None
        stopped = False
        interval, next_send = self.cfg.stream_interval_ms / 1000.0, 0.0
        cancelled = CancelCheck(lambda: self.client_gone(p), self.cancel_interval_s)
        p.last_heard = self.clock()
        with self._live_lock:
            self._live[(id(p), engine)] = p
        try:
            for out in self.transport.stream(model, inputs, request_id, outputs):
                if p.stale(engine):
                    return "abandoned"  # the router ended it or moved it: the engine died
                p.last_heard = self.clock()
                if p.cancel_seen or cancelled():
                    return self._cancelled(p, engine, model, request_id)
                extras.absorb(out)
                if detok is not None:
                    ids = out["output_ids"].reshape(-1).tolist()
                    n_out += len(ids)
                    piece = detok.push(ids)
                else:
                    piece = b"".join(out["text_output"].reshape(-1).tolist()).decode("utf-8")
                    if "num_output_tokens" in out:
                        n_out += int(out["num_output_tokens"].reshape(-1)[0])
                if not piece:
                    continue
                extras.last_ns = time.time_ns()
                extras.first_ns = extras.first_ns or extras.last_ns
                if first is None:
                    first = self.clock()
                    st.ttft.add((first - t_start) * 1000.0)
                    self.metrics.ttft(engine, first - p.arrived)
                full += piece
                if job.stop_words:
                    cut = find_stop(full, job.stop_words, max(emitted - max(map(len, job.stop_words)), 0))
                    if cut != -1:
                        full = full[:cut]
                        self.stop_engine(engine, model, request_id)
                        stopped = True
                if job.stream:
                    hold = 0 if stopped or not job.stop_words else _stop_holdback(full, job.stop_words)
                    delta = full[emitted:len(full) - hold]
                    # The first text goes at once (TTFT); later text at most every
                    # stream_interval_ms (each response is an IPC round trip), the rest with FINAL.
                    now = self.clock() if interval else 0.0
                    if delta and (emitted == 0 or now >= next_send):
                        if not self.send(p, engine, self._outputs(job, delta, engine, None, extras), final=False):
                            return "abandoned"
                        emitted += len(delta)
                        p.emitted = emitted
                        next_send = now + interval
                if stopped:
                    break
        except EngineError as exc:
            if p.stale(engine):
                return "abandoned"
            if p.cancel_seen:  # the engine ended the request because the router stopped it
                return self._cancelled(p, engine, model, request_id)
            client_error = exc.code == "INVALID_ARG"
            st.breaker.record(client_error)
            if first is None and allow_failover and not client_error and self.health.other_up(engine):
                return "failover"
            where = "before the first token" if first is None else f"after {emitted} characters were streamed"
            return self.fail(p, engine, f"engine {model} failed {where}: {exc}",
                              "INVALID_ARG" if client_error else ("UNAVAILABLE" if first is None else "INTERNAL"))
        if p.cancel_seen and not stopped:  # the engine ended the request because the router stopped it
            return self._cancelled(p, engine, model, request_id)
        if detok is not None and not stopped:
            full += detok.flush()
        t_end = self.clock()
        st.breaker.record(True)
        self.metrics.finished(engine, n_out, t_end - p.arrived,
                              None if first is None or n_out < 2 else (t_end - first) / (n_out - 1))
        if job.stream:
            rest = full[emitted:]
            sent = self.send(p, engine, self._outputs(job, rest, engine, n_out, extras), final=True)
        else:
            text = full if job.exclude_input_in_output else job.prompt + full
            sent = self.send(p, engine, self._outputs(job, text, engine, n_out, extras), final=True)
        return "done" if sent else "abandoned"

    def cancel_interval_s(self) -> float:
        """Seconds between two cancel checks of one stream: ``cancel_check_ms``, stretched so
        that the streams in flight together check at most ``cancel_checks_per_s`` times a
        second (each check is an IPC round trip, as costly as relaying a response)."""
        return check_interval_s(self.cfg.cancel_check_ms / 1000.0, len(self._live), self.cfg.cancel_checks_per_s)

    def _cancelled(self, p: Pending, engine: str, model: str, request_id: str) -> str:
        """End an attempt whose client cancelled: stop the engine request (unless the watcher did)."""
        if engine not in p.stopped_on:
            self.stop_engine(engine, model, request_id)
        self.metrics.cancelled(engine)
        self.send(p, engine, None, final=True)
        self.health.engines[engine].breaker.record(True)
        return "cancelled"

    def stop_quiet_cancelled(self, quiet_s: float, stopping: threading.Event,
                             submit: Callable[..., Any]) -> None:
        """One watcher round: stop the engine request of each quiet attempt whose client left."""
        now = self.clock()
        with self._live_lock:
            quiet = [(e, p) for (_, e), p in self._live.items() if not p.cancel_seen and now - p.last_heard >= quiet_s]
        for engine, p in quiet:
            if p.stale(engine) or not self.client_gone(p):
                continue
            with p.lock:
                if p.stale(engine) or p.cancel_seen:
                    continue
                p.stopped_on.add(engine)
            if not stopping.is_set():
                submit(self.stop_engine, engine, self.cfg.model_name(engine), attempt_id(p.job, engine))

    def _left_while_queued(self, p: Pending) -> bool:
        """True when the client cancelled while the request waited in the router queue.

        Checked once before dispatch, and only for a request that waited at least
        ``cancel_check_ms`` (each check is an IPC round trip): under overload, clients
        that give up while queued must not cost the engine a prefill.
        """
        if p.stop_asked:
            return True
        waited_ms = (self.clock() - p.arrived) * 1000.0
        return waited_ms >= self.cfg.cancel_check_ms and self.client_gone(p)

    def client_gone(self, p: Pending) -> bool:
        """Ask Triton whether ``p``'s client left (or a stop request named it); never once its
        stream has ended (then False).

        Python backend r24.10 frees a response factory when its FINAL goes out, and a
        cancellation query after that makes tritonserver read freed memory: seen on the GPU
        machine as a SIGSEGV in TRITONBACKEND_ResponseFactoryIsCancelled at 256 streams,
        where the quiet-attempt watcher's query raced the relay's FINAL. Queries and sends of
        one request hold its lock, so neither passes the other.
        """
        with p.lock:
            return not p.ended and (p.stop_asked or self.transport.is_cancelled(p.sender))

    def send(self, p: Pending, engine: str, outputs: Mapping[str, np.ndarray] | None, final: bool) -> bool:
        """Send one response of the attempt on ``engine`` unless that attempt was taken off."""
        with p.lock:
            if p.stale(engine):
                return False
            self.transport.send(p.sender, outputs, final=final)
            p.sent = True
            if final:
                p.ended = True
            return True

    def fail(self, p: Pending, engine: str, message: str, code: str, any_attempt: bool = False) -> str:
        """End the stream with an error (only from its current attempt, unless ``any_attempt``)."""
        with p.lock:
            if p.ended or (not any_attempt and p.current != engine):
                return "abandoned"
            p.ended = True
            self.metrics.errored(engine, code)  # counted even if the client is gone
            self.transport.send_error(p.sender, message, code)
        return "error"

    def stop_engine(self, engine: str, model: str, request_id: str) -> None:
        """Ask the engine to stop generating for a request (tensorrtllm ``stop`` semantics)."""
        inputs = trtllm.stop_tensors() if engine == TRTLLM else vllm.stop_tensors()
        try:
            for _ in self.transport.stream(model, inputs, request_id, ()):
                pass
        except Exception as exc:  # noqa: BLE001 - the request may have finished already
            self.log(f"stop of {request_id} on {model}: {exc!r}")

    def _outputs(self, job: RouterJob, text: str, engine: str, n_out: int | None,
                 extras: "Extras") -> dict[str, np.ndarray]:
        return router_contract.pack_response(
            text, engine, len(job.prompt_ids) if job.return_num_input_tokens else None,
            n_out if job.return_num_output_tokens else None,
            extras.take_log_probs() if job.return_log_probs else None, extras.cum,
            extras.perf() if job.return_perf_metrics else None)


@dataclass
class Extras:
    """What one attempt relays besides text: the sampled tokens' log probs (from either
    engine's outputs) and the perf metrics (router-side times, trtllm's KV-block counts)."""

    log_probs_wanted: bool
    perf_wanted: bool
    arrival_ns: int = 0
    scheduled_ns: int = 0
    first_ns: int = 0
    last_ns: int = 0
    log_probs: list[float] = field(default_factory=list)
    cum: float = 0.0
    sent: int = 0
    kv: dict[str, int] = field(default_factory=dict)

    def absorb(self, out: Mapping[str, np.ndarray]) -> None:
        """Fold one engine response in."""
        if self.log_probs_wanted:
            if "output_log_probs" in out:  # trtllm: one value per new token
                self.log_probs.extend(float(x) for x in out["output_log_probs"].reshape(-1))
            elif "logprobs" in out:  # vllm_backend: JSON, one {token: {logprob, ...}} per new token
                for raw in out["logprobs"].reshape(-1)[:1]:
                    for position in json.loads(raw.decode() if isinstance(raw, bytes) else str(raw)) or []:
                        self.log_probs.append(float(next(iter(position.values()))["logprob"]))
            for name in ("cum_log_probs", "cumulative_logprob"):
                if name in out and out[name].size and math.isfinite(float(out[name].reshape(-1)[0])):
                    self.cum = float(out[name].reshape(-1)[0])
        if self.perf_wanted:
            for name in ("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks"):
                if name in out and out[name].size:
                    self.kv[name] = int(out[name].reshape(-1)[0])

    def take_log_probs(self) -> list[float]:
        """The log probs not sent yet."""
        new, self.sent = self.log_probs[self.sent:], len(self.log_probs)
        return new

    def perf(self) -> dict[str, float]:
        """The perf-metric outputs: times are the router's (wall clock, ns); KV blocks the engine's
        where it reports them (trtllm), else 0; no speculative decoding here (0)."""
        now = time.time_ns()
        first = self.first_ns or now
        return {"kv_cache_alloc_new_blocks": self.kv.get("kv_cache_alloc_new_blocks", 0),
                "kv_cache_reused_blocks": self.kv.get("kv_cache_reused_blocks", 0),
                "kv_cache_alloc_total_blocks": self.kv.get("kv_cache_alloc_total_blocks", 0),
                "arrival_time_ns": self.arrival_ns, "first_scheduled_time_ns": max(self.scheduled_ns, self.arrival_ns),
                "first_token_time_ns": max(first, self.scheduled_ns), "last_token_time_ns": max(self.last_ns or now, first,
                                                                                              self.scheduled_ns),
                "acceptance_rate": 0.0, "total_accepted_draft_tokens": 0, "total_draft_tokens": 0}


def attempt_id(job: RouterJob, engine: str) -> str:
    """The request id of a job's attempt on ``engine`` (what a ``stop`` request names)."""
    return f"{job.request_id}-{engine}"


def _stop_holdback(text: str, stop_words: Sequence[str]) -> int:
    """Characters to hold back because they could be the start of a stop word."""
    hold = 0
    for word in stop_words:
        for k in range(min(len(word) - 1, len(text)), 0, -1):
            if text.endswith(word[:k]):
                hold = max(hold, k)
                break
    return hold
