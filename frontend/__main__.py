"""``python -m frontend``: serve the OpenAI API on 127.0.0.1 in front of router_bls (gRPC)."""

from __future__ import annotations

import argparse
import sys

from frontend.mapping import Defaults


def main(argv: list[str] | None = None) -> int:
    """Parse flags, build the app, run uvicorn until SIGTERM / Ctrl-C."""
    import uvicorn

    from frontend.app import HangWatch, chat_renderer, create_app
    from frontend.backend import TritonRouter

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--triton-grpc", default="127.0.0.1:8001", help="Triton's gRPC endpoint")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9000)
    p.add_argument("--model-name", required=True, help="the model name clients send (GET /v1/models)")
    p.add_argument("--tokenizer", required=True, help="tokenizer folder with the chat template")
    p.add_argument("--completion-max-tokens", type=int, default=16)
    p.add_argument("--chat-max-tokens", type=int, default=256)
    p.add_argument("--metrics-url", help="Triton's metrics endpoint: readiness then follows router_bls's progress")
    p.add_argument("--hang-bound-s", type=float, default=15.0,
                   help="busy without progress this long: not ready (with --metrics-url)")
    args = p.parse_args(argv)
    app = create_app(TritonRouter(args.triton_grpc),
                     Defaults(args.model_name, args.completion_max_tokens, args.chat_max_tokens),
                     chat_renderer(args.tokenizer),
                     HangWatch(args.metrics_url, args.hang_bound_s) if args.metrics_url else None)
    print(f"[frontend] OpenAI API on http://{args.host}:{args.port}/v1 (model '{args.model_name}') "
          f"-> router_bls at {args.triton_grpc}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
