"""build_scripts/build_stub.py: argument parsing, pin checks, manifest, CMake rewrites (no network, no compile)."""

from __future__ import annotations

import gzip
import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from build_scripts import build_stub as bs

# A CMake text in the shape of python_backend r24.10's, written for this test.
FIXTURE_CMAKE = """cmake_minimum_required(VERSION 3.17)
project(fixture LANGUAGES C CXX)
include(ExternalProject)

FetchContent_Declare(
  pybind11
  GIT_REPOSITORY "https://example.invalid/pybind11"
  GIT_TAG "0000000000000000000000000000000000000000"  # a comment with a ) in it
  GIT_SHALLOW ON
)
FetchContent_MakeAvailable(pybind11)

ExternalProject_Add(
  boostorg
  URL https://example.invalid/boost_1_0_0.tar.gz
  URL_HASH SHA256=0000
  PREFIX "boost-src"
  CONFIGURE_COMMAND ${CMAKE_COMMAND} -E copy_directory
                    <SOURCE_DIR>/boost/ ${CMAKE_BINARY_DIR}/boost
  INSTALL_COMMAND ""
  BUILD_COMMAND ""
)
set(boostorg_INCLUDE_DIRS "${CMAKE_BINARY_DIR}/boost/")

ExternalProject_Add(other URL "https://example.invalid/other(1).tar.gz")
add_executable(stub main.cc)
add_dependencies(stub boostorg)
"""


def make_git_repo(path: Path) -> str:
    """A one-commit git repository; returns its commit."""
    path.mkdir()
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@e", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
           "PATH": "/usr/bin:/bin"}
    (path / "CMakeLists.txt").write_text("project(x)\n")
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "one"]):
        subprocess.run(["git", "-C", str(path), *cmd], check=True, env=env)
    return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], check=True, env=env,
                          capture_output=True, text=True).stdout.strip()


def fake_manifest(folder: Path) -> bs.Manifest:
    """A manifest of small fake files (its PyPI entries cannot match the pins)."""
    files = []
    for pin in bs.FILE_PINS:
        (folder / pin.filename).write_bytes(pin.name.encode())
        files.append(bs.SourceEntry(name=pin.name, file=pin.filename, version=pin.version,
                                    sha256=bs.sha256_file(folder / pin.filename)))
    return bs.Manifest(git=(), files=tuple(files))


# --------------------------------------------------------------------------- arguments


def test_build_defaults():
    args = bs.parse_args(["build"])
    assert args.jobs == 2 and args.python and args.libarchive == "placeholder"
    assert args.sources == bs.DEFAULT_SOURCES and args.runtime == bs.DEFAULT_RUNTIME
    assert args.boost_include == Path("/usr/include") and args.rapidjson_include == Path("/usr/include")
    assert bs.DEFAULT_BUILD_ROOT == bs.ROOT / ".cache" / "stub-build"
    cfg = bs.build_config(args)
    assert cfg.install and cfg.cuda_root is None and cfg.build_dir is None


def test_all_takes_both_sets_of_options(tmp_path):
    args = bs.parse_args(["all", "--git-template", "/srv/{owner}+{name}/repo", "--out", str(tmp_path),
                          "--rev", "python_backend=r24.11", "--allow-unpinned", "-j", "3", "--no-install"])
    assert args.sources == tmp_path and args.jobs == 3 and args.revs == {"python_backend": "r24.11"}
    assert bs.git_pin("dlpack").url(args.git_template) == "/srv/dmlc+dlpack/repo"
    assert not bs.build_config(args).install


def test_default_urls_are_public_github():
    assert bs.git_pin("common").url() == "https://github.com/triton-inference-server/common.git"
    assert bs.git_pin("dlpack").url() == "https://github.com/dmlc/dlpack.git"


@pytest.mark.parametrize("argv, message", [
    (["sources", "--rev", "python_backend"], "NAME=REV"),
    (["sources", "--rev", "nosuchrepo=main"], "no pinned repository"),
    (["sources", "--git-template", "/srv/repo"], "{name}"),
    (["build", "-j", "0"], "-j"),
])
def test_bad_arguments_are_refused(argv, message):
    with pytest.raises(bs.StubBuildError, match=message):
        bs.parse_args(argv)


def test_main_reports_errors_without_a_traceback(capsys):
    assert bs.main(["sources", "--rev", "python_backend"]) == 1
    assert "ERROR" in capsys.readouterr().err


# --------------------------------------------------------------------------- pins


