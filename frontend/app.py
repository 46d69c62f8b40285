"""The OpenAI-compatible HTTP server in front of router_bls (FastAPI on uvicorn).

FastAPI/Starlette and uvicorn are what vLLM's own OpenAI server runs on, so they are in
the pinned environment already (no new dependency); Starlette's streaming response
cancels the generator when the client disconnects, which is how a disconnect becomes a
gRPC cancellation and stops the engine. Every request is one coroutine and one gRPC
stream on one channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from frontend import mapping as m
from frontend.backend import Piece, RouterError, TritonRouter
from hybrid_llm.watchdog import HangDetector, progress_of


class HangWatch:
    """Scrapes Triton's metrics endpoint every ``period_s`` into a HangDetector
    (``hybrid_llm/watchdog.py``): readiness goes off while the router makes no progress."""

    def __init__(self, metrics_url: str, bound_s: float, period_s: float = 1.0) -> None:
        self.metrics_url, self.period_s = metrics_url, period_s
        self.detector = HangDetector(bound_s)
        self.scrape_ok = False

    async def run(self) -> None:
        """Poll until cancelled (a failed scrape keeps the last verdict)."""
        import httpx

        async with httpx.AsyncClient(timeout=2.0) as http:
            while True:
                try:
                    text = (await http.get(self.metrics_url)).text
                    self.detector.observe(progress_of(text), time.monotonic())
                    self.scrape_ok = True
                except Exception:  # noqa: BLE001 - Triton is restarting or gone: readiness says so
                    self.scrape_ok = False
                await asyncio.sleep(self.period_s)

    def metrics_text(self) -> str:
        """Prometheus text of the watch's gauges."""
        d = self.detector
        return (
            "# HELP frontend_router_progress_ok 1 while router_bls makes progress (or has nothing to do), "
            "0 once it was busy without progress for the bound.\n# TYPE frontend_router_progress_ok gauge\n"
            f"frontend_router_progress_ok {int(d.healthy)}\n"
            "# HELP frontend_router_stalled_seconds Seconds router_bls has been busy without progress.\n"
            "# TYPE frontend_router_stalled_seconds gauge\n"
            f"frontend_router_stalled_seconds {d.stalled_s:.1f}\n"
        )


def chat_renderer(tokenizer_dir: str) -> Callable[[list[dict[str, str]]], str]:
    """Render messages with the model's own chat template (from its tokenizer files), once per request."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    if not getattr(tok, "chat_template", None):
        raise SystemExit(f"frontend: the tokenizer in {tokenizer_dir} has no chat template; "
                         "/v1/chat/completions needs one (tokenizer_config.json 'chat_template')")

    def render(messages: list[dict[str, str]]) -> str:
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    return render


def _error(err: m.ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers())


async def _json(request: Request) -> Any:
    try:
        return await request.json()
    except Exception:  # noqa: BLE001 - not JSON at all
        raise m.bad("the request body is not valid JSON") from None


def create_app(router: TritonRouter, defaults: m.Defaults,
               render: Callable[[list[dict[str, str]]], str] | None, watch: HangWatch | None = None) -> FastAPI:
    """The ASGI app: /v1/models, /v1/completions, /v1/chat/completions, /health, /health/ready, /metrics."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        task = asyncio.ensure_future(watch.run()) if watch is not None else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
            await router.close()

    app = FastAPI(title="hybrid-llm OpenAI frontend", docs_url=None, redoc_url=None, lifespan=lifespan)
    created = int(time.time())

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return m.models_body(defaults.model, created)

    @app.get("/health")
    async def health() -> Response:
        ok = await router.live()
        return JSONResponse({"status": "ok" if ok else "triton unreachable"}, status_code=200 if ok else 503)

    @app.get("/health/ready")
    async def ready() -> Response:
        triton = await router.ready()
        progressing = watch is None or watch.detector.healthy
        body: dict[str, Any] = {"ready": triton and progressing}
        if not progressing:
            body["reason"] = (f"router_bls has been busy ({watch.detector.admitted} requests admitted) without "
                              f"progress for {watch.detector.stalled_s:.0f} s")
        return JSONResponse(body, status_code=200 if body["ready"] else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(watch.metrics_text() if watch is not None else "", media_type="text/plain; version=0.0.4")

    async def serve(request: Request, kind: str) -> Response:
        try:
            body = await _json(request)
            headers = m.header_map(request.headers)
            if kind == "completion":
                req = m.completion_request(body, headers, defaults)
            else:
                if render is None:
                    raise m.ApiError(404, "this server has no chat template; use /v1/completions")
                req = m.chat_request(body, headers, defaults, render)
        except m.ApiError as err:
            return _error(err)
        pieces = router.generate(req.generation, req.request_id)
        try:
            first = await pieces.__anext__()
        except RouterError as err:
            return _error(m.http_error_of(err.code, err.message))
        except StopAsyncIteration:
            return _error(m.ApiError(500, "router_bls ended the stream without a response", "server_error"))
        if req.stream:
            return StreamingResponse(_stream(req, first, pieces), media_type="text/event-stream",
                                     headers={m.ENGINE_HEADER: first.backend or "", "Cache-Control": "no-cache"})
        return await _unary(request, req, first, pieces)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await serve(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await serve(request, "chat")

    return app


def _fold(out: m.Outcome, piece: Piece) -> None:
    out.text += piece.text
    out.backend = piece.backend or out.backend
    if piece.num_input_tokens is not None:
        out.prompt_tokens = piece.num_input_tokens
    if piece.num_output_tokens is not None:
        out.completion_tokens = piece.num_output_tokens


async def _unary(request: Request, req: m.FrontendRequest, first: Piece,
                 pieces: AsyncIterator[Piece]) -> Response:
    """Collect the whole answer; a client that leaves meanwhile cancels it (499)."""
    out = m.Outcome()
    _fold(out, first)

    async def collect() -> None:
        if first.last:
            return
        async for piece in pieces:
            _fold(out, piece)

    task = asyncio.ensure_future(collect())
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=0.25)
            if not task.done() and await request.is_disconnected():
                task.cancel()  # the generator's own cancel and stop run as the task unwinds
                await asyncio.gather(task, return_exceptions=True)
                return _error(m.ApiError(499, "the client closed the request", "server_error", code="cancelled"))
        task.result()
    except RouterError as err:
        return _error(m.http_error_of(err.code, err.message))
    finally:
        await pieces.aclose()  # now, not at garbage collection (a left client's stop goes out here)
    return JSONResponse(m.response_body(req, out), headers={m.ENGINE_HEADER: out.backend or ""})


async def _stream(req: m.FrontendRequest, first: Piece, pieces: AsyncIterator[Piece]) -> AsyncIterator[bytes]:
    """SSE: a chunk per router response, the final chunk, usage if asked, [DONE].

    A disconnect cancels this generator; closing ``pieces`` then cancels the gRPC stream.
    """
    out = m.Outcome()
    try:
        if req.kind == "chat":
            yield m.sse(m.delta_chunk(req, "", first=True))  # the role comes first, as OpenAI sends it
        piece: Piece | None = first
        while piece is not None:
            _fold(out, piece)
            if piece.last:
                for chunk in m.final_chunks(req, out, piece.text):
                    yield m.sse(chunk)
                break
            if piece.text:
                yield m.sse(m.delta_chunk(req, piece.text))
            try:
                piece = await pieces.__anext__()
            except StopAsyncIteration:
                piece = None
        yield m.sse("[DONE]")
    except RouterError as err:
        yield m.sse(m.http_error_of(err.code, err.message).body())
        yield m.sse("[DONE]")
    finally:
        await pieces.aclose()
