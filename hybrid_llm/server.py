"""Start and stop a real tritonserver 2.51 (laid out by setup.sh) as a managed process.

Used by ``make serve`` and by the integration-test fixtures: free ports, the
environment the Python stubs and vLLM need, readiness polling, a log file, and a
teardown that kills only this server's own process tree and removes its own
shared-memory regions.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sysconfig
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from hybrid_llm.procs import alive, descendants, parent_of, shm_paths

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = ROOT / ".runtime" / "tritonserver"
VENV = ROOT / ".venv"
CACHE = ROOT / ".cache"
SHM = Path("/dev/shm")
# Triton 2.51's gRPC frontend keeps this many request/response objects for reuse. Left at
# its default, streamed responses reached clients seconds late under a burst (40 streams:
# refusals after up to 18 s; with 128: all within 0.55 s). Override with HYBRID_GRPC_POOL.
GRPC_POOL = int(os.environ.get("HYBRID_GRPC_POOL", "256"))


def free_ports(count: int) -> list[int]:
    """Ask the kernel for ``count`` distinct free TCP ports on loopback."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def server_environment(base: dict[str, str] | None = None, venv: Path = VENV,
                       runtime: Path = RUNTIME, device: str = "cpu") -> dict[str, str]:
    """The environment tritonserver and its Python stubs need (STACK.md).

    ``venv`` is the environment the stubs import from (its ``bin/`` goes first on PATH);
    the server's shared libraries are the pytriton wheel's, found in that venv's
    site-packages or, for a runtime laid out without the wheel (the offline GPU bundle),
    in ``runtime/lib``. ``device`` "cuda" leaves vLLM's target device to the engines.
    """
    env = dict(os.environ if base is None else base)
    site = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    libs = [str(p) for p in (site / "nvidia_pytriton.libs", runtime / "lib") if p.is_dir()] + [libdir]
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(p for p in libs if p)
    # The stub picks its site-packages from the python found first on PATH.
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    env["LC_ALL"] = "C.UTF-8"
    env["LANG"] = "C.UTF-8"
    tmp = CACHE / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(tmp)
    if device == "cpu":
        env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("VLLM_USE_AOT_COMPILE", "0")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


