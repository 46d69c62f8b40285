"""Tensor contracts of the router and the two engines, as data (no Triton imports).

One declarative spec per model and one generic parser: every model in the
repository reads its inputs through ``parse_inputs``, so dtype, shape and
presence checks (and their error messages) are the same everywhere.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np


# Exported by each engine model (both contracts): 1 while its engine serves, 0 while it is
# dead or restarting. Triton's own readiness stays READY while the stub lives.
ENGINE_READY = "hybrid_engine_ready"
# Request parameter set by router_bls on its BLS calls: the caller stops the request with a
# ``stop`` request, so the engine model does not poll Triton for its cancellation.
CANCEL_VIA_STOP = "cancel_via_stop"


class CancelCheck:
    """Rate-limits cancellation checks: each one is an IPC round trip to tritonserver,
    and checking on every streamed token cost ~20% of throughput at 16-64 streams."""

    def __init__(self, check: "Callable[[], bool]", interval_s: "float | Callable[[], float]" = 0.05) -> None:
        self._check = check
        self._interval = interval_s if callable(interval_s) else (lambda: interval_s)
        self._next = 0.0

    def __call__(self) -> bool:
        """True when the client has cancelled (checked at most every interval, read at each check)."""
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self._interval()
        return self._check()


class InvalidInput(ValueError):
    """A request input is missing or malformed; the message says what to send."""


@dataclass(frozen=True)
class TensorSpec:
    """One input tensor: name, kind of values, and whether it is a single value."""

    name: str
    kind: str  # "text", "bool", "int", "uint", "float", "text_list", "int_list"
    required: bool = False
    dtype_hint: str = ""  # the Triton dtype, for error messages

    @property
    def triton_dtype(self) -> str:
        """The Triton dtype name clients must send."""
        return self.dtype_hint or {
            "text": "BYTES",
            "text_list": "BYTES",
            "bool": "BOOL",
            "int": "INT32",
            "int_list": "INT32",
            "uint": "UINT64",
            "float": "FP32",
        }[self.kind]


_NP_KINDS = {
    "text": ("O", "S", "U"),
    "text_list": ("O", "S", "U"),
    "bool": ("b",),
    "int": ("i", "u"),
    "int_list": ("i", "u"),
    "uint": ("u", "i"),
    "float": ("f",),
}


def _decode_text(name: str, value: Any) -> str:
    if isinstance(value, (bytes, np.bytes_)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(
                f"input '{name}' is not valid UTF-8 (byte {exc.start}); send UTF-8 encoded text"
            ) from None
    return str(value)


def parse_tensor(spec: TensorSpec, array: np.ndarray) -> Any:
    """Convert one request tensor (batch of one) into a Python value, or raise InvalidInput."""
    if array.dtype.kind not in _NP_KINDS[spec.kind]:
        raise InvalidInput(
            f"input '{spec.name}' has dtype {array.dtype}; send {spec.triton_dtype}"
        )
    if spec.kind in ("text_list", "int_list"):
        flat = array.reshape(-1)
        if spec.kind == "text_list":
            return [_decode_text(spec.name, v) for v in flat]
        return [int(v) for v in flat]
    if array.size != 1:
        raise InvalidInput(
            f"input '{spec.name}' has shape {list(array.shape)}; send one value per request "
            f"(shape [1] or [1, 1])"
        )
    value = array.reshape(-1)[0]
    if spec.kind == "text":
        return _decode_text(spec.name, value)
    if spec.kind == "bool":
        return bool(value)
    if spec.kind in ("int", "uint"):
        return int(value)
    number = float(value)
    if math.isnan(number) or math.isinf(number):
        raise InvalidInput(f"input '{spec.name}' is {number}; send a finite number")
    return number


def parse_inputs(raw: Mapping[str, np.ndarray], specs: Sequence[TensorSpec]) -> dict[str, Any]:
    """Parse the inputs a model knows; absent optional inputs map to None."""
    out: dict[str, Any] = {}
    for spec in specs:
        array = raw.get(spec.name)
        if array is None:
            if spec.required:
                raise InvalidInput(f"input '{spec.name}' ({spec.triton_dtype}) is required")
            out[spec.name] = None
            continue
        out[spec.name] = parse_tensor(spec, array)
    return out


# --- router_bls: TensorRT-LLM BLS compatible, plus priority / latency_sla_ms ------------
ROUTER_INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("text_input", "text", required=True),
    TensorSpec("max_tokens", "int"),
    TensorSpec("stream", "bool"),
    TensorSpec("temperature", "float"),
    TensorSpec("top_p", "float"),
    TensorSpec("top_k", "int"),
    TensorSpec("seed", "uint"),
    TensorSpec("stop_words", "text_list"),
    TensorSpec("exclude_input_in_output", "bool"),
    TensorSpec("return_num_input_tokens", "bool"),
    TensorSpec("return_num_output_tokens", "bool"),
    TensorSpec("priority", "int"),
    TensorSpec("latency_sla_ms", "float"),
)

# --- vllm_backend: the official vLLM backend's inputs, plus priority and stop ----------
VLLM_INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("text_input", "text", required=True),
    TensorSpec("stream", "bool"),
    TensorSpec("sampling_parameters", "text"),
    TensorSpec("exclude_input_in_output", "bool"),
    TensorSpec("return_finish_reason", "bool"),
    TensorSpec("return_num_input_tokens", "bool"),
    TensorSpec("return_num_output_tokens", "bool"),
    TensorSpec("priority", "int"),
    TensorSpec("stop", "bool"),
)

# --- trtllm: the tensorrtllm backend's inputs the stand-in implements ------------------
TRTLLM_INPUTS: tuple[TensorSpec, ...] = (
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
