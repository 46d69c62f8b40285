"""The router's control flow: admit, decide, queue, dispatch, stream, fail over.

No Triton imports: the Triton side is a ``Transport`` (BLS streams, responses,
cancellation checks, model readiness) and a ``RouterMetrics`` (see metrics.py), both
injected by ``router_bls/1/model.py``; unit tests inject fakes.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

import numpy as np

from . import prom
from .breaker import BreakerState, CircuitBreaker
from .config import RouterConfig
from .contracts import ENGINE_READY, CancelCheck
from .detok import IncrementalDetokenizer
from .dispatch import Dispatcher, Ticket
from .latency import LatencyWindow
from .policy import (ENGINE_KEYS, TRTLLM, VLLM, Decision, EngineStats, RequestFeatures, RoutingPolicy,
                     create_policy, engine_weight, other)
from .requests import (
    TRTLLM_OUTPUTS, VLLM_OUTPUTS, RouterJob, find_stop, trtllm_inputs, trtllm_stop_inputs,
    vllm_inputs, vllm_stop_inputs,
)


QUIET_MIN_S = 0.5  # the watcher's period: streaming attempts hear from their engine more often


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


class NullMetrics:
    """Router metrics that record nothing (unit tests, or metrics disabled)."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


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
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def cancel_seen(self) -> bool:
        """True once the watcher found the client gone (and stopped the engine request)."""
        return bool(self.stopped_on)

    def stale(self, engine: str) -> bool:
        """True when an attempt on ``engine`` may no longer answer the client."""
        return self.ended or self.current != engine


class EngineState:
    """Health and load signals of one engine."""

    def __init__(self, cfg: RouterConfig, clock: Callable[[], float]) -> None:
        self.breaker = CircuitBreaker(cfg, clock)
        self.ttft = LatencyWindow(cfg.latency_window_s, clock=clock)
        self.kv_usage = 0.0
        self.ready = True  # Triton says the model is ready and its engine reports itself up
        self.engine_up = True  # the engine model's hybrid_engine_ready gauge (last scrape)


