"""The sampling fields both engine contracts carry (vllm_backend's ``sampling_parameters`` JSON, trtllm's
sampling tensors): their names, types and ranges, checked once (no Triton imports)."""

from __future__ import annotations

import json
import math
from typing import Any

from hybrid_llm.contracts.spec import InvalidInput

# vllm_backend's ``sampling_parameters`` keys and their types. Strings are accepted for
# numbers and booleans because the official backend's clients often send them that way.
SAMPLING_KEYS: dict[str, type] = {
    "max_tokens": int,
    "min_tokens": int,
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "seed": int,
    "presence_penalty": float,
    "frequency_penalty": float,
    "repetition_penalty": float,
    "ignore_eos": bool,
    "stop": list,
    "stop_token_ids": list,
    "n": int,
    "skip_special_tokens": bool,
    "logprobs": int,
    "bad_words": list,
}
MAX_N = 16  # completions per request (vllm_backend's sampling parameter n)
MAX_LOGPROBS = 20


def _coerce(key: str, value: Any, kind: type) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise InvalidInput(f"sampling parameter '{key}' must be true or false")
    if kind is list:
        if isinstance(value, str):
            return [value]
        if isinstance(value, list):
            return value
        raise InvalidInput(f"sampling parameter '{key}' must be a list")
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise InvalidInput(f"sampling parameter '{key}' must be a {kind.__name__}, got {value!r}") from None
    if isinstance(number, float) and not math.isfinite(number):
        raise InvalidInput(f"sampling parameter '{key}' must be finite")
    return number


def validate_sampling(kw: dict[str, Any]) -> dict[str, Any]:
    """Check ranges vLLM would reject later, with messages that say what to send."""
    if "max_tokens" in kw and kw["max_tokens"] <= 0:
        raise InvalidInput("'max_tokens' must be >= 1")
    if "temperature" in kw and kw["temperature"] < 0:
        raise InvalidInput("'temperature' must be >= 0 (0 means greedy)")
    if "top_p" in kw and not 0 < kw["top_p"] <= 1:
        raise InvalidInput("'top_p' must be in (0, 1]")
    if "top_k" in kw and kw["top_k"] < 0:
        raise InvalidInput("'top_k' must be >= 0 (0 disables top-k)")
    if "n" in kw and not 1 <= kw["n"] <= MAX_N:
        raise InvalidInput(f"'n' must be in 1..{MAX_N}")
    if "repetition_penalty" in kw and kw["repetition_penalty"] <= 0:
        raise InvalidInput("'repetition_penalty' must be > 0 (1 means none)")
    for key in ("presence_penalty", "frequency_penalty"):
        if key in kw and not -2.0 <= kw[key] <= 2.0:
            raise InvalidInput(f"'{key}' must be in [-2, 2] (0 means none)")
    if "min_tokens" in kw and kw["min_tokens"] < 0:
        raise InvalidInput("'min_tokens' must be >= 0")
    if "min_tokens" in kw and "max_tokens" in kw and kw["min_tokens"] > kw["max_tokens"]:
        raise InvalidInput("'min_tokens' must not exceed the maximum number of tokens")
    if kw.get("logprobs") is not None and not 0 <= kw["logprobs"] <= MAX_LOGPROBS:
        raise InvalidInput(f"'logprobs' must be in 0..{MAX_LOGPROBS}")
    return kw


def sampling_kwargs_from_json(text: str) -> dict[str, Any]:
    """Parse vllm_backend's ``sampling_parameters`` JSON into SamplingParams keyword args."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise InvalidInput(f"input 'sampling_parameters' is not JSON ({exc}); send a JSON object") from None
    if not isinstance(raw, dict):
        raise InvalidInput("input 'sampling_parameters' must be a JSON object")
    unknown = sorted(set(raw) - set(SAMPLING_KEYS))
    if unknown:
        raise InvalidInput(
            f"unknown sampling parameter(s) {unknown}; supported: {sorted(SAMPLING_KEYS)}"
        )
    kw = validate_sampling({k: _coerce(k, v, SAMPLING_KEYS[k]) for k, v in raw.items()})
    if kw.get("top_k") == 0:
        kw["top_k"] = -1  # vLLM spells "disabled" as -1; 0 is the tensorrtllm spelling
    return kw
