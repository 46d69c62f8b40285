"""Make the offline GPU bundle: everything a GPU host with no network needs for the gpu-vllm profile.

One command, on a machine with network (PyPI, Debian packages, the Triton sources):

    python -m build_scripts.gpu_bundle make [--limit-mib 60] [--git-template ...]

It downloads every cp312 wheel in ``requirements/gpu-vllm-cp312.txt`` (GPU vLLM and the
packages it needs beyond a CUDA + PyTorch image; hashes checked), repacks the vLLM wheel
without the parts Hopper does not load (FA2 kernels, the vllm-rs binary, deep_gemm builds
for other Pythons), takes tritonserver 2.51 and the shared libraries it loads from the
pytriton wheel, and the Python stub's pinned build inputs (``build_stub.py sources``,
rapidjson headers from Debian), and packs them into folders of at most ``--limit-mib``
each under ``.bundle/parts/`` (ignored by git): one transfer each to a host that takes
files in bounded pieces. Groups are packed in the order the GPU host uses them (the stub
and the runtime first, vLLM last), so its setup can start before the last folder lands.

``build_scripts/gpu_offline.py`` is the other half (install, build the stub, make the
model, render, serve). docs/deploy_gpu.md, section 7, walks through both.
"""

from __future__ import annotations

import argparse
import json
import lzma
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from build_scripts.build_stub import sha256_file

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "gpu-vllm-cp312.txt"
BUNDLE = ROOT / ".bundle"
MANIFEST = "bundle.json"
MIB = 2**20
# What pip is told the GPU host is (the image: CPython 3.12, glibc 2.39, x86-64).
PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux_2_39_x86_64", "manylinux_2_35_x86_64", "manylinux_2_34_x86_64",
             "manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
# Members of the vLLM wheel a Hopper GPU never loads (STACK.md: the 156 MB repack ran).
VLLM_DROP = (
    r"vllm/vllm_flash_attn/_vllm_fa2_C\.abi3\.so",
    r"vllm/vllm-rs",
    r"vllm/third_party/deep_gemm/_C\.cpython-3(?!12)\d+-x86_64-linux-gnu\.so",
)
GROUP_ORDER = ("stub", "runtime", "wheels", "vllm")


class BundleError(ValueError):
    """The bundle cannot be made or checked; the message says what to fix."""


@dataclass(frozen=True)
class Pin:
    """One wheel of the lock: ``name==version --hash=sha256:...  # filename``."""

    name: str
    version: str
    sha256: str
    filename: str


def read_lock(path: Path = LOCK) -> list[Pin]:
    """Parse the wheel lock; raise BundleError naming a malformed line or a package pinned twice."""
    pins: list[Pin] = []
    line_re = re.compile(r"^([A-Za-z0-9_.\-]+)==(\S+)\s+--hash=sha256:([0-9a-f]{64})\s+#\s*(\S+\.whl)\s*$")
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = line_re.match(line.strip())
        if not m:
            raise BundleError(f"{path.name}:{n}: expected 'name==version --hash=sha256:HEX  # file.whl', got {line!r}")
        pins.append(Pin(*m.groups()))
    seen: dict[str, str] = {}
    for pin in pins:
        key = canonical(pin.name)
        if key in seen:
            raise BundleError(f"{path.name}: {pin.name} is pinned twice ({seen[key]} and {pin.version}); "
                              "keep one version: two stop the whole --no-deps install")
        seen[key] = pin.version
        if canonical(pin.filename.split("-")[0]) != key or pin.filename.split("-")[1] != pin.version:
            raise BundleError(f"{path.name}: {pin.filename} is not a wheel of {pin.name}=={pin.version}")
    return pins


