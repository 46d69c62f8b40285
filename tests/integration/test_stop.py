"""``make serve`` (build_scripts/serve.py) stops within 10 s on SIGTERM: idle, under load,
right after an engine death and during the engine's restart, leaving none of its own
processes or shared-memory files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from client.stream import stream_grpc
from hybrid_llm.contracts import GenerationRequest, router_tensors
from hybrid_llm.procs import alive, children_named, start_time
from hybrid_llm.server import ROOT, free_ports
from tests.server_fixture import BUILD

pytestmark = pytest.mark.integration
STOP_BOUND_S = 10.0


class Serve:
    """One ``python -m build_scripts.serve`` on free ports, with its output collected."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._start()

    def _start(self) -> None:
        self.http, self.grpc, self.metrics, self.openai = free_ports(4)
        self.dir = BUILD / self.name
        self.lines: list[str] = []
        cmd = [sys.executable, "-m", "build_scripts.serve", "--http-port", str(self.http), "--grpc-port",
               str(self.grpc), "--metrics-port", str(self.metrics), "--openai-port", str(self.openai),
               "--repository", str(self.dir / "repository"), "--log-dir", str(self.dir / "logs")]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     preexec_fn=lambda: os.nice(5))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    @property
    def state_path(self) -> Path:
        return self.dir / "logs" / f"serve-{self.http}.state.json"

    def wait_ready(self, timeout_s: float = 420.0) -> dict:
        deadline = time.monotonic() + timeout_s
        retried = False
        while time.monotonic() < deadline:
            if any("Ctrl-C to stop" in line for line in self.lines):
                return json.loads(self.state_path.read_text())
            if self.proc.poll() is not None and not retried and any("already in use" in ln for ln in self.lines):
                # free_ports releases its ports before tritonserver binds them; another
                # process took one in between. Once, with new ports.
                self.proc.wait()
                retried = True
                self._start()
                continue
            assert self.proc.poll() is None, "\n".join(self.lines[-40:])
            time.sleep(0.5)
        raise AssertionError("serve not ready:\n" + "\n".join(self.lines[-40:]))

    def kill(self) -> None:
        """After a failed test: SIGTERM and wait, so no run outlives its test."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def sigterm(self) -> float:
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        return time.monotonic() - t0


def _assert_clean(state: dict, serve: Serve) -> None:
    time.sleep(0.2)
    left = [pid for pid, st in state["processes"] if alive(pid, st)]
    assert not left, f"processes of the run still alive: {left}"
    files = [f for f in state["shm"] if os.path.exists(f)]
    assert not files, f"shared-memory files left: {files}"
    assert not list(Path("/dev/shm").glob(f"{state['prefix']}*"))
    assert not serve.state_path.exists()
    assert serve.proc.returncode == 0, "\n".join(serve.lines[-20:])
    stubs = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if state["prefix"].encode() in cmdline.read_bytes():  # the stubs name their shm prefix
                stubs.append(cmdline.parent.name)
        except OSError:
            continue
    assert not stubs, f"stubs of this run still alive: {stubs}"


@pytest.fixture
def serve_run(request):
    runs: list[Serve] = []
    yield lambda name: runs.append(Serve(name)) or runs[-1]
    for run in runs:
        run.kill()


def test_an_idle_server_stops_within_10_s(serve_run):
    serve = serve_run("stop-idle")
    state = serve.wait_ready()
    assert len(state["processes"]) >= 5 and state["shm"]  # server, 3 stubs, engines; their regions
    took = serve.sigterm()
    assert took < STOP_BOUND_S, (took, serve.lines[-5:])
    _assert_clean(state, serve)


def test_a_server_under_load_stops_within_10_s_and_every_stream_ends(serve_run):
    serve = serve_run("stop-load")
    serve.wait_ready()
    results = []

    def stream(i: int) -> None:
        req = GenerationRequest(f"tell me a long story number {i}", max_tokens=1000, min_tokens=1000, temperature=0.0,
                                latency_sla_ms=50.0 if i % 2 else None)
        results.append(stream_grpc(f"127.0.0.1:{serve.grpc}", "router_bls", router_tensors(req), timeout_s=60))

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(3.0)  # streaming on both engines
    state = json.loads(serve.state_path.read_text())
    took = serve.sigterm()
    for t in threads:
        t.join(timeout=30)
    assert took < STOP_BOUND_S, (took, serve.lines[-5:])
    assert len(results) == 8  # every client got an answer (text or an error), none hangs
    _assert_clean(state, serve)


def _engine_cores(state: dict) -> list[int]:
    """The vLLM engine-core processes below the run's processes now (a restarted engine's are new)."""
    return [core for pid, _ in state["processes"] for core in children_named(pid, "VLLM::EngineCore")]


def test_a_server_stops_within_10_s_right_after_an_engine_death(serve_run):
    serve = serve_run("stop-engine-death")
    state = serve.wait_ready()
    cores = [pid for pid, _ in state["processes"]
             if "EngineCor" in Path(f"/proc/{pid}/comm").read_text(errors="replace")]
    assert cores, state
    os.kill(cores[0], signal.SIGKILL)
    time.sleep(0.5)
    took = serve.sigterm()
    assert took < STOP_BOUND_S, (took, serve.lines[-5:])
    _assert_clean(state, serve)


def test_a_server_stops_within_10_s_during_an_engine_restart(serve_run):
    serve = serve_run("stop-engine-restart")
    state = serve.wait_ready()
    first = _engine_cores(state)
    assert first, state
    log = serve.dir / "logs" / "server.log"
    os.kill(first[0], signal.SIGKILL)
    deadline = time.monotonic() + 60
    new: list[int] = []
    while time.monotonic() < deadline:  # the model noticed and a new engine core is starting
        new = [pid for pid in _engine_cores(state) if pid not in first]
        if new and "the engine process died; restarting it" in log.read_text(errors="replace"):
            break
        time.sleep(0.2)
    assert new, "no engine restart began within 60 s:\n" + "\n".join(serve.lines[-20:])
    assert "engine restarted in" not in log.read_text(errors="replace")  # still restarting
    starting = [(pid, st) for pid in new if (st := start_time(pid)) is not None]
    t0 = time.monotonic()
    took = serve.sigterm()
    assert took < STOP_BOUND_S, (took, serve.lines[-5:])
    _assert_clean(state, serve)
    # The starting engine is no child the run recorded: its stub's orphan guard (one poll a
    # second) kills it once the stub is gone, within the same bound.
    while any(alive(pid, st) for pid, st in starting) and time.monotonic() - t0 < STOP_BOUND_S:
        time.sleep(0.2)
    assert not [pid for pid, st in starting if alive(pid, st)], "the restarting engine outlived the run"
