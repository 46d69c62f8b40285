"""The router_bls contract: TensorRT-LLM's BLS/ensemble text interface, plus the router's
``priority`` and ``latency_sla_ms`` (no Triton imports).

One request dataclass (``GenerationRequest``) serves every side: the client packs it
(``pack`` for tensors, ``generate_payload`` for Triton's generate endpoints), the
router's job is built on it (``hybrid_llm.router.job``), and ``pack_response`` is what
router_bls answers with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hybrid_llm.contracts.spec import (EXCLUDE_INPUT, NORMAL, PRIORITY, RETURN_COUNTS, STREAM, TEXT_INPUT, TensorSpec,
                                       scalar_array, text_array)

INPUTS: tuple[TensorSpec, ...] = (
    TEXT_INPUT,
    TensorSpec("max_tokens", "int"),
    STREAM,
    TensorSpec("temperature", "float"),
    TensorSpec("top_p", "float"),
    TensorSpec("top_k", "int"),
    TensorSpec("seed", "uint"),
    TensorSpec("stop_words", "text_list"),
    EXCLUDE_INPUT,
    *RETURN_COUNTS,
    PRIORITY,
    TensorSpec("latency_sla_ms", "float"),
)
# Request parameter (not a tensor) naming a per-request routing policy, when the server
# allows it (router_bls parameter policy_override).
POLICY_PARAMETER = "routing_policy"
# The optional sampling inputs the router passes on to the engines, with their dtypes.
SAMPLING_FIELDS: tuple[tuple[str, Any], ...] = (
    ("temperature", np.float32), ("top_p", np.float32), ("top_k", np.int32), ("seed", np.uint64),
)


@dataclass
class GenerationRequest:
    """What a caller wants generated; packed per target model by the contract modules."""

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
    return_num_input_tokens: bool = True
    return_num_output_tokens: bool = True


def pack(req: GenerationRequest) -> dict[str, np.ndarray]:
    """Tensors for ``router_bls`` (batch of one: [1, 1])."""
    t: dict[str, np.ndarray] = {
        "text_input": text_array([req.prompt]),
        "max_tokens": scalar_array(req.max_tokens, np.int32),
        "stream": scalar_array(req.stream, np.bool_),
        "exclude_input_in_output": scalar_array(req.exclude_input_in_output, np.bool_),
        "priority": scalar_array(req.priority, np.int32),
    }
    for name in ("return_num_input_tokens", "return_num_output_tokens"):
        if getattr(req, name):
            t[name] = scalar_array(True, np.bool_)
    for name, dtype in (*SAMPLING_FIELDS, ("latency_sla_ms", np.float32)):
        value = getattr(req, name)
        if value is not None:
            t[name] = scalar_array(value, dtype)
    if req.stop_words:
        t["stop_words"] = text_array(req.stop_words)
    return t


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


def pack_response(text: str, engine: str, num_input_tokens: int | None = None,
                  num_output_tokens: int | None = None) -> dict[str, np.ndarray]:
    """One router_bls response: the text, the engine that served it, and the counts asked for."""
    out = {"text_output": text_array([text]), "backend": text_array([engine])}
    if num_input_tokens is not None:
        out["num_input_tokens"] = scalar_array(num_input_tokens, np.int32)
    if num_output_tokens is not None:
        out["num_output_tokens"] = scalar_array(num_output_tokens, np.int32)
    return out
