"""The router's configuration: parsed once from config.pbtxt parameters, frozen, validated.

Every routing threshold is a parameter. An unfilled ``${...}`` template value or an
empty string means "use the default" (the tensorrtllm_backend convention). A bad
value raises ``ValueError`` naming the parameter and what to put there.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

ENGINES = ("trtllm", "vllm_backend")
POLICIES = ("hybrid", "round_robin", "vllm_only", "trtllm_only")
# Histogram bucket upper bounds (seconds) of the router's metric families.
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                     0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS_S = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05,
                  0.075, 0.1, 0.2, 0.5)
QUEUE_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5,
                   1.0, 2.5, 5.0, 10.0)
FALLBACKS = ("weighted", "trtllm", "vllm_backend")


@dataclass(frozen=True)
class RouterConfig:
    """All router settings; field names are the config.pbtxt parameter keys."""

    # Targets (the router dispatches only to these two models).
    trtllm_model: str = "trtllm"
    vllm_model: str = "vllm_backend"
    policy: str = "hybrid"
    # Not a config.pbtxt parameter: router_bls's own transaction policy (the profile's
    # decoupled_mode). False (unary): one response per request, engines called unary too.
    decoupled: bool = True
    # Off by default. On, a request may name another policy in its Triton request parameter
    # 'routing_policy' (benchmarks compare policies on one running server: no reload).
    policy_override: bool = False
    # Rule 1-3: length tiers (tokens of the model's tokenizer) and the SLA rule.
    long_prompt_tokens: int = 2048
    short_prompt_tokens: int = 512
    interactive_sla_ms: float = 120.0
    default_latency_sla_ms: float = 0.0  # 0: no SLA unless the request sends one
    fallback_target: str = "weighted"
    # Rule 4: KV watermark; classes with priority >= kv_guard_min_priority are held back.
    kv_watermark: float = 0.92
    kv_guard_min_priority: int = 2
    # Rule 5: dispatch batching, bounded by engine capacity.
    trtllm_capacity: int = 32
    vllm_capacity: int = 64
    dispatch_p95_slow_ms: float = 200.0
    # Rule 6: priority classes (1 URGENT, 2 HIGH, 3 NORMAL).
    priority_weights: tuple[int, int, int] = (5, 3, 1)
    priority_max_wait_ms: tuple[float, float, float] = (10.0, 50.0, 200.0)
    default_priority: int = 3
    # Rule 7: engine weights.
    weight_base: float = 100.0
    weight_slow_p95_ms: float = 200.0
    weight_slow_factor: float = 0.3
    weight_fast_p95_ms: float = 50.0
    weight_fast_factor: float = 1.5
    weight_min: float = 10.0
    weight_max: float = 100.0
    latency_window_s: float = 60.0
    # Rule 8: circuit breaker.
    breaker_failure_ratio: float = 0.6
    breaker_window_s: float = 60.0
    breaker_min_requests: int = 20
    breaker_burst_failures: int = 5
    breaker_burst_window_s: float = 30.0
    breaker_burst_min_requests: int = 10
    # Limits and defaults of the request contract.
    max_tokens_default: int = 64
    max_tokens_limit: int = 1024
    max_prompt_tokens: int = 3968
    max_stop_words: int = 16
    max_stop_word_chars: int = 256
    max_queue: int = 1024
    # Streaming: text after the first piece is sent at most every this many ms (0: every piece).
    stream_interval_ms: float = 0.0
    # Cancellation: each check of a client's cancel flag is an IPC round trip; at most one per
    # stream every this many ms (a cancelled stream may get that much more generation).
    cancel_check_ms: float = 50.0
    # ... and all streams together at most this many times a second (0: no cap): with many
    # streams each one is checked less often instead of the checks crowding out responses.
    cancel_checks_per_s: float = 200.0
    # Signals: Triton's own metrics endpoint, polled in the background.
    metrics_url: str = "http://127.0.0.1:8002/metrics"
    metrics_poll_ms: float = 500.0  # 0 disables polling (KV usage then stays 0)
    server_http_url: str = "http://127.0.0.1:8000"  # readiness: GET /v2/models/<m>/ready
    tokenizer_dir: str = ""
    end_id: int = -1  # -1: the tokenizer's EOS id
    # Metrics: bucket upper bounds (seconds) of router_ttft/e2e, router_tpot and router_queue_wait.
    latency_buckets_s: tuple[float, ...] = LATENCY_BUCKETS_S
    tpot_buckets_s: tuple[float, ...] = TPOT_BUCKETS_S
    queue_buckets_s: tuple[float, ...] = QUEUE_BUCKETS_S

    def validate(self) -> "RouterConfig":
        """Raise ValueError naming the first bad parameter."""
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"config.pbtxt parameter '{name}' = {getattr(self, name)!r}: {why}")

        if self.policy not in POLICIES:
            raise bad("policy", f"choose one of {list(POLICIES)}")
        if self.fallback_target not in FALLBACKS:
            raise bad("fallback_target", f"choose one of {list(FALLBACKS)}")
        if not 0 < self.short_prompt_tokens <= self.long_prompt_tokens:
            raise bad("short_prompt_tokens", "must be > 0 and <= long_prompt_tokens")
        if not 0 < self.kv_watermark <= 1:
            raise bad("kv_watermark", "must be in (0, 1]")
        if self.kv_guard_min_priority not in (1, 2, 3, 4):
            raise bad("kv_guard_min_priority", "must be 1, 2, 3 (classes at or above are held) or 4 (none)")
        if self.default_priority not in (1, 2, 3):
            raise bad("default_priority", "must be 1 (URGENT), 2 (HIGH) or 3 (NORMAL)")
        for name in ("trtllm_capacity", "vllm_capacity", "max_tokens_default", "max_tokens_limit",
                     "max_prompt_tokens", "max_queue", "breaker_min_requests",
                     "breaker_burst_failures", "breaker_burst_min_requests", "max_stop_words",
                     "max_stop_word_chars"):
            if getattr(self, name) <= 0:
                raise bad(name, "must be a positive integer")
        if self.max_tokens_default > self.max_tokens_limit:
            raise bad("max_tokens_default", "must be <= max_tokens_limit")
        if len(self.priority_weights) != 3 or any(w <= 0 for w in self.priority_weights):
            raise bad("priority_weights", "must be three positive integers, e.g. '5,3,1'")
        if len(self.priority_max_wait_ms) != 3 or any(w < 0 for w in self.priority_max_wait_ms):
            raise bad("priority_max_wait_ms", "must be three non-negative numbers, e.g. '10,50,200'")
        if not 0 < self.breaker_failure_ratio <= 1:
            raise bad("breaker_failure_ratio", "must be in (0, 1]")
        if not 0 < self.weight_min <= self.weight_max:
            raise bad("weight_min", "must be > 0 and <= weight_max")
        for name in ("interactive_sla_ms", "default_latency_sla_ms", "dispatch_p95_slow_ms",
                     "weight_slow_p95_ms", "weight_fast_p95_ms", "latency_window_s",
                     "breaker_window_s", "breaker_burst_window_s", "metrics_poll_ms", "weight_base",
                     "stream_interval_ms", "cancel_check_ms", "cancel_checks_per_s"):
            value = getattr(self, name)
            if math.isnan(value) or value < 0:
                raise bad(name, "must be a non-negative number")
        for name in ("latency_buckets_s", "tpot_buckets_s", "queue_buckets_s"):
            bounds = getattr(self, name)
            if (not bounds or any(math.isnan(b) or math.isinf(b) or b <= 0 for b in bounds)
                    or any(a >= b for a, b in zip(bounds, bounds[1:]))):
                raise bad(name, "must be increasing positive finite seconds, e.g. '0.01,0.1,1,10' "
                                "(+Inf is added by Triton)")
        if self.trtllm_model == self.vllm_model:
            raise bad("vllm_model", "must differ from trtllm_model")
        return self

    def capacity(self, engine: str) -> int:
        """In-flight request capacity of an engine (TRT-LLM max_batch_size, vLLM max_num_seqs)."""
        return self.trtllm_capacity if engine == "trtllm" else self.vllm_capacity

    def model_name(self, engine: str) -> str:
        """Triton model name of an engine key."""
        return self.trtllm_model if engine == "trtllm" else self.vllm_model


def _convert(name: str, raw: str, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return raw.lower() in ("true", "1", "yes")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            value = float(raw)
            if math.isnan(value):
                raise ValueError
            return value
        if isinstance(default, tuple):
            kind = type(default[0])
            return tuple(kind(x) for x in raw.replace(" ", "").split(",") if x)
        return raw
    except ValueError:
        kind = type(default).__name__ if not isinstance(default, tuple) else "comma-separated list"
        raise ValueError(f"config.pbtxt parameter '{name}' = {raw!r}: expected a {kind}") from None


def _split(total: int, index: int, count: int) -> int:
    """Instance ``index``'s part when ``count`` instances split ``total`` (the first ones get the remainder)."""
    return total // count + (1 if index < total % count else 0)


