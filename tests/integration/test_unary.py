"""Unary mode (profile value decoupled_mode=false): router_bls and both engine models answer
plain gRPC ModelInfer and HTTP /infer, as upstream CI scripts call them, one response each.

One server for the module, rendered non-decoupled, with per-request routing policies
allowed so each engine is reached through the router. Requests are shaped as the upstream
clients send them (tests/upstream.py); every output is checked.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.server_fixture import running_server
from tests.upstream import (check_router_answer, check_trtllm_answer, check_vllm_answer, e2e_router_request,
                            generate, ifb_trtllm_request, unary, vllm_sample_request)

pytestmark = pytest.mark.integration
MODEL = __import__("pathlib").Path(__file__).resolve().parents[2] / "models" / "tiny-llama"
PROMPT = "The history of the printing press begins"
ENGINE_OF = {"vllm_only": "vllm_backend", "trtllm_only": "trtllm"}


@pytest.fixture(scope="module")
def server():
    with running_server("unary", overrides={"decoupled_mode": "false", "router_policy_override": "true"}) as s:
        yield s


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(MODEL))


def _url(server, protocol: str) -> str:
    return server.grpc_url if protocol == "grpc" else server.http_url


def test_models_are_rendered_non_decoupled(server):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url)
    for model in ("router_bls", "vllm_backend", "trtllm"):
        policy = client.get_model_config(model).get("model_transaction_policy", {})
        assert not policy.get("decoupled", False), (model, policy)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("policy", ["vllm_only", "trtllm_only"])
def test_router_answers_model_infer_with_every_upstream_input(server, tok, protocol, policy):
    inputs = e2e_router_request(PROMPT, False, tok.eos_token_id, tok.pad_token_id or tok.eos_token_id)
    out = unary(_url(server, protocol), "router_bls", inputs, protocol, parameters={"routing_policy": policy})
    check_router_answer([out], ENGINE_OF[policy], len(tok.encode(PROMPT)))


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_trtllm_answers_model_infer_as_tensorrt_llm(server, tok, protocol):
    ids = tok.encode(PROMPT)
    out = unary(_url(server, protocol), "trtllm", ifb_trtllm_request(ids, False, tok.eos_token_id, 0), protocol)
    check_trtllm_answer([out], len(ids))


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_vllm_answers_model_infer_as_the_vllm_backend(server, tok, protocol):
    out = unary(_url(server, protocol), "vllm_backend", vllm_sample_request(PROMPT, False), protocol)
    text = check_vllm_answer([out], len(tok.encode(PROMPT)))
    assert text.strip()


def test_vllm_without_exclude_input_returns_the_prompt_first(server):
    inputs = vllm_sample_request(PROMPT, False)
    inputs["exclude_input_in_output"] = np.array([False], dtype=bool)
    out = unary(server.grpc_url, "vllm_backend", inputs, "grpc")
    assert out["text_output"].reshape(-1)[0].decode().startswith(PROMPT)


@pytest.mark.parametrize("model", ["router_bls", "vllm_backend", "trtllm"])
def test_stream_true_is_refused_with_what_to_send(server, tok, model):
    from tritonclient.utils import InferenceServerException

    if model == "router_bls":
        inputs = e2e_router_request(PROMPT, True, tok.eos_token_id, 0)
    elif model == "trtllm":
        inputs = ifb_trtllm_request(tok.encode(PROMPT), True, tok.eos_token_id, 0)
    else:
        inputs = vllm_sample_request(PROMPT, True)
    with pytest.raises(InferenceServerException) as err:
        unary(server.grpc_url, model, inputs, "grpc")
    message = str(err.value)
    assert "decoupled_mode" in message and "stream" in message.lower(), message


def test_router_cuts_at_a_stop_word_in_unary_mode(server, tok):
    inputs = e2e_router_request(PROMPT, False, tok.eos_token_id, 0)
    first = unary(server.grpc_url, "router_bls", inputs, "grpc", parameters={"routing_policy": "vllm_only"})
    text = first["text_output"].reshape(-1)[0].decode()
    word = text.strip().split()[0] if text.strip() else ""
    assert word, text
    inputs = e2e_router_request(PROMPT, False, tok.eos_token_id, 0)
    inputs["stop_words"] = np.array([[word]], dtype=object)
    inputs["seed"] = np.array([[1234]], dtype=np.uint64)
    cut = unary(server.grpc_url, "router_bls", inputs, "grpc", parameters={"routing_policy": "vllm_only"})
    cut_text = cut["text_output"].reshape(-1)[0].decode()
    assert word not in cut_text and text.startswith(cut_text), (word, text, cut_text)


def test_http_generate_works_on_the_unary_router(server):
    body = {"text_input": PROMPT, "max_tokens": 8, "stream": False, "return_log_probs": True,
            "return_perf_metrics": True, "beam_width": 1, "exclude_input_in_output": True,
            "return_num_output_tokens": True}
    status, events = generate(server.http_url, "router_bls", body, stream=False)
    assert status == 200, events
    (event,) = events
    assert event["text_output"] and 1 <= event["num_output_tokens"] <= 8
    assert event["arrival_time_ns"] <= event["first_token_time_ns"] <= event["last_token_time_ns"]
    assert all(x <= 1e-6 for x in np.array(event["output_log_probs"]).reshape(-1))
    status, events = generate(server.http_url, "router_bls", {**body, "beam_widht": 1},
                              stream=False)
    assert status == 400 and "beam_widht" in json.dumps(events), events
