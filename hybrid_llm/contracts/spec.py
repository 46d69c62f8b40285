"""What the three wire contracts share (no Triton imports): tensor specs and their one
parser, numpy packing helpers, priority classes, and the cancellation constants.

Every model in the repository reads its inputs through ``parse_inputs``, so dtype,
shape and presence checks (and their error messages) are the same everywhere; every
packer (client, router, engines) builds its arrays with ``text_array``/``scalar_array``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np


# Priority classes: the router's queues, the request tensor ``priority`` and the vLLM
# engine's priority all use these numbers (lower is served first).
URGENT, HIGH, NORMAL = 1, 2, 3
PRIORITY_NAMES: dict[str, int] = {"urgent": URGENT, "high": HIGH, "normal": NORMAL}
PRIORITY_LABELS: dict[int, str] = {v: k for k, v in PRIORITY_NAMES.items()}

# Exported by each engine model (both contracts): 1 while its engine serves, 0 while it is
# dead or restarting. Triton's own readiness stays READY while the stub lives.
ENGINE_READY = "hybrid_engine_ready"
# Request parameter set by router_bls on its BLS calls: the caller stops the request with a
# ``stop`` request, so the engine model does not poll Triton for its cancellation.
CANCEL_VIA_STOP = "cancel_via_stop"
# Request parameters Triton itself sets or reads (its clients' ``priority``/``timeout``, sequence
# batching, the HTTP client's ``binary_data_output`` and ``headers``); names starting with
# ``triton_`` are Triton's too. Models read any other parameter as their own.
TRITON_PARAMETERS = frozenset({"priority", "timeout", "sequence_id", "sequence_start", "sequence_end",
                               "binary_data_output", "headers"})


def own_parameters(parameters: "Mapping[str, Any]") -> "dict[str, Any]":
    """The request parameters meant for the model: Triton's own and ``cancel_via_stop`` left out."""
    return {k: v for k, v in parameters.items()
            if k not in TRITON_PARAMETERS and k != CANCEL_VIA_STOP and not k.startswith("triton_")}


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


def check_interval_s(base_s: float, open_streams: int, checks_per_s: float) -> float:
    """Seconds between two cancellation checks of one stream: ``base_s``, stretched so that
    ``open_streams`` streams together check at most ``checks_per_s`` times a second (0: no cap)."""
    if checks_per_s <= 0:
        return base_s
    return max(base_s, open_streams / checks_per_s)


class InvalidInput(ValueError):
    """A request input is missing or malformed; the message says what to send."""


@dataclass(frozen=True)
class TensorSpec:
    """One input tensor: name, kind of values, and whether it is a single value."""

    name: str
    kind: str  # "text", "bool", "int", "uint", "float", "text_list", "int_list", "refused"
    required: bool = False
    dtype_hint: str = ""  # the Triton dtype, for error messages
    refusal: str = ""  # kind "refused": why the model cannot honour this input (its INVALID_ARG message)

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
            "refused": "any",
        }[self.kind]


# Inputs the router and the vLLM contracts share by name and meaning (the text interface).
TEXT_INPUT = TensorSpec("text_input", "text", required=True)
STREAM = TensorSpec("stream", "bool")
EXCLUDE_INPUT = TensorSpec("exclude_input_in_output", "bool")
RETURN_COUNTS = (TensorSpec("return_num_input_tokens", "bool"), TensorSpec("return_num_output_tokens", "bool"))
PRIORITY = TensorSpec("priority", "int")


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
    if spec.kind == "refused":
        raise InvalidInput(f"input '{spec.name}' is not supported ({spec.refusal}); leave it out")
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


_DTYPES = {
    np.dtype(np.object_): "BYTES",
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64",
    np.dtype(np.uint32): "UINT32",
    np.dtype(np.uint64): "UINT64",
    np.dtype(np.float32): "FP32",
}


def triton_dtype(array: np.ndarray) -> str:
    """The Triton dtype name of a numpy array."""
    try:
        return _DTYPES[array.dtype]
    except KeyError:
        raise ValueError(f"no Triton dtype for numpy {array.dtype}") from None


def text_array(values: Sequence[str], batch: bool = True) -> np.ndarray:
    """UTF-8 BYTES tensor of ``values``: [1, n] for a batch-of-one contract, else [n]."""
    arr = np.array([v.encode("utf-8") for v in values], dtype=np.object_)
    return arr.reshape(1, -1) if batch else arr


def scalar_array(value: Any, dtype: Any, batch: bool = True) -> np.ndarray:
    """One value as a tensor: [1, 1] for a batch-of-one contract, else [1]."""
    arr = np.array([value], dtype=dtype)
    return arr.reshape(1, 1) if batch else arr