def instance_share(cfg: RouterConfig, index: int, count: int) -> RouterConfig:
    """The config of router instance ``index`` of ``count``: each instance dispatches its
    share of the engines' capacity, queues its share of ``max_queue`` and makes its share of
    the cancel checks, so that the instances together keep the configured totals."""
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"router instance {index} of {count}: the index must be in [0, count)")
    if count == 1:
        return cfg
    smallest = min(cfg.trtllm_capacity, cfg.vllm_capacity, cfg.max_queue)
    if count > smallest:
        raise ValueError(f"router_bls instance_group count (router_instances) = {count}: each instance needs "
                         f"at least one slot of each engine and of the queue; use at most {smallest} "
                         f"(trtllm_capacity={cfg.trtllm_capacity}, vllm_capacity={cfg.vllm_capacity}, "
                         f"max_queue={cfg.max_queue})")
    return replace(cfg,
                   trtllm_capacity=_split(cfg.trtllm_capacity, index, count),
                   vllm_capacity=_split(cfg.vllm_capacity, index, count),
                   max_queue=_split(cfg.max_queue, index, count),
                   cancel_checks_per_s=cfg.cancel_checks_per_s / count)


def instance_of(instance_name: str, model_config: Mapping[str, Any]) -> tuple[int, int]:
    """(index, count) of a router instance from Triton's instance name (``<group>_<k>``)
    and the model config's instance group."""
    groups = model_config.get("instance_group") or [{}]
    if len(groups) > 1:
        raise ValueError("router_bls: use one instance_group (its count sets the number of router instances)")
    count = max(int(groups[0].get("count", 1)), 1)
    match = re.search(r"_(\d+)$", instance_name)
    index = int(match.group(1)) if match else 0
    if index >= count:
        raise ValueError(f"router_bls: instance name {instance_name!r} does not end in an index below {count}")
    return index, count


def config_from_parameters(params: Mapping[str, str]) -> RouterConfig:
    """Build and validate the config from config.pbtxt parameters (unknown keys are errors)."""
    defaults = RouterConfig()
    known = {f.name for f in fields(RouterConfig)} - {"decoupled"}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"unknown config.pbtxt parameter(s) {unknown}; known: {sorted(known)}")
    values: dict[str, Any] = {}
    for name, raw in params.items():
        raw = raw.strip()
        if not raw or raw.startswith("${"):
            continue  # unset: keep the default
        values[name] = _convert(name, raw, getattr(defaults, name))
    return RouterConfig(**values).validate()
