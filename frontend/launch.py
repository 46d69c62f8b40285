"""Run the frontend as a child process beside tritonserver (``make serve``, tests, benchmarks)."""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from hybrid_llm.server import prepare_child

ROOT = Path(__file__).resolve().parent.parent


class FrontendProcess:
    """``python -m frontend`` on 127.0.0.1:``port``, in front of Triton's gRPC ``grpc_url``."""

    def __init__(self, grpc_url: str, port: int, model_name: str, tokenizer: Path, log_path: Path,
                 nice: int = 0, metrics_url: str | None = None, hang_bound_s: float | None = None) -> None:
        self.grpc_url, self.port, self.model_name, self.tokenizer = grpc_url, port, model_name, tokenizer
        self.log_path = log_path
        self.nice = nice
        self.metrics_url, self.hang_bound_s = metrics_url, hang_bound_s
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The base URL clients use (``.../v1`` is the OpenAI API)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the process (returns at once; see ``wait_ready``)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        cmd = [sys.executable, "-m", "frontend", "--triton-grpc", self.grpc_url, "--port", str(self.port),
               "--model-name", self.model_name, "--tokenizer", str(self.tokenizer)]
        if self.metrics_url:
            cmd += ["--metrics-url", self.metrics_url]
        if self.hang_bound_s is not None:
            cmd += ["--hang-bound-s", str(self.hang_bound_s)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                     preexec_fn=functools.partial(prepare_child, self.nice))
        log.close()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait until GET /v1/models answers; RuntimeError with the log's tail if it exits or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"frontend exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"frontend not up within {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the frontend's log."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def terminate(self) -> None:
        """Send SIGTERM and return (``stop`` waits)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def __enter__(self) -> "FrontendProcess":
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
