"""Routing policies (DESIGN.md rules 1-4 and 7): which engine serves a request, and why.

Policies are small typed objects with one signature, ``decide(features, engines)``,
built by ``create_policy``. Inputs are plain stats objects; nothing here knows
about Triton. Engine keys are ``"trtllm"`` and ``"vllm_backend"``.
"""

from __future__ import annotations

import abc
import enum
import itertools
import threading
from dataclasses import dataclass

from hybrid_llm.router.config import RouterConfig

TRTLLM, VLLM = "trtllm", "vllm_backend"
ENGINE_KEYS = (TRTLLM, VLLM)


def other(engine: str) -> str:
    """The other engine's key."""
    return VLLM if engine == TRTLLM else TRTLLM


@dataclass
class EngineStats:
    """What the policy knows about one engine right now."""

    healthy: bool = True
    kv_usage: float = 0.0  # 0..1, KV-cache block usage from Triton's metrics endpoint
    p95_ms: float | None = None  # recent TTFT p95 seen by the router (None: no samples)
    in_flight: int = 0
    queued: int = 0


@dataclass(frozen=True)
class RequestFeatures:
    """What the policy knows about one request."""

    prompt_tokens: int
    latency_sla_ms: float | None  # None: no SLA
    priority: int  # 1 URGENT, 2 HIGH, 3 NORMAL


@dataclass(frozen=True)
class Decision:
    """Where a request goes and the rule that sent it there."""

    engine: str
    reason: str


def engine_weight(stats: EngineStats, cfg: RouterConfig) -> float:
    """Rule 7: 100, 0 if unhealthy, x0.3 if p95 > 200 ms, x1.5 if p95 < 50 ms, clamped to [10, 100]."""
    if not stats.healthy:
        return 0.0
    weight = cfg.weight_base
    if stats.p95_ms is not None:
        if stats.p95_ms > cfg.weight_slow_p95_ms:
            weight *= cfg.weight_slow_factor
        elif stats.p95_ms < cfg.weight_fast_p95_ms:
            weight *= cfg.weight_fast_factor
    return min(max(weight, cfg.weight_min), cfg.weight_max)


class PolicyKind(enum.Enum):
    """The routing policies a router can run (config parameter ``policy``)."""

    HYBRID = "hybrid"
    ROUND_ROBIN = "round_robin"
    VLLM_ONLY = "vllm_only"
    TRTLLM_ONLY = "trtllm_only"


class RoutingPolicy(abc.ABC):
    """One fixed signature for every policy."""

    def __init__(self, cfg: RouterConfig) -> None:
        self.cfg = cfg

    @abc.abstractmethod
    def decide(self, req: RequestFeatures, engines: dict[str, EngineStats]) -> Decision:
        """Choose the engine for a request."""

    def failover(self, decision: Decision, engines: dict[str, EngineStats]) -> Decision:
        """Rule 9: if the chosen engine is down and the other is up, use the other."""
        if not engines[decision.engine].healthy and engines[other(decision.engine)].healthy:
            return Decision(other(decision.engine), "failover")
        return decision


class HybridPolicy(RoutingPolicy):
    """DESIGN.md rules 1-4 with rule 7 weights for the fallback.

    Order: (1) prompt >= long_prompt_tokens -> trtllm; (2) prompt < short_prompt_tokens
    and SLA <= interactive_sla_ms and vLLM KV < watermark -> vllm_backend; (3) the
    fallback target (``weighted``: the higher engine weight; ties go to the engine with
    more free capacity, then to trtllm); (4) a low-priority request whose engine is over
    the KV watermark goes to the other engine if that one is under it (otherwise it is
    held in the router queue by the dispatcher; it is never dropped). Unhealthy engines
    are avoided whenever the other is healthy.
    """

    def decide(self, req: RequestFeatures, engines: dict[str, EngineStats]) -> Decision:
        """Apply rules 1-4."""
        cfg = self.cfg
        if req.prompt_tokens >= cfg.long_prompt_tokens:
            decision = Decision(TRTLLM, "long_prompt")
        elif (
            req.prompt_tokens < cfg.short_prompt_tokens
            and req.latency_sla_ms is not None
            and req.latency_sla_ms <= cfg.interactive_sla_ms
            and engines[VLLM].kv_usage < cfg.kv_watermark
        ):
            decision = Decision(VLLM, "short_interactive")
        else:
            decision = Decision(self._fallback(engines), "fallback")
        if req.priority >= cfg.kv_guard_min_priority:
            chosen = engines[decision.engine]
            alt = engines[other(decision.engine)]
            if chosen.kv_usage > cfg.kv_watermark and alt.healthy and alt.kv_usage <= cfg.kv_watermark:
                decision = Decision(other(decision.engine), "kv_pressure")
        return self.failover(decision, engines)

    def _fallback(self, engines: dict[str, EngineStats]) -> str:
        target = self.cfg.fallback_target
        if target in ENGINE_KEYS:
            return target
        def key(engine: str) -> tuple[float, int, int]:
            stats = engines[engine]
            free = self.cfg.capacity(engine) - stats.in_flight - stats.queued
            return (engine_weight(stats, self.cfg), free, engine == TRTLLM)
        return max(ENGINE_KEYS, key=key)


class RoundRobinPolicy(RoutingPolicy):
    """The baseline: alternate engines regardless of the request (healthy ones only)."""

    def __init__(self, cfg: RouterConfig) -> None:
        super().__init__(cfg)
        self._next = itertools.cycle(ENGINE_KEYS)
        self._lock = threading.Lock()

    def decide(self, req: RequestFeatures, engines: dict[str, EngineStats]) -> Decision:
        """Next engine in turn."""
        with self._lock:
            engine = next(self._next)
        return self.failover(Decision(engine, "round_robin"), engines)


class SingleEnginePolicy(RoutingPolicy):
    """Everything to one engine (baselines and single-engine deployments)."""

    def __init__(self, cfg: RouterConfig, engine: str) -> None:
        super().__init__(cfg)
        self.engine = engine

    def decide(self, req: RequestFeatures, engines: dict[str, EngineStats]) -> Decision:
        """Always the configured engine (failover still applies)."""
        return self.failover(Decision(self.engine, "single_engine"), engines)


def create_policy(cfg: RouterConfig) -> RoutingPolicy:
    """Build the policy named by ``cfg.policy``."""
    kind = PolicyKind(cfg.policy)
    if kind is PolicyKind.HYBRID:
        return HybridPolicy(cfg)
    if kind is PolicyKind.ROUND_ROBIN:
        return RoundRobinPolicy(cfg)
    return SingleEnginePolicy(cfg, VLLM if kind is PolicyKind.VLLM_ONLY else TRTLLM)
