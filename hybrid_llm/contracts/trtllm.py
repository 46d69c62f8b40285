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
    TensorSpec("return_num_input_tokens", "bool"),
    TensorSpec("return_num_output_tokens", "bool"),
    TensorSpec("num_return_sequences", "int"),
    # Beam-search knobs: no effect at beam_width 1 (the only width here), as in the real backend.
    TensorSpec("len_penalty", "float"),
    TensorSpec("early_stopping", "bool"),
    TensorSpec("beam_search_diversity_rate", "float"),
    # The rest of upstream's tensorrt_llm/config.pbtxt (TensorRT-LLM 0c8de69): declared, refused.
    *(TensorSpec(name, "refused", refusal=why) for name, why in (
        ("runtime_top_p_min", "top-p decay"), ("runtime_top_p_decay", "top-p decay"),
        ("runtime_top_p_reset_ids", "top-p decay"), ("embedding_bias", "embedding bias"),
        ("encoder_input_features", "encoder-decoder models"), ("encoder_output_lengths", "encoder-decoder models"),
        ("decoder_input_ids", "encoder-decoder models"), ("decoder_input_lengths", "encoder-decoder models"),
        ("cross_attention_mask", "encoder-decoder models"), ("skip_cross_attn_blocks", "encoder-decoder models"),
        ("draft_input_ids", "speculative decoding"), ("draft_logits", "speculative decoding"),
        ("draft_acceptance_threshold", "speculative decoding"), ("lookahead_window_size", "lookahead decoding"),
        ("lookahead_ngram_size", "lookahead decoding"), ("lookahead_verification_set_size", "lookahead decoding"),
        ("prompt_embedding_table", "prompt tuning"), ("prompt_table_extra_ids", "prompt tuning"),
        ("prompt_vocab_size", "prompt tuning"), ("lora_task_id", "LoRA"), ("lora_weights", "LoRA"),
        ("lora_config", "LoRA"), ("mrope_rotary_cos_sin", "multimodal rope"),
        ("mrope_position_deltas", "multimodal rope"), ("context_phase_params", "disaggregated serving"),
        ("retention_token_range_starts", "KV retention"), ("retention_token_range_ends", "KV retention"),
        ("retention_token_range_priorities", "KV retention"), ("retention_token_range_durations_ms", "KV retention"),
        ("retention_decode_priority", "KV retention"), ("retention_decode_duration_ms", "KV retention"),
        ("guided_decoding_guide_type", "guided decoding"), ("guided_decoding_guide", "guided decoding"),
    )),
)
OUTPUTS: tuple[str, ...] = ("output_ids", "sequence_length", "cum_log_probs", "output_log_probs",
                            "kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks")
# Perf-metric outputs (return_perf_metrics) and their numpy dtypes, as upstream declares them.
PERF_OUTPUTS: dict[str, Any] = {
    "kv_cache_alloc_new_blocks": np.int32, "kv_cache_reused_blocks": np.int32, "kv_cache_alloc_total_blocks": np.int32,
    "arrival_time_ns": np.int64, "first_scheduled_time_ns": np.int64, "first_token_time_ns": np.int64,
    "last_token_time_ns": np.int64, "acceptance_rate": np.float32, "total_accepted_draft_tokens": np.int32,
    "total_draft_tokens": np.int32,
}
# Every tensor the router may send, with its Triton dtype (checked against the rendered
# configs of every profile in tests/unit/test_profiles.py).
REQUEST_TENSORS: dict[str, str] = {
    "input_ids": "TYPE_INT32", "input_lengths": "TYPE_INT32", "request_output_len": "TYPE_INT32",
    "streaming": "TYPE_BOOL", "end_id": "TYPE_INT32", "pad_id": "TYPE_INT32",
    "exclude_input_in_output": "TYPE_BOOL", "stop": "TYPE_BOOL", "temperature": "TYPE_FP32",
    "runtime_top_p": "TYPE_FP32", "runtime_top_k": "TYPE_INT32", "seed": "TYPE_UINT64",
    "repetition_penalty": "TYPE_FP32", "presence_penalty": "TYPE_FP32", "frequency_penalty": "TYPE_FP32",
    "len_penalty": "TYPE_FP32", "min_tokens": "TYPE_INT32", "bad_words_list": "TYPE_INT32",
    "return_log_probs": "TYPE_BOOL", "return_perf_metrics": "TYPE_BOOL",
}
# GenerationRequest field -> (tensor, dtype) for the optional sampling inputs.
SAMPLING_TENSORS: tuple[tuple[str, str, Any], ...] = (
    ("temperature", "temperature", np.float32), ("top_p", "runtime_top_p", np.float32),
    ("top_k", "runtime_top_k", np.int32), ("seed", "seed", np.uint64),
    ("repetition_penalty", "repetition_penalty", np.float32), ("presence_penalty", "presence_penalty", np.float32),
    ("frequency_penalty", "frequency_penalty", np.float32), ("length_penalty", "len_penalty", np.float32),
    ("min_tokens", "min_tokens", np.int32),
)
# tensor -> vLLM SamplingParams keyword, for what the model side passes on.
_SAMPLING_KWARGS: tuple[tuple[str, str], ...] = (
    ("temperature", "temperature"), ("runtime_top_p", "top_p"), ("runtime_top_k", "top_k"), ("seed", "seed"),
    ("repetition_penalty", "repetition_penalty"), ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"), ("min_tokens", "min_tokens"),
)
# len_penalty, early_stopping, beam_search_diversity_rate: beam search only, no effect at width 1.