def test_pins_are_full_commits_and_hashes():
    assert {p.name for p in bs.GIT_PINS} == {"python_backend", "common", "core", "backend", "dlpack"}
    for pin in bs.GIT_PINS:
        assert len(pin.commit) == 40 and int(pin.commit, 16) >= 0
    for pin in bs.FILE_PINS:
        assert len(pin.sha256) == 64 and pin.version in pin.filename
    assert bs.PYBIND11.version == "2.12.0" and bs.PYBIND11.sdist
    assert "--no-binary" in bs.PYBIND11.pip_args() and "--only-binary" in bs.CUDA_RUNTIME.pip_args()
    assert bs.CUDA_RUNTIME.version.startswith("12.")


def test_wrong_commit_is_refused_unless_unpinned(capsys):
    pin = bs.git_pin("python_backend")
    bs.check_commit(pin, pin.commit)
    with pytest.raises(bs.PinError, match="--allow-unpinned"):
        bs.check_commit(pin, "f" * 40)
    bs.check_commit(pin, "f" * 40, allow_unpinned=True)
    assert "WARNING" in capsys.readouterr().err


def test_wrong_sha256_is_refused_unless_unpinned():
    with pytest.raises(bs.PinError, match="differs from the pin"):
        bs.check_sha256(bs.PYBIND11, "0" * 64)
    bs.check_sha256(bs.PYBIND11, "0" * 64, allow_unpinned=True)


@pytest.mark.parametrize("version", ["2.10.0", "2.11.1", "2.6"])
def test_old_pybind11_is_refused(version):
    with pytest.raises(bs.PinError, match="too old"):
        bs.check_pybind11_version(version)


@pytest.mark.parametrize("version", ["2.12.0", "2.13.6", "3.0.1"])
def test_new_pybind11_is_accepted(version):
    bs.check_pybind11_version(version)


def test_pybind11_version_is_read_from_its_header():
    header = "#define PYBIND11_VERSION_MAJOR 2\n#  define PYBIND11_VERSION_MINOR 10\n#define PYBIND11_VERSION_PATCH 4\n"
    assert bs.pybind11_version_from_header(header) == "2.10.4"
    with pytest.raises(bs.PinError):
        bs.check_pybind11_version(bs.pybind11_version_from_header(header))
    with pytest.raises(bs.StubBuildError, match="MINOR"):
        bs.pybind11_version_from_header("#define PYBIND11_VERSION_MAJOR 2\n")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_sources_refuse_a_repository_at_another_commit(tmp_path, monkeypatch):
    commit = make_git_repo(tmp_path / "acme+widget")
    good = bs.GitPin("widget", "acme", "widget", "main", commit)
    monkeypatch.setattr(bs, "GIT_PINS", (good,))
    out = tmp_path / "out"
    out.mkdir()
    template = str(tmp_path / "{owner}+{name}")
    entries = bs.archive_sources(out, template, {}, allow_unpinned=False)
    assert entries[0].commit == commit and bs.tar_commit(out / entries[0].file) == commit
    with tarfile.open(out / entries[0].file) as tf:
        assert "widget/CMakeLists.txt" in tf.getnames()
    monkeypatch.setattr(bs, "GIT_PINS", (bs.GitPin("widget", "acme", "widget", "main", "e" * 40),))
    with pytest.raises(bs.StubBuildError, match="has no commit e"):  # the pinned commit is not there
        bs.archive_sources(out, template, {}, allow_unpinned=False)
    with pytest.raises(bs.PinError, match=f"at commit {commit}, the pin is e"):  # --rev to another commit
        bs.archive_sources(out, template, {"widget": "HEAD"}, allow_unpinned=False)
    assert bs.archive_sources(out, template, {"widget": "HEAD"}, allow_unpinned=True)[0].commit == commit


# --------------------------------------------------------------------------- Python headers


def python_info(**changes) -> bs.PythonInfo:
    """A PythonInfo for 3.11.7, with ``changes``."""
    base = dict(executable="/opt/py/bin/python3.11", version="3.11.7", include="/opt/py/include/python3.11",
                has_header=True, libdir="/opt/py/lib", soname="libpython3.11.so.1.0")
    return bs.PythonInfo(**{**base, **changes})


def test_missing_python_header_names_the_package():
    with pytest.raises(bs.StubBuildError) as err:
        bs.check_python(python_info(version="3.12.3", include="/usr/include/python3.12", has_header=False))
    message = str(err.value)
    assert "Python.h" in message and "python3.12-dev" in message and "/usr/include/python3.12" in message


def test_static_only_python_is_refused():
    with pytest.raises(bs.StubBuildError, match="libpython3.11"):
        bs.check_python(python_info(soname=""))


