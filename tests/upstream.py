"""Requests shaped as the upstream projects' own clients send them, and their raw answers.

The tensors are built by hand here, as TensorRT-LLM's ``end_to_end_grpc_client.py`` /
``inflight_batcher_llm_client.py`` and Triton vLLM backend's ``samples/client.py`` build
theirs (one ``np.array`` per input, ``tritonclient`` ``InferInput`` with
``np_to_triton_dtype``), not with the project's packing helpers: these tests check that a
user's unchanged upstream client works. The answers are kept whole (every output of every
response), so each output's dtype, shape and value can be checked.
"""

from __future__ import annotations

import json
import queue
import urllib.error
import urllib.request
import uuid
from typing import Any

import numpy as np


def _inputs(tensors: dict[str, np.ndarray], protocol: str) -> list[Any]:
    """``prepare_tensor`` as the upstream clients write it."""
    from tritonclient.utils import np_to_triton_dtype

    if protocol == "http":
        import tritonclient.http as mod
    else:
        import tritonclient.grpc as mod
    out = []
    for name, array in tensors.items():
        t = mod.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        t.set_data_from_numpy(array)
        out.append(t)
    return out


def e2e_router_request(prompt: str, stream: bool, end_id: int, pad_id: int) -> dict[str, np.ndarray]:
    """Every optional input of tensorrt_llm_bls that a text client sends, each as a [1, 1] array."""
    def one(value: Any, dtype: Any) -> np.ndarray:
        return np.array([[value]], dtype=dtype)

    return {
        "text_input": one(prompt, object), "max_tokens": one(12, np.int32), "bad_words": one("", object),
        "stop_words": one("", object), "end_id": one(end_id, np.int32), "pad_id": one(pad_id, np.int32),
        "beam_width": one(1, np.int32), "num_return_sequences": one(1, np.int32),
        "temperature": one(0.7, np.float32), "top_k": one(40, np.int32), "top_p": one(0.9, np.float32),
        "seed": one(1234, np.uint64), "repetition_penalty": one(1.1, np.float32),
        "presence_penalty": one(0.1, np.float32), "frequency_penalty": one(0.1, np.float32),
        "length_penalty": one(1.0, np.float32), "min_tokens": one(4, np.int32),
        "return_log_probs": one(True, bool), "return_context_logits": one(False, bool),
        "return_generation_logits": one(False, bool), "return_perf_metrics": one(True, bool),
        "exclude_input_in_output": one(True, bool), "return_num_input_tokens": one(True, bool),
        "return_num_output_tokens": one(True, bool), "stream": one(stream, bool),
    }


def ifb_trtllm_request(ids: list[int], streaming: bool, end_id: int, pad_id: int) -> dict[str, np.ndarray]:
    """inflight_batcher_llm_client.py's tensorrt_llm request, with the optional inputs it can set;
    runtime_top_k 0 and runtime_top_p 0 are upstream's "not set"."""
    def one(value: Any, dtype: Any) -> np.ndarray:
        return np.array([[value]], dtype=dtype)

    return {
        "input_ids": np.array([ids], dtype=np.int32), "input_lengths": one(len(ids), np.int32),
        "request_output_len": one(12, np.int32), "end_id": one(end_id, np.int32), "pad_id": one(pad_id, np.int32),
        "beam_width": one(1, np.int32), "temperature": one(0.7, np.float32), "runtime_top_k": one(0, np.int32),
        "runtime_top_p": one(0.0, np.float32), "repetition_penalty": one(1.1, np.float32),
        "presence_penalty": one(0.1, np.float32), "frequency_penalty": one(0.1, np.float32),
        "min_tokens": one(4, np.int32), "seed": one(1234, np.uint64), "len_penalty": one(1.0, np.float32),
        "num_return_sequences": one(1, np.int32), "return_log_probs": one(True, bool),
        "return_context_logits": one(False, bool), "return_generation_logits": one(False, bool),
        "return_perf_metrics": one(True, bool), "return_num_input_tokens": one(True, bool),
        "return_num_output_tokens": one(True, bool), "exclude_input_in_output": one(True, bool),
        "streaming": one(streaming, bool),
    }


