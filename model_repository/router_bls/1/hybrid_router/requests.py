"""Router request validation and the engine request name maps (no Triton imports).

``build_job`` turns parsed router inputs into a validated ``RouterJob`` (every
rejection is an ``InvalidInput`` whose message says what to send). ``trtllm_inputs``
and ``vllm_inputs`` pack a job for each engine from one declarative map each.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .config import POLICIES, RouterConfig
from .contracts import InvalidInput


@dataclass
class RouterJob:
    """A validated router request."""

    prompt: str
    prompt_ids: list[int]
    max_tokens: int
    stream: bool
    priority: int
    latency_sla_ms: float | None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop_words: list[str] = field(default_factory=list)
    exclude_input: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False
    request_id: str = ""
    policy: str | None = None  # a per-request routing policy (policy_override); None: the configured one


POLICY_PARAMETER = "routing_policy"


def requested_policy(parameters: Mapping[str, Any], cfg: RouterConfig) -> str | None:
    """The request parameter 'routing_policy', checked: None when absent; InvalidInput when
    the server does not allow it (policy_override off) or names no policy."""
    name = parameters.get(POLICY_PARAMETER)
    if name is None:
        return None
    if not cfg.policy_override:
        raise InvalidInput(f"request parameter '{POLICY_PARAMETER}' is not accepted by this server "
                           "(router_bls parameter policy_override is false); send the request without it")
    if name not in POLICIES:
        raise InvalidInput(f"request parameter '{POLICY_PARAMETER}' is {name!r}; send one of {list(POLICIES)}")
    return str(name)


def build_job(values: Mapping[str, Any], cfg: RouterConfig, tokenize: Callable[[str], list[int]]) -> RouterJob:
    """Validate parsed router inputs and tokenize the prompt once."""
    prompt = values["text_input"]
    if not prompt or not prompt.strip():
        raise InvalidInput("input 'text_input' is empty; send the prompt as a non-empty UTF-8 string")
    max_tokens = cfg.max_tokens_default if values.get("max_tokens") is None else values["max_tokens"]
    if not 1 <= max_tokens <= cfg.max_tokens_limit:
        raise InvalidInput(f"input 'max_tokens' is {max_tokens}; send 1..{cfg.max_tokens_limit}")
    priority = cfg.default_priority if values.get("priority") is None else values["priority"]
    if priority not in (1, 2, 3):
        raise InvalidInput(f"input 'priority' is {priority}; send 1 (URGENT), 2 (HIGH) or 3 (NORMAL)")
    sla = values.get("latency_sla_ms")
    if sla is None and cfg.default_latency_sla_ms > 0:
        sla = cfg.default_latency_sla_ms
    if sla is not None and (math.isnan(sla) or sla <= 0):
        raise InvalidInput(f"input 'latency_sla_ms' is {sla}; send a positive number of milliseconds")
    temperature = values.get("temperature")
    if temperature is not None and temperature < 0:
        raise InvalidInput(f"input 'temperature' is {temperature}; send a value >= 0 (0 is greedy)")
    top_p = values.get("top_p")
    if top_p is not None and not 0 < top_p <= 1:
        raise InvalidInput(f"input 'top_p' is {top_p}; send a value in (0, 1]")
    top_k = values.get("top_k")
    if top_k is not None and top_k < 0:
        raise InvalidInput(f"input 'top_k' is {top_k}; send 0 (disabled) or a positive integer")
    stop_words = [w for w in (values.get("stop_words") or []) if w]
    if len(stop_words) > cfg.max_stop_words:
        raise InvalidInput(f"input 'stop_words' has {len(stop_words)} entries; send at most {cfg.max_stop_words}")
    if any(len(w) > cfg.max_stop_word_chars for w in stop_words):
        raise InvalidInput(f"input 'stop_words' has an entry longer than {cfg.max_stop_word_chars} characters")
    ids = tokenize(prompt)
    if len(ids) > cfg.max_prompt_tokens:
        raise InvalidInput(
            f"prompt is {len(ids)} tokens; this deployment accepts at most {cfg.max_prompt_tokens} "
            f"(the model context minus room for output); shorten 'text_input'"
        )
    return RouterJob(
        prompt=prompt, prompt_ids=ids, max_tokens=max_tokens, stream=bool(values.get("stream")),
        priority=priority, latency_sla_ms=sla, temperature=temperature, top_p=top_p, top_k=top_k,
        seed=values.get("seed"), stop_words=stop_words,
        exclude_input=bool(values.get("exclude_input_in_output")),
        return_num_input_tokens=bool(values.get("return_num_input_tokens")),
        return_num_output_tokens=bool(values.get("return_num_output_tokens")),
    )


def _b(v: bool) -> np.ndarray:
    return np.array([[v]], dtype=np.bool_)


# router field -> (trtllm tensor, numpy dtype); one map, one generic packer.
TRTLLM_OPTIONAL_MAP: dict[str, tuple[str, Any]] = {
    "temperature": ("temperature", np.float32),
    "top_p": ("runtime_top_p", np.float32),
    "top_k": ("runtime_top_k", np.int32),
    "seed": ("seed", np.uint64),
}
VLLM_SAMPLING_MAP: dict[str, str] = {
    "max_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "seed": "seed",
}
# Every tensor the router may send to each engine, with its Triton dtype (checked
# against the rendered configs of both profiles in tests/unit/test_profiles.py).
TRTLLM_REQUEST_TENSORS: dict[str, str] = {
    "input_ids": "TYPE_INT32", "input_lengths": "TYPE_INT32", "request_output_len": "TYPE_INT32",
    "streaming": "TYPE_BOOL", "end_id": "TYPE_INT32", "pad_id": "TYPE_INT32",
    "exclude_input_in_output": "TYPE_BOOL", "stop": "TYPE_BOOL", "temperature": "TYPE_FP32",
    "runtime_top_p": "TYPE_FP32", "runtime_top_k": "TYPE_INT32", "seed": "TYPE_UINT64",
}
VLLM_REQUEST_TENSORS: dict[str, str] = {
    "text_input": "TYPE_STRING", "stream": "TYPE_BOOL", "sampling_parameters": "TYPE_STRING",
    "exclude_input_in_output": "TYPE_BOOL", "return_num_input_tokens": "TYPE_BOOL",
    "return_num_output_tokens": "TYPE_BOOL", "return_finish_reason": "TYPE_BOOL",
    "priority": "TYPE_INT32", "stop": "TYPE_BOOL",
}
TRTLLM_OUTPUTS: tuple[str, ...] = ("output_ids", "sequence_length")
VLLM_OUTPUTS: tuple[str, ...] = ("text_output", "finish_reason", "num_input_tokens", "num_output_tokens")


def trtllm_inputs(job: RouterJob, end_id: int) -> dict[str, np.ndarray]:
    """The tensorrtllm-contract request for a job (always streamed from the engine)."""
    t = {
        "input_ids": np.array([job.prompt_ids], dtype=np.int32),
        "input_lengths": np.array([[len(job.prompt_ids)]], dtype=np.int32),
        "request_output_len": np.array([[job.max_tokens]], dtype=np.int32),
        "streaming": _b(True),
        "end_id": np.array([[end_id]], dtype=np.int32),
        "pad_id": np.array([[end_id]], dtype=np.int32),
        "exclude_input_in_output": _b(True),
    }
    for src, (dst, dtype) in TRTLLM_OPTIONAL_MAP.items():
        value = getattr(job, src)
        if value is not None:
            t[dst] = np.array([[value]], dtype=dtype)
    return t


def trtllm_stop_inputs() -> dict[str, np.ndarray]:
    """A tensorrtllm ``stop`` request: cancels the in-flight request with the same id."""
    return {
        "input_ids": np.zeros((1, 1), dtype=np.int32),
        "input_lengths": np.zeros((1, 1), dtype=np.int32),
        "request_output_len": np.zeros((1, 1), dtype=np.int32),
        "stop": _b(True),
    }


def vllm_inputs(job: RouterJob) -> dict[str, np.ndarray]:
    """The vllm_backend request for a job (text in, always streamed from the engine)."""
    sampling = {dst: getattr(job, src) for src, dst in VLLM_SAMPLING_MAP.items() if getattr(job, src) is not None}
    return {
        "text_input": np.array([job.prompt.encode("utf-8")], dtype=np.object_),
        "stream": np.array([True]),
        "sampling_parameters": np.array([json.dumps(sampling).encode()], dtype=np.object_),
        "exclude_input_in_output": np.array([True]),
        "return_num_input_tokens": np.array([True]),
        "return_num_output_tokens": np.array([True]),
        "priority": np.array([job.priority], dtype=np.int32),
    }


def vllm_stop_inputs() -> dict[str, np.ndarray]:
    """A vllm_backend ``stop`` request (the project's extension of the vLLM contract)."""
    return {"text_input": np.array([b"stop"], dtype=np.object_), "stop": np.array([True])}


def find_stop(text: str, stop_words: Sequence[str], start: int = 0) -> int:
    """Index of the earliest stop word in ``text`` at or after ``start`` (-1 if none)."""
    best = -1
    for word in stop_words:
        i = text.find(word, start)
        if i != -1 and (best == -1 or i < best):
            best = i
    return best
