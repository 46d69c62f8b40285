"""The OpenAI frontend on a real server, driven by the official openai package and genai-perf."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import httpx
import openai
import pytest

from client.stream import stream_grpc
from frontend.launch import FrontendProcess
from hybrid_llm.contracts import GenerationRequest, router_tensors
from hybrid_llm.server import ROOT, free_ports
from tests.server_fixture import BUILD, SERVER_NICE, metric_value, running_server, scrape, wait_for

pytestmark = pytest.mark.integration
MODEL = "tiny-llama"
SHORT = "the quick brown fox jumps over the lazy dog"
VLLM = {"model": "vllm_backend"}
HANG_BOUND_S = 4.0
# Long enough (~8 s on this box) that the request is still generating when the client leaves:
# on 2 shared cores the kernel was seen to run no client process for up to ~1.8 s while vLLM
# generated, and 1,000 tokens took ~2.5 s, so a 1,000-token stream could end before the
# client had read its third chunk (CI: the stop request then found nothing in flight).
LONG_TOKENS = 4000


@pytest.fixture(scope="module")
def stack():
    # Fallback trtllm: a short prompt with an SLA goes to vllm_backend, one without to trtllm.
    # router_max_tokens_limit: the disconnect test's stream must outlast a starved test process
    with running_server("frontend", overrides={"router_fallback_target": "trtllm",
                                               "router_max_tokens_limit": str(LONG_TOKENS)}) as server:
        (port,) = free_ports(1)
        with FrontendProcess(server.grpc_url, port, MODEL, ROOT / "models" / MODEL,
                             BUILD / "frontend" / "frontend.log", nice=SERVER_NICE, metrics_url=server.metrics_url,
                             hang_bound_s=HANG_BOUND_S) as fe:
            yield server, fe


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=f"{stack[1].url}/v1", api_key="none", max_retries=0, timeout=120)


def router_counts(server, prompt: str, max_tokens: int) -> tuple[str, int, int]:
    r = stream_grpc(server.grpc_url, "router_bls", router_tensors(
        GenerationRequest(prompt, max_tokens=max_tokens, temperature=0.0, stream=False)), timeout_s=120)
    assert r.ok, r.error
    return r.text, r.num_input_tokens, r.num_output_tokens


def test_models_and_health(stack, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(f"{stack[1].url}/health").status_code == 200
    assert httpx.get(f"{stack[1].url}/health/ready").json() == {"ready": True}


def test_a_completion_and_its_usage_equal_the_routers(stack, client):
    text, n_in, n_out = router_counts(stack[0], SHORT, 12)
    c = client.completions.create(model=MODEL, prompt=SHORT, max_tokens=12, temperature=0)
    assert c.choices[0].text == text and c.object == "text_completion"
    assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (n_in, n_out)
    assert c.choices[0].finish_reason == ("length" if n_out == 12 else "stop")


def test_a_streamed_completion_has_the_same_text_usage_and_names_its_engine(stack, client):
    whole = client.completions.create(model=MODEL, prompt=SHORT, max_tokens=12, temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt=SHORT, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    final = [c for c in chunks if c.choices][-1]
    assert final.model_extra.get("backend") in ("trtllm", "vllm_backend")


def test_chat_sync_and_async_streaming_and_not(stack, client):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    full = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=10, temperature=0)
    assert full.object == "chat.completion" and full.choices[0].message.role == "assistant"
    assert full.usage.completion_tokens >= 1

    async def run() -> tuple[str, str | None, object]:
        aclient = openai.AsyncOpenAI(base_url=f"{stack[1].url}/v1", api_key="none", max_retries=0, timeout=120)
        stream = await aclient.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=10,
                                                       temperature=0, stream=True,
                                                       stream_options={"include_usage": True})
        parts, role, usage = [], None, None
        async for chunk in stream:
            if chunk.choices:
                role = role or chunk.choices[0].delta.role
                parts.append(chunk.choices[0].delta.content or "")
            usage = chunk.usage or usage
        unary = await aclient.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
        await aclient.close()
        return "".join(parts), role, (usage, unary)

    text, role, (usage, unary) = asyncio.run(run())
    assert role == "assistant" and text == full.choices[0].message.content == unary.choices[0].message.content
    assert usage.prompt_tokens == full.usage.prompt_tokens and usage.completion_tokens == full.usage.completion_tokens


def test_the_prompt_is_the_models_chat_template_rendered_once(stack, client):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ROOT / "models" / MODEL))
    messages = [{"role": "user", "content": "hello there"}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    text, n_in, _ = router_counts(stack[0], rendered, 8)
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    assert chat.usage.prompt_tokens == n_in and chat.choices[0].message.content == text


def test_stop_strings_end_the_output(stack, client):
    text = client.completions.create(model=MODEL, prompt=SHORT, max_tokens=24, temperature=0).choices[0].text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    assert stop.strip(), text
    cut = client.completions.create(model=MODEL, prompt=SHORT, max_tokens=24, temperature=0, stop=[stop])
    assert cut.choices[0].text == text[:text.index(stop)] and cut.choices[0].finish_reason == "stop"


def test_priority_and_sla_extensions_reach_the_router(stack):
    server, fe = stack
    url = f"{fe.url}/v1/completions"
    body = {"model": MODEL, "prompt": SHORT, "max_tokens": 4, "temperature": 0}
    urgent0 = metric_value(scrape(server), "router_queue_wait_seconds_count", priority="urgent")
    high0 = metric_value(scrape(server), "router_queue_wait_seconds_count", priority="high")
    r = httpx.post(url, json={**body, "priority": "urgent", "latency_sla_ms": 50}, timeout=60)
    assert r.status_code == 200 and r.headers["x-hybrid-engine"] == "vllm_backend"  # short + SLA: interactive
    r = httpx.post(url, json=body, headers={"x-priority": "high", "x-latency-sla-ms": "50"}, timeout=60)
    assert r.status_code == 200 and r.headers["x-hybrid-engine"] == "vllm_backend"
    r = httpx.post(url, json=body, timeout=60)
    assert r.headers["x-hybrid-engine"] == "trtllm"  # no SLA: the fallback
    text = scrape(server)
    assert metric_value(text, "router_queue_wait_seconds_count", priority="urgent") == urgent0 + 1
    assert metric_value(text, "router_queue_wait_seconds_count", priority="high") == high0 + 1


@pytest.mark.parametrize("body, status, needle", [
    ({"n": 2}, 400, "'n'"),
    ({"max_tokens": 5000}, 400, "max_tokens"),  # the router's INVALID_ARG, passed through
    ({"logprobs": 3}, 400, "logprobs"),
    ({"model": "gpt-x"}, 404, "gpt-x"),
])
def test_bad_requests_get_the_openai_error_shape(client, body, status, needle):
    with pytest.raises(openai.APIStatusError) as err:
        client.completions.create(**{"model": MODEL, "prompt": SHORT, **body})
    assert err.value.status_code == status
    error = err.value.body
    assert needle in error["message"] and {"message", "type", "param", "code"} <= set(error)


def test_a_disconnect_mid_stream_stops_generation_in_the_engine(stack):
    server, fe = stack
    before = scrape(server)
    aborted0 = metric_value(before, "vllm:request_aborted_total", **VLLM)
    cancelled0 = metric_value(before, "router_cancelled_total", engine="vllm_backend")
    gen0 = metric_value(before, "vllm:generation_tokens_total", **VLLM)
    # min_tokens (vLLM's extension): a random model's greedy path may reach EOS before the disconnect
    body = {"model": MODEL, "prompt": "tell me a long story", "max_tokens": LONG_TOKENS, "min_tokens": LONG_TOKENS,
            "temperature": 0,
            "stream": True, "latency_sla_ms": 50}
    chunks = 0
    with httpx.stream("POST", f"{fe.url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["x-hybrid-engine"] == "vllm_backend"
        for line in r.iter_lines():
            chunks += line.startswith("data: {")
            if chunks >= 3:
                break  # leaving the block closes the connection mid-stream
    try:
        wait_for(lambda: metric_value(scrape(server), "vllm:request_aborted_total", **VLLM) >= aborted0 + 1, 30,
                 "the engine to abort the request")
    except AssertionError as exc:  # say how far the disconnect got: router cancel, stop request, tokens
        text = scrape(server)
        raise AssertionError(
            f"{exc}; since the request: router_cancelled_total +"
            f"{metric_value(text, 'router_cancelled_total', engine='vllm_backend') - cancelled0:.0f}, "
            f"router_stop_requests_total {[l for l in text.splitlines() if l.startswith('router_stop')]}, "
            f"vllm:generation_tokens_total +{metric_value(text, 'vllm:generation_tokens_total', **VLLM) - gen0:.0f}, "
            f"vllm:num_requests_running {metric_value(text, 'vllm:num_requests_running', **VLLM):.0f}") from None
    wait_for(lambda: metric_value(scrape(server), "router_cancelled_total", engine="vllm_backend") >= cancelled0 + 1,
             30, "the router to count the cancellation")
    time.sleep(1.0)
    generated = metric_value(scrape(server), "vllm:generation_tokens_total", **VLLM) - gen0
    assert generated < LONG_TOKENS, generated
    assert metric_value(scrape(server), "vllm:num_requests_running", **VLLM) == 0


def test_genai_perf_chat_against_the_frontend_has_no_errors(stack):
    from loadtests.run_perf_analyzer import run_genai_perf

    out = ROOT / "loadtests" / "results" / "ci-genai-perf-chat"
    code, summary = run_genai_perf(stack[1].url, out, model=MODEL, concurrency=2, input_tokens=32,
                                   output_tokens=8, num_prompts=8, endpoint_type="chat", request_count=8)
    assert code == 0, (out / "genai_perf.log").read_text()[-2000:]
    assert summary["request_count"] >= 8 and summary["output_token_throughput"] > 0


def test_readiness_goes_off_while_the_router_makes_no_progress_and_comes_back(stack):
    # Deterministic stand-in for a hung router: the engine its request went to stops (SIGSTOP).
    server, fe = stack
    core = server.engine_core_pids("vllm_backend")
    assert core, "no vLLM engine core found"
    body = {"model": MODEL, "prompt": SHORT, "max_tokens": 8, "temperature": 0, "latency_sla_ms": 50}
    done: dict = {}
    os.kill(core[0], signal.SIGSTOP)
    try:
        t = threading.Thread(target=lambda: done.update(r=httpx.post(f"{fe.url}/v1/completions", json=body,
                                                                      timeout=90)))
        t.start()
        t0 = time.monotonic()
        wait_for(lambda: httpx.get(f"{fe.url}/health/ready").status_code == 503, HANG_BOUND_S + 10,
                 "readiness to go off")
        took = time.monotonic() - t0
        ready = httpx.get(f"{fe.url}/health/ready").json()
        assert "without progress" in ready["reason"] and took >= HANG_BOUND_S - 1.5
        assert "frontend_router_progress_ok 0" in httpx.get(f"{fe.url}/metrics").text
    finally:
        os.kill(core[0], signal.SIGCONT)
    t.join(timeout=60)
    assert done["r"].status_code == 200  # nothing lost: the request finishes once the engine runs again
    wait_for(lambda: httpx.get(f"{fe.url}/health/ready").status_code == 200, 15, "readiness to come back")
    assert "frontend_router_progress_ok 1" in httpx.get(f"{fe.url}/metrics").text
