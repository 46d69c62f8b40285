"""The router's job: a router-contract request, validated against this deployment and
tokenized once (no Triton imports).

``build_job`` turns parsed router inputs into a ``RouterJob`` (every rejection is an
``InvalidInput`` whose message says what to send); the engine requests are packed by
the contract modules (``engine_request``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from hybrid_llm.contracts import trtllm, vllm
from hybrid_llm.contracts.router import POLICY_PARAMETER, GenerationRequest
from hybrid_llm.contracts.spec import InvalidInput
from hybrid_llm.router.config import POLICIES, RouterConfig
from hybrid_llm.router.policy import TRTLLM


@dataclass
class RouterJob(GenerationRequest):
    """A validated router request: the client's request plus what the router adds."""

    prompt_ids: list[int] = field(default_factory=list)
    bad_words_ids: list[list[int]] = field(default_factory=list)  # bad_words tokenized (trtllm carries ids)
    request_id: str = ""
    policy: str | None = None  # a per-request routing policy (policy_override); None: the configured one


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


def build_job(values: Mapping[str, Any], cfg: RouterConfig, tokenize: Callable[[str], list[int]],
              tokenize_word: Callable[[str], list[int]] | None = None) -> RouterJob:
    """Validate parsed router inputs and tokenize the prompt once (``tokenize_word``: a bad word,
    without special tokens, as TensorRT-LLM's preprocessing does; default ``tokenize``)."""
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
    for name, neutral, what in (("beam_width", 1, "beam search is not supported"),
                                ("num_return_sequences", 1, "one sequence per request")):
        if values.get(name) not in (None, neutral):
            raise InvalidInput(f"input '{name}' is {values[name]}; send {neutral} ({what} by router_bls)")
    for name in ("return_context_logits", "return_generation_logits"):
        if values.get(name):
            raise InvalidInput(f"input '{name}' is true; send false (router_bls returns no logits)")
    penalties = {k: values.get(k) for k in ("repetition_penalty", "presence_penalty", "frequency_penalty",
                                            "length_penalty", "min_tokens")}
    if penalties["repetition_penalty"] is not None and penalties["repetition_penalty"] <= 0:
        raise InvalidInput(f"input 'repetition_penalty' is {penalties['repetition_penalty']}; send a value > 0 "
                           "(1 means none)")
    for key in ("presence_penalty", "frequency_penalty"):
        if penalties[key] is not None and not -2.0 <= penalties[key] <= 2.0:
            raise InvalidInput(f"input '{key}' is {penalties[key]}; send a value in [-2, 2] (0 means none)")
    if penalties["min_tokens"] is not None and not 0 <= penalties["min_tokens"] <= max_tokens:
        raise InvalidInput(f"input 'min_tokens' is {penalties['min_tokens']}; send 0..max_tokens ({max_tokens})")
    for key in ("end_id", "pad_id"):
        if values.get(key) is not None and values[key] < 0:
            raise InvalidInput(f"input '{key}' is {values[key]}; send a token id >= 0")
    bad_words = [w for w in (values.get("bad_words") or []) if w]
    if len(bad_words) > cfg.max_stop_words:
        raise InvalidInput(f"input 'bad_words' has {len(bad_words)} entries; send at most {cfg.max_stop_words}")
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
        exclude_input_in_output=bool(values.get("exclude_input_in_output")),
        return_num_input_tokens=bool(values.get("return_num_input_tokens")),
        return_num_output_tokens=bool(values.get("return_num_output_tokens")),
        **penalties, bad_words=bad_words, bad_words_ids=[(tokenize_word or tokenize)(w) for w in bad_words],
        end_id=values.get("end_id"), pad_id=values.get("pad_id"),
        return_log_probs=bool(values.get("return_log_probs")),
        return_perf_metrics=bool(values.get("return_perf_metrics")),
    )


def engine_request(job: RouterJob, engine: str, end_id: int, stream: bool = True) -> dict[str, np.ndarray]:
    """The request for ``engine`` ("trtllm" or "vllm_backend"): streamed from the engine
    (unless the server is unary), input excluded, counts returned; stop words stay with the router."""
    req = replace(job, stream=stream, exclude_input_in_output=True, stop_words=[],
                  return_num_input_tokens=True, return_num_output_tokens=True)
    if engine == TRTLLM:
        return trtllm.pack(job.prompt_ids, req, end_id, job.bad_words_ids)
    return vllm.pack(req, return_finish_reason=False)


def find_stop(text: str, stop_words: Sequence[str], start: int = 0) -> int:
    """Index of the earliest stop word in ``text`` at or after ``start`` (-1 if none)."""
    best = -1
    for word in stop_words:
        i = text.find(word, start)
        if i != -1 and (best == -1 or i < best):
            best = i
    return best
