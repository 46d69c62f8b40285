"""The trtllm contract: the tensorrtllm backend's token-id interface (no Triton imports).

``pack`` builds a request from prompt ids and a ``GenerationRequest`` (the client and
the router use it alike), ``unpack`` validates one on the model side into a
``TrtllmRequest``, ``pack_response`` is the model's answer. The stop-word codec is the
backend's ``[1, 2, L]`` layout (ids row, offsets row).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from hybrid_llm.contracts.router import GenerationRequest
from hybrid_llm.contracts.sampling import validate_sampling
from hybrid_llm.contracts.spec import InvalidInput, TensorSpec, scalar_array

INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("input_ids", "int_list", required=True),
    TensorSpec("input_lengths", "int", required=True),
    TensorSpec("request_output_len", "int", required=True),
    TensorSpec("end_id", "int"),
    TensorSpec("pad_id", "int"),
    TensorSpec("stop_words_list", "int_list"),
    TensorSpec("bad_words_list", "int_list"),
    TensorSpec("beam_width", "int"),
    TensorSpec("temperature", "float"),
    TensorSpec("runtime_top_k", "int"),
    TensorSpec("runtime_top_p", "float"),
    TensorSpec("repetition_penalty", "float"),
    TensorSpec("presence_penalty", "float"),
    TensorSpec("frequency_penalty", "float"),
    TensorSpec("min_tokens", "int"),
    TensorSpec("seed", "uint"),
    TensorSpec("streaming", "bool"),
    TensorSpec("stop", "bool"),
    TensorSpec("exclude_input_in_output", "bool"),
    TensorSpec("return_perf_metrics", "bool"),
    TensorSpec("return_log_probs", "bool"),
    TensorSpec("return_context_logits", "bool"),
    TensorSpec("return_generation_logits", "bool"),
)
OUTPUTS: tuple[str, ...] = ("output_ids", "sequence_length")
# Every tensor the router may send, with its Triton dtype (checked against the rendered
# configs of every profile in tests/unit/test_profiles.py).
REQUEST_TENSORS: dict[str, str] = {
    "input_ids": "TYPE_INT32", "input_lengths": "TYPE_INT32", "request_output_len": "TYPE_INT32",
    "streaming": "TYPE_BOOL", "end_id": "TYPE_INT32", "pad_id": "TYPE_INT32",
    "exclude_input_in_output": "TYPE_BOOL", "stop": "TYPE_BOOL", "temperature": "TYPE_FP32",
    "runtime_top_p": "TYPE_FP32", "runtime_top_k": "TYPE_INT32", "seed": "TYPE_UINT64",
}
# GenerationRequest field -> (tensor, dtype) for the optional sampling inputs.
SAMPLING_TENSORS: tuple[tuple[str, str, Any], ...] = (
    ("temperature", "temperature", np.float32), ("top_p", "runtime_top_p", np.float32),
    ("top_k", "runtime_top_k", np.int32), ("seed", "seed", np.uint64),
)
# tensor -> vLLM SamplingParams keyword, for what the model side passes on.
_SAMPLING_KWARGS: tuple[tuple[str, str], ...] = (
    ("temperature", "temperature"), ("runtime_top_p", "top_p"), ("runtime_top_k", "top_k"), ("seed", "seed"),
    ("repetition_penalty", "repetition_penalty"), ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"), ("min_tokens", "min_tokens"),
)


def pack(input_ids: Sequence[int], req: GenerationRequest, end_id: int | None = None) -> dict[str, np.ndarray]:
    """Tensors for ``trtllm`` from prompt token ids (batch of one: [1, 1]; ids [1, L])."""
    t = {
        "input_ids": np.array([list(input_ids)], dtype=np.int32),
        "input_lengths": scalar_array(len(input_ids), np.int32),
        "request_output_len": scalar_array(req.max_tokens, np.int32),
        "streaming": scalar_array(req.stream, np.bool_),
        "exclude_input_in_output": scalar_array(req.exclude_input_in_output, np.bool_),
    }
    if end_id is not None:
        t["end_id"] = scalar_array(end_id, np.int32)
        t["pad_id"] = scalar_array(end_id, np.int32)
    for src, name, dtype in SAMPLING_TENSORS:
        value = getattr(req, src)
        if value is not None:
            t[name] = scalar_array(value, dtype)
    return t


def stop_tensors() -> dict[str, np.ndarray]:
    """A ``stop`` request: cancels the in-flight request with the same request id."""
    return {
        "input_ids": np.zeros((1, 1), dtype=np.int32),
        "input_lengths": np.zeros((1, 1), dtype=np.int32),
        "request_output_len": np.zeros((1, 1), dtype=np.int32),
        "stop": scalar_array(True, np.bool_),
    }


@dataclass
class TrtllmRequest:
    """One validated tensorrtllm-contract request (model side)."""

    input_ids: list[int]
    max_new: int
    streaming: bool
    end_id: int | None
    sampling: dict[str, Any]
    stop_words: list[list[int]] = field(default_factory=list)
    exclude_input: bool = False
    perf_metrics: bool = False
    stop: bool = False


def unpack(v: Mapping[str, Any], who: str = "the CPU stand-in") -> TrtllmRequest:
    """Validate parsed ``INPUTS`` values (``parse_inputs``) into a request, or raise InvalidInput."""
    if v["stop"]:
        return TrtllmRequest([], 0, False, None, {}, stop=True)
    for name in ("return_log_probs", "return_context_logits", "return_generation_logits"):
        if v[name]:
            raise InvalidInput(f"input '{name}' is not supported by {who}; send false")
    if v["beam_width"] not in (None, 1):
        raise InvalidInput(f"input 'beam_width' must be 1 (beam search is not supported by {who})")
    ids = v["input_ids"]
    length = v["input_lengths"]
    if length <= 0 or length > len(ids):
        raise InvalidInput(
            f"input 'input_lengths' is {length} but 'input_ids' holds {len(ids)} ids; "
            "send the prompt length (1..len(input_ids))"
        )
    if v["request_output_len"] <= 0:
        raise InvalidInput("input 'request_output_len' must be >= 1")
    sampling: dict[str, Any] = {"max_tokens": v["request_output_len"]}
    for src, dst in _SAMPLING_KWARGS:
        if v[src] is not None:
            sampling[dst] = v[src]
    validate_sampling(sampling)
    if sampling.get("top_k") == 0:
        sampling["top_k"] = -1  # tensorrtllm: 0 disables top-k; vLLM spells it -1
    return TrtllmRequest(
        input_ids=ids[:length],
        max_new=v["request_output_len"],
        streaming=bool(v["streaming"]),
        end_id=v["end_id"],
        sampling=sampling,
        stop_words=decode_stop_words_list(v["stop_words_list"]) if v["stop_words_list"] else [],
        exclude_input=bool(v["exclude_input_in_output"]),
        perf_metrics=bool(v["return_perf_metrics"]),
    )


def pack_response(ids: Sequence[int], perf: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """One tensorrtllm response: ``output_ids`` [1, 1, n] (batch, beam), ``sequence_length``,
    and the perf-metric outputs in ``perf`` (name -> int64 value)."""
    outputs = {"output_ids": np.array([[list(ids)]], dtype=np.int32),
               "sequence_length": scalar_array(len(ids), np.int32)}
    for name, value in (perf or {}).items():
        outputs[name] = scalar_array(value, np.int64)
    return outputs


def decode_stop_words_list(flat: Sequence[int]) -> list[list[int]]:
    """Turn a tensorrtllm ``stop_words_list`` ([1, 2, L]: ids row, offsets row) into id lists."""
    if len(flat) % 2:
        raise InvalidInput("input 'stop_words_list' must have shape [1, 2, L] (ids row, offsets row)")
    width = len(flat) // 2
    ids, offsets = list(flat[:width]), list(flat[width:])
    words: list[list[int]] = []
    start = 0
    for end in offsets:
        if end < 0:
            break
        if end < start or end > width:
            raise InvalidInput("input 'stop_words_list' has offsets out of order or out of range")
        if end > start:
            words.append(ids[start:end])
        start = end
    return words


def encode_stop_words_list(words: Sequence[Sequence[int]]) -> np.ndarray:
    """Build a tensorrtllm ``stop_words_list`` tensor [1, 2, L] from id lists."""
    ids: list[int] = []
    offsets: list[int] = []
    for word in words:
        ids.extend(int(t) for t in word)
        offsets.append(len(ids))
    width = max(len(ids), 1)
    ids_row = ids + [0] * (width - len(ids))
    off_row = offsets + [-1] * (width - len(offsets))
    return np.array([[ids_row, off_row]], dtype=np.int32)