def vllm_sample_request(prompt: str, stream: bool) -> dict[str, np.ndarray]:
    """samples/client.py's request (shape [1] each; sampling values as strings, as it sends them),
    with every optional input of the vLLM backend's config."""
    params = {"temperature": "0.7", "top_p": "0.95", "max_tokens": "12", "seed": "1234", "min_tokens": "4",
              "logprobs": "1", "n": "1"}
    return {
        "text_input": np.array([prompt.encode()], dtype=np.object_), "stream": np.array([stream], dtype=bool),
        "sampling_parameters": np.array([json.dumps(params)], dtype=np.object_),
        "exclude_input_in_output": np.array([True], dtype=bool),
        "return_finish_reason": np.array([True], dtype=bool),
        "return_cumulative_logprob": np.array([True], dtype=bool),
        "return_logprobs": np.array([True], dtype=bool),
        "return_num_input_tokens": np.array([True], dtype=bool),
        "return_num_output_tokens": np.array([True], dtype=bool),
    }


def _outputs(res: Any, names: list[str]) -> dict[str, np.ndarray]:
    return {n: res.as_numpy(n) for n in names if res.as_numpy(n) is not None}


def grpc_stream(url: str, model: str, tensors: dict[str, np.ndarray], timeout_s: float = 120.0,
                parameters: dict[str, Any] | None = None) -> list[dict[str, np.ndarray]]:
    """ModelStreamInfer as the upstream clients use it: every non-empty response's outputs, in order."""
    import tritonclient.grpc as grpcclient

    answers: "queue.Queue[tuple[Any, Any]]" = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    responses: list[dict[str, np.ndarray]] = []
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer(model, _inputs(tensors, "grpc"), request_id=uuid.uuid4().hex,
                                  enable_empty_final_response=True, parameters=parameters)
        while True:
            res, err = answers.get(timeout=timeout_s)
            if err is not None:
                raise err
            response = res.get_response()
            names = [o.name for o in response.outputs]
            if names:
                responses.append(_outputs(res, names))
            final = response.parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                return responses
    finally:
        client.stop_stream()
        client.close()


