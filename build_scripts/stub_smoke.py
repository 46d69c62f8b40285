"""Smoke check of a tritonserver 2.51 runtime's Python backend stub, under whatever numpy it sees.

Writes a temporary model repository with three Python models, starts tritonserver on free
loopback ports, and compares every value exactly:
  echo      BYTES, INT32 and FP32 inputs (several elements each) returned as outputs
  stream    decoupled: N responses over POST /v2/models/stream/generate_stream (SSE)
  bls       calls echo with pb_utils.InferenceRequest(...).exec() and returns its outputs
Each model also returns the numpy version the stub imported (printed at the end).

The wheel's pybind11-2.10 stub fails this under numpy 2 (STACK.md): BYTES crash the stub,
numeric inputs arrive as copies of element 0, outputs arrive empty.

Usage:
  python -m build_scripts.stub_smoke [--server-root .runtime/tritonserver]
      [--python-bin-dir DIR]   # put first on PATH: the stub uses that Python's site-packages
      [--ld-library-path DIR]  # extra entries, repeatable (e.g. nvidia_pytriton.libs)
      [--stub PATH]            # test this stub instead of the runtime's (placed in the repository)
      [--expect-numpy 2.]      # fail unless the stub saw a numpy version starting so

Standard library and hybrid_llm.server only (the models use numpy inside the stub). Exit 0 when everything
matched; 1 with a message naming each difference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Sequence

from hybrid_llm.server import TritonServer

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SERVER_ROOT = ROOT / ".runtime" / "tritonserver"

# Values chosen to catch the numpy-2 failures: several elements (a copy of element 0 shows),
# non-ASCII, an empty string, JSON escapes, int32 extremes, floats that round in FP32.
TEXT = ["hello", "", "naïve ünïcödé ✓", 'tab\tquote"back\\slash', "x" * 300]
INTS = [-2147483648, -1, 0, 7, 2147483647]
FLOATS = [1.5, -2.25, 0.1, 3.4028234663852886e38, 1e-30, 0.0]
STREAM_TEXT, STREAM_COUNT, STREAM_SCALE = "héllo wörld", 4, 0.1

ECHO_CONFIG = """name: "echo"
backend: "python"
max_batch_size: 0
input [
  { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "INTS" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "FLOATS" data_type: TYPE_FP32 dims: [ -1 ] }
]
output [
  { name: "TEXT_OUT" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "INTS_OUT" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "FLOATS_OUT" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "NUMPY_VERSION" data_type: TYPE_STRING dims: [ 1 ] }
]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

ECHO_MODEL = '''import numpy as np
import triton_python_backend_utils as pb_utils

NAMES = ("TEXT", "INTS", "FLOATS")


class TritonPythonModel:
    def initialize(self, args):
        # Custom metrics cross the stub's shared memory too (the router uses them): one kept,
        # and one made and dropped per request (its destructor talks to the server).
        self.family = pb_utils.MetricFamily(name="stub_smoke_requests", description="smoke check",
                                            kind=pb_utils.MetricFamily.COUNTER)
        self.counter = self.family.Metric(labels={"model": "echo"})

    def execute(self, requests):
        responses = []
        for request in requests:
            self.counter.increment(1)
            temporary = self.family.Metric(labels={"model": "echo", "kind": "temporary"})
            temporary.increment(1)
            del temporary
            tensors = [pb_utils.Tensor(n + "_OUT", pb_utils.get_input_tensor_by_name(request, n).as_numpy())
                       for n in NAMES]
            tensors.append(pb_utils.Tensor("NUMPY_VERSION", np.array([np.__version__.encode()], dtype=np.object_)))
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
'''

BLS_CONFIG = ECHO_CONFIG.replace('name: "echo"', 'name: "bls"')

BLS_MODEL = '''import numpy as np
import triton_python_backend_utils as pb_utils

NAMES = ("TEXT", "INTS", "FLOATS")


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            # Rebuilt from numpy on the way in and out, so both conversions are exercised.
            inputs = [pb_utils.Tensor(n, pb_utils.get_input_tensor_by_name(request, n).as_numpy()) for n in NAMES]
            reply = pb_utils.InferenceRequest(model_name="echo", inputs=inputs,
                                              requested_output_names=[n + "_OUT" for n in NAMES]).exec()
            if reply.has_error():
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("echo failed: " + reply.error().message())))
                continue
            tensors = [pb_utils.Tensor(n + "_OUT", pb_utils.get_output_tensor_by_name(reply, n + "_OUT").as_numpy())
                       for n in NAMES]
            tensors.append(pb_utils.Tensor("NUMPY_VERSION", np.array([np.__version__.encode()], dtype=np.object_)))
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
'''