def pack(input_ids: Sequence[int], req: GenerationRequest, end_id: int | None = None,
         bad_words_ids: Sequence[Sequence[int]] = ()) -> dict[str, np.ndarray]:
    """Tensors for ``trtllm`` from prompt token ids (batch of one: [1, 1]; ids [1, L]); the
    request's ``end_id`` / ``pad_id`` win over ``end_id``; ``bad_words_ids`` are its bad words
    tokenized (the tensorrtllm contract carries ids)."""
    t = {
        "input_ids": np.array([list(input_ids)], dtype=np.int32),
        "input_lengths": scalar_array(len(input_ids), np.int32),
        "request_output_len": scalar_array(req.max_tokens, np.int32),
        "streaming": scalar_array(req.stream, np.bool_),
        "exclude_input_in_output": scalar_array(req.exclude_input_in_output, np.bool_),
    }
    end = req.end_id if req.end_id is not None else end_id
    if end is not None:
        t["end_id"] = scalar_array(end, np.int32)
        t["pad_id"] = scalar_array(req.pad_id if req.pad_id is not None else end, np.int32)
    for src, name, dtype in SAMPLING_TENSORS:
        value = getattr(req, src)
        if value is not None:
            t[name] = scalar_array(value, dtype)
    for name in ("return_log_probs", "return_perf_metrics"):
        if getattr(req, name):
            t[name] = scalar_array(True, np.bool_)
    if bad_words_ids:
        t["bad_words_list"] = encode_stop_words_list(bad_words_ids)
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
    log_probs: bool = False
    num_input_tokens: bool = False
    num_output_tokens: bool = False


def unpack(v: Mapping[str, Any], who: str = "the CPU stand-in") -> TrtllmRequest:
    """Validate parsed ``INPUTS`` values (``parse_inputs``) into a request, or raise InvalidInput."""
    if v["stop"]:
        return TrtllmRequest([], 0, False, None, {}, stop=True)
    for name in ("return_context_logits", "return_generation_logits"):
        if v[name]:
            raise InvalidInput(f"input '{name}' is not supported by {who}; send false")
    if v["beam_width"] not in (None, 1):
        raise InvalidInput(f"input 'beam_width' must be 1 (beam search is not supported by {who})")
    if v["num_return_sequences"] not in (None, 1):
        raise InvalidInput(f"input 'num_return_sequences' must be 1 (one sequence per request with {who})")
    bad_words = decode_stop_words_list(v["bad_words_list"]) if v["bad_words_list"] else []
    if any(len(w) > 1 for w in bad_words):
        raise InvalidInput(f"input 'bad_words_list' has a word of several tokens; {who} bans single-token "
                           "words only (send each as one id)")
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
    # The real backend's defaults: runtime_top_p <= 0 is "not set"; runtime_top_k 0 is "all
    # logits" (vLLM spells it -1); a negative top_k is still an error.
    if sampling.get("top_p") is not None and sampling["top_p"] <= 0:
        del sampling["top_p"]
    if sampling.get("top_k") == 0:
        del sampling["top_k"]
    validate_sampling(sampling)
    if bad_words:
        sampling["logit_bias"] = {w[0]: -100.0 for w in bad_words}  # a banned token is never sampled
    return TrtllmRequest(
        input_ids=ids[:length],
        max_new=v["request_output_len"],
        streaming=bool(v["streaming"]),
        end_id=v["end_id"],
        sampling=sampling,
        stop_words=decode_stop_words_list(v["stop_words_list"]) if v["stop_words_list"] else [],
        exclude_input=bool(v["exclude_input_in_output"]),
        perf_metrics=bool(v["return_perf_metrics"]),
        log_probs=bool(v["return_log_probs"]),
        num_input_tokens=bool(v["return_num_input_tokens"]),
        num_output_tokens=bool(v["return_num_output_tokens"]),
    )


def pack_response(req: TrtllmRequest, ids: Sequence[int], log_probs: Sequence[float] = (),
                  cum_log_prob: float = 0.0, perf: Mapping[str, float] | None = None) -> dict[str, np.ndarray]:
    """One tensorrtllm response, shaped as the real backend sends it: ``output_ids`` [1, 1, n]
    (batch, beam), ``sequence_length`` [1, 1], and what ``req`` asked for: ``cum_log_probs``
    [1, 1] and ``output_log_probs`` [1, 1, n], ``num_input_tokens`` / ``num_output_tokens``
    [1, 1] (the ids in this response), the perf metrics in ``perf`` ([1, 1] each)."""
    outputs = {"output_ids": np.array([[list(ids)]], dtype=np.int32),
               "sequence_length": scalar_array(len(ids), np.int32)}
    if req.log_probs:
        outputs["cum_log_probs"] = scalar_array(cum_log_prob, np.float32)
        outputs["output_log_probs"] = np.array([[list(log_probs)]], dtype=np.float32).reshape(1, 1, -1)
    if req.num_input_tokens:
        outputs["num_input_tokens"] = scalar_array(len(req.input_ids), np.int32)
    if req.num_output_tokens:
        outputs["num_output_tokens"] = scalar_array(len(ids), np.int32)
    if req.perf_metrics:
        for name, value in (perf or {}).items():
            outputs[name] = scalar_array(value, PERF_OUTPUTS[name])
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
