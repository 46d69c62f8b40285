"""The vllm_backend contract: Triton's vLLM backend (text in, text out, a JSON
``sampling_parameters``), plus ``priority`` and a ``stop`` request (no Triton imports).

``pack`` builds a request from a ``GenerationRequest`` (client and router alike),
``unpack`` validates one on the model side into a ``VllmRequest``, ``pack_response``
is the model's answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from hybrid_llm.contracts.router import GenerationRequest
from hybrid_llm.contracts.sampling import sampling_kwargs_from_json
from hybrid_llm.contracts.spec import (EXCLUDE_INPUT, NORMAL, PRIORITY, RETURN_COUNTS, STREAM, TEXT_INPUT, InvalidInput,
                                       TensorSpec, own_parameters, scalar_array, text_array)

INPUTS: tuple[TensorSpec, ...] = (
    TEXT_INPUT,
    STREAM,
    TensorSpec("sampling_parameters", "text"),
    EXCLUDE_INPUT,
    TensorSpec("return_finish_reason", "bool"),
    TensorSpec("return_cumulative_logprob", "bool"),
    TensorSpec("return_logprobs", "bool"),
    *RETURN_COUNTS,
    PRIORITY,
    TensorSpec("stop", "bool"),
)
OUTPUTS: tuple[str, ...] = ("text_output", "finish_reason", "cumulative_logprob", "logprobs", "num_input_tokens",
                            "num_output_tokens")
# Upstream's answer to a stream that asks for the prompt in its output (vllm_backend's
# utils/request.py; its CI asserts the message).
STREAM_WITH_INPUT = "When streaming, `exclude_input_in_output` = False is not allowed."
# Every tensor the router may send, with its Triton dtype (checked against the rendered
# configs of every profile in tests/unit/test_profiles.py).
REQUEST_TENSORS: dict[str, str] = {
    "text_input": "TYPE_STRING", "stream": "TYPE_BOOL", "sampling_parameters": "TYPE_STRING",
    "exclude_input_in_output": "TYPE_BOOL", "return_num_input_tokens": "TYPE_BOOL",
    "return_num_output_tokens": "TYPE_BOOL", "return_finish_reason": "TYPE_BOOL",
    "priority": "TYPE_INT32", "stop": "TYPE_BOOL", "return_logprobs": "TYPE_BOOL",
    "return_cumulative_logprob": "TYPE_BOOL",
}
# GenerationRequest fields that go into ``sampling_parameters`` when set (max_tokens always).
SAMPLING_KEYS: tuple[str, ...] = ("temperature", "top_p", "top_k", "seed", "repetition_penalty", "presence_penalty",
                                   "frequency_penalty", "min_tokens")


def pack(req: GenerationRequest, return_finish_reason: bool = True) -> dict[str, np.ndarray]:
    """Tensors for ``vllm_backend`` (shape [1]); the stop words go to vLLM as ``stop``."""
    sampling: dict[str, Any] = {"max_tokens": req.max_tokens}
    for key in SAMPLING_KEYS:
        value = getattr(req, key)
        if value is not None:
            sampling[key] = value
    if req.stop_words:
        sampling["stop"] = list(req.stop_words)
    if req.bad_words:
        sampling["bad_words"] = list(req.bad_words)
    if req.end_id is not None:
        sampling["stop_token_ids"] = [req.end_id]
    if req.return_log_probs:
        sampling["logprobs"] = 0  # the sampled token's log prob
    t = {
        "text_input": text_array([req.prompt], batch=False),
        "stream": scalar_array(req.stream, np.bool_, batch=False),
        "sampling_parameters": text_array([json.dumps(sampling)], batch=False),
        "exclude_input_in_output": scalar_array(req.exclude_input_in_output, np.bool_, batch=False),
        "priority": scalar_array(req.priority, np.int32, batch=False),
    }
    if return_finish_reason:
        t["return_finish_reason"] = scalar_array(True, np.bool_, batch=False)
    for name in ("return_num_input_tokens", "return_num_output_tokens"):
        if getattr(req, name):
            t[name] = scalar_array(True, np.bool_, batch=False)
    if req.return_log_probs:
        t["return_logprobs"] = scalar_array(True, np.bool_, batch=False)
        t["return_cumulative_logprob"] = scalar_array(True, np.bool_, batch=False)
    return t


def stop_tensors() -> dict[str, np.ndarray]:
    """A ``stop`` request: aborts the in-flight request with the same request id."""
    return {"text_input": text_array(["stop"], batch=False), "stop": scalar_array(True, np.bool_, batch=False)}


@dataclass
class VllmRequest:
    """One validated vllm_backend request (model side)."""

    prompt: str
    sampling: dict[str, Any]
    stream: bool
    exclude_input: bool
    return_finish_reason: bool
    return_num_input_tokens: bool
    return_num_output_tokens: bool
    priority: int
    stop: bool
    return_cumulative_logprob: bool = False
    return_logprobs: bool = False

    @property
    def n(self) -> int:
        """Completions per request (sampling parameter ``n``)."""
        return int(self.sampling.get("n", 1) or 1)


def unpack(v: Mapping[str, Any], parameters: Mapping[str, Any] | None = None) -> VllmRequest:
    """Validate parsed ``INPUTS`` values (``parse_inputs``) into a request, or raise InvalidInput.

    Without a ``sampling_parameters`` tensor the request's own parameters are the sampling
    parameters, as in Triton's vLLM backend (its generate examples send ``"parameters":
    {"temperature": 0, ...}``); Triton's parameters and ``stream`` (an input) are left out.
    """
    priority = NORMAL if v["priority"] is None else v["priority"]
    if v["stop"]:
        return VllmRequest("", {}, False, False, False, False, False, priority, True)
    if not v["text_input"]:
        raise InvalidInput("input 'text_input' is empty; send the prompt text")
    if v["stream"] and v["exclude_input_in_output"] is False:
        raise InvalidInput(STREAM_WITH_INPUT)
    return VllmRequest(
        prompt=v["text_input"],
        sampling=sampling_kwargs_from_json(v["sampling_parameters"] if v["sampling_parameters"] is not None
                                           else json.dumps(_sampling_from(parameters or {}))),
        stream=bool(v["stream"]),
        exclude_input=bool(v["exclude_input_in_output"]),
        return_finish_reason=bool(v["return_finish_reason"]),
        return_num_input_tokens=bool(v["return_num_input_tokens"]),
        return_num_output_tokens=bool(v["return_num_output_tokens"]),
        priority=priority,
        stop=False,
        return_cumulative_logprob=bool(v["return_cumulative_logprob"]),
        return_logprobs=bool(v["return_logprobs"]),
    )


def _sampling_from(parameters: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in own_parameters(parameters).items() if k != "stream"}


@dataclass
class Completion:
    """What one response says of one completion (index ``i`` of ``n``)."""

    text: str = ""
    finish_reason: Any = None
    num_output_tokens: int = 0
    cumulative_logprob: float | None = None
    logprobs: list[dict[str, dict[str, Any]]] | None = None  # one {token id: {logprob, rank, decoded_token}} per position


def pack_response(req: VllmRequest, completions: Sequence[Completion], n_in: int) -> dict[str, np.ndarray]:
    """One vllm_backend response (one element per completion): the text and the outputs ``req``
    asked for, as upstream sends them (``finish_reason`` "None" until a completion ends,
    ``logprobs`` "null" when the ``logprobs`` sampling parameter was not set)."""
    outputs = {"text_output": text_array([c.text for c in completions], batch=False)}
    if req.return_finish_reason:
        outputs["finish_reason"] = text_array([str(c.finish_reason) for c in completions], batch=False)
    if req.return_cumulative_logprob:
        outputs["cumulative_logprob"] = np.array(
            [np.nan if c.cumulative_logprob is None else c.cumulative_logprob for c in completions], dtype=np.float32)
    if req.return_logprobs:
        outputs["logprobs"] = text_array([json.dumps(c.logprobs) for c in completions], batch=False)
    if req.return_num_input_tokens:
        outputs["num_input_tokens"] = scalar_array(n_in, np.uint32, batch=False)
    if req.return_num_output_tokens:
        outputs["num_output_tokens"] = np.array([c.num_output_tokens for c in completions], dtype=np.uint32)
    return outputs
