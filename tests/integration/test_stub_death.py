"""Real faults: SIGKILL the Python stub that owns a vLLM engine, then SIGKILL tritonserver
itself. The engine processes must not outlive their stub, and neither stub nor engine may
outlive the server (the orphan guard kills them); after a stub's death the server stays live.

Each test gets its own server with the trtllm stand-in only (one engine), so a fault
touches nothing else.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request

import pytest

from hybrid_llm.contracts import GenerationRequest, trtllm_tensors
from client.stream import stream_grpc
from hybrid_llm.procs import shm_paths
from tests.server_fixture import running_server, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture()
def server():
    with running_server("stub_death", models=["trtllm"]) as s:
        yield s


def _serve_once(server) -> None:
    r = stream_grpc(server.grpc_url, "trtllm", trtllm_tensors([1, 2, 3, 4],
                                                              GenerationRequest("", max_tokens=4)), timeout_s=60)
    assert r.ok, r.error


def _exists(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _survivors(pids: list[int]) -> list[tuple[int, str, str]]:
    """(pid, state, command line) of the processes in ``pids`` that still live (zombies do not)."""
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:120]
        except OSError:
            continue
        if state != "Z":
            out.append((pid, state, cmd))
    return out


def test_engine_processes_die_with_their_stub(server):
    _serve_once(server)
    stubs, cores = server.stub_pids("trtllm"), server.engine_core_pids("trtllm")
    assert len(stubs) == 1 and cores, (stubs, cores)
    engine_tree = [pid for pid in server.descendants() if pid not in stubs]
    workers = [pid for pid in engine_tree if _exists(pid) and pid not in cores]
    shm = shm_paths(cores)
    assert shm, "the engine maps no /dev/shm queue (vLLM changed?)"
    os.kill(stubs[0], signal.SIGKILL)
    wait_for(lambda: not any(_exists(pid) for pid in cores + workers), 15,
             f"engine processes {cores + workers} to exit after their stub was killed")
    wait_for(lambda: not any(os.path.exists(p) for p in shm), 10, f"the engine's shared memory {shm} removed")
    with urllib.request.urlopen(f"http://{server.http_url}/v2/health/live", timeout=5) as resp:
        assert resp.status == 200


def test_nothing_outlives_a_crashed_server(server):
    _serve_once(server)
    stubs, cores = server.stub_pids("trtllm"), server.engine_core_pids("trtllm")
    everything = server.descendants()
    assert len(stubs) == 1 and cores and set(stubs + cores) <= set(everything)
    shm = shm_paths(cores)
    server.proc.kill()  # SIGKILL tritonserver: its stubs are reparented, nobody stops them
    server.proc.wait()
    # The guard polls once a second; 60 s leaves room for a loaded CI machine. A failure
    # names the survivors, their state and command line.
    deadline = time.monotonic() + 60
    while _survivors(everything) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _survivors(everything), f"alive 60 s after the server was killed: {_survivors(everything)}"
    wait_for(lambda: not any(os.path.exists(p) for p in shm), 10, f"the engine's shared memory {shm} removed")
