"""The upstream projects' own client calls, unchanged, against the decoupled (default) server.

Requests are shaped as TensorRT-LLM's end_to_end_grpc_client / inflight_batcher_llm_client
and Triton vLLM backend's samples/client.py and CI send them (tests/upstream.py), with every
optional input present, streaming and not, over gRPC and HTTP generate; each output is
checked (dtype, shape, log probs <= 0, ordered timestamps, counts = tokens streamed).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.server_fixture import running_server, scrape, wait_for
from tests.upstream import (check_router_answer, check_trtllm_answer, check_vllm_answer, e2e_router_request,
                            generate, grpc_stream, ifb_trtllm_request, vllm_sample_request)

pytestmark = pytest.mark.integration
MODEL = Path(__file__).resolve().parents[2] / "models" / "tiny-llama"
PROMPT = "Once upon a time in a small village by the sea"
ENGINE_OF = {"vllm_only": "vllm_backend", "trtllm_only": "trtllm"}


@pytest.fixture(scope="module")
def server():
    with running_server("upstream", overrides={"router_policy_override": "true"}) as s:
        yield s


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(MODEL))


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("policy", ["vllm_only", "trtllm_only"])
def test_router_bls_takes_the_e2e_client_request(server, tok, stream, policy):
    inputs = e2e_router_request(PROMPT, stream, tok.eos_token_id, tok.pad_token_id or tok.eos_token_id)
    responses = grpc_stream(server.grpc_url, "router_bls", inputs, parameters={"routing_policy": policy})
    assert len(responses) > 1 if stream else len(responses) == 1, len(responses)
    check_router_answer(responses, ENGINE_OF[policy], len(tok.encode(PROMPT)))


@pytest.mark.parametrize("streaming", [True, False])
def test_trtllm_takes_the_inflight_batcher_client_request(server, tok, streaming):
    ids = tok.encode(PROMPT)
    responses = grpc_stream(server.grpc_url, "trtllm", ifb_trtllm_request(ids, streaming, tok.eos_token_id, 0))
    assert len(responses) > 1 if streaming else len(responses) == 1, len(responses)
    check_trtllm_answer(responses, len(ids))


@pytest.mark.parametrize("stream", [True, False])
def test_vllm_backend_takes_the_sample_client_request(server, tok, stream):
    responses = grpc_stream(server.grpc_url, "vllm_backend", vllm_sample_request(PROMPT, stream))
    assert len(responses) > 1 if stream else len(responses) == 1, len(responses)
    check_vllm_answer(responses, len(tok.encode(PROMPT)))


def test_vllm_backend_refuses_stream_with_the_prompt_as_upstream(server):
    from tritonclient.utils import InferenceServerException

    inputs = vllm_sample_request(PROMPT, True)
    inputs["exclude_input_in_output"] = np.array([False], dtype=bool)
    with pytest.raises(InferenceServerException, match="exclude_input_in_output"):
        grpc_stream(server.grpc_url, "vllm_backend", inputs)


def test_router_generate_stream_json_with_every_key(server, tok):
    body = {"text_input": PROMPT, "max_tokens": 12, "stream": True, "bad_words": "", "stop_words": "",
            "end_id": tok.eos_token_id, "pad_id": tok.eos_token_id, "beam_width": 1, "num_return_sequences": 1,
            "temperature": 0.7, "top_k": 40, "top_p": 0.9, "seed": 7, "repetition_penalty": 1.1,
            "presence_penalty": 0.1, "frequency_penalty": 0.1, "length_penalty": 1.0, "min_tokens": 4,
            "return_log_probs": True, "return_context_logits": False, "return_generation_logits": False,
            "return_perf_metrics": True, "exclude_input_in_output": True, "return_num_input_tokens": True,
            "return_num_output_tokens": True}
    status, events = generate(server.http_url, "router_bls", body, stream=True)
    assert status == 200, events
    assert len(events) > 1
    log_probs = [x for e in events for x in np.array(e["output_log_probs"]).reshape(-1)]
    final = events[-1]
    assert final["num_input_tokens"] == len(tok.encode(PROMPT))
    assert 4 <= final["num_output_tokens"] == len(log_probs) <= 12, (final["num_output_tokens"], len(log_probs))
    assert all(x <= 1e-6 for x in log_probs) and final["cum_log_probs"] <= 1e-6
    assert 0 < final["arrival_time_ns"] <= final["first_scheduled_time_ns"] <= final["first_token_time_ns"] \
        <= final["last_token_time_ns"]


def test_router_generate_refuses_a_misspelt_key_by_name(server):
    status, events = generate(server.http_url, "router_bls", {"text_input": PROMPT, "max_tokens": 4,
                                                               "retrun_log_probs": True}, stream=False)
    assert status == 400 and "retrun_log_probs" in json.dumps(events), events


def test_vllm_generate_as_its_ci_calls_it(server, tok):
    # the vLLM backend's README / CI: sampling parameters as a JSON string, stream false
    body = {"text_input": PROMPT, "stream": False, "exclude_input_in_output": True, "return_num_output_tokens": True,
            "sampling_parameters": json.dumps({"temperature": 0, "max_tokens": 6}), "return_finish_reason": True}
    status, events = generate(server.http_url, "vllm_backend", body, stream=False)
    assert status == 200, events
    (event,) = events
    assert event["text_output"] and 1 <= event["num_output_tokens"] <= 6 and event["finish_reason"] in ("length", "stop")


def test_vllm_generate_with_request_parameters_as_its_readme_calls_it(server):
    # no sampling_parameters input: the request's parameters are the sampling parameters
    body = {"text_input": PROMPT, "parameters": {"stream": False, "temperature": 0, "max_tokens": 5},
            "exclude_input_in_output": True, "return_num_output_tokens": True}
    status, events = generate(server.http_url, "vllm_backend", body, stream=False)
    assert status == 200, events
    (event,) = events
    assert event["text_output"] and 1 <= event["num_output_tokens"] <= 5


UPSTREAM_VLLM_FAMILIES = (  # vllm_backend src/utils/metrics.py
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total",
    "vllm:iteration_tokens_total", "vllm:time_to_first_token_seconds", "vllm:time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds", "vllm:request_inference_time_seconds",
    "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds", "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens", "vllm:request_params_n", "vllm:num_requests_running",
    "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc",
)


def test_vllm_backend_exports_upstreams_metric_families(server):
    grpc_stream(server.grpc_url, "vllm_backend", vllm_sample_request(PROMPT, False))

    def n_count() -> list[float]:
        return [float(line.rsplit(" ", 1)[1]) for line in scrape(server).splitlines()
                if line.startswith("vllm:request_params_n_count{") and 'model="vllm_backend"' in line]

    # The engine's metric writes are asynchronous: wait until this request's are in.
    wait_for(lambda: bool(n_count()) and n_count()[0] >= 1, 10, "vllm:request_params_n to count the request")
    text = scrape(server)
    declared = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    missing = [f for f in UPSTREAM_VLLM_FAMILIES if f not in declared]
    assert not missing, missing

    def bounds(family: str) -> list[str]:
        return [line.split('le="')[1].split('"')[0] for line in text.splitlines()
                if line.startswith(family + "_bucket{") and 'model="vllm_backend"' in line]

    assert bounds("vllm:request_params_n") == ["1", "2", "5", "10", "20", "+Inf"]
    prompt = bounds("vllm:request_prompt_tokens")
    assert prompt[:6] == ["1", "2", "5", "10", "20", "50"] and prompt[-1] == "+Inf", prompt
