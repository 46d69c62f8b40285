"""Input validation at its edges for the upstream-parity inputs of the three contracts."""

from __future__ import annotations

import pytest

from hybrid_llm.contracts import trtllm, vllm
from hybrid_llm.contracts.spec import InvalidInput, parse_inputs
from hybrid_llm.router.config import RouterConfig
from hybrid_llm.router.job import build_job

import numpy as np


def job(**values):
    return build_job({"text_input": "hello", **values}, RouterConfig(), lambda t: list(range(len(t))),
                     lambda w: [len(w)])


@pytest.mark.parametrize("name", ["beam_width", "num_return_sequences"])
def test_router_beam_width_and_sequences_must_be_1(name):
    assert job(**{name: 1}).prompt == "hello"
    with pytest.raises(InvalidInput, match=f"'{name}' is 2; send 1"):
        job(**{name: 2})


@pytest.mark.parametrize("name", ["return_context_logits", "return_generation_logits"])
def test_router_logits_only_false(name):
    job(**{name: False})
    with pytest.raises(InvalidInput, match=name):
        job(**{name: True})


@pytest.mark.parametrize("values, ok", [
    ({"repetition_penalty": 0.01}, True), ({"repetition_penalty": 0.0}, False),
    ({"presence_penalty": 2.0}, True), ({"presence_penalty": 2.01}, False), ({"frequency_penalty": -2.0}, True),
    ({"frequency_penalty": -2.5}, False), ({"min_tokens": 0}, True), ({"min_tokens": 64, "max_tokens": 64}, True),
    ({"min_tokens": 65, "max_tokens": 64}, False), ({"min_tokens": -1}, False), ({"end_id": -1}, False),
    ({"length_penalty": 3.0}, True),
])
def test_router_penalty_ranges(values, ok):
    if ok:
        j = job(**values)
        for k, v in values.items():
            if k != "max_tokens":
                assert getattr(j, k) == v
    else:
        with pytest.raises(InvalidInput):
            job(**values)


def test_router_passes_the_new_inputs_to_both_engines():
    j = job(repetition_penalty=1.1, presence_penalty=0.2, frequency_penalty=0.3, min_tokens=2, end_id=7, pad_id=0,
            bad_words=["xx"], return_log_probs=True, return_perf_metrics=True)
    from hybrid_llm.router.job import engine_request
    import json
    t = engine_request(j, "trtllm", 2)
    assert t["end_id"].item() == 7 and t["pad_id"].item() == 0 and t["min_tokens"].item() == 2
    assert t["return_log_probs"].item() and t["return_perf_metrics"].item()
    assert trtllm.decode_stop_words_list(t["bad_words_list"].reshape(-1).tolist()) == [[2]]
    v = engine_request(j, "vllm_backend", 2)
    sampling = json.loads(v["sampling_parameters"][0])
    assert sampling["bad_words"] == ["xx"] and sampling["stop_token_ids"] == [7] and sampling["logprobs"] == 0
    assert sampling["repetition_penalty"] == pytest.approx(1.1) and v["return_logprobs"].item()


def _trt(**extra):
    raw = {"input_ids": np.array([[1, 2, 3]], np.int32), "input_lengths": np.array([[3]], np.int32),
           "request_output_len": np.array([[8]], np.int32), **extra}
    return trtllm.unpack(parse_inputs(raw, trtllm.INPUTS))


def test_trtllm_top_p_0_and_top_k_0_mean_not_set():
    r = _trt(runtime_top_p=np.array([[0.0]], np.float32), runtime_top_k=np.array([[0]], np.int32))
    assert "top_p" not in r.sampling and "top_k" not in r.sampling
    r = _trt(runtime_top_p=np.array([[-1.0]], np.float32))
    assert "top_p" not in r.sampling
    assert _trt(runtime_top_p=np.array([[0.5]], np.float32)).sampling["top_p"] == 0.5
    with pytest.raises(InvalidInput, match="top_k"):
        _trt(runtime_top_k=np.array([[-1]], np.int32))


