"""router_bls on a real server: routing rules, contract, streaming through both engines."""

from __future__ import annotations

import concurrent.futures as cf
from pathlib import Path

import pytest

from hybrid_llm.contracts import GenerationRequest, generate_payload, router_tensors, trtllm_tensors
from client.stream import stream_grpc, stream_http
from tests.server_fixture import metric_value, running_server, scrape

pytestmark = pytest.mark.integration
MODEL = Path(__file__).resolve().parents[2] / "models" / "tiny-llama"


@pytest.fixture(scope="module")
def server():
    with running_server("router", overrides={"router_fallback_target": "trtllm"}) as s:
        yield s


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(MODEL))


def prompt_of(tok, n: int, seed_text: str = "the quick brown fox jumps over the lazy dog ") -> str:
    """A prompt of exactly n tokens."""
    ids = tok.encode(seed_text * (n // 4 + 8), add_special_tokens=False)[:n]
    text = tok.decode(ids)
    assert len(tok.encode(text, add_special_tokens=False)) == n
    return text


def ask(server, prompt: str, **kw):
    req = GenerationRequest(prompt, **{"max_tokens": 8, "temperature": 0.0, **kw})
    return stream_grpc(server.grpc_url, "router_bls", router_tensors(req), priority=req.priority, timeout_s=120)


def test_short_interactive_prompt_goes_to_vllm(server, tok):
    r = ask(server, prompt_of(tok, 40), latency_sla_ms=100.0)
    assert r.ok, r.error
    assert r.backend == "vllm_backend" and r.text and r.num_input_tokens == 40


def test_long_prompt_goes_to_trtllm(server, tok):
    r = ask(server, prompt_of(tok, 2048), latency_sla_ms=100.0)
    assert r.ok, r.error
    assert r.backend == "trtllm" and r.num_input_tokens == 2048 and r.num_output_tokens <= 8


def test_just_below_long_threshold_is_not_long(server, tok):
    r = ask(server, prompt_of(tok, 2047))
    assert r.backend == "trtllm"  # the configured fallback, not rule 1
    before = scrape(server)
    ask(server, prompt_of(tok, 2047))
    after = scrape(server)
    key = dict(engine="trtllm", reason="fallback")
    assert metric_value(after, "router_requests_total", **key) == metric_value(before, "router_requests_total", **key) + 1


def test_middle_band_goes_to_the_configured_fallback(server, tok):
    r = ask(server, prompt_of(tok, 1000), latency_sla_ms=50.0)
    assert r.backend == "trtllm"


def test_sla_input_changes_the_decision(server, tok):
    p = prompt_of(tok, 100)
    assert ask(server, p, latency_sla_ms=120.0).backend == "vllm_backend"
    assert ask(server, p, latency_sla_ms=121.0).backend == "trtllm"
    assert ask(server, p).backend == "trtllm"  # no SLA: not interactive


@pytest.mark.parametrize("script", [
    "日本語のテキストと中文文本、東京都。", "emoji 😀🚀✨👩‍👩‍👧 party ", "café naïve façade crème brûlée ",
])
def test_trtllm_stream_equals_full_detokenized_sequence(server, tok, script):
    text = script * 2
    while len(tok.encode(text)) < 2100:
        text += script
    ids = tok.encode(text, add_special_tokens=True)
    routed = ask(server, text, max_tokens=48)
    assert routed.backend == "trtllm" and routed.ok
    direct = stream_grpc(server.grpc_url, "trtllm",
                         trtllm_tensors(ids, GenerationRequest("", max_tokens=48, temperature=0.0), end_id=2))
    assert routed.text == tok.decode(direct.token_ids, skip_special_tokens=True)
    assert "\ufffd" not in "".join(routed.chunks[:-1])
    assert len(routed.chunks) > 1


def test_non_streaming_and_exclude_input(server, tok):
    p = prompt_of(tok, 30)
    streamed = ask(server, p, latency_sla_ms=50.0)
    single = ask(server, p, latency_sla_ms=50.0, stream=False)
    assert single.ok and len(single.chunks) == 1 and single.text == streamed.text
    with_input = ask(server, p, latency_sla_ms=50.0, stream=False, exclude_input_in_output=False)
    assert with_input.text == p + streamed.text


def test_stop_words_end_the_output(server, tok):
    p = prompt_of(tok, 30)
    base = ask(server, p, latency_sla_ms=50.0, max_tokens=40)
    word = base.text[len(base.text) // 2:len(base.text) // 2 + 4]
    if not word.strip():
        pytest.skip("greedy output has no usable stop word")
    cut = base.text.index(word)
    stopped = ask(server, p, latency_sla_ms=50.0, max_tokens=40, stop_words=[word])
    assert stopped.ok and stopped.text == base.text[:cut]


def test_generate_endpoints_accept_the_contract(server, tok):
    req = GenerationRequest(prompt_of(tok, 20), max_tokens=6, temperature=0.0, stream=False, latency_sla_ms=80.0)
    single = stream_http(server.http_url, "router_bls", generate_payload(req), stream=False)
    assert single.ok, single.error
    assert single.backend == "vllm_backend" and single.text
    req.stream = True
    streamed = stream_http(server.http_url, "router_bls", generate_payload(req), stream=True)
    assert streamed.ok, streamed.error
    assert streamed.text == single.text and len(streamed.chunks) >= 1


def test_priority_classes_and_triton_priority_are_accepted(server, tok):
    for cls in (1, 2, 3):
        r = ask(server, prompt_of(tok, 20), priority=cls, latency_sla_ms=50.0)
        assert r.ok, r.error


def test_many_concurrent_streams(server, tok):
    prompts = [prompt_of(tok, 20 + i) for i in range(24)]
    with cf.ThreadPoolExecutor(24) as pool:
        results = list(pool.map(lambda p: ask(server, p, max_tokens=16, latency_sla_ms=100.0), prompts))
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert all(r.backend == "vllm_backend" and r.num_output_tokens <= 16 for r in results)


@pytest.mark.parametrize("kw,needle", [
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 100000}, "max_tokens"),
    ({"priority": 7}, "priority"), ({"latency_sla_ms": -5.0}, "latency_sla_ms"),
])
def test_invalid_requests_get_invalid_arg(server, kw, needle):
    r = ask(server, "hello", **kw)
    assert r.error_code == "INVALID_ARG" and needle in r.error
