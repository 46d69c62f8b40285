"""Set up and serve the gpu-vllm profile on a GPU host with no network, from the offline bundle.

The other half of ``build_scripts/gpu_bundle.py``. On the GPU host, with the bundle's
folders copied anywhere (e.g. ``.bundle/parts/p01`` ... of this checkout):

    python3 -m build_scripts.gpu_offline receive .bundle/parts/p*   # any order, any number at a time
    python3 -m build_scripts.gpu_offline setup                      # venv + wheels, runtime, stub, smoke, model
    python3 -m build_scripts.gpu_offline serve                      # render gpu-vllm, start, wait for ready

``receive`` keeps each chunk in the staging folder and unpacks a group as soon as its
last chunk is there (so the stub can be built while vLLM is still on its way); ``setup``
runs whatever is not done yet: each step leaves a stamp and is skipped next time.
``serve --detach`` starts a supervisor in its own session (it outlives the shell) and
returns once the server is ready; ``stop`` ends it. Everything lives in ignored folders of
the checkout: ``.bundle/staging``, ``.runtime/gpu/`` (venv, tritonserver, stub build),
``models/random-llama-1b``, ``build/gpu-vllm/``.

What the host must have (the H200 image of STACK.md): CPython 3.12 with its headers and
libpython, PyTorch 2.11 + CUDA, numpy 2, gcc, cmake, ninja, Boost headers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
from pathlib import Path
from typing import Sequence

from build_scripts.build_stub import sha256_file
from build_scripts.gpu_bundle import MANIFEST

ROOT = Path(__file__).resolve().parent.parent
STAGING = ROOT / ".bundle" / "staging"
GPU = ROOT / ".runtime" / "gpu"
VENV = GPU / "venv"
RUNTIME = GPU / "tritonserver"
MODEL = ROOT / "models" / "random-llama-1b"
REPO = ROOT / "build" / "gpu-vllm" / "repository"
STATE = GPU / "server.json"
LOG = ROOT / "build" / "gpu-vllm" / "server.log"


def say(msg: str) -> None:
    """Progress line on stdout."""
    print(f"[gpu-offline] {msg}", flush=True)


def receive(folders: Sequence[Path], staging: Path = STAGING) -> list[str]:
    """Copy the chunks of bundle folders into ``staging``; unpack every group now complete.

    Returns the groups unpacked by this call. A chunk already received is not copied
    again; a group's archive is checked against the manifest's sha256 before unpacking.
    """
    staging.mkdir(parents=True, exist_ok=True)
    manifest: dict | None = None
    for folder in folders:
        info = json.loads((folder / MANIFEST).read_text())
        manifest = manifest or info
        for name in info["chunks"]:
            dst = staging / name
            if not dst.exists() or dst.stat().st_size != (folder / name).stat().st_size:
                shutil.copyfile(folder / name, dst.with_suffix(dst.suffix + ".part"))
                os.replace(dst.with_suffix(dst.suffix + ".part"), dst)
    if manifest is None:
        return []
    (staging / MANIFEST).write_text(json.dumps(manifest))
    done = []
    for group in manifest["order"]:
        meta = manifest["groups"][group]
        stamp = staging / f"{group}.unpacked"
        if stamp.exists():
            continue
        chunks = [staging / f"{group}.tar.xz.{i:03d}" for i in range(meta["chunks"])]
        if not all(c.exists() for c in chunks):
            continue
        archive = staging / f"{group}.tar.xz"
        with open(archive, "wb") as out:
            for c in chunks:
                with open(c, "rb") as src:
                    shutil.copyfileobj(src, out, 8 * 2**20)
        if sha256_file(archive) != meta["sha256"]:
            archive.unlink()
            raise RuntimeError(f"group {group}: sha256 differs from the manifest; copy its folders again")
        with tarfile.open(archive, "r:xz") as tar:
            tar.extractall(staging, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(staging)
        archive.unlink()
        for c in chunks:
            c.unlink()
        stamp.write_text(str(time.time()))
        done.append(group)
        say(f"unpacked {group}")
    missing = [g for g in manifest["order"] if not (staging / f"{g}.unpacked").exists()]
    say(f"groups waiting for chunks: {missing or 'none'}")
    return done


def _stamped(name: str) -> bool:
    return (GPU / f".{name}.done").exists()


def _stamp(name: str) -> None:
    GPU.mkdir(parents=True, exist_ok=True)
    (GPU / f".{name}.done").write_text(str(time.time()))


def venv_site(venv: Path = VENV) -> Path:
    """The venv's site-packages folder."""
    return Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])


