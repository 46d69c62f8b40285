"""Routing rules 1-4 and 7 at and around their thresholds."""

from __future__ import annotations

import pytest

from hybrid_llm.router.config import RouterConfig
from hybrid_llm.router.policy import (
    TRTLLM, VLLM, EngineStats, HybridPolicy, RequestFeatures, RoundRobinPolicy, create_policy,
    engine_weight,
)

CFG = RouterConfig()


def engines(**kw) -> dict[str, EngineStats]:
    return {TRTLLM: EngineStats(**kw.get("trt", {})), VLLM: EngineStats(**kw.get("vllm", {}))}


def decide(tokens: int, sla: float | None = None, priority: int = 3, cfg: RouterConfig = CFG, **kw):
    return HybridPolicy(cfg).decide(RequestFeatures(tokens, sla, priority), engines(**kw))


@pytest.mark.parametrize("tokens,engine,reason", [(2047, None, "fallback"), (2048, TRTLLM, "long_prompt"), (4000, TRTLLM, "long_prompt")])
def test_rule1_long_prompts_go_to_trtllm(tokens, engine, reason):
    d = decide(tokens, sla=50)
    assert d.reason == reason
    if engine:
        assert d.engine == engine


@pytest.mark.parametrize("tokens,sla,expected", [
    (511, 120.0, "short_interactive"), (512, 120.0, "fallback"), (10, 120.0, "short_interactive"),
    (10, 120.1, "fallback"), (10, None, "fallback"), (10, 1.0, "short_interactive"),
])
def test_rule2_short_and_tight_sla_goes_to_vllm(tokens, sla, expected):
    d = decide(tokens, sla=sla)
    assert d.reason == expected
    if expected == "short_interactive":
        assert d.engine == VLLM


def test_rule2_needs_vllm_kv_under_watermark():
    assert decide(10, sla=50, vllm={"kv_usage": 0.919}).engine == VLLM
    d = decide(10, sla=50, vllm={"kv_usage": 0.92})
    assert d.reason != "short_interactive"


def test_rule3_fallback_target_is_configurable():
    assert decide(1000, cfg=RouterConfig(fallback_target="trtllm")).engine == TRTLLM
    assert decide(1000, cfg=RouterConfig(fallback_target="vllm_backend")).engine == VLLM


def test_rule3_weighted_fallback_prefers_higher_weight_then_free_capacity():
    # equal weights: vLLM has more capacity (64 vs 32)
    assert decide(1000).engine == VLLM
    # vLLM slow (p95 > 200 ms) -> weight 30 < trtllm 100
    assert decide(1000, vllm={"p95_ms": 250.0}).engine == TRTLLM
    # trtllm fast (p95 < 50) -> 150 clamped to 100 = vLLM's 100; capacity decides again
    assert decide(1000, trt={"p95_ms": 10.0}).engine == VLLM
    # vLLM nearly full of queued work: trtllm has more free slots
    assert decide(1000, vllm={"in_flight": 64, "queued": 10}).engine == TRTLLM


def test_rule4_kv_pressure_moves_low_priority_work():
    # long prompt -> trtllm, but trtllm over the watermark: NORMAL and HIGH move, URGENT stays
    over = {"trt": {"kv_usage": 0.95}}
    assert decide(3000, priority=3, **over) .engine == VLLM
    assert decide(3000, priority=3, **over).reason == "kv_pressure"
    assert decide(3000, priority=2, **over).engine == VLLM
    assert decide(3000, priority=1, **over).engine == TRTLLM
    # exactly at the watermark is not over it
    assert decide(3000, priority=3, trt={"kv_usage": 0.92}).engine == TRTLLM
    # both over: stays (held by the dispatcher, never dropped)
    both = decide(3000, priority=3, trt={"kv_usage": 0.95}, vllm={"kv_usage": 0.97})
    assert both.engine == TRTLLM and both.reason == "long_prompt"


def test_unhealthy_engine_is_avoided():
    d = decide(3000, trt={"healthy": False})
    assert (d.engine, d.reason) == (VLLM, "failover")
    # both down: keep the rule's choice (the service answers UNAVAILABLE)
    d = decide(3000, trt={"healthy": False}, vllm={"healthy": False})
    assert d.engine == TRTLLM


@pytest.mark.parametrize("stats,weight", [
    (EngineStats(), 100.0), (EngineStats(healthy=False), 0.0), (EngineStats(p95_ms=200.0), 100.0),
    (EngineStats(p95_ms=200.1), 30.0), (EngineStats(p95_ms=50.0), 100.0),
    (EngineStats(p95_ms=49.9), 100.0),  # 150 clamped to 100
])
def test_rule7_weights_and_clamping(stats, weight):
    assert engine_weight(stats, CFG) == weight


def test_rule7_clamp_floor():
    cfg = RouterConfig(weight_slow_factor=0.05)
    assert engine_weight(EngineStats(p95_ms=500.0), cfg) == 10.0


def test_round_robin_alternates_and_factory():
    rr = create_policy(RouterConfig(policy="round_robin"))
    assert isinstance(rr, RoundRobinPolicy)
    picks = [rr.decide(RequestFeatures(10, None, 3), engines()).engine for _ in range(4)]
    assert picks == [TRTLLM, VLLM, TRTLLM, VLLM]
    assert create_policy(RouterConfig(policy="vllm_only")).decide(RequestFeatures(4000, None, 3), engines()).engine == VLLM
    assert create_policy(RouterConfig(policy="trtllm_only")).decide(RequestFeatures(4, 10, 3), engines()).engine == TRTLLM
