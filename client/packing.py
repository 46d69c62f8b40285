"""tritonclient glue of the one request-packing API (``hybrid_llm.contracts``): wrap the
contract modules' numpy tensors as ``InferInput`` objects for gRPC or HTTP."""

from __future__ import annotations

from typing import Any

import numpy as np

from hybrid_llm.contracts import triton_dtype


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