STREAM_CONFIG = """name: "stream"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "SCALE" data_type: TYPE_FP32 dims: [ 1 ] }
]
output [
  { name: "INDEX" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "TEXT_OUT" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "VALUE" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "RANGE" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "NUMPY_VERSION" data_type: TYPE_STRING dims: [ 1 ] }
]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

STREAM_MODEL = '''import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)[0]
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy().reshape(-1)[0])
            scale = pb_utils.get_input_tensor_by_name(request, "SCALE").as_numpy().reshape(-1)[0]
            for i in range(count):
                tensors = [
                    pb_utils.Tensor("INDEX", np.array([i], dtype=np.int32)),
                    pb_utils.Tensor("TEXT_OUT", np.array([text + b"#" + str(i).encode()], dtype=np.object_)),
                    pb_utils.Tensor("VALUE", np.array([scale * np.float32(i)], dtype=np.float32)),
                    pb_utils.Tensor("RANGE", np.arange(10, 10 + i + 2, dtype=np.int32)),
                    pb_utils.Tensor("NUMPY_VERSION", np.array([np.__version__.encode()], dtype=np.object_)),
                ]
                final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if i == count - 1 else 0
                sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=final)
            if count <= 0:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

MODELS = {"echo": (ECHO_CONFIG, ECHO_MODEL), "bls": (BLS_CONFIG, BLS_MODEL), "stream": (STREAM_CONFIG, STREAM_MODEL)}


def f32(value: float) -> float:
    """``value`` rounded to FP32, as a Python float (what the server sends back for it)."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


def write_repository(folder: Path, stub: Path | None = None,
                     models: dict[str, tuple[str, str]] | None = None) -> Path:
    """``models`` (name -> (config.pbtxt, model.py); default the three above); with ``stub``, a
    copy in each model's folder, which the backend prefers to its own."""
    for name, (config, model) in (MODELS if models is None else models).items():
        (folder / name / "1").mkdir(parents=True, exist_ok=True)
        (folder / name / "config.pbtxt").write_text(config)
        (folder / name / "1" / "model.py").write_text(model)
        if stub is not None:
            shutil.copy2(stub, folder / name / "triton_python_backend_stub")
    return folder


def stub_executables(server: TritonServer) -> set[str]:
    """The executables of the Python stubs running below the server."""
    exes = set()
    for child in server.descendants():
        try:
            exe = os.readlink(f"/proc/{child}/exe")
        except OSError:
            continue
        if Path(exe).name.startswith("triton_python_backend_stub"):
            exes.add(exe)
    return exes


def sha256(path: Path) -> str:
    """Hex sha256 of a file ("" if it cannot be read)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


def python_libdir(bin_dir: Path) -> str:
    """LIBDIR of the python in ``bin_dir`` (where its libpython is), "" if there is none."""
    python = bin_dir / "python"
    if not python.exists():
        python = bin_dir / "python3"
    if not python.exists():
        return ""
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR') or '')"],
                         capture_output=True, text=True)
    return out.stdout.strip()


def default_lib_dirs() -> list[str]:
    """nvidia_pytriton.libs of the project's venv, where tritonserver's own libraries are."""
    return [str(p) for p in sorted((ROOT / ".venv").glob("lib/python3*/site-packages/nvidia_pytriton.libs"))]


def server_env(bin_dir: Path, lib_dirs: Sequence[str]) -> dict[str, str]:
    """tritonserver's environment: the bin dir first on PATH, the libraries and libpython on LD_LIBRARY_PATH."""
    env = dict(os.environ)
    libs = [*lib_dirs, python_libdir(bin_dir), env.get("LD_LIBRARY_PATH", "")]
    env["LD_LIBRARY_PATH"] = ":".join(p for p in libs if p)
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}"
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(name, None)
    env["LC_ALL"] = env["LANG"] = "C.UTF-8"
    return env


def log_lines(path: Path, markers: Sequence[str], limit: int) -> list[str]:
    """The first ``limit`` lines of a log that contain one of ``markers``."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line[:300] for line in lines if any(m in line for m in markers)][:limit]


def post_json(url: str, body: dict[str, Any], timeout_s: float = 60.0) -> tuple[int, Any]:
    """POST JSON; (status, parsed body or error text)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as r:
            return r.status, json.loads(r.read().decode())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def infer(url: str, model: str) -> tuple[int, Any]:
    """One /infer call with the TEXT, INTS and FLOATS test values."""
    body = {"inputs": [
        {"name": "TEXT", "datatype": "BYTES", "shape": [len(TEXT)], "data": TEXT},
        {"name": "INTS", "datatype": "INT32", "shape": [len(INTS)], "data": INTS},
        {"name": "FLOATS", "datatype": "FP32", "shape": [len(FLOATS)], "data": FLOATS},
    ]}
    return post_json(f"{url}/v2/models/{model}/infer", body)


