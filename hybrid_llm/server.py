"""Start and stop a real tritonserver 2.51 (laid out by setup.sh) as a managed process.

Used by ``make serve`` and by the integration-test fixtures: free ports, the
environment the Python stubs and vLLM need, readiness polling, a log file, and a
teardown that kills only this server's own process tree and removes its own
shared-memory regions.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sysconfig
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from hybrid_llm.procs import alive, descendants, parent_of, shm_paths, start_time, unlink_all

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = ROOT / ".runtime" / "tritonserver"
VENV = ROOT / ".venv"
CACHE = ROOT / ".cache"
SHM = Path("/dev/shm")
# Triton 2.51's gRPC frontend keeps this many request/response objects for reuse. Left at
# its default, streamed responses reached clients seconds late under a burst (40 streams:
# refusals after up to 18 s; with 128: all within 0.55 s). Override with HYBRID_GRPC_POOL.
GRPC_POOL = int(os.environ.get("HYBRID_GRPC_POOL", "256"))
# Stopping: in-flight requests get EXIT_TIMEOUT_S (tritonserver --exit-timeout-secs), the
# whole server STOP_GRACE_S after SIGTERM; then this server's own recorded processes are
# SIGKILLed and its shared memory removed, so a stop takes < 10 s in every state (an
# engine that just died made tritonserver 2.51 wait > 30 s for its model to unload).
EXIT_TIMEOUT_S = 3
STOP_GRACE_S = 7.0


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
    # Where this server records its processes and shared memory while it runs; a start
    # that finds the record of an earlier run that did not stop cleanly (crash, SIGKILL)
    # kills what is left of that run and removes its shared memory. None: no record.
    state_path: Path | None = None
    _known: dict[int, int] = field(default_factory=dict)  # pid -> start time: every process seen below it
    leftover_pids: list[int] = field(default_factory=list)
    orphan_pids: list[int] = field(default_factory=list)
    stop_report: str = ""  # how the last stop went, phase by phase (make serve prints it)
    # Shared-memory files seen mapped by the server's processes (record_state), and a lock
    # that keeps a background record_state from writing the state file once a stop began.
    _shm_seen: set = field(default_factory=set)
    _state_lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: bool = False

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
            f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
            "--log-verbose=0",
        ]
        for model in self.load_models:
            cmd.append(f"--load-model={model}")
        cmd.extend(self.extra_args)
        return cmd

    def start(self) -> "TritonServer":
        """Launch the server (does not wait for readiness), after cleaning up an earlier crashed run."""
        if self.state_path is not None:
            clean_stale_run(self.state_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        with self._state_lock:
            self._stopping, self._shm_seen = False, set()
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT,
            env=self.env if self.env is not None else server_environment(venv=self.venv, runtime=self.runtime,
                                                                          device=self.device),
            cwd=str(ROOT), start_new_session=True, preexec_fn=functools.partial(prepare_child, self.nice),
        )
        log.close()
        self.record_state()
        return self

    def record_state(self) -> None:
        """Write this run's processes (pid, start time) and shared-memory files to ``state_path``."""
        if self.state_path is None or self.proc is None:
            return
        # _known is read by stop() on another thread (make serve records on a background one)
        with self._state_lock:
            if self._stopping:
                return
            self._remember()
            live = [pid for pid, st in self._known.items() if alive(pid, st)]
        server = [[self.proc.pid, st]] if (st := start_time(self.proc.pid)) is not None else []
        mapped = shm_paths([self.proc.pid, *live])  # reads /proc/*/maps: seconds for busy vLLM processes
        with self._state_lock:
            if self._stopping:
                return
            self._shm_seen.update(mapped)
            state = {"prefix": self.shm_prefix,
                     "processes": server + [[pid, self._known[pid]] for pid in sorted(live)],
                     "shm": sorted({*self._shm_seen, *map(str, self.shm_regions())})}
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.state_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(state))
            tmp.replace(self.state_path)

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
                self._remember()
                return
            self._remember()
            time.sleep(0.5)
        raise TimeoutError(f"tritonserver not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 60) -> str:
        """The last lines of the server log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _remember(self) -> None:
        """Add the processes below the server now to the ones seen (with their start times)."""
        for pid in self.descendants():
            if pid not in self._known and (st := start_time(pid)) is not None:
                self._known[pid] = st

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

    def stop(self, grace_s: float = STOP_GRACE_S) -> float:
        """SIGTERM; after ``grace_s`` SIGKILL this server's own recorded processes; remove its
        shared memory. Returns the seconds it took."""
        t0 = time.monotonic()
        if self.proc is None:
            return 0.0
        with self._state_lock:
            self._stopping = True
        self._remember()
        # The files the processes map (vLLM's queues too: a killed engine leaves them). Read
        # from /proc/*/maps, which took 5 s under load before SIGTERM went out: a server that
        # records its state (make serve, every 5 s) uses what it recorded; else scan now.
        mapped = (set(self._shm_seen) if self._shm_seen
                  else shm_paths([pid for pid, st in self._known.items() if alive(pid, st)]))
        how = "had exited"
        t_term = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            how = "exited on SIGTERM"
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self._remember()
                self.proc.kill()
                self.proc.wait(timeout=10)
                how = f"SIGKILLed after {grace_s:.1f} s"
        t_exit = time.monotonic()
        self.orphan_pids = [pid for pid, st in self._known.items() if alive(pid, st)]
        self.leftover_pids = _kill_pids(self.orphan_pids)
        t_orphans = time.monotonic()
        for region in {*self.shm_regions(), *map(Path, mapped)}:  # the server maps its own regions too
            try:
                region.unlink()
            except OSError:
                pass
        if self.state_path is not None and not self.leftover_pids:
            self.state_path.unlink(missing_ok=True)
        self.stop_report = (f"tritonserver {how} ({t_exit - t_term:.1f} s), {len(self.orphan_pids)} processes "
                            f"left below it killed ({t_orphans - t_exit:.1f} s), {t_term - t0:.1f} s before SIGTERM")
        return time.monotonic() - t0

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


def prepare_child(nice: int = 0) -> None:
    """In the child: get SIGTERM when the launching process dies (no orphaned servers), and
    add ``nice`` to its niceness (and to its autogroup's, when it leads a session of its own)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if nice:
        niceness = os.nice(nice)
        # A new session is a new scheduler autogroup, and niceness only ranks tasks inside
        # their autogroup: without this the whole server weighs as much as any client
        # session and the kernel starves clients for over a second while vLLM generates.
        # A child in its launcher's session shares the launcher's autogroup: leave that alone.
        if os.getsid(0) == os.getpid():
            try:
                with open("/proc/self/autogroup", "w") as f:
                    f.write(str(niceness))
            except OSError:
                pass  # no autogroups (CONFIG_SCHED_AUTOGROUP off or disabled): niceness already applies


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


def clean_stale_run(state_path: Path) -> tuple[int, int]:
    """Kill what is left of the run recorded in ``state_path`` (its processes, by pid and start
    time, so nothing else is touched) and remove its shared memory, unless that run is still
    serving; returns (processes killed, files removed)."""
    try:
        state = json.loads(state_path.read_text())
    except (OSError, ValueError):
        return 0, 0
    processes = [(int(pid), int(st)) for pid, st in state.get("processes", [])]
    if processes and alive(*processes[0]):
        raise RuntimeError(f"the server recorded in {state_path} (pid {processes[0][0]}) is still running; "
                           "stop it first")
    ours = [pid for pid, st in processes if alive(pid, st)]
    _kill_pids(ours)
    prefix = state.get("prefix", "")
    files = [*state.get("shm", []), *(map(str, SHM.glob(f"{prefix}*")) if prefix else [])]
    removed = unlink_all(sorted(set(files)))
    state_path.unlink(missing_ok=True)
    return len(ours), removed
