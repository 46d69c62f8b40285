"""Router configuration: parsed once, validated, errors name the parameter."""

from __future__ import annotations

import pytest

from hybrid_llm.router.config import RouterConfig, config_from_parameters


class RecordingWriter:
    """A metrics writer that records each series' labels and buckets and drops the values."""

    def __init__(self) -> None:
        self.buckets: dict[str, list[float] | None] = {}
        self.labels: list[dict[str, str]] = []

    def family(self, name, desc, kind):
        pass

    def metric(self, name, labels, buckets=None):
        self.buckets[name] = buckets
        self.labels.append(labels)
        return name

    def observe(self, metric, value):
        pass

    def inc(self, metric, value=1.0):
        pass

    def set(self, metric, value):
        pass


def test_defaults_and_unset_template_values():
    cfg = config_from_parameters({"long_prompt_tokens": "${long}", "policy": "", "kv_watermark": "0.8"})
    assert cfg.long_prompt_tokens == 2048 and cfg.policy == "hybrid" and cfg.kv_watermark == 0.8


def test_lists_are_parsed():
    cfg = config_from_parameters({"priority_weights": "4, 2, 1", "priority_max_wait_ms": "5,25,100"})
    assert cfg.priority_weights == (4, 2, 1) and cfg.priority_max_wait_ms == (5.0, 25.0, 100.0)


@pytest.mark.parametrize("params,needle", [
    ({"kv_watermark": "1.5"}, "'kv_watermark'"),
    ({"kv_watermark": "abc"}, "'kv_watermark'"),
    ({"policy": "random"}, "'policy'"),
    ({"fallback_target": "gpu"}, "'fallback_target'"),
    ({"long_prompt_tokens": "100"}, "'short_prompt_tokens'"),
    ({"priority_weights": "5,3"}, "'priority_weights'"),
    ({"max_queue": "0"}, "'max_queue'"),
    ({"max_tokens_default": "2000"}, "'max_tokens_default'"),
    ({"interactive_sla_ms": "nan"}, "'interactive_sla_ms'"),
    ({"no_such_knob": "1"}, "no_such_knob"),
    ({"trtllm_capacity": "3.5"}, "'trtllm_capacity'"),
    ({"stream_interval_ms": "-1"}, "'stream_interval_ms'"),
    ({"cancel_check_ms": "-5"}, "'cancel_check_ms'"),
    ({"cancel_checks_per_s": "-1"}, "'cancel_checks_per_s'"),
    ({"latency_buckets_s": "0.1,0.05,1"}, "'latency_buckets_s'"),
    ({"tpot_buckets_s": "0,0.01"}, "'tpot_buckets_s'"),
    ({"queue_buckets_s": "0.1,inf"}, "'queue_buckets_s'"),
    ({"queue_buckets_s": "0.1,ten"}, "'queue_buckets_s'"),
])
def test_bad_values_name_the_parameter(params, needle):
    with pytest.raises(ValueError) as err:
        config_from_parameters(params)
    assert needle in str(err.value)


def test_bucket_bounds_are_parameters_and_reach_the_histograms():
    from hybrid_llm.router.metrics import RouterMetrics

    cfg = config_from_parameters({"latency_buckets_s": "0.05, 0.5, 5", "tpot_buckets_s": "0.01,0.1",
                                  "queue_buckets_s": "0.001"})
    assert cfg.latency_buckets_s == (0.05, 0.5, 5.0) and cfg.queue_buckets_s == (0.001,)

    w = RecordingWriter()
    m = RouterMetrics(w, latency_buckets=cfg.latency_buckets_s, tpot_buckets=cfg.tpot_buckets_s,
                      queue_buckets=cfg.queue_buckets_s)
    m.queue_wait(1, 0.01)
    m.ttft("vllm_backend", 0.2)
    m.finished("vllm_backend", 10, 1.0, 0.02)
    assert w.buckets["router_ttft_seconds"] == [0.05, 0.5, 5.0]
    assert w.buckets["router_e2e_seconds"] == [0.05, 0.5, 5.0]
    assert w.buckets["router_tpot_seconds"] == [0.01, 0.1]
    assert w.buckets["router_queue_wait_seconds"] == [0.001]


def test_config_is_frozen():
    cfg = RouterConfig()
    with pytest.raises(Exception):
        cfg.kv_watermark = 0.5  # type: ignore[misc]


def test_router_instances_split_capacity_queue_and_cancel_checks():
    from hybrid_llm.router.config import instance_share

    cfg = config_from_parameters({"trtllm_capacity": "32", "vllm_capacity": "65", "max_queue": "1024",
                                  "cancel_checks_per_s": "200"})
    assert instance_share(cfg, 0, 1) is cfg
    shares = [instance_share(cfg, k, 3) for k in range(3)]
    assert [s.trtllm_capacity for s in shares] == [11, 11, 10]
    assert [s.vllm_capacity for s in shares] == [22, 22, 21]
    assert sum(s.max_queue for s in shares) == 1024 and sum(s.cancel_checks_per_s for s in shares) == 200
    assert all(s.kv_watermark == cfg.kv_watermark and s.policy == cfg.policy for s in shares)
    with pytest.raises(ValueError, match=r"router_instances\) = 40: .* use at most 32"):
        instance_share(cfg, 0, 40)


@pytest.mark.parametrize("name,groups,expected", [
    ("router_bls_0_0", [{"count": 1, "kind": "KIND_CPU"}], (0, 1)),
    ("router_bls_0_2", [{"count": 4, "kind": "KIND_CPU"}], (2, 4)),
    ("", [], (0, 1)),
])
def test_instance_index_and_count_come_from_triton(name, groups, expected):
    from hybrid_llm.router.config import instance_of

    assert instance_of(name, {"instance_group": groups}) == expected


def test_instance_errors_say_what_to_change():
    from hybrid_llm.router.config import instance_of

    with pytest.raises(ValueError, match="one instance_group"):
        instance_of("router_bls_1_0", {"instance_group": [{"count": 1}, {"count": 1}]})
    with pytest.raises(ValueError, match="below 2"):
        instance_of("router_bls_0_5", {"instance_group": [{"count": 2}]})


def test_every_series_of_a_router_instance_carries_its_index():
    from hybrid_llm.router.metrics import RouterMetrics

    for instance, expected in ((None, {"model": "router_bls"}), ("1", {"model": "router_bls", "instance": "1"})):
        w = RecordingWriter()
        m = RouterMetrics(w, instance=instance)
        m.engine_gauges("vllm_backend", 100.0, 0, 0.1, 3)
        m.routed("vllm_backend", "short_prompt")
        assert w.labels and all({k: v for k, v in labels.items() if k in ("model", "instance")} == expected
                                for labels in w.labels)