def make_venv(base_python: str, venv: Path = VENV) -> Path:
    """A venv whose site-packages come first and the base interpreter's (torch, numpy) after.

    The image's python3 may itself be a venv; ``--system-site-packages`` would then see
    the system Python's packages, not the image's, so a .pth file adds the base
    interpreter's site-packages instead.
    """
    if not (venv / "bin" / "python3").exists():
        subprocess.run([base_python, "-m", "venv", "--without-pip", str(venv)], check=True)
    base_site = subprocess.run([base_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip()
    site = Path(subprocess.run([str(venv / "bin" / "python3"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    site.mkdir(parents=True, exist_ok=True)
    (site / "zz_base_site.pth").write_text(base_site + "\n")
    (site / "hybrid_llm.pth").write_text(f"{ROOT}\n")  # the stubs import hybrid_llm from the checkout
    return site


def install_wheels(base_python: str, site: Path, wheel_dirs: Sequence[Path]) -> None:
    """pip install every bundled wheel into ``site`` (no index, no dependency resolution)."""
    wheels = sorted(str(w) for d in wheel_dirs for w in d.glob("*.whl"))
    if not wheels:
        raise RuntimeError(f"no wheels in {[str(d) for d in wheel_dirs]}: receive the bundle first")
    subprocess.run([base_python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index",
                    "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site), *wheels],
                   check=True)


def layout_runtime(staging: Path = STAGING, runtime: Path = RUNTIME) -> Path:
    """Copy the bundled tritonserver (bin, lib, backends, caches) into ``runtime``."""
    src = staging / "runtime"
    if runtime.exists():
        shutil.rmtree(runtime)
    shutil.copytree(src, runtime, symlinks=True)
    (runtime / "bin" / "tritonserver").chmod(0o755)
    return runtime


def setup(args: argparse.Namespace) -> int:
    """Run the setup steps not done yet: venv + wheels, runtime, stub build + smoke, model."""
    py = args.python
    if not (STAGING / "stub.unpacked").exists() or not (STAGING / "runtime.unpacked").exists():
        raise RuntimeError("the stub and runtime groups are not unpacked yet: run 'receive' with their folders")
    if not _stamped("runtime"):
        layout_runtime()
        _stamp("runtime")
        say(f"tritonserver laid out in {RUNTIME}")
    if not _stamped("stub"):
        t0 = time.monotonic()
        cmd = [py, "-m", "build_scripts.build_stub", "build", "--sources", str(STAGING / "stub" / "sources"),
               "--python", py, "--runtime", str(RUNTIME),
               "--rapidjson-include", str(STAGING / "stub" / "include"), "--jobs", str(args.jobs)]
        subprocess.run(cmd, cwd=ROOT, check=True)
        _stamp("stub")
        say(f"stub built and installed in {time.monotonic() - t0:.0f} s")
    if not _stamped("smoke"):
        # Under the image's numpy 2: the wheel's stub fails exactly this check.
        subprocess.run([py, "-m", "build_scripts.stub_smoke", "--server-root", str(RUNTIME),
                        "--python-bin-dir", str(Path(py).parent), "--ld-library-path", str(RUNTIME / "lib"),
                        "--expect-numpy", args.expect_numpy], cwd=ROOT, check=True)
        _stamp("smoke")
    if not args.skip_model and not _stamped("model"):
        subprocess.run([py, "-m", "build_scripts.make_tiny_model", "--out", str(MODEL), "--size", "1b"],
                       cwd=ROOT, check=True)
        _stamp("model")
    groups = [STAGING / "wheels", STAGING / "vllm"]
    if all((STAGING / f"{g.name}.unpacked").exists() for g in groups):
        if not _stamped("wheels"):
            t0 = time.monotonic()
            site = make_venv(py)
            install_wheels(py, site, groups)
            _stamp("wheels")
            say(f"wheels installed into {site} in {time.monotonic() - t0:.0f} s")
        # What the engine and router stubs and the benchmark import (an import that fails only
        # inside a stub costs a whole server start to find: MistralCommonBackend did).
        check = subprocess.run([str(VENV / "bin" / "python3"), "-c",
                                "import numpy, torch, vllm, tritonclient.grpc, transformers; "
                                "from vllm.v1.engine.async_llm import AsyncLLM; "
                                "from vllm.engine.arg_utils import AsyncEngineArgs; "
                                "import vllm.v1.structured_output.backend_guidance; "
                                "import vllm.entrypoints.openai.api_server; "
                                "print('numpy', numpy.__version__, 'torch', torch.__version__, 'vllm', "
                                "vllm.__version__, 'cuda', torch.cuda.is_available())"],
                               capture_output=True, text=True)
        say(f"import check: {check.stdout.strip() or check.stderr.strip()[-2000:]}")
        if check.returncode:
            return 1
    else:
        say("wheel groups not all here yet: setup again after receiving them")
    return 0


def render_repo(overrides: Sequence[str]) -> Path:
    """Render the gpu-vllm profile with the bundle's model."""
    from build_scripts.render import parse_overrides, render

    return render("gpu-vllm", REPO, {"model_dir": str(MODEL), "tokenizer_dir": str(MODEL),
                                     **parse_overrides(overrides)})


def make_server(repo: Path, ports: Sequence[int]) -> "TritonServer":  # noqa: F821
    """The TritonServer of the gpu-vllm profile (bundle runtime and venv, GPU metrics, serial loads)."""
    from hybrid_llm.server import TritonServer

    return TritonServer(repo, LOG, *ports, runtime=RUNTIME, venv=VENV, device="cuda",
                        model_control="explicit", load_models=("*",),
                        # One model at a time: two vLLM engines profiling GPU memory at once
                        # would each count the other's allocations (or frees) as their own.
                        extra_args=("--model-load-thread-count=1",))


def serve(args: argparse.Namespace) -> int:
    """Start the server and supervise it until SIGTERM (``--detach``: in the background)."""
    if args.detach:
        LOG.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "build_scripts.gpu_offline", "serve", "--ports", args.ports,
               *sum((["--set", s] for s in args.overrides), [])]
        STATE.unlink(missing_ok=True)
        with open(LOG.with_name("supervisor.log"), "ab") as log:
            subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        return wait_ready(args.timeout)
    repo = render_repo(args.overrides)
    server = make_server(repo, [int(p) for p in args.ports.split(",")])
    stop = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(flag=True))
    t0 = time.monotonic()
    server.start()
    state = {"pid": os.getpid(), "server_pid": server.proc.pid, "grpc": server.grpc_url, "http": server.http_url,
             "metrics": server.metrics_url, "repository": str(repo), "log": str(LOG), "ready": False}
    STATE.write_text(json.dumps(state))
    try:
        while not stop["flag"]:
            if server.proc.poll() is not None:
                state["exited"] = server.proc.returncode
                STATE.write_text(json.dumps(state))
                say(f"tritonserver exited with {server.proc.returncode}:\n{server.log_tail()}")
                return 1
            if not state["ready"] and server.is_ready():
                state.update(ready=True, ready_s=round(time.monotonic() - t0, 1))
                STATE.write_text(json.dumps(state))
                say(f"ready in {state['ready_s']} s: gRPC {server.grpc_url}, metrics {server.metrics_url}")
            time.sleep(0.5)
    finally:
        server.stop(grace_s=30)
        if "exited" not in state:  # a server that died keeps its state file: 'wait' reports it
            STATE.unlink(missing_ok=True)
    return 0


def wait_ready(timeout_s: float) -> int:
    """Wait for the detached server's state file to say ready (or the server to exit)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if STATE.exists():
            try:
                state = json.loads(STATE.read_text())
            except json.JSONDecodeError:
                state = {}
            if state.get("ready"):
                say(f"ready in {state['ready_s']} s: {json.dumps(state)}")
                return 0
            if "exited" in state:
                say(f"server exited ({state['exited']}); log {LOG}")
                return 1
        time.sleep(1)
    say(f"not ready after {timeout_s:.0f} s; log {LOG}")
    return 1


def stop(args: argparse.Namespace) -> int:
    """SIGTERM the detached supervisor and wait for it to stop the server."""
    if not STATE.exists():
        say("no server running")
        return 0
    pid = json.loads(STATE.read_text())["pid"]
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        STATE.unlink(missing_ok=True)
        return 0
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline and STATE.exists():
        time.sleep(0.5)
    say("stopped" if not STATE.exists() else f"still running after {args.timeout} s (pid {pid})")
    return 0 if not STATE.exists() else 1


PEER_PORT = 8100
PEER_LOG = ROOT / "build" / "gpu-vllm" / "vllm-serve.log"


def peer_command(repo: Path = REPO, port: int = PEER_PORT, python: Path = VENV / "bin" / "python3") -> list[str]:
    """``vllm serve`` with vllm_backend's engine args (its rendered model.json), alone on the GPU.

    The peer a user would run instead of this product: same vLLM, model and engine
    settings, so a benchmark against both compares the serving paths, not the configs.
    Its GPU memory share is vllm_backend's too (KV room is far beyond any benchmark's need).
    """
    args = json.loads((repo / "vllm_backend" / "1" / "model.json").read_text())
    model = args.pop("model")
    cmd = [str(python), "-m", "vllm.entrypoints.cli.main", "serve", model, "--host", "127.0.0.1",
           "--port", str(port), "--served-model-name", model]
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            cmd.append(flag if value else "--no-" + flag[2:])
        else:
            cmd += [flag, str(value)]
    return cmd


def peer(args: argparse.Namespace) -> int:
    """Start plain ``vllm serve`` in its own session and wait until /health answers."""
    PEER_LOG.parent.mkdir(parents=True, exist_ok=True)
    cmd = peer_command(port=args.port)
    say(" ".join(cmd))
    env = dict(os.environ, VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1", LC_ALL="C.UTF-8")
    env.pop("PYTHONPATH", None)
    with open(PEER_LOG, "ab") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
    (GPU / "peer.pid").write_text(str(proc.pid))
    t0 = time.monotonic()
    while time.monotonic() - t0 < args.timeout:
        if proc.poll() is not None:
            say(f"vllm serve exited with {proc.returncode}; log {PEER_LOG}")
            return 1
        try:
            import urllib.request

            urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health", timeout=2).close()
            say(f"vllm serve ready in {time.monotonic() - t0:.0f} s on 127.0.0.1:{args.port}")
            return 0
        except OSError:
            time.sleep(1)
    say(f"vllm serve not ready after {args.timeout:.0f} s; log {PEER_LOG}")
    return 1


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("receive", help="take bundle folders (any order); unpack complete groups")
    r.add_argument("folders", nargs="+", type=Path)
    s = sub.add_parser("setup", help="venv + wheels, runtime, stub build + smoke check, 1B model")
    s.add_argument("--python", default=shutil.which("python3") or sys.executable,
                   help="the interpreter the stub is built for and the venv is based on")
    s.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    s.add_argument("--skip-model", action="store_true")
    s.add_argument("--expect-numpy", default="2", help="the smoke check fails unless the stub sees this numpy")
    v = sub.add_parser("serve", help="render gpu-vllm and run tritonserver until SIGTERM")
    v.add_argument("--detach", action="store_true", help="run in the background; return once ready")
    v.add_argument("--ports", default="8000,8001,8002", help="HTTP,gRPC,metrics")
    v.add_argument("--timeout", type=float, default=900.0, help="--detach: seconds to wait for ready")
    v.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    w = sub.add_parser("wait", help="wait for a detached server to be ready")
    w.add_argument("--timeout", type=float, default=900.0)
    pr = sub.add_parser("peer", help="start plain `vllm serve` with vllm_backend's engine args (detached)")
    pr.add_argument("--port", type=int, default=PEER_PORT)
    pr.add_argument("--timeout", type=float, default=600.0)
    t = sub.add_parser("stop", help="stop a detached server")
    t.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    if args.cmd == "receive":
        receive(args.folders)
        return 0
    if args.cmd == "setup":
        return setup(args)
    if args.cmd == "serve":
        return serve(args)
    if args.cmd == "wait":
        return wait_ready(args.timeout)
    if args.cmd == "peer":
        return peer(args)
    return stop(args)


if __name__ == "__main__":
    sys.exit(main())
