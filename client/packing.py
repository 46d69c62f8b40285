"""The one request-packing helper: router, vllm_backend and trtllm requests as tensors.

Used by the CLI, the tests and the load tests. Values are packed into numpy arrays
shaped the way each model's config expects (router and trtllm: a batch of one,
``[1, 1]``; vllm_backend: ``[1]``), then wrapped as tritonclient inputs for the
chosen protocol.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

URGENT, HIGH, NORMAL = 1, 2, 3
PRIORITY_NAMES = {"urgent": URGENT, "high": HIGH, "normal": NORMAL}

_DTYPES = {
    np.dtype(np.object_): "BYTES",
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64",
    np.dtype(np.uint32): "UINT32",
    np.dtype(np.uint64): "UINT64",
    np.dtype(np.float32): "FP32",
}


@dataclass
class GenerationRequest:
    """What a caller wants generated; packed per target model by the functions below."""

    prompt: str
    max_tokens: int = 64
    stream: bool = True
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop_words: list[str] = field(default_factory=list)
    exclude_input_in_output: bool = True
    priority: int = NORMAL
    latency_sla_ms: float | None = None
    return_num_tokens: bool = True


def _text(values: Sequence[str], batch: bool) -> np.ndarray:
    arr = np.array([v.encode("utf-8") for v in values], dtype=np.object_)
    return arr.reshape(1, -1) if batch else arr


def _scalar(value: Any, dtype: Any, batch: bool) -> np.ndarray:
    arr = np.array([value], dtype=dtype)
    return arr.reshape(1, 1) if batch else arr


def router_tensors(req: GenerationRequest) -> dict[str, np.ndarray]:
    """Tensors for ``router_bls`` (TensorRT-LLM BLS contract, batch of one: [1, 1])."""
    t: dict[str, np.ndarray] = {
        "text_input": _text([req.prompt], True),
        "max_tokens": _scalar(req.max_tokens, np.int32, True),
        "stream": _scalar(req.stream, np.bool_, True),
        "exclude_input_in_output": _scalar(req.exclude_input_in_output, np.bool_, True),
        "priority": _scalar(req.priority, np.int32, True),
    }
    if req.return_num_tokens:
        t["return_num_input_tokens"] = _scalar(True, np.bool_, True)
        t["return_num_output_tokens"] = _scalar(True, np.bool_, True)
    optional = (("temperature", req.temperature, np.float32), ("top_p", req.top_p, np.float32),
                ("top_k", req.top_k, np.int32), ("seed", req.seed, np.uint64),
                ("latency_sla_ms", req.latency_sla_ms, np.float32))
    for name, value, dtype in optional:
        if value is not None:
            t[name] = _scalar(value, dtype, True)
    if req.stop_words:
        t["stop_words"] = _text(req.stop_words, True)
    return t


def vllm_tensors(req: GenerationRequest) -> dict[str, np.ndarray]:
    """Tensors for ``vllm_backend`` (the official vLLM backend contract, shape [1])."""
    sampling: dict[str, Any] = {"max_tokens": req.max_tokens}
    for key in ("temperature", "top_p", "top_k", "seed"):
        value = getattr(req, key)
        if value is not None:
            sampling[key] = value
    if req.stop_words:
        sampling["stop"] = list(req.stop_words)
    t = {
        "text_input": _text([req.prompt], False),
        "stream": _scalar(req.stream, np.bool_, False),
        "sampling_parameters": _text([json.dumps(sampling)], False),
        "exclude_input_in_output": _scalar(req.exclude_input_in_output, np.bool_, False),
        "priority": _scalar(req.priority, np.int32, False),
        "return_finish_reason": _scalar(True, np.bool_, False),
    }
    if req.return_num_tokens:
        t["return_num_input_tokens"] = _scalar(True, np.bool_, False)
        t["return_num_output_tokens"] = _scalar(True, np.bool_, False)
    return t


def vllm_stop_tensors() -> dict[str, np.ndarray]:
    """A ``vllm_backend`` stop request: aborts the in-flight request with the same request id."""
    return {"text_input": _text(["stop"], False), "stop": _scalar(True, np.bool_, False)}


def trtllm_tensors(input_ids: Sequence[int], req: GenerationRequest, end_id: int | None = None) -> dict[str, np.ndarray]:
    """Tensors for ``trtllm`` (the tensorrtllm backend contract) from prompt token ids."""
    t = {
        "input_ids": np.array([list(input_ids)], dtype=np.int32),
        "input_lengths": _scalar(len(input_ids), np.int32, True),
        "request_output_len": _scalar(req.max_tokens, np.int32, True),
        "streaming": _scalar(req.stream, np.bool_, True),
        "exclude_input_in_output": _scalar(req.exclude_input_in_output, np.bool_, True),
    }
    if end_id is not None:
        t["end_id"] = _scalar(end_id, np.int32, True)
        t["pad_id"] = _scalar(end_id, np.int32, True)
    optional = (("temperature", req.temperature, np.float32), ("runtime_top_p", req.top_p, np.float32),
                ("runtime_top_k", req.top_k, np.int32), ("seed", req.seed, np.uint64))
    for name, value, dtype in optional:
        if value is not None:
            t[name] = _scalar(value, dtype, True)
    return t


def triton_dtype(array: np.ndarray) -> str:
    """The Triton dtype name of a numpy array."""
    try:
        return _DTYPES[array.dtype]
    except KeyError:
        raise ValueError(f"no Triton dtype for numpy {array.dtype}") from None


def to_infer_inputs(tensors: dict[str, np.ndarray], protocol: str = "grpc") -> list[Any]:
    """Wrap numpy tensors as tritonclient ``InferInput`` objects (grpc or http)."""
    if protocol == "grpc":
        import tritonclient.grpc as mod
    elif protocol == "http":
        import tritonclient.http as mod
    else:
        raise ValueError(f"protocol must be 'grpc' or 'http', not {protocol!r}")
    inputs = []
    for name, array in tensors.items():
        inp = mod.InferInput(name, list(array.shape), triton_dtype(array))
        inp.set_data_from_numpy(array)
        inputs.append(inp)
    return inputs


def generate_payload(req: GenerationRequest) -> dict[str, Any]:
    """JSON body for Triton's ``/v2/models/router_bls/generate[_stream]`` endpoints."""
    body: dict[str, Any] = {
        "text_input": req.prompt,
        "max_tokens": req.max_tokens,
        "stream": req.stream,
        "exclude_input_in_output": req.exclude_input_in_output,
        "priority": req.priority,
    }
    for key in ("temperature", "top_p", "top_k", "seed", "latency_sla_ms"):
        value = getattr(req, key)
        if value is not None:
            body[key] = value
    if req.stop_words:
        body["stop_words"] = list(req.stop_words)
    return body