def canonical(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def supported_tags() -> set[tuple[str, str, str]]:
    """(python, abi, platform) wheel tags CPython 3.12 on manylinux x86-64 installs."""
    pythons = ["cp312", "py312", "py3", "cp3"] + [f"cp3{m}" for m in range(2, 12)]
    abis = ["cp312", "abi3", "none"]
    plats = list(PLATFORMS) + ["any"]
    return {(py, abi, plat) for py in pythons for abi in abis for plat in plats}


def wheel_installable(filename: str, tags: set[tuple[str, str, str]] | None = None) -> bool:
    """True when a wheel's filename tags fit CPython 3.12 / manylinux x86-64 (pip's --no-deps check)."""
    tags = tags or supported_tags()
    parts = filename[:-4].split("-")
    if len(parts) < 5:
        return False
    pys, abis, plats = (p.split(".") for p in parts[-3:])
    for py in pys:
        for abi in abis:
            for plat in plats:
                if (py, abi, plat) in tags:
                    # abi3 wheels name the oldest CPython they support (cp38-abi3 fits 3.12).
                    if abi == "abi3" and not (py.startswith("cp3") and int(py[3:] or 0) <= 12):
                        continue
                    return True
    return False


def check_lock(pins: Sequence[Pin]) -> list[str]:
    """Problems with the wheel set for an empty cp312 --no-deps target (empty list: it installs)."""
    tags = supported_tags()
    return [f"{p.filename}: no tag that CPython 3.12 on manylinux x86-64 installs"
            for p in pins if not wheel_installable(p.filename, tags)]


@dataclass(frozen=True)
class Chunk:
    """Bytes [offset, offset + length) of one group archive, stored as one file of a folder."""

    group: str
    index: int
    offset: int
    length: int

    @property
    def filename(self) -> str:
        """The chunk's file name inside its folder."""
        return f"{self.group}.tar.xz.{self.index:03d}"


def plan_folders(sizes: Sequence[tuple[str, int]], limit: int, reserve: int = 64 * 1024) -> list[list[Chunk]]:
    """Split group archives (in order) into chunks and pack them into folders of <= ``limit`` bytes.

    ``reserve`` bytes per folder are kept for its manifest. Groups stay in order, so a
    folder only holds the start of a group once every earlier group is placed: the host
    can unpack each group as soon as its last chunk arrives.
    """
    room = limit - reserve
    if room <= 0:
        raise BundleError(f"limit {limit} bytes leaves no room for a manifest")
    folders: list[list[Chunk]] = [[]]
    free = room
    for group, size in sizes:
        offset, index = 0, 0
        while offset < size or (size == 0 and index == 0):
            if free == 0:
                folders.append([])
                free = room
            length = min(free, size - offset)
            folders[-1].append(Chunk(group, index, offset, length))
            offset += length
            free -= length
            index += 1
            if size == 0:
                break
    return [f for f in folders if f]


def pip_download(pins: Sequence[Pin], dest: Path) -> list[Path]:
    """Download each pinned wheel for cp312 (no dependencies), checking its file name and hash."""
    dest.mkdir(parents=True, exist_ok=True)
    missing = [p for p in pins if not (dest / p.filename).exists() or sha256_file(dest / p.filename) != p.sha256]
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", "--no-deps",
               "--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation", "cp",
               "-d", str(dest)]
        for plat in PLATFORMS:
            cmd += ["--platform", plat]
        subprocess.run(cmd + [f"{p.name}=={p.version}" for p in missing], check=True)
    out = []
    for pin in pins:
        path = dest / pin.filename
        if not path.exists():
            raise BundleError(f"pip did not fetch {pin.filename}; check the lock's file name for {pin.name}")
        if sha256_file(path) != pin.sha256:
            raise BundleError(f"{pin.filename}: sha256 differs from the lock (a re-released file?)")
        out.append(path)
    return out


def repack_wheel(src: Path, dest: Path, drop: Iterable[str]) -> list[str]:
    """Copy a wheel without the members matching ``drop`` (and their RECORD lines), uncompressed.

    Stored (not deflated) so that the group's xz stream compresses the raw bytes: ~20%
    smaller than the deflated wheel. Returns the dropped member names.
    """
    patterns = [re.compile(p + r"$") for p in drop]
    dropped: list[str] = []
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            if any(p.match(info.filename) for p in patterns):
                dropped.append(info.filename)
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines()
                data = ("\n".join(l for l in lines if l.split(",")[0] not in dropped) + "\n").encode()
            info.compress_type = zipfile.ZIP_STORED
            zout.writestr(info, data)
    return dropped


