"""The client's failure paths, without a Triton server: no server, a silent server, a
stream cut short. Each ends as a StreamResult with an error code, never an exception."""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from hybrid_llm.server import free_ports
from hybrid_llm.contracts import GenerationRequest, router_tensors
from client.stream import stream_grpc, stream_http


@contextmanager
def one_shot_server(handle: Callable[[socket.socket], None]) -> Iterator[str]:
    """A TCP server on 127.0.0.1 that runs ``handle`` on its first connection; yields host:port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    done = threading.Event()

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            handle(conn)
            done.wait(5)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{srv.getsockname()[1]}"
    finally:
        done.set()
        t.join(5)
        srv.close()


def test_grpc_without_a_server_is_unavailable_not_an_exception():
    tensors = router_tensors(GenerationRequest("hi", max_tokens=4))
    for _ in range(3):  # the stream breaks before or after the request is queued: both paths
        r = stream_grpc(f"127.0.0.1:{free_ports(1)[0]}", "router_bls", tensors, timeout_s=10)
        assert r.error_code == "UNAVAILABLE", r
        assert "connect" in r.error and not r.text and not r.cancelled


def test_http_without_a_server_is_unavailable_not_an_exception():
    port = free_ports(1)[0]
    r = stream_http(f"127.0.0.1:{port}", "router_bls", {"text_input": "hi"}, timeout_s=10)
    assert r.error_code == "UNAVAILABLE"
    assert r.error.startswith(f"connection to 127.0.0.1:{port} failed") and not r.text


def test_http_server_that_never_answers_times_out():
    with one_shot_server(lambda conn: conn.recv(65536)) as url:
        r = stream_http(url, "router_bls", {"text_input": "hi"}, timeout_s=0.5)
    assert r.error_code == "TIMEOUT" and r.error == "no response within 0.5 s"
    assert r.e2e_s < 5


def test_http_stream_cut_short_keeps_the_text_so_far():
    def half_a_stream(conn: socket.socket) -> None:
        conn.recv(65536)
        event = b'data: {"text_output": "Hello"}\n\n'
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + f"{len(event):x}\r\n".encode() + event + b"\r\n")
        conn.shutdown(socket.SHUT_RDWR)  # no terminating chunk: the connection breaks mid-stream

    with one_shot_server(half_a_stream) as url:
        r = stream_http(url, "router_bls", {"text_input": "hi"}, timeout_s=5)
    assert r.text == "Hello" and r.ttft_s is not None
    assert r.error_code == "UNAVAILABLE" and r.error.startswith(f"the stream from {url} broke after 1 chunks")


@contextmanager
def silent_grpc_server(seen: dict[str, threading.Event]) -> Iterator[str]:
    """A gRPC inference server whose stream takes requests and never answers; sets
    ``seen['request']`` on the first request and ``seen['cancelled']`` when the client
    cancels its stream (a plain close ends the requests without cancelling the call)."""
    import time
    from concurrent import futures

    import grpc
    from tritonclient.grpc import service_pb2_grpc

    class Silent(service_pb2_grpc.GRPCInferenceServiceServicer):
        def ModelStreamInfer(self, request_iterator, context):  # noqa: N802 - the service's name
            try:
                for _ in request_iterator:
                    seen["request"].set()
            except grpc.RpcError:
                pass  # the client cancelled
            deadline = time.monotonic() + 2
            while context.is_active() and time.monotonic() < deadline:
                time.sleep(0.01)
            if not context.is_active():
                seen["cancelled"].set()
            return iter(())

    server = grpc.server(futures.ThreadPoolExecutor(2))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Silent(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)


def test_grpc_cancel_event_closes_the_stream_with_cancellation():
    seen = {"request": threading.Event(), "cancelled": threading.Event()}
    cancel = threading.Event()
    with silent_grpc_server(seen) as url:
        threading.Thread(target=lambda: seen["request"].wait(10) and cancel.set(), daemon=True).start()
        r = stream_grpc(url, "router_bls", router_tensors(GenerationRequest("hi", max_tokens=4)),
                        timeout_s=30, cancel=cancel)
        assert seen["cancelled"].wait(5), "the server never saw the stream cancelled"
    assert r.cancelled and r.error is None and not r.text
    assert r.cancel_sent_s is not None and r.cancel_sent_s < 10 and r.e2e_s < 10