def test_python_without_its_library_is_refused():
    with pytest.raises(bs.StubBuildError, match="libpython3.11-dev"):
        bs.check_python(python_info(has_library=False))


def test_python_probe_of_this_interpreter():
    info = bs.probe_python(bs.sys.executable)
    assert info.version.startswith(f"{bs.sys.version_info[0]}.{bs.sys.version_info[1]}.")
    assert info.tag == f"cp{bs.sys.version_info[0]}{bs.sys.version_info[1]}"
    assert python_info().short == "3.11"


# --------------------------------------------------------------------------- manifest


def test_manifest_round_trip(tmp_path):
    manifest = bs.Manifest(
        git=(bs.SourceEntry(name="python_backend", file="python_backend-01d0ad82f9f5.tar.gz", sha256="a" * 64,
                            commit=bs.git_pin("python_backend").commit, ref="r24.10", url="https://x/y.git"),),
        files=(bs.SourceEntry(name="pybind11", file=bs.PYBIND11.filename, sha256=bs.PYBIND11.sha256,
                              version="2.12.0"),))
    (tmp_path / bs.MANIFEST).write_text(manifest.to_json())
    again = bs.load_manifest(tmp_path)
    assert again == manifest
    assert again.entry("pybind11").version == "2.12.0"
    with pytest.raises(bs.StubBuildError, match="no 'dlpack'"):
        again.entry("dlpack")


def test_manifest_of_another_format_is_refused():
    with pytest.raises(bs.StubBuildError, match="format"):
        bs.Manifest.from_json('{"format": "something/9", "git": [], "files": []}')


def test_missing_manifest_says_how_to_make_one(tmp_path):
    with pytest.raises(bs.StubBuildError, match="sources --out"):
        bs.load_manifest(tmp_path)


def test_manifest_check_finds_changed_and_unpinned_files(tmp_path, monkeypatch):
    monkeypatch.setattr(bs, "GIT_PINS", ())
    manifest = fake_manifest(tmp_path)
    with pytest.raises(bs.PinError, match="differs from the pin"):
        bs.check_manifest(manifest, tmp_path)
    bs.check_manifest(manifest, tmp_path, allow_unpinned=True)
    (tmp_path / bs.PYBIND11.filename).write_bytes(b"changed")
    with pytest.raises(bs.StubBuildError, match="differs from the manifest"):
        bs.check_manifest(manifest, tmp_path, allow_unpinned=True)
    (tmp_path / bs.PYBIND11.filename).unlink()
    with pytest.raises(bs.StubBuildError, match="missing"):
        bs.check_manifest(manifest, tmp_path, allow_unpinned=True)


def test_tar_commit_reads_git_archive_pax_header(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "c" * 40}) as tf:
        info = tarfile.TarInfo("x/a.txt")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"a"))
    (tmp_path / "x.tar.gz").write_bytes(gzip.compress(buf.getvalue()))
    assert bs.tar_commit(tmp_path / "x.tar.gz") == "c" * 40


# --------------------------------------------------------------------------- CMake rewrites


def boost_rewrite() -> bs.CMakeRewrite:
    """The real boost rewrite."""
    return next(r for r in bs.REWRITES if r.first_arg == "boostorg")


def test_boost_block_is_rewritten_to_local_headers():
    out = bs.apply_rewrite(FIXTURE_CMAKE, boost_rewrite())
    assert "example.invalid/boost" not in out and "URL_HASH" not in out
    assert 'file(COPY "${TRITON_STUB_BOOST_INCLUDE}/boost" DESTINATION "${CMAKE_BINARY_DIR}")' in out
    assert "add_custom_target(boostorg)" in out
    # what follows the block is kept: the include variable, the other ExternalProject, the dependency
    assert 'set(boostorg_INCLUDE_DIRS "${CMAKE_BINARY_DIR}/boost/")' in out
    assert 'ExternalProject_Add(other URL "https://example.invalid/other(1).tar.gz")' in out
    assert "add_dependencies(stub boostorg)" in out
    assert out.count("build_stub.py:") == 1


def test_pybind11_fetch_becomes_find_package():
    rewrites = [r for r in bs.REWRITES if r.repo == "python_backend" and r.first_arg == "pybind11"]
    out = FIXTURE_CMAKE
    for rw in rewrites:
        out = bs.apply_rewrite(out, rw)
    assert "FetchContent_Declare" not in out and "FetchContent_MakeAvailable(pybind11)" not in out
    assert 'find_package(pybind11 2.12 CONFIG REQUIRED PATHS "${TRITON_STUB_PYBIND11_DIR}" NO_DEFAULT_PATH)' in out