def elf_needed(path: Path) -> list[str]:
    """The NEEDED entries of an ELF file (binutils' readelf)."""
    out = subprocess.run(["readelf", "-d", str(path)], check=True, capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def runtime_files(pytriton_root: Path) -> dict[str, Path]:
    """tritonserver's files for the bundle: bin, the Python backend (no stubs), caches, and the
    pytriton libraries they load (the NEEDED closure), mapped to their place in the runtime."""
    server = pytriton_root / "tritonserver"
    libs = pytriton_root.parent / "nvidia_pytriton.libs"
    files: dict[str, Path] = {}
    for path in sorted(server.rglob("*")):
        rel = path.relative_to(server)
        if path.is_file() and "python_backend_stubs" not in rel.parts and "__pycache__" not in rel.parts:
            files[rel.as_posix()] = path
    todo = [p for p in files.values() if p.suffix == ".so" or p.name == "tritonserver"]
    seen: set[str] = set()
    while todo:
        for name in elf_needed(todo.pop()):
            if name in seen or not (libs / name).exists():
                continue  # system libraries (libc, libstdc++, libz) come from the host
            seen.add(name)
            files[f"lib/{name}"] = libs / name
            todo.append(libs / name)
    return files


def debian_headers(package: str, dest: Path) -> Path:
    """Download a Debian package and extract it (header-only packages such as rapidjson-dev)."""
    work = dest / "deb"
    work.mkdir(parents=True, exist_ok=True)
    debs = list(work.glob(f"{package}_*.deb"))
    if not debs:
        subprocess.run(["apt-get", "download", package], cwd=work, check=True)
        debs = list(work.glob(f"{package}_*.deb"))
    root = dest / package
    if root.exists():
        shutil.rmtree(root)
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(root)], check=True)
    return root


def write_group(name: str, members: dict[str, Path], out: Path, preset: int = 6) -> Path:
    """Write one group as ``<name>.tar.xz`` with its members at the given archive paths."""
    path = out / f"{name}.tar.xz"
    with tarfile.open(path, "w:xz", preset=preset) as tar:
        for arcname, src in sorted(members.items()):
            tar.add(str(src), arcname=f"{name}/{arcname}", recursive=False)
    return path


