"""Every malformed request gets INVALID_ARG with a message that says what to send, while a
long stream runs alongside and completes intact (issue: resilience / bad input)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from hybrid_llm.contracts import GenerationRequest, generate_payload, router_tensors
from client.stream import stream_grpc, stream_http
from tests.server_fixture import running_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server():
    with running_server("bad_input") as s:
        yield s


def base(**kw) -> dict[str, np.ndarray]:
    return router_tensors(GenerationRequest("hello there", max_tokens=4, temperature=0.0, **kw))


def with_(name: str, value: np.ndarray | None, **kw) -> dict[str, np.ndarray]:
    t = base(**kw)
    if value is None:
        t.pop(name)
    else:
        t[name] = value
    return t


def f32(v: float) -> np.ndarray:
    return np.array([[v]], dtype=np.float32)


def i32(v: int) -> np.ndarray:
    return np.array([[v]], dtype=np.int32)


CASES = {
    "missing text_input": (with_("text_input", None), "text_input"),
    "empty text_input": (with_("text_input", np.array([[b""]], dtype=object)), "text_input"),
    "blank text_input": (with_("text_input", np.array([["   ".encode()]], dtype=object)), "text_input"),
    "non-utf8 text_input": (with_("text_input", np.array([[b"\xff\xfe bad"]], dtype=object)), "UTF-8"),
    "wrong dtype max_tokens": (with_("max_tokens", np.array([[4.0]], dtype=np.float32)), "max_tokens"),
    "batch of two": ({k: np.concatenate([v, v]) for k, v in base().items()}, "one value per request"),
    "max_tokens zero": (with_("max_tokens", i32(0)), "max_tokens"),
    "max_tokens negative": (with_("max_tokens", i32(-3)), "max_tokens"),
    "max_tokens above ceiling": (with_("max_tokens", i32(5000)), "max_tokens"),
    "prompt longer than context": (with_("text_input", np.array([[("word " * 5000).encode()]], dtype=object)), "tokens"),
    "priority zero": (with_("priority", i32(0)), "priority"),
    "priority four": (with_("priority", i32(4)), "priority"),
    "negative sla": (with_("latency_sla_ms", f32(-1.0)), "latency_sla_ms"),
    "nan sla": (with_("latency_sla_ms", f32(float("nan"))), "latency_sla_ms"),
    "nan temperature": (with_("temperature", f32(float("nan"))), "temperature"),
    "negative temperature": (with_("temperature", f32(-0.5)), "temperature"),
    "top_p zero": (with_("top_p", f32(0.0)), "top_p"),
    "top_p above one": (with_("top_p", f32(1.5)), "top_p"),
    "negative top_k": (with_("top_k", i32(-1)), "top_k"),
    "too many stop words": (with_("stop_words", np.array([[f"w{i}".encode() for i in range(40)]], dtype=object)), "stop_words"),
    "oversized stop word": (with_("stop_words", np.array([[b"x" * 1000]], dtype=object)), "stop_words"),
    "unknown input name": ({**base(), "model_name": np.array([[b"other_model"]], dtype=object)}, "model_name"),
}


def test_bad_inputs_are_rejected_while_a_long_stream_completes(server):
    long_req = GenerationRequest("a long story begins " * 20, max_tokens=400, min_tokens=400, temperature=0.0, latency_sla_ms=50.0)
    result = {}
    t = threading.Thread(target=lambda: result.update(
        r=stream_grpc(server.grpc_url, "router_bls", router_tensors(long_req), timeout_s=300)))
    t.start()
    failures = []
    for name, (tensors, needle) in CASES.items():
        r = stream_grpc(server.grpc_url, "router_bls", tensors, timeout_s=60)
        # Triton itself rejects a missing/unknown input or a wrong dtype before the model runs
        # (its gRPC stream carries no code then); everything else is the router's INVALID_ARG.
        if r.ok or needle.lower() not in (r.error or "").lower():
            failures.append((name, r.error_code, r.error))
    t.join()
    assert not failures, failures
    long = result["r"]
    assert long.ok and long.num_output_tokens == 400 or long.finish_reason == "stop", long.error
    assert stream_grpc(server.grpc_url, "router_bls", base(), timeout_s=60).ok


def test_router_raised_errors_carry_invalid_arg(server):
    for name in ("empty text_input", "non-utf8 text_input", "max_tokens zero", "priority four",
                 "nan sla", "top_p zero", "negative top_k", "too many stop words", "batch of two",
                 "prompt longer than context"):
        r = stream_grpc(server.grpc_url, "router_bls", CASES[name][0], timeout_s=60)
        assert r.error_code == "INVALID_ARG", (name, r.error)


def test_http_generate_maps_invalid_arg_to_400(server):
    body = generate_payload(GenerationRequest("hi", max_tokens=0, stream=False))
    r = stream_http(server.http_url, "router_bls", body, stream=False)
    assert r.error_code == "INVALID_ARG" and "max_tokens" in r.error
    ok = stream_http(server.http_url, "router_bls", generate_payload(GenerationRequest("hi", max_tokens=3, stream=False)), stream=False)
    assert ok.ok


def test_a_routing_policy_parameter_is_refused_when_the_server_does_not_allow_it(server):
    # The default profiles render policy_override=false: the request parameter is an error
    # that says so, not silently ignored.
    r = stream_grpc(server.grpc_url, "router_bls", base(), timeout_s=60,
                    parameters={"routing_policy": "round_robin"})
    assert r.error_code == "INVALID_ARG" and "policy_override" in r.error, r.error