def test_rewrite_refuses_sources_that_changed():
    with pytest.raises(bs.StubBuildError, match="found 0"):
        bs.apply_rewrite(FIXTURE_CMAKE.replace("boostorg\n", "boost_other\n"), boost_rewrite())
    twice = FIXTURE_CMAKE + FIXTURE_CMAKE[FIXTURE_CMAKE.index("ExternalProject_Add(\n  boostorg"):]
    with pytest.raises(bs.StubBuildError, match="found 2"):
        bs.apply_rewrite(twice, boost_rewrite())


def test_find_calls_skips_comments_and_quoted_parentheses():
    calls = bs.find_calls(FIXTURE_CMAKE, "FetchContent_Declare")
    assert len(calls) == 1 and "GIT_SHALLOW ON" in calls[0][2]
    with pytest.raises(bs.StubBuildError, match="unbalanced"):
        bs.find_calls("add_library(x\n", "add_library")


def test_apply_rewrites_edits_files_in_place(tmp_path):
    (tmp_path / "python_backend").mkdir()
    (tmp_path / "python_backend" / "CMakeLists.txt").write_text(FIXTURE_CMAKE)
    bs.apply_rewrites(tmp_path, [r for r in bs.REWRITES if r.repo == "python_backend"])
    text = (tmp_path / "python_backend" / "CMakeLists.txt").read_text()
    assert "example.invalid/boost" not in text and "find_package(pybind11" in text


def test_every_rewrite_is_marked():
    for rw in bs.REWRITES:
        assert rw.replacement.startswith(bs.REWRITE_MARK), rw


def test_strip_werror_keeps_other_warnings():
    text = ("target_compile_options(x PRIVATE\n  $<$<CXX_COMPILER_ID:GNU>:\n    -Wall -Wextra -Werror>\n)\n"
            "target_compile_options(y PRIVATE\n      -Wall -Wno-unused-parameter -Werror\n)\n")
    out = bs.strip_werror(text)
    assert "-Werror" not in out and out.count("-Wall") == 2 and "-Wextra>" in out and "-Wno-unused-parameter\n" in out
    assert bs.strip_werror("-Werror=format") == "-Werror=format"
    assert bs.parse_args(["build", "--no-werror"]).no_werror and bs.build_config(bs.parse_args(["build"])).werror


def test_version_parsing():
    assert bs.parse_version("2.12.0") == (2, 12, 0)
    assert bs.parse_version("2.13.0.dev1") == (2, 13, 0)
    with pytest.raises(bs.StubBuildError):
        bs.parse_version("dev")


def test_boost_older_than_1_78_is_refused_unless_allowed(capsys):
    from build_scripts.build_stub import StubBuildError, check_boost

    check_boost("1.83.0")
    check_boost("1.78.0")
    with pytest.raises(StubBuildError, match="libboost1.81-dev"):
        check_boost("1.74.0")
    check_boost("1.74.0", allow_old=True)
    assert "WARNING" in capsys.readouterr().out


def test_source_fixes_apply_once_and_are_marked(tmp_path):
    texts: dict[Path, str] = {}
    for fix in bs.SOURCE_FIXES:  # several fixes may edit one file
        path = tmp_path / fix.repo / fix.path
        texts[path] = texts.get(path, "// before\n") + fix.old + "\n// after\n"
    for path, text in texts.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    lines = bs.apply_fixes(tmp_path)
    assert lines == [fix.label for fix in bs.SOURCE_FIXES]
    for fix in bs.SOURCE_FIXES:
        text = (tmp_path / fix.repo / fix.path).read_text()
        assert fix.old not in text and bs.FIX_MARK in text and text.startswith("// before\n")


def test_an_optional_fix_is_skipped_where_the_revision_predates_its_fault(tmp_path):
    optional = [f for f in bs.SOURCE_FIXES if f.optional]
    assert optional, "the main-only exit fix is optional"
    fix = optional[0]
    assert bs.apply_fix("r24.10 has no such text", fix) == "r24.10 has no such text"
    with pytest.raises(bs.StubBuildError, match="occurs 2 times"):
        bs.apply_fix(fix.old + fix.old, fix)
    path = tmp_path / fix.repo / fix.path
    path.parent.mkdir(parents=True)
    path.write_text("int main() {}\n")
    assert bs.apply_fixes(tmp_path, [fix]) == [] and path.read_text() == "int main() {}\n"
    # The exit fix drops main's reference before the stub instance, both before return.
    assert fix.new.index("stub.reset();") < fix.new.index("Stub::DestroyInstance();") < fix.new.index("return 0;")