def unary(url: str, model: str, tensors: dict[str, np.ndarray], protocol: str,
          parameters: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """One gRPC ModelInfer or HTTP /v2/models/<model>/infer call: every output of its one response."""
    if protocol == "http":
        import tritonclient.http as mod
    else:
        import tritonclient.grpc as mod
    client = mod.InferenceServerClient(url)
    try:
        res = client.infer(model, _inputs(tensors, protocol), parameters=parameters)
        response = res.get_response()
        names = ([o["name"] for o in response.get("outputs", [])] if protocol == "http"
                 else [o.name for o in response.outputs])
        return _outputs(res, names)
    finally:
        client.close()


def generate(base_url: str, model: str, body: dict[str, Any], stream: bool,
             timeout_s: float = 120.0) -> tuple[int, list[dict[str, Any]]]:
    """POST Triton's generate / generate_stream: (HTTP status, the JSON events or the error body)."""
    endpoint = "generate_stream" if stream else "generate"
    req = urllib.request.Request(f"http://{base_url}/v2/models/{model}/{endpoint}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw = resp.read().decode()
            status = resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read().decode(errors="replace"), exc.code
    if stream and status == 200:
        return status, [json.loads(line[5:]) for line in raw.splitlines() if line.startswith("data:")]
    text = raw[5:].strip() if raw.startswith("data:") else raw
    return status, [json.loads(text)]


def _scalar(out: dict[str, np.ndarray], name: str) -> Any:
    return out[name].reshape(-1)[0]


def check_router_answer(responses: list[dict[str, np.ndarray]], engine: str, n_prompt: int) -> str:
    """Check router_bls's answer to ``e2e_router_request`` (streamed or one response); its text."""
    from hybrid_llm.contracts.router import PERF_OUTPUTS

    assert responses, "no response with outputs"
    final = responses[-1]
    for out in responses:
        assert out["text_output"].dtype == np.object_ and out["text_output"].shape == (1, 1)
        assert _scalar(out, "backend").decode() == engine
        assert out["output_log_probs"].dtype == np.float32 and out["output_log_probs"].ndim == 3
        assert out["cum_log_probs"].dtype == np.float32 and out["cum_log_probs"].shape == (1, 1)
    log_probs = np.concatenate([out["output_log_probs"].reshape(-1) for out in responses])
    assert np.isfinite(log_probs).all() and (log_probs <= 1e-6).all(), log_probs
    n_out = int(_scalar(final, "num_output_tokens"))
    assert final["num_output_tokens"].dtype == np.int32 and final["num_input_tokens"].dtype == np.int32
    assert int(_scalar(final, "num_input_tokens")) == n_prompt
    assert 4 <= n_out <= 12, n_out  # min_tokens 4, max_tokens 12
    assert len(log_probs) == n_out, (len(log_probs), n_out)
    cum = float(_scalar(final, "cum_log_probs"))
    assert cum <= 1e-6 and abs(cum - float(log_probs.sum())) <= 1e-3 + 1e-2 * n_out, (cum, log_probs.sum())
    for name, dtype in PERF_OUTPUTS.items():
        assert final[name].dtype == dtype and final[name].shape == (1, 1), (name, final[name].dtype)
    t = [int(_scalar(final, k)) for k in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
                                          "last_token_time_ns")]
    assert 0 < t[0] <= t[1] <= t[2] <= t[3], t
    assert all(int(_scalar(final, k)) >= 0 for k in ("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks",
                                                    "kv_cache_alloc_total_blocks"))
    assert float(_scalar(final, "acceptance_rate")) == 0.0 and int(_scalar(final, "total_draft_tokens")) == 0
    text = "".join(_scalar(out, "text_output").decode() for out in responses)
    assert text.strip(), "no text"
    return text


def check_trtllm_answer(responses: list[dict[str, np.ndarray]], n_prompt: int) -> list[int]:
    """Check trtllm's answer to ``ifb_trtllm_request``; the new token ids."""
    from hybrid_llm.contracts.router import PERF_OUTPUTS

    assert responses
    ids: list[int] = []
    log_probs: list[float] = []
    for out in responses:
        assert out["output_ids"].dtype == np.int32 and out["output_ids"].ndim == 3 and out["output_ids"].shape[:2] == (1, 1)
        assert out["sequence_length"].dtype == np.int32
        assert out["output_log_probs"].dtype == np.float32 and out["cum_log_probs"].dtype == np.float32
        ids += out["output_ids"].reshape(-1).tolist()
        log_probs += out["output_log_probs"].reshape(-1).tolist()
    final = responses[-1]
    n_out = int(_scalar(final, "num_output_tokens"))
    assert int(_scalar(final, "num_input_tokens")) == n_prompt
    assert 4 <= len(ids) <= 12 and (n_out == len(ids) or sum(int(_scalar(o, "num_output_tokens"))
                                                             for o in responses) == len(ids)), (n_out, len(ids))
    assert len(log_probs) == len(ids) and all(x <= 1e-6 for x in log_probs), log_probs
    assert float(_scalar(final, "cum_log_probs")) <= 1e-6
    for name, dtype in PERF_OUTPUTS.items():
        assert final[name].dtype == dtype, (name, final[name].dtype)
    t = [int(_scalar(final, k)) for k in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
                                          "last_token_time_ns")]
    assert 0 < t[0] <= t[1] <= t[2] <= t[3], t
    return ids


def check_vllm_answer(responses: list[dict[str, np.ndarray]], n_prompt: int) -> str:
    """Check vllm_backend's answer to ``vllm_sample_request``; the text."""
    assert responses
    n_total, text = 0, ""
    for i, out in enumerate(responses):
        assert out["text_output"].dtype == np.object_
        n = int(out["num_output_tokens"].reshape(-1)[0])
        assert out["num_output_tokens"].dtype == np.uint32 and out["num_input_tokens"].dtype == np.uint32
        positions = json.loads(out["logprobs"].reshape(-1)[0])
        assert len(positions) == n, (positions, n)
        for position in positions:
            assert all(v["logprob"] <= 1e-6 for v in position.values()), position
        assert float(out["cumulative_logprob"].reshape(-1)[0]) <= 1e-6
        reason = out["finish_reason"].reshape(-1)[0].decode()
        assert (reason in ("length", "stop")) if i == len(responses) - 1 else reason == "None", (i, reason)
        n_total += n
        text += out["text_output"].reshape(-1)[0].decode()
        assert int(out["num_input_tokens"].reshape(-1)[0]) == n_prompt
    assert 4 <= n_total <= 12, n_total
    return text