def check_infer(model: str, status: int, reply: Any) -> tuple[list[str], str]:
    """(differences, numpy version) of an echo-shaped /infer reply."""
    if status != 200:
        return [f"{model}: HTTP {status}: {str(reply)[:400]}"], ""
    outputs = {o["name"]: o for o in reply.get("outputs", [])}
    expected = {"TEXT_OUT": ("BYTES", TEXT), "INTS_OUT": ("INT32", INTS), "FLOATS_OUT": ("FP32", [f32(v) for v in FLOATS])}
    problems = []
    for name, (datatype, values) in expected.items():
        got = outputs.get(name)
        if got is None:
            problems.append(f"{model}: output {name} missing")
            continue
        if got.get("datatype") != datatype or got.get("shape") != [len(values)] or got.get("data") != values:
            problems.append(f"{model}: {name} differs: sent {datatype} {[len(values)]} {values!r}, got "
                            f"{got.get('datatype')} {got.get('shape')} {got.get('data')!r}"[:600])
    version = (outputs.get("NUMPY_VERSION", {}).get("data") or [""])[0]
    return problems, version


def generate_stream(url: str, model: str, body: dict[str, Any], timeout_s: float = 60.0) -> tuple[int, list[Any]]:
    """POST /generate_stream; (status, the JSON events of its SSE stream, or [error text])."""
    request = urllib.request.Request(f"{url}/v2/models/{model}/generate_stream", data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json",
                                                             "Accept": "text/event-stream"})
    events = []
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as r:
            for raw in r:
                line = raw.decode().strip()
                if line.startswith("data:"):
                    events.append(json.loads(line[5:].strip()))
            return r.status, events
    except urllib.error.HTTPError as exc:
        return exc.code, [exc.read().decode(errors="replace")]
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return 0, [str(exc)]


def check_stream(status: int, events: list[Any]) -> tuple[list[str], str]:
    """(differences, numpy version) of the decoupled model's SSE events."""
    if status != 200:
        return [f"stream: HTTP {status}: {str(events)[:400]}"], ""
    problems = []
    if len(events) != STREAM_COUNT:
        problems.append(f"stream: {len(events)} events, expected {STREAM_COUNT}: {str(events)[:400]}")
    for i, event in enumerate(events[:STREAM_COUNT]):
        if not isinstance(event, dict) or "error" in event:
            problems.append(f"stream: event {i} is an error: {str(event)[:300]}")
            continue
        want = {"INDEX": i, "TEXT_OUT": f"{STREAM_TEXT}#{i}", "VALUE": f32(f32(STREAM_SCALE) * i),
                "RANGE": list(range(10, 10 + i + 2))}
        for name, value in want.items():
            if event.get(name) != value:
                problems.append(f"stream: event {i} {name} is {event.get(name)!r}, expected {value!r}")
    version = next((e.get("NUMPY_VERSION", "") for e in events if isinstance(e, dict)), "")
    return problems, version


def run_checks(url: str, metrics_url: str) -> tuple[list[str], dict[str, str]]:
    """Every check; (differences, numpy version per model)."""
    problems, versions = [], {}
    for model in ("echo", "bls"):
        found, versions[model] = check_infer(model, *infer(url, model))
        problems += found
    body = {"TEXT": STREAM_TEXT, "COUNT": STREAM_COUNT, "SCALE": STREAM_SCALE}
    found, versions["stream"] = check_stream(*generate_stream(url, "stream", body))
    problems += found
    problems += check_metrics(metrics_url)
    return problems, versions


