"""CLI: stream a generation from router_bls (or an engine) to the terminal.

Examples:
  python -m client "Hello, Triton"
  python -m client --priority urgent --sla-ms 120 --max-tokens 32 "Write a haiku"
  python -m client --json --protocol http "Hello"          # timings as JSON
  python -m client --model vllm_backend "Hello"             # straight to an engine
  python -m client --unary "Hello"                          # ModelInfer (a decoupled_mode=false server)
"""

from __future__ import annotations

import argparse
import json
import sys

from hybrid_llm.contracts import PRIORITY_NAMES, GenerationRequest, generate_payload, router_tensors, vllm_tensors
from .stream import StreamResult, infer, stream_grpc, stream_http


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, stream, print text (or JSON), exit non-zero on error."""
    p = argparse.ArgumentParser(prog="python -m client", description="Stream from the hybrid Triton server.")
    p.add_argument("prompt")
    p.add_argument("--url", default="127.0.0.1:8001", help="gRPC host:port (HTTP: --http-url)")
    p.add_argument("--http-url", default="127.0.0.1:8000")
    p.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    p.add_argument("--model", default="router_bls", choices=("router_bls", "vllm_backend"))
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", default=[], help="stop word (repeatable)")
    p.add_argument("--priority", choices=sorted(PRIORITY_NAMES), default="normal")
    p.add_argument("--sla-ms", type=float, help="latency SLA in ms (router input latency_sla_ms)")
    p.add_argument("--no-stream", action="store_true", help="one response instead of a stream")
    p.add_argument("--unary", action="store_true",
                   help="gRPC ModelInfer / HTTP /infer (implies --no-stream; needs a decoupled_mode=false server)")
    p.add_argument("--json", action="store_true", help="print the result and timings as JSON")
    p.add_argument("--timeout", type=float, default=300.0)
    a = p.parse_args(argv)
    req = GenerationRequest(
        prompt=a.prompt, max_tokens=a.max_tokens, stream=not (a.no_stream or a.unary), temperature=a.temperature,
        top_p=a.top_p, top_k=a.top_k, seed=a.seed, stop_words=a.stop,
        priority=PRIORITY_NAMES[a.priority], latency_sla_ms=a.sla_ms,
    )
    printer = None if a.json else _printer()
    if a.unary:
        tensors = router_tensors(req) if a.model == "router_bls" else vllm_tensors(req)
        url = a.url if a.protocol == "grpc" else a.http_url
        result = infer(url, a.model, tensors, a.protocol, priority=req.priority, timeout_s=a.timeout)
        if printer is not None and result.ok:
            sys.stdout.write(result.text)
    elif a.protocol == "grpc":
        tensors = router_tensors(req) if a.model == "router_bls" else vllm_tensors(req)
        result = stream_grpc(a.url, a.model, tensors, priority=req.priority, timeout_s=a.timeout, on_chunk=printer)
    else:
        result = stream_http(a.http_url, a.model, generate_payload(req), timeout_s=a.timeout, stream=req.stream)
        if printer is not None and result.ok:
            sys.stdout.write(result.text)
    if a.json:
        print(json.dumps(result.as_dict(), ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        if result.error:
            print(f"error ({result.error_code}): {result.error}", file=sys.stderr)
        else:
            ttft = f"{result.ttft_s * 1000:.1f} ms" if result.ttft_s is not None else "-"
            print(f"[{result.backend or a.model}] ttft {ttft}, {result.num_output_tokens} tokens, "
                  f"{result.e2e_s:.2f} s", file=sys.stderr)
    return 0 if result.ok else 1


def _printer():
    """A chunk callback that prints each new piece of text as it arrives."""
    seen = {"n": 0}

    def on_chunk(result: StreamResult) -> None:
        for piece in result.chunks[seen["n"]:]:
            sys.stdout.write(piece)
        sys.stdout.flush()
        seen["n"] = len(result.chunks)

    return on_chunk


if __name__ == "__main__":
    sys.exit(main())
