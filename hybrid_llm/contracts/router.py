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

from hybrid_llm.contracts.spec import (EXCLUDE_INPUT, NORMAL, PRIORITY, RETURN_COUNTS, STREAM, TEXT_INPUT,
                                       TRITON_PARAMETERS, TensorSpec, scalar_array, text_array)

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
    # tensorrt_llm's ``stop`` (the core model's, not the BLS's): stop the in-flight request
    # with this request's id; for clients whose stream cancellation may not reach the model.
    TensorSpec("stop", "bool"),
    # The rest of TensorRT-LLM's tensorrt_llm_bls inputs a text client sends (TensorRT-LLM 0193dbd).
    TensorSpec("bad_words", "text_list"),
    TensorSpec("end_id", "int"),
    TensorSpec("pad_id", "int"),
    TensorSpec("repetition_penalty", "float"),
    TensorSpec("presence_penalty", "float"),
    TensorSpec("frequency_penalty", "float"),
    TensorSpec("length_penalty", "float"),
    TensorSpec("min_tokens", "int"),
    TensorSpec("beam_width", "int"),
    TensorSpec("num_return_sequences", "int"),
    TensorSpec("return_log_probs", "bool"),
    TensorSpec("return_context_logits", "bool"),
    TensorSpec("return_generation_logits", "bool"),
    TensorSpec("return_perf_metrics", "bool"),
)
# Perf-metric outputs (return_perf_metrics) with their dtypes, as tensorrt_llm_bls declares them.
PERF_OUTPUTS: dict[str, Any] = {
    "kv_cache_alloc_new_blocks": np.int32, "kv_cache_reused_blocks": np.int32, "kv_cache_alloc_total_blocks": np.int32,
    "arrival_time_ns": np.int64, "first_scheduled_time_ns": np.int64, "first_token_time_ns": np.int64,
    "last_token_time_ns": np.int64, "acceptance_rate": np.float32, "total_accepted_draft_tokens": np.int32,
    "total_draft_tokens": np.int32,
}
# Request parameter (not a tensor) naming a per-request routing policy, when the server
# allows it (router_bls parameter policy_override).
POLICY_PARAMETER = "routing_policy"
# The optional sampling inputs the router passes on to the engines, with their dtypes.
SAMPLING_FIELDS: tuple[tuple[str, Any], ...] = (
    ("temperature", np.float32), ("top_p", np.float32), ("top_k", np.int32), ("seed", np.uint64),
    ("repetition_penalty", np.float32), ("presence_penalty", np.float32), ("frequency_penalty", np.float32),
    ("length_penalty", np.float32), ("min_tokens", np.int32),
)
# Request parameters (not tensors) router_bls reads; Triton's own are ignored. Any other
# parameter (e.g. a misspelt key in the JSON of the generate endpoints, which Triton
# turns into a parameter) gets INVALID_ARG.
KNOWN_PARAMETERS = frozenset({POLICY_PARAMETER, *TRITON_PARAMETERS})


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
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    length_penalty: float | None = None  # beam search only: no effect at beam width 1
    min_tokens: int | None = None
    bad_words: list[str] = field(default_factory=list)
    end_id: int | None = None
    pad_id: int | None = None
    return_log_probs: bool = False
    return_perf_metrics: bool = False


#: The request flags that turn on router_bls's optional outputs (GenerationRequest fields of the same names).
RETURN_FLAGS: tuple[str, ...] = ("return_num_input_tokens", "return_num_output_tokens", "return_log_probs",
                                 "return_perf_metrics")


def pack(req: GenerationRequest) -> dict[str, np.ndarray]:
    """Tensors for ``router_bls`` (batch of one: [1, 1])."""
    t: dict[str, np.ndarray] = {
        "text_input": text_array([req.prompt]),
        "max_tokens": scalar_array(req.max_tokens, np.int32),
        "stream": scalar_array(req.stream, np.bool_),
        "exclude_input_in_output": scalar_array(req.exclude_input_in_output, np.bool_),
        "priority": scalar_array(req.priority, np.int32),
    }
    for name in RETURN_FLAGS:
        if getattr(req, name):
            t[name] = scalar_array(True, np.bool_)
    for name, dtype in (*SAMPLING_FIELDS, ("latency_sla_ms", np.float32), ("end_id", np.int32), ("pad_id", np.int32)):
        value = getattr(req, name)
        if value is not None:
            t[name] = scalar_array(value, dtype)
    if req.stop_words:
        t["stop_words"] = text_array(req.stop_words)
    if req.bad_words:
        t["bad_words"] = text_array(req.bad_words)
    return t


def pack_stop() -> dict[str, np.ndarray]:
    """Tensors of a stop request for ``router_bls``: send them with the request id of the
    request to stop (``text_input`` is required by the config and ignored)."""
    return {"text_input": text_array([""]), "stop": scalar_array(True, np.bool_)}


def generate_payload(req: GenerationRequest) -> dict[str, Any]:
    """JSON body for Triton's ``/v2/models/router_bls/generate[_stream]`` endpoints."""
    body: dict[str, Any] = {
        "text_input": req.prompt,
        "max_tokens": req.max_tokens,
        "stream": req.stream,
        "exclude_input_in_output": req.exclude_input_in_output,
        "priority": req.priority,
    }
    for key in ("temperature", "top_p", "top_k", "seed", "latency_sla_ms", "repetition_penalty", "presence_penalty",
                "frequency_penalty", "length_penalty", "min_tokens", "end_id", "pad_id"):
        value = getattr(req, key)
        if value is not None:
            body[key] = value
    for key in ("return_log_probs", "return_perf_metrics"):
        if getattr(req, key):
            body[key] = True
    if req.stop_words:
        body["stop_words"] = list(req.stop_words)
    if req.bad_words:
        body["bad_words"] = list(req.bad_words)
    return body


def pack_response(text: str, engine: str, num_input_tokens: int | None = None,
                  num_output_tokens: int | None = None, log_probs: list[float] | None = None,
                  cum_log_prob: float | None = None, perf: dict[str, float] | None = None) -> dict[str, np.ndarray]:
    """One router_bls response: the text, the engine that served it, and what was asked for:
    counts, ``cum_log_probs`` [1, 1] / ``output_log_probs`` [1, 1, n] (the tokens of this
    response), the perf metrics [1, 1] each."""
    out = {"text_output": text_array([text]), "backend": text_array([engine])}
    if num_input_tokens is not None:
        out["num_input_tokens"] = scalar_array(num_input_tokens, np.int32)
    if num_output_tokens is not None:
        out["num_output_tokens"] = scalar_array(num_output_tokens, np.int32)
    if log_probs is not None:
        out["cum_log_probs"] = scalar_array(cum_log_prob or 0.0, np.float32)
        out["output_log_probs"] = np.array(log_probs, dtype=np.float32).reshape(1, 1, -1)
    for name, value in (perf or {}).items():
        out[name] = scalar_array(value, PERF_OUTPUTS[name])
    return out
