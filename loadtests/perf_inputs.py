"""perf_analyzer ``--input-data`` JSON for router_bls, vllm_backend and trtllm, from a workload mix.

Tensors come from ``hybrid_llm.contracts`` (via ``runner.pack``); this module only writes
them in perf_analyzer's format: ``{"data": [{name: {"content": [...], "shape": [...]}}]}``,
one entry per request (perf_analyzer cycles through them). For models with
``max_batch_size > 0`` (router_bls, trtllm) the shape leaves out the batch
dimension, which perf_analyzer adds (``-b 1``): router_bls's ``text_input`` is sent
as ``[1, 1]``. vllm_backend has ``max_batch_size: 0``, so its shapes are the full
``[1]``.

Usage: python -m loadtests.perf_inputs --model router_bls --mix chat --samples 32 --out inputs.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from hybrid_llm.contracts.router import RETURN_FLAGS

from .runner import contract_for, pack
from .workload import (
    DEFAULT_TOKENIZER, MIXES, PromptFactory, SampledRequest, WorkloadSampler, get_mix, load_tokenizer,
)

#: Whether perf_analyzer should add the batch dimension for a contract's model.
BATCHED = {"router": True, "trtllm": True, "vllm": False}


def ask_for_every_output(request: Any) -> None:
    """Make ``request`` ask for every optional output its model declares (counts, log probs, perf metrics).

    perf_analyzer 2.51 records every output a model declares in each response; one a response
    leaves out is read from uninitialized memory, and when that reads as NaN or infinity its
    JSON writer stops and the profile export is empty (genai-perf then fails on it)."""
    for flag in RETURN_FLAGS:
        setattr(request, flag, True)


def _content(array: np.ndarray) -> list[Any]:
    flat = array.reshape(-1)
    if array.dtype == np.object_:
        return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in flat]
    if array.dtype == np.bool_:
        return [bool(v) for v in flat]
    if np.issubdtype(array.dtype, np.integer):
        return [int(v) for v in flat]
    return [float(v) for v in flat]


def tensors_to_entry(tensors: dict[str, np.ndarray], batched: bool) -> dict[str, dict[str, Any]]:
    """One perf_analyzer data entry from packed tensors (batch dimension dropped when ``batched``)."""
    entry = {}
    for name, array in tensors.items():
        if batched and (array.ndim < 1 or array.shape[0] != 1):
            raise ValueError(f"tensor '{name}' has shape {list(array.shape)}; a batched model's "
                             "tensors must lead with a batch of 1")
        shape = list(array.shape[1:]) if batched else list(array.shape)
        entry[name] = {"content": _content(array), "shape": shape}
    return entry


def input_data(samples: Sequence[SampledRequest], contract: str, tokenizer: Any = None) -> dict[str, Any]:
    """The ``--input-data`` document for ``samples`` in ``contract`` (router, vllm or trtllm)."""
    if contract not in BATCHED:
        raise ValueError(f"contract must be one of {sorted(BATCHED)}, got {contract!r}")
    return {"data": [tensors_to_entry(pack(contract, s.request, tokenizer), BATCHED[contract])
                     for s in samples]}


def write_inputs(path: Path, model: str, mix: str = "chat", samples: int = 32, seed: int = 0,
                 tokenizer: Any = None, contract: str | None = None,
                 stream: bool = True, every_output: bool = True) -> Path:
    """Sample ``samples`` requests from ``mix`` and write perf_analyzer input data for ``model``
    (``every_output``: each request asks for every optional output, see ask_for_every_output)."""
    tok = tokenizer if tokenizer is not None else load_tokenizer(DEFAULT_TOKENIZER)
    sampler = WorkloadSampler(get_mix(mix), PromptFactory(tok), seed=seed)
    drawn = sampler.take(samples)
    for s in drawn:
        s.request.stream = stream
        if every_output:
            ask_for_every_output(s.request)
    doc = input_data(drawn, contract_for(model, contract), tok)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description="Write perf_analyzer --input-data JSON from a workload mix.")
    p.add_argument("--model", default="router_bls", help="router_bls, vllm_backend or trtllm")
    p.add_argument("--contract", choices=sorted(BATCHED), help="default: from the model name")
    p.add_argument("--mix", default="chat", choices=sorted(MIXES))
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-stream", action="store_true", help="ask for one response per request")
    p.add_argument("--asked-outputs-only", action="store_true",
                   help="do not ask for every optional output (perf_analyzer 2.51 may then empty its export)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        path = write_inputs(args.out, args.model, args.mix, args.samples, args.seed,
                            contract=args.contract, stream=not args.no_stream,
                            every_output=not args.asked_outputs_only)
    except (ValueError, OSError) as exc:
        print(f"perf_inputs: {exc}", file=sys.stderr)
        return 2
    print(f"[perf_inputs] {args.samples} requests for {args.model} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