def test_trtllm_beam_width_sequences_and_refused_inputs():
    assert _trt(beam_width=np.array([[1]], np.int32), num_return_sequences=np.array([[1]], np.int32)).max_new == 8
    with pytest.raises(InvalidInput, match="beam_width"):
        _trt(beam_width=np.array([[2]], np.int32))
    with pytest.raises(InvalidInput, match="num_return_sequences"):
        _trt(num_return_sequences=np.array([[2]], np.int32))
    with pytest.raises(InvalidInput, match="'lora_task_id' is not supported \\(LoRA\\)"):
        _trt(lora_task_id=np.array([[3]], np.uint64))


def test_trtllm_flags_and_single_token_bad_words():
    r = _trt(return_log_probs=np.array([[True]]), return_num_input_tokens=np.array([[True]]),
             return_num_output_tokens=np.array([[True]]),
             bad_words_list=trtllm.encode_stop_words_list([[5], [9]]))
    assert r.log_probs and r.num_input_tokens and r.num_output_tokens
    assert r.sampling["logit_bias"] == {5: -100.0, 9: -100.0}
    with pytest.raises(InvalidInput, match="several tokens"):
        _trt(bad_words_list=trtllm.encode_stop_words_list([[5, 6]]))
    out = trtllm.pack_response(r, [4, 5], [-0.5, -1.0], -1.5)
    assert out["output_log_probs"].shape == (1, 1, 2) and out["cum_log_probs"].shape == (1, 1)
    assert out["num_input_tokens"].item() == 3 and out["num_output_tokens"].item() == 2


def _vllm(**extra):
    raw = {"text_input": np.array([b"hi"], object), **extra}
    return vllm.unpack(parse_inputs(raw, vllm.INPUTS))


def test_vllm_stream_with_the_prompt_is_refused_as_upstream():
    with pytest.raises(InvalidInput, match="When streaming, `exclude_input_in_output` = False is not allowed."):
        _vllm(stream=np.array([True]), exclude_input_in_output=np.array([False]))
    assert _vllm(stream=np.array([True])).stream  # absent: not prepended, accepted


@pytest.mark.parametrize("params, ok", [({"n": 2}, True), ({"n": 17}, False), ({"logprobs": 2}, True),
                                        ({"logprobs": 21}, False), ({"presence_penalty": "3"}, False),
                                        ({"temperature": "0.1", "top_p": "0.95", "max_tokens": "100"}, True)])
def test_vllm_sampling_parameters_edges(params, ok):
    import json
    tensor = {"sampling_parameters": np.array([json.dumps(params).encode()], object)}
    if ok:
        assert _vllm(**tensor).sampling
    else:
        with pytest.raises(InvalidInput):
            _vllm(**tensor)


def test_vllm_request_parameters_are_the_sampling_parameters_without_the_tensor():
    raw = {"text_input": np.array([b"hi"], object)}
    params = {"temperature": 0, "max_tokens": "6", "stream": False, "priority": 1, "timeout": 5,
              "triton_enable_empty_final_response": True, "cancel_via_stop": True}
    assert vllm.unpack(parse_inputs(raw, vllm.INPUTS), params).sampling == {"temperature": 0.0, "max_tokens": 6}
    with pytest.raises(InvalidInput, match=r"unknown sampling parameter\(s\) \['temprature'\]"):
        vllm.unpack(parse_inputs(raw, vllm.INPUTS), {"temprature": 0})
    tensor = {**raw, "sampling_parameters": np.array([b'{"max_tokens": 3}'], object)}
    assert vllm.unpack(parse_inputs(tensor, vllm.INPUTS), {"temperature": 0}).sampling == {"max_tokens": 3}


def test_vllm_response_as_upstream_sends_it():
    r = _vllm(return_finish_reason=np.array([True]), return_logprobs=np.array([True]),
              return_cumulative_logprob=np.array([True]), return_num_output_tokens=np.array([True]))
    out = vllm.pack_response(r, [vllm.Completion("a", None, 1, -0.5, None), vllm.Completion("b", "length", 2, -1.0, [])], 3)
    assert out["finish_reason"].tolist() == [b"None", b"length"] and out["logprobs"].tolist() == [b"null", b"[]"]
    assert out["num_output_tokens"].tolist() == [1, 2] and out["cumulative_logprob"].dtype == np.float32