@dataclass
class TritonServer:
    """One tritonserver process serving ``repository``; use as a context manager."""

    repository: Path
    log_path: Path
    http_port: int = 0
    grpc_port: int = 0
    metrics_port: int = 0
    model_control: str = "none"  # or "explicit"
    load_models: Sequence[str] = ()
    extra_args: Sequence[str] = ()
    address: str = "127.0.0.1"
    nice: int = 0  # added to the server's niceness (all its processes): > 0 yields CPU to its clients
    runtime: Path = RUNTIME  # tritonserver's folder (bin/, backends/, caches/)
    venv: Path = VENV  # the environment the Python stubs import from
    device: str = "cpu"  # "cuda": GPU metrics on, vLLM's device left to the engines
    env: dict[str, str] | None = None  # the server's whole environment; None: server_environment(...)
    proc: subprocess.Popen | None = None
    shm_prefix: str = field(default_factory=lambda: f"hybrid_{uuid.uuid4().hex[:10]}_")
    _known_pids: set[int] = field(default_factory=set)
    leftover_pids: list[int] = field(default_factory=list)
    orphan_pids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not (self.http_port and self.grpc_port and self.metrics_port):
            self.http_port, self.grpc_port, self.metrics_port = free_ports(3)

    @property
    def http_url(self) -> str:
        """host:port of the HTTP endpoint."""
        return f"{self.address}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """host:port of the gRPC endpoint."""
        return f"{self.address}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """URL of Triton's Prometheus metrics endpoint."""
        return f"http://{self.address}:{self.metrics_port}/metrics"

    def command(self) -> list[str]:
        """The tritonserver command line."""
        binary = self.runtime / "bin" / "tritonserver"
        if not binary.exists():
            raise FileNotFoundError(f"{binary} is missing; run build_scripts/setup.sh (make setup)")
        cmd = [
            str(binary),
            f"--model-repository={self.repository}",
            f"--backend-directory={self.runtime / 'backends'}",
            f"--cache-directory={self.runtime / 'caches'}",
            f"--http-address={self.address}",
            f"--grpc-address={self.address}",
            f"--metrics-address={self.address}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            f"--allow-gpu-metrics={'true' if self.device == 'cuda' else 'false'}",
            "--allow-cpu-metrics=true",
            "--metrics-interval-ms=1000",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            f"--grpc-infer-allocation-pool-size={GRPC_POOL}",
            f"--model-control-mode={self.model_control}",
            "--log-verbose=0",
        ]
        for model in self.load_models:
            cmd.append(f"--load-model={model}")
        cmd.extend(self.extra_args)
        return cmd

    def start(self) -> "TritonServer":
        """Launch the server (does not wait for readiness)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT,
            env=self.env if self.env is not None else server_environment(venv=self.venv, runtime=self.runtime,
                                                                          device=self.device),
            cwd=str(ROOT), start_new_session=True, preexec_fn=functools.partial(_prepare_child, self.nice),
        )
        log.close()
        return self

    def is_ready(self) -> bool:
        """True when /v2/health/ready answers 200."""
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Block until ready; raise with the log's tail if the server exits or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.is_ready():
                self._known_pids |= set(self.descendants())
                return
            self._known_pids |= set(self.descendants())
            time.sleep(0.5)
        raise TimeoutError(f"tritonserver not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 60) -> str:
        """The last lines of the server log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def descendants(self) -> list[int]:
        """PIDs of every process below the server (stubs, engine cores, workers)."""
        return [] if self.proc is None else descendants(self.proc.pid)

    def rss_bytes(self) -> int:
        """Resident memory of the server and every process below it."""
        total = 0
        for pid in [self.proc.pid if self.proc else 0, *self.descendants()]:
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            except OSError:
                continue
        return total

    def control_model(self, model: str, action: str, timeout_s: float = 600.0) -> None:
        """POST /v2/repository/models/<model>/<load|unload> (explicit model-control mode)."""
        req = urllib.request.Request(f"http://{self.http_url}/v2/repository/models/{model}/{action}",
                                     data=b"{}", method="POST")
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            if resp.status != 200:
                raise RuntimeError(f"{action} {model}: HTTP {resp.status}")

    def model_ready(self, model: str) -> bool:
        """True when /v2/models/<model>/ready answers 200."""
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/models/{model}/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stub_pids(self, model: str) -> list[int]:
        """PIDs of the Python-backend stubs that serve ``model``."""
        stubs = []
        for pid in self.descendants():
            try:
                if f"/{model}/1/model.py" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    stubs.append(pid)
            except OSError:
                continue
        return stubs

    def engine_core_pids(self, model: str) -> list[int]:
        """PIDs of the VLLM::EngineCore processes started by the stub that serves ``model``."""
        stubs = set(self.stub_pids(model))
        cores = []
        for pid in self.descendants():
            try:
                if parent_of(pid) in stubs and "EngineCor" in Path(f"/proc/{pid}/comm").read_text():
                    cores.append(pid)
            except (OSError, ValueError, IndexError):
                continue
        return cores

    def shm_regions(self) -> list[Path]:
        """This server's Python-backend shared-memory regions."""
        return sorted(SHM.glob(f"{self.shm_prefix}*"))

    def stop(self, grace_s: float = 60.0) -> None:
        """SIGTERM, wait for a clean exit, then kill leftovers of this server only."""
        if self.proc is None:
            return
        self._known_pids |= set(self.descendants())
        mapped = shm_paths(list(self._known_pids))  # vLLM's queues too: a killed engine leaves them
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.orphan_pids = [p for p in self._known_pids if alive(p)]
        self.leftover_pids = _kill_pids(self.orphan_pids)
        for region in {*self.shm_regions(), *map(Path, mapped)}:  # the server maps its own regions too
            try:
                region.unlink()
            except OSError:
                pass

    def __enter__(self) -> "TritonServer":
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _prepare_child(nice: int = 0) -> None:
    """In the child: get SIGTERM when the launching process dies (no orphaned servers), and
    add ``nice`` to its niceness."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if nice:
        os.nice(nice)


def _kill_pids(pids: Iterable[int], wait_s: float = 5.0) -> list[int]:
    """SIGKILL processes that are still alive (only PIDs we recorded as ours); return survivors."""
    pids = [p for p in pids if alive(p)]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    deadline = time.monotonic() + wait_s
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if alive(p)]
        time.sleep(0.05)
    return pids