def check_metrics(metrics_url: str) -> list[str]:
    """The echo model's counter reads 2 (one echo, one through BLS) on Triton's /metrics."""
    # Triton starts its metrics service after HTTP/gRPC are ready: a refused connection right
    # after readiness is retried for a few seconds (seen on a loaded machine).
    deadline = time.monotonic() + 10
    while True:
        try:
            with urllib.request.urlopen(metrics_url, timeout=10) as resp:
                page = resp.read().decode()
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                return [f"metrics: {metrics_url} did not answer: {exc}"]
            time.sleep(0.2)
    want = 'stub_smoke_requests{model="echo"} 2'
    if want not in page:
        lines = [line for line in page.splitlines() if line.startswith("stub_smoke_requests")]
        return [f"metrics: expected '{want}' on /metrics, found {lines or 'no stub_smoke_requests line'}"]
    return []


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server-root", type=Path, default=DEFAULT_SERVER_ROOT,
                   help="tritonserver runtime (bin/tritonserver, backends/python)")
    p.add_argument("--python-bin-dir", type=Path, default=Path(sys.executable).parent,
                   help="first on PATH: the stub uses that Python's site-packages (default: this Python's)")
    p.add_argument("--ld-library-path", action="append", default=None, metavar="DIR",
                   help="extra LD_LIBRARY_PATH entries (default: the project venv's nvidia_pytriton.libs)")
    p.add_argument("--stub", type=Path, help="test this stub instead of the runtime's")
    p.add_argument("--expect-numpy", default="", metavar="PREFIX",
                   help="also fail unless every model saw a numpy version starting with PREFIX")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the server")
    p.add_argument("--keep", action="store_true", help="keep the temporary repository and log")
    return p.parse_args(argv)


def stub_and_env(args: argparse.Namespace) -> tuple[Path, Path, dict[str, str]]:
    """(server root, the stub under test, the server's environment) from the common options
    (--server-root, --stub, --python-bin-dir, --ld-library-path)."""
    root = args.server_root.resolve()
    lib_dirs = args.ld_library_path if args.ld_library_path is not None else default_lib_dirs()
    stub = (args.stub or root / "backends" / "python" / "triton_python_backend_stub").resolve()
    if args.stub:  # its libcudart.so.12 may lie beside it ($ORIGIN no longer points there)
        lib_dirs = [*lib_dirs, str(stub.parent)]
    return root, stub, server_env(args.python_bin_dir.absolute(), lib_dirs)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    args = parse_args(argv)
    root, stub, env = stub_and_env(args)
    record = stub.parent / "triton_python_backend_stub.json"
    built = json.loads(record.read_text()).get("stub_sha256") if record.is_file() and not args.stub else None
    print(f"[smoke] stub {stub}" + (" (built by build_stub.py)" if built else ""))
    print(f"[smoke] PATH starts with {args.python_bin_dir.absolute()}; LD_LIBRARY_PATH={env['LD_LIBRARY_PATH']}")
    if not (root / "bin" / "tritonserver").exists():
        raise SystemExit(f"[smoke] {root / 'bin' / 'tritonserver'} is missing (--server-root)")
    work = Path(tempfile.mkdtemp(prefix="stub-smoke-"))
    server = TritonServer(write_repository(work / "models", stub if args.stub else None), work / "tritonserver.log",
                          runtime=root, env=env, extra_args=("--exit-timeout-secs=5",),
                          shm_prefix=f"stubsmoke_{uuid.uuid4().hex[:8]}_")
    started = time.monotonic()
    try:
        server.start()
        server.wait_ready(args.timeout)
        url = f"http://{server.http_url}"
        print(f"[smoke] server ready in {time.monotonic() - started:.1f} s at {url}")
        running = stub_executables(server)  # before the checks: a crashed stub is gone
        print(f"[smoke] stub processes run: {', '.join(sorted(running)) or '(none found)'}")
        problems, versions = run_checks(url, server.metrics_url)
        if not running or any(sha256(Path(exe)) != sha256(stub) for exe in running):
            problems.append(f"the stubs that ran ({', '.join(sorted(running)) or 'none found'}) are not {stub}")
    except (RuntimeError, TimeoutError) as exc:  # the server exited, or never got ready
        problems, versions = [str(exc)], {}
    finally:
        server.stop()
    for model, version in versions.items():
        print(f"[smoke] {model}: the stub saw numpy {version or '(no answer)'}")
    if args.expect_numpy:
        problems += [f"{m}: numpy {v or '(no answer)'} does not start with {args.expect_numpy!r}"
                     for m, v in versions.items() if not v.startswith(args.expect_numpy)]
    if problems:
        print("\n[smoke] " + "!" * 60 + "\n[smoke] STUB SMOKE CHECK FAILED:", file=sys.stderr)
        for problem in problems:
            print(f"[smoke]   - {problem}", file=sys.stderr)
        print(f"[smoke] server log: {server.log_path}; what the stubs said:", file=sys.stderr)
        for line in log_lines(server.log_path, ("what():", "Traceback", "Error", "error:"), limit=8):
            print(f"[smoke]   | {line}", file=sys.stderr)
        return 1
    print(f"[smoke] OK: echo, bls and stream returned exactly what was sent ({time.monotonic() - started:.1f} s)")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
