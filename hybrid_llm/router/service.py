"""The router's control flow: admit, decide, queue, dispatch, fail over, engine death.

No Triton imports: the Triton side is a ``Transport`` (see relay.py) and a
``RouterMetrics`` (metrics.py), both injected by ``hybrid_llm.triton.router_model``;
unit tests inject fakes. One attempt's streaming is ``Relay``'s; what the router knows
of each engine is ``Health``'s.
"""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Callable

from hybrid_llm.router.config import RouterConfig
from hybrid_llm.router.dispatch import Dispatcher, Ticket
from hybrid_llm.router.health import Health
from hybrid_llm.router.job import RouterJob
from hybrid_llm.router.policy import RequestFeatures, RoutingPolicy, create_policy, other
from hybrid_llm.router.relay import Pending, Relay, Transport

QUIET_MIN_S = 0.5  # the watcher's period: streaming attempts hear from their engine more often


class NullMetrics:
    """Router metrics that record nothing (unit tests, or metrics disabled)."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


class RouterService:
    """Everything between ``execute`` and the engines."""

    def __init__(self, cfg: RouterConfig, transport: Transport, tokenizer: Any,
                 metrics: Any = None, clock: Callable[[], float] = time.monotonic,
                 log: Callable[[str], None] = lambda msg: None) -> None:
        self.cfg = cfg
        self.metrics = metrics or NullMetrics()
        self.clock = clock
        self.log = log
        self.policy = create_policy(cfg)
        # Per-request policies (policy_override): one object each, made on first use.
        self._policies: dict[str, RoutingPolicy] = {cfg.policy: self.policy}
        self.engines = Health.new_engines(cfg, clock)
        eos = getattr(tokenizer, "eos_token_id", None)
        end_id = cfg.end_id if cfg.end_id >= 0 else int(eos if eos is not None else 2)
        self.dispatcher = Dispatcher(
            cfg,
            kv_usage=lambda e: self.engines[e].kv_usage,
            p95_ms=lambda e: self.engines[e].ttft.p95(),
            on_release=self._on_release,
            clock=clock,
        )
        self.health = Health(cfg, self.dispatcher, self.engines, self.metrics, log, on_engine_down=self.end_streams_on)
        self.relay = Relay(cfg, transport, tokenizer, self.health, self.metrics, clock, log, end_id)
        # Generous: a reader stuck in a BLS iterator on a dead engine (Triton 2.51 never
        # ends it) keeps its thread after its slot was released (``end_streams_on``).
        self.pool = ThreadPoolExecutor(max_workers=4 * (cfg.trtllm_capacity + cfg.vllm_capacity) + 64,
                                       thread_name_prefix="router-stream")
        self._stop = threading.Event()
        self._serving = threading.Event()
        self._poller: threading.Thread | None = None
        self._watcher: threading.Thread | None = None
        # An attempt that heard nothing from its engine this long is checked by the watcher.
        self.quiet_s = max(cfg.cancel_check_ms / 1000.0, QUIET_MIN_S)
        # Admitted requests by request id, for stop requests; an entry goes with its request.
        self._by_id: weakref.WeakValueDictionary[str, Pending] = weakref.WeakValueDictionary()
        self._by_id_lock = threading.Lock()

    # ---- lifecycle -------------------------------------------------------------------
    def start(self, poll: bool = True) -> None:
        """Start dispatching (and polling Triton's metrics endpoint and readiness)."""
        self.dispatcher.start()
        self._watcher = threading.Thread(target=self._watch_quiet_attempts, name="router-cancel-watch", daemon=True)
        self._watcher.start()
        if poll and self.cfg.metrics_poll_ms > 0:
            self._poller = threading.Thread(target=self.health.poll, args=(self._stop, self._serving), name="router-poller", daemon=True)
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
        decision = self.policy_for(job).decide(self.features(job), self.health.engine_stats())
        pending = Pending(job, sender, decision, self.clock())
        ticket = self.dispatcher.submit(decision.engine, job.priority, pending)
        if ticket is None:
            self.metrics.rejected("queue_full")
            return False
        self.metrics.routed(decision.engine, decision.reason)
        with self._by_id_lock:
            self._by_id[job.request_id] = pending
        return True

    def stop_request(self, request_id: str) -> str | None:
        """Stop the in-flight request with ``request_id`` (tensorrt_llm's ``stop`` input): it
        ends as if its client had cancelled, its engine request stopped within a cancel check.
        Returns the engine it was queued for or streaming on; None when no such request is in
        flight (it finished, or never reached this router instance)."""
        with self._by_id_lock:
            p = self._by_id.get(request_id)
        if p is None:
            return None
        with p.lock:
            if p.ended:
                return None
            p.stop_asked = True
            return p.current or p.decision.engine

    def _on_release(self, ticket: Ticket) -> None:
        self.metrics.queue_wait(ticket.priority, ticket.wait_s)
        self.pool.submit(self._run, ticket.payload, ticket.engine)

    def _run(self, pending: Pending, engine: str, moved: bool = False) -> None:
        """Serve one request on ``engine``; fail over once if it fails before the first token.

        ``moved``: ``engine`` died under the request before anything reached the client
        (``end_streams_on``); go straight to the other engine.
        """
        try:
            if moved or (self.relay.serve(pending, engine) == "failover" and self._claim_failover(pending, engine)):
                self._fail_over(pending, engine)
        except Exception as exc:  # noqa: BLE001 - a stream must always end with FINAL
            self.log(f"request {pending.job.request_id}: router error {exc!r}")
            try:
                self.relay.fail(pending, engine, f"router error: {exc}", "INTERNAL", any_attempt=True)
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
            if self.relay.serve(p, target, allow_failover=False) == "failover":
                self.relay.fail(p, target, "both engines failed before producing a token; retry later", "UNAVAILABLE")
        finally:
            self._complete(p, target)

    def _watch_quiet_attempts(self) -> None:
        """Look at the cancel flag of attempts that heard nothing from their engine for a
        while (prefill, the engine's own queue), once per ``quiet_s`` each; streams that get
        responses are checked as they relay them. One check at a time (an IPC round trip)."""
        period = self.quiet_s
        failures = 0
        while not self._stop.wait(period):
            try:
                self.relay.stop_quiet_cancelled(period, self._stop, self.pool.submit)
            except Exception as exc:  # noqa: BLE001 - keep watching; streams are still checked inline
                failures += 1
                if failures in (1, 100):
                    self.log(f"cancel watcher: {exc!r}")

    def end_streams_on(self, engine: str) -> int:
        """Take every request in flight off an engine that reported itself dead.

        Triton 2.51 does not deliver an engine's error response to a BLS stream, so without
        this those clients would wait forever. A request that has sent nothing to its
        client yet moves to the other engine (once, as any failover); the others end
        with UNAVAILABLE. The reader thread stays in the BLS iterator; whatever it gets
        later is dropped. Returns how many requests were taken off.
        """
        victims = self.relay.live(engine)
        model, ended, moved = self.cfg.model_name(engine), 0, 0
        for p in victims:
            with p.lock:
                if p.stale(engine):
                    continue  # it finished or was taken off meanwhile
                move = not p.sent and not p.failed_over and self.health.other_up(engine)
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
                self.relay.fail(p, engine, f"engine {model} died {where}; retry the request", "UNAVAILABLE")
            except Exception:  # noqa: BLE001 - the client is already gone; the stream is ended all the same
                pass
            ended += 1
            self._complete(p, engine)
        if ended or moved:
            self.log(f"engine {model} reported itself dead: {moved} requests moved to {other(engine)}, "
                     f"{ended} streams ended")
        return ended + moved

    def _complete(self, p: Pending, engine: str) -> None:
        """Give back the engine slot, unless ``end_streams_on`` already did."""
        with p.lock:
            if engine in p.released:
                return
            p.released.add(engine)
        self.dispatcher.complete(engine)


__all__ = ["RouterService"]