def test_pin_sets_share_the_servers_core_and_differ_in_python_backend():
    r2410, main = bs.pin_set("r24.10"), bs.pin_set("main")
    assert bs.git_pin("core", r2410) == bs.git_pin("core", main)  # 2.51's API headers in both
    assert bs.git_pin("python_backend", main).commit != bs.git_pin("python_backend", r2410).commit
    assert [p.name for p in r2410] == [p.name for p in main]
    with pytest.raises(bs.StubBuildError, match="no pin set 'r99'"):
        bs.pin_set("r99")
    for name in ("r24.10", "main"):
        entries = tuple(bs.SourceEntry(name=p.name, file=p.archive_name, sha256="0", commit=p.commit)
                        for p in bs.pin_set(name))
        assert bs.pin_set_of(bs.Manifest(git=entries, files=())) == name
    assert bs.parse_args(["sources", "--pins", "main"]).pins == "main"
    assert bs.parse_args(["sources"]).pins == bs.DEFAULT_PIN_SET == "r24.10"


def test_cmake_minimum_is_read_and_enforced():
    assert bs.cmake_minimum_required("cmake_minimum_required(VERSION 3.31.8)\nproject(x)") == (3, 31, 8)
    assert bs.cmake_minimum_required("project(x)") == ()
    bs.check_cmake_minimum((4, 0, 3), (3, 31, 8), "main")
    bs.check_cmake_minimum((3, 25, 1), (), "r24.10")
    with pytest.raises(bs.StubBuildError, match=r"main needs CMake >= 3.31.8, --cmake is 3.25.1"):
        bs.check_cmake_minimum((3, 25, 1), (3, 31, 8), "main")


def test_the_backend_is_linked_to_the_servers_renamed_libraries():
    server = ["libtritonserver-717102f0.so", "libarchive-3508abb0.so.13.6.0", "libcudart-09529672.so.12.6.77",
              "libstdc++.so.6", "libc.so.6"]
    built = ["libtritonserver.so", "libarchive-3508abb0.so.13.6.0", "libcudart.so.12", "libstdc++.so.6",
             "libgcc_s.so.1"]
    assert bs.needed_renames(built, server) == {"libtritonserver.so": "libtritonserver-717102f0.so",
                                                "libcudart.so.12": "libcudart-09529672.so.12.6.77"}
    with pytest.raises(bs.StubBuildError, match="links libz.so.placeholder, which the server's"):
        bs.needed_renames(["libz.so.placeholder"], server)


def test_a_backend_calling_what_the_core_lacks_is_named():
    undefined = {"TRITONBACKEND_RequestInput", "TRITONSERVER_NewerThan251", "memcpy", "archive_read_new"}
    defined = {"TRITONBACKEND_RequestInput", "TRITONSERVER_ErrorNew"}
    assert bs.missing_server_functions(undefined, defined) == ["TRITONSERVER_NewerThan251"]


def test_the_gather_kernel_becomes_a_host_function_that_refuses():
    assert "add_library(kernel_library_new STATIC" in bs.KERNEL_BLOCK
    assert "return cudaErrorNotSupported;" in bs.KERNEL_BLOCK and "RunGatherKernel(" in bs.KERNEL_BLOCK


def test_backend_options():
    args = bs.parse_args(["build", "--backend", "--archive-include", "/opt/a/include", "--server-libs", "/opt/l",
                          "--patchelf", "/opt/bin/patchelf"])
    cfg = bs.build_config(args)
    assert cfg.backend and cfg.archive_include == Path("/opt/a/include") and cfg.server_libs == (Path("/opt/l"),)
    assert cfg.patchelf == "/opt/bin/patchelf"
    assert not bs.build_config(bs.parse_args(["build"])).backend


def test_the_iterator_fix_releases_the_gil_before_taking_mu():
    fix = next(f for f in bs.SOURCE_FIXES if f.path.endswith("pb_response_iterator.cc"))
    # The release guard is declared before the lock, so the lock goes first at scope end.
    assert fix.new.index("gil_scoped_release") < fix.new.index("std::unique_lock<std::mutex> lock{mu_}")
    assert "PyGILState_Check()" in fix.new  # no release in a thread without the GIL (a destructor's)


def test_a_fix_whose_text_is_missing_or_repeated_is_refused():
    fix = bs.SOURCE_FIXES[0]
    with pytest.raises(bs.StubBuildError, match="occurs 0 times"):
        bs.apply_fix("nothing here", fix)
    with pytest.raises(bs.StubBuildError, match="occurs 2 times"):
        bs.apply_fix(fix.old + fix.old, fix)