def split_into_folders(archives: Sequence[Path], out: Path, limit: int) -> list[Path]:
    """Cut the group archives into chunk files placed in folders p01, p02, ... (each <= limit)."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    groups = [(a.name.split(".")[0], a.stat().st_size) for a in archives]
    plan = plan_folders(groups, limit)
    by_group = {a.name.split(".")[0]: a for a in archives}
    manifest = {
        "groups": {g: {"size": s, "sha256": sha256_file(by_group[g]),
                       "chunks": sum(1 for f in plan for c in f if c.group == g)} for g, s in groups},
        "order": [g for g, _ in groups],
        "folders": len(plan),
    }
    folders = []
    for i, chunks in enumerate(plan, 1):
        folder = out / f"p{i:02d}"
        folder.mkdir()
        for c in chunks:
            with open(by_group[c.group], "rb") as src, open(folder / c.filename, "wb") as dst:
                src.seek(c.offset)
                remaining = c.length
                while remaining:
                    block = src.read(min(remaining, 8 * MIB))
                    dst.write(block)
                    remaining -= len(block)
        info = dict(manifest, folder=i, chunks=[c.filename for c in chunks])
        (folder / MANIFEST).write_text(json.dumps(info, indent=1))
        size = sum(p.stat().st_size for p in folder.iterdir())
        if size > limit:
            raise BundleError(f"{folder.name} is {size} bytes, over the {limit}-byte limit")
        folders.append(folder)
    return folders


def make(args: argparse.Namespace) -> int:
    """Download, gather and pack the whole bundle."""
    pins = read_lock(args.lock)
    problems = check_lock(pins)
    if problems:
        raise BundleError("; ".join(problems))
    cache = args.work / "cache"
    groups: dict[str, dict[str, Path]] = {g: {} for g in GROUP_ORDER}
    # The stub's pinned sources and build inputs.
    sources = cache / "stub-sources"
    subprocess.run([sys.executable, "-m", "build_scripts.build_stub", "sources", "--out", str(sources),
                    *(["--git-template", args.git_template] if args.git_template else [])],
                   cwd=ROOT, check=True)
    for path in sorted(sources.rglob("*")):
        if path.is_file():
            groups["stub"][f"sources/{path.relative_to(sources).as_posix()}"] = path
    rapidjson = debian_headers("rapidjson-dev", cache)
    for path in sorted((rapidjson / "usr" / "include").rglob("*")):
        if path.is_file():
            groups["stub"][f"include/{path.relative_to(rapidjson / 'usr' / 'include').as_posix()}"] = path
    # tritonserver 2.51 from the pytriton wheel (its files only; no Python API).
    import importlib.util

    spec = importlib.util.find_spec("pytriton")  # found, not imported (its API needs more packages)
    if spec is None or not spec.submodule_search_locations:
        raise BundleError("nvidia-pytriton is not installed in this Python: run make setup, then use .venv/bin/python")
    for rel, path in runtime_files(Path(list(spec.submodule_search_locations)[0])).items():
        groups["runtime"][rel] = path
    # Wheels; vLLM repacked on its own group, last.
    wheels = pip_download(pins, cache / "wheels")
    for path in wheels:
        if canonical(path.name.split("-")[0]) == "vllm":
            slim = cache / "repacked" / path.name
            slim.parent.mkdir(parents=True, exist_ok=True)
            if not slim.exists() or slim.stat().st_mtime < path.stat().st_mtime:
                dropped = repack_wheel(path, slim, VLLM_DROP)
                print(f"[bundle] {path.name}: dropped {len(dropped)} members: {dropped}", flush=True)
            groups["vllm"][path.name] = slim
        else:
            groups["wheels"][path.name] = path
    archives_dir = cache / "archives"
    archives_dir.mkdir(parents=True, exist_ok=True)
    archives = []
    for name in GROUP_ORDER:
        print(f"[bundle] packing {name}: {len(groups[name])} files", flush=True)
        archives.append(write_group(name, groups[name], archives_dir, preset=9 if name == "vllm" else 6))
    folders = split_into_folders(archives, args.work / "parts", args.limit_mib * MIB)
    for folder in folders:
        size = sum(p.stat().st_size for p in folder.iterdir())
        print(f"[bundle] {folder.relative_to(ROOT)}: {size / MIB:.1f} MiB "
              f"({', '.join(sorted(p.name for p in folder.iterdir() if p.name != MANIFEST))})")
    print(f"[bundle] {len(folders)} folders; on the GPU host: python3 -m build_scripts.gpu_offline --help")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("make", help="download, gather and pack everything")
    p.add_argument("--lock", type=Path, default=LOCK)
    p.add_argument("--work", type=Path, default=BUNDLE, help="bundle folder (default .bundle/)")
    p.add_argument("--limit-mib", type=int, default=60, help="largest folder, MiB")
    p.add_argument("--git-template", help="where the Triton sources' git repositories are "
                   "(build_stub.py sources --git-template); default: GitHub")
    c = sub.add_parser("check", help="check the lock: one version per package, every wheel installs on cp312")
    c.add_argument("--lock", type=Path, default=LOCK)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "check":
            pins = read_lock(args.lock)
            problems = check_lock(pins)
            for line in problems:
                print(f"[bundle] {line}", file=sys.stderr)
            print(f"[bundle] {len(pins)} wheels, {len(problems)} problems")
            return 1 if problems else 0
        return make(args)
    except BundleError as exc:
        print(f"gpu_bundle: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