class RouterService:
    """Everything between ``execute`` and the engines."""

    def __init__(self, cfg: RouterConfig, transport: Transport, tokenizer: Any,
                 metrics: Any = None, clock: Callable[[], float] = time.monotonic,
                 log: Callable[[str], None] = lambda msg: None) -> None:
        self.cfg = cfg
        self.transport = transport
        self.tokenizer = tokenizer
        self.metrics = metrics or NullMetrics()
        self.clock = clock
        self.log = log
        self.policy = create_policy(cfg)
        # Per-request policies (policy_override): one object each, made on first use.
        self._policies: dict[str, RoutingPolicy] = {cfg.policy: self.policy}
        self.engines = {e: EngineState(cfg, clock) for e in ENGINE_KEYS}
        eos = getattr(tokenizer, "eos_token_id", None)
        self.end_id = cfg.end_id if cfg.end_id >= 0 else int(eos if eos is not None else 2)
        self.dispatcher = Dispatcher(
            cfg,
            kv_usage=lambda e: self.engines[e].kv_usage,
            p95_ms=lambda e: self.engines[e].ttft.p95(),
            on_release=self._on_release,
            clock=clock,
        )
        # Generous: a reader stuck in a BLS iterator on a dead engine (Triton 2.51 never
        # ends it) keeps its thread after its slot was released (``end_streams_on``).
        self.pool = ThreadPoolExecutor(max_workers=4 * (cfg.trtllm_capacity + cfg.vllm_capacity) + 64,
                                       thread_name_prefix="router-stream")
        self._stop = threading.Event()
        self._serving = threading.Event()
        self._nvml: Any = None  # None: not tried yet; False: unavailable
        self._poller: threading.Thread | None = None
        self._watcher: threading.Thread | None = None
        # An attempt that heard nothing from its engine this long is checked by the watcher.
        self.quiet_s = max(cfg.cancel_check_ms / 1000.0, QUIET_MIN_S)
        self._live: dict[tuple[int, str], Pending] = {}  # (id(pending), engine) -> pending, streaming
        self._live_lock = threading.Lock()
        self._opened_seen: dict[str, int] = {}  # breaker openings already exported

    # ---- lifecycle -------------------------------------------------------------------
    def start(self, poll: bool = True) -> None:
        """Start dispatching (and polling Triton's metrics endpoint and readiness)."""
        self.dispatcher.start()
        self._watcher = threading.Thread(target=self._watch_quiet_attempts, name="router-cancel-watch", daemon=True)
        self._watcher.start()
        if poll and self.cfg.metrics_poll_ms > 0:
            self._poller = threading.Thread(target=self._poll_loop, name="router-poller", daemon=True)
            self._poller.start()

    def serving(self) -> None:
        """The model has started serving: background polling may begin.

        Nothing talks to Triton from a background thread before the first request;
        IPC from another thread while ``initialize`` returns can hang the 2.51 stub.
        """
        self._serving.set()

    def stop(self) -> None:
        """Stop background threads; in-flight streams finish on their own."""
        self._stop.set()
        self._serving.set()
        self.dispatcher.stop()
        self.pool.shutdown(wait=False, cancel_futures=False)
        for thread in (self._poller, self._watcher):
            if thread is not None:
                thread.join(timeout=5)

    # ---- signals ---------------------------------------------------------------------
    def engine_stats(self) -> dict[str, EngineStats]:
        """A snapshot of what the policy needs per engine."""
        out = {}
        for e, st in self.engines.items():
            out[e] = EngineStats(
                healthy=st.ready and st.breaker.available(),
                kv_usage=st.kv_usage,
                p95_ms=st.ttft.p95(),
                in_flight=self.dispatcher.in_flight[e],
                queued=self.dispatcher.queued(e),
            )
        return out

    def apply_metrics(self, text: str) -> None:
        """Update KV usage from a scrape of Triton's metrics endpoint."""
        samples = prom.parse_text(text)
        vllm_kv = prom.value(samples, "vllm:kv_cache_usage_perc", model=self.cfg.vllm_model)
        trt_kv = prom.value(samples, "nv_trt_llm_kv_cache_block_metrics",
                            model=self.cfg.trtllm_model, kv_cache_block_type="fraction")
        if vllm_kv is not None:
            self.engines[VLLM].kv_usage = vllm_kv
        if trt_kv is not None:
            self.engines[TRTLLM].kv_usage = trt_kv
        for e, st in self.engines.items():
            up = prom.value(samples, ENGINE_READY, model=self.cfg.model_name(e))
            was_up, st.engine_up = st.engine_up, up is None or up > 0.5  # absent: trust readiness
            if was_up and not st.engine_up:
                self.end_streams_on(e)

    def _poll_loop(self) -> None:
        import urllib.request

        period = self.cfg.metrics_poll_ms / 1000.0
        failures = 0
        self._serving.wait()
        while not self._stop.wait(period):
            try:
                with urllib.request.urlopen(self.cfg.metrics_url, timeout=2) as resp:
                    self.apply_metrics(resp.read().decode("utf-8", "replace"))
                failures = 0
            except Exception as exc:  # noqa: BLE001 - keep polling; routing uses the last values
                failures += 1
                if failures in (1, 100):
                    self.log(f"metrics poll of {self.cfg.metrics_url} failed: {exc!r}")
            self.refresh_health()
            self._export_gauges()

    def refresh_health(self) -> None:
        """An engine is ready when Triton says its model is and its engine reports itself up."""
        for e, st in self.engines.items():
            st.ready = st.engine_up and self._model_ready(self.cfg.model_name(e))

    def _model_ready(self, model: str) -> bool:
        """Readiness from Triton's HTTP endpoint.

        Not ``pb_utils.is_model_ready``: called from a background thread while requests
        execute, it aborts tritonserver 2.51 (boost::interprocess::lock_exception).
        """
        import urllib.error
        import urllib.request

        if not self.cfg.server_http_url:
            return True
        try:
            with urllib.request.urlopen(f"{self.cfg.server_http_url}/v2/models/{model}/ready", timeout=2) as r:
                return r.status == 200
        except urllib.error.HTTPError:
            return False
        except OSError:
            return self.engines[VLLM if model == self.cfg.vllm_model else TRTLLM].ready

    def _gpu_memory(self) -> None:
        """Export GPU memory per device through NVML, if a GPU exists (one log line if not)."""
        if self._nvml is False:
            return
        try:
            if self._nvml is None:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
            nv = self._nvml
            for i in range(nv.nvmlDeviceGetCount()):
                info = nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(i))
                self.metrics.gpu_memory(i, float(info.used), float(info.total))
        except Exception as exc:  # noqa: BLE001 - no GPU / no driver: report once, carry on
            self._nvml = False
            self.log(f"GPU memory metrics disabled: no NVIDIA GPU visible through NVML ({exc.__class__.__name__})")

    def _export_gauges(self) -> None:
        self._gpu_memory()
        stats = self.engine_stats()
        for e, st in stats.items():
            opened = self.engines[e].breaker.opened
            if opened > self._opened_seen.get(e, 0):
                self.metrics.breaker_opened(e, opened - self._opened_seen.get(e, 0))
                self._opened_seen[e] = opened
            self.metrics.engine_gauges(e, weight=engine_weight(st, self.cfg),
                                       breaker=int(self.engines[e].breaker.state),
                                       kv_usage=st.kv_usage, in_flight=st.in_flight)
        self.metrics.queue_depth(self.dispatcher.queued_by_class())

    # ---- requests --------------------------------------------------------------------
    def features(self, job: RouterJob) -> RequestFeatures:
        """Policy inputs of a job."""
        return RequestFeatures(len(job.prompt_ids), job.latency_sla_ms, job.priority)

    def policy_for(self, job: RouterJob) -> RoutingPolicy:
        """The policy that routes ``job``: its own (policy_override) or the configured one."""
        name = job.policy or self.cfg.policy
        if name not in self._policies:
            self._policies[name] = create_policy(replace(self.cfg, policy=name))
        return self._policies[name]

    def admit(self, job: RouterJob, sender: Any) -> bool:
        """Decide and queue a request; False (caller answers UNAVAILABLE) when the queue is full."""
        job.request_id = job.request_id or uuid.uuid4().hex
        decision = self.policy_for(job).decide(self.features(job), self.engine_stats())
        pending = Pending(job, sender, decision, self.clock())
        ticket = self.dispatcher.submit(decision.engine, job.priority, pending)
        if ticket is None:
            self.metrics.rejected("queue_full")
            return False
        self.metrics.routed(decision.engine, decision.reason)
        return True

    def _on_release(self, ticket: Ticket) -> None:
        self.metrics.queue_wait(ticket.priority, ticket.wait_s)
        self.pool.submit(self._run, ticket.payload, ticket.engine)

    def _run(self, pending: Pending, engine: str, moved: bool = False) -> None:
        """Serve one request on ``engine``; fail over once if it fails before the first token.

        ``moved``: ``engine`` died under the request before anything reached the client
        (``end_streams_on``); go straight to the other engine.
        """
        try:
            if moved or (self._serve(pending, engine) == "failover" and self._claim_failover(pending, engine)):
                self._fail_over(pending, engine)
        except Exception as exc:  # noqa: BLE001 - a stream must always end with FINAL
            self.log(f"request {pending.job.request_id}: router error {exc!r}")
            try:
                self._fail(pending, engine, f"router error: {exc}", "INTERNAL", any_attempt=True)
            except Exception:  # noqa: BLE001 - the client is gone
                pass
        finally:
            self._complete(pending, engine)

    def _claim_failover(self, p: Pending, engine: str) -> bool:
        """Take ``p`` off its failed attempt on ``engine`` for a failover; False when
        ``end_streams_on`` took it off first (it then moves or ends the request itself).

        Without the claim, an ``end_streams_on`` that listed the request while its attempt
        was failing saw it still current on the dead engine but already failed over, and
        ended it with UNAVAILABLE in the middle of its failover (seen with 2 router instances).
        """
        with p.lock:
            if p.stale(engine):
                return False
            p.current = None
            return True

    def _fail_over(self, p: Pending, engine: str) -> None:
        """Serve ``p`` on the other engine (once; it is never retried again)."""
        target = other(engine)
        p.failed_over = True
        self.metrics.failover(engine, target)
        self.log(f"request {p.job.request_id}: {engine} failed before the first token; failing over to {target}")
        self.dispatcher.acquire(target)
        try:
            if self._serve(p, target, allow_failover=False) == "failover":
                self._fail(p, target, "both engines failed before producing a token; retry later", "UNAVAILABLE")
        finally:
            self._complete(p, target)

    def _serve(self, p: Pending, engine: str, allow_failover: bool = True) -> str:
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
        job, st = p.job, self.engines[engine]
        model = self.cfg.model_name(engine)
        if p.cancel_seen or self._left_while_queued(p):
            self.metrics.cancelled(engine)
            self._send(p, engine, None, final=True)
            return "cancelled"
        if not st.breaker.allow() or not st.ready:
            return "failover" if allow_failover and self._other_up(engine) else self._fail(
                p, engine, f"engine {model} is unavailable (circuit open or not ready)", "UNAVAILABLE")
        request_id = attempt_id(job, engine)
        if engine == TRTLLM:
            inputs, outputs, detok = trtllm_inputs(job, self.end_id), TRTLLM_OUTPUTS, IncrementalDetokenizer(self.tokenizer)
        else:
            inputs, outputs, detok = vllm_inputs(job), VLLM_OUTPUTS, None
        t_start = self.clock()
        full = ""  # text generated so far (after any stop-word cut)
        emitted = 0  # characters already sent to the client
        n_out = 0
        first = None
        stopped = False
        interval, next_send = self.cfg.stream_interval_ms / 1000.0, 0.0
        cancelled = CancelCheck(lambda: self.transport.is_cancelled(p.sender), self.cancel_interval_s)
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
                if first is None:
                    first = self.clock()
                    st.ttft.add((first - t_start) * 1000.0)
                    self.metrics.ttft(engine, first - p.arrived)
                full += piece
                if job.stop_words:
                    cut = find_stop(full, job.stop_words, max(emitted - max(map(len, job.stop_words)), 0))
                    if cut != -1:
                        full = full[:cut]
                        self._stop_engine(engine, model, request_id)
                        stopped = True
                if job.stream:
                    hold = 0 if stopped or not job.stop_words else _stop_holdback(full, job.stop_words)
                    delta = full[emitted:len(full) - hold]
                    # The first text goes at once (TTFT); later text at most every
                    # stream_interval_ms (each response is an IPC round trip), the rest with FINAL.
                    now = self.clock() if interval else 0.0
                    if delta and (emitted == 0 or now >= next_send):
                        if not self._send(p, engine, self._outputs(job, delta, engine, None), final=False):
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
            if first is None and allow_failover and not client_error and self._other_up(engine):
                return "failover"
            where = "before the first token" if first is None else f"after {emitted} characters were streamed"
            return self._fail(p, engine, f"engine {model} failed {where}: {exc}",
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
            sent = self._send(p, engine, self._outputs(job, rest, engine, n_out), final=True)
        else:
            text = full if job.exclude_input else job.prompt + full
            sent = self._send(p, engine, self._outputs(job, text, engine, n_out), final=True)
        return "done" if sent else "abandoned"

    def cancel_interval_s(self) -> float:
        """Seconds between two cancel checks of one stream: ``cancel_check_ms``, stretched so
        that the streams in flight together check at most ``cancel_checks_per_s`` times a
        second (each check is an IPC round trip, as costly as relaying a response)."""
        base = self.cfg.cancel_check_ms / 1000.0
        if self.cfg.cancel_checks_per_s <= 0:
            return base
        return max(base, len(self._live) / self.cfg.cancel_checks_per_s)

    def _cancelled(self, p: Pending, engine: str, model: str, request_id: str) -> str:
        """End an attempt whose client cancelled: stop the engine request (unless the watcher did)."""
        if engine not in p.stopped_on:
            self._stop_engine(engine, model, request_id)
        self.metrics.cancelled(engine)
        self._send(p, engine, None, final=True)
        self.engines[engine].breaker.record(True)
        return "cancelled"

    def _watch_quiet_attempts(self) -> None:
        """Look at the cancel flag of attempts that heard nothing from their engine for a
        while (prefill, the engine's own queue), once per ``quiet_s`` each; streams that get
        responses are checked as they relay them. One check at a time (an IPC round trip)."""
        period = self.quiet_s
        failures = 0
        while not self._stop.wait(period):
            try:
                self._stop_quiet_cancelled(period)
            except Exception as exc:  # noqa: BLE001 - keep watching; streams are still checked inline
                failures += 1
                if failures in (1, 100):
                    self.log(f"cancel watcher: {exc!r}")

    def _stop_quiet_cancelled(self, quiet_s: float) -> None:
        """One watcher round: stop the engine request of each quiet attempt whose client left."""
        now = self.clock()
        with self._live_lock:
            quiet = [(e, p) for (_, e), p in self._live.items() if not p.cancel_seen and now - p.last_heard >= quiet_s]
        for engine, p in quiet:
            if p.stale(engine) or not self.transport.is_cancelled(p.sender):
                continue
            with p.lock:
                if p.stale(engine) or p.cancel_seen:
                    continue
                p.stopped_on.add(engine)
            if not self._stop.is_set():
                self.pool.submit(self._stop_engine, engine, self.cfg.model_name(engine), attempt_id(p.job, engine))

    def _left_while_queued(self, p: Pending) -> bool:
        """True when the client cancelled while the request waited in the router queue.

        Checked once before dispatch, and only for a request that waited at least
        ``cancel_check_ms`` (each check is an IPC round trip): under overload, clients
        that give up while queued must not cost the engine a prefill.
        """
        waited_ms = (self.clock() - p.arrived) * 1000.0
        return waited_ms >= self.cfg.cancel_check_ms and self.transport.is_cancelled(p.sender)

    def end_streams_on(self, engine: str) -> int:
        """Take every request in flight off an engine that reported itself dead.

        Triton 2.51 does not deliver an engine's error response to a BLS stream, so without
        this those clients would wait forever. A request that has sent nothing to its
        client yet moves to the other engine (once, as any failover); the others end
        with UNAVAILABLE. The reader thread stays in the BLS iterator; whatever it gets
        later is dropped. Returns how many requests were taken off.
        """
        with self._live_lock:
            victims = [p for (_, e), p in self._live.items() if e == engine]
        model, ended, moved = self.cfg.model_name(engine), 0, 0
        for p in victims:
            with p.lock:
                if p.stale(engine):
                    continue  # it finished or was taken off meanwhile
                move = not p.sent and not p.failed_over and self._other_up(engine)
                if move:
                    p.current = None  # the stuck attempt may no longer answer
            self.engines[engine].breaker.record(False)
            if move:
                moved += 1
                self._complete(p, engine)
                self.pool.submit(self._run, p, engine, True)
                continue
            where = "before the first token" if p.emitted == 0 else f"after {p.emitted} characters were streamed"
            try:
                self._fail(p, engine, f"engine {model} died {where}; retry the request", "UNAVAILABLE")
            except Exception:  # noqa: BLE001 - the client is already gone; the stream is ended all the same
                pass
            ended += 1
            self._complete(p, engine)
        if ended or moved:
            self.log(f"engine {model} reported itself dead: {moved} requests moved to {other(engine)}, "
                     f"{ended} streams ended")
        return ended + moved

    def _send(self, p: Pending, engine: str, outputs: Mapping[str, np.ndarray] | None, final: bool) -> bool:
        """Send one response of the attempt on ``engine`` unless that attempt was taken off."""
        with p.lock:
            if p.stale(engine):
                return False
            self.transport.send(p.sender, outputs, final=final)
            p.sent = True
            if final:
                p.ended = True
            return True

    def _complete(self, p: Pending, engine: str) -> None:
        """Give back the engine slot, unless ``end_streams_on`` already did."""
        with p.lock:
            if engine in p.released:
                return
            p.released.add(engine)
        self.dispatcher.complete(engine)

    def _other_up(self, engine: str) -> bool:
        st = self.engines[other(engine)]
        return st.ready and st.breaker.available()

    def _fail(self, p: Pending, engine: str, message: str, code: str, any_attempt: bool = False) -> str:
        """End the stream with an error (only from its current attempt, unless ``any_attempt``)."""
        with p.lock:
            if p.ended or (not any_attempt and p.current != engine):
                return "abandoned"
            p.ended = True
            self.metrics.errored(engine, code)  # counted even if the client is gone
            self.transport.send_error(p.sender, message, code)
        return "error"

    def _stop_engine(self, engine: str, model: str, request_id: str) -> None:
        """Ask the engine to stop generating for a request (tensorrtllm ``stop`` semantics)."""
        inputs = trtllm_stop_inputs() if engine == TRTLLM else vllm_stop_inputs()
        try:
            for _ in self.transport.stream(model, inputs, request_id, ()):
                pass
        except Exception as exc:  # noqa: BLE001 - the request may have finished already
            self.log(f"stop of {request_id} on {model}: {exc!r}")

    def _outputs(self, job: RouterJob, text: str, engine: str, n_out: int | None) -> dict[str, np.ndarray]:
        out = {
            "text_output": np.array([[text.encode("utf-8")]], dtype=np.object_),
            "backend": np.array([[engine.encode()]], dtype=np.object_),
        }
        if job.return_num_input_tokens:
            out["num_input_tokens"] = np.array([[len(job.prompt_ids)]], dtype=np.int32)
        if job.return_num_output_tokens and n_out is not None:
            out["num_output_tokens"] = np.array([[n_out]], dtype=np.int32)
        return out


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


__all__ = ["EngineError", "RouterService", "Transport", "BreakerState"]
