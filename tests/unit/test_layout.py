"""The layout's boundaries, enforced by walking every import of the project's Python files."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("hybrid_llm", "client", "frontend", "loadtests", "tests", "build_scripts", "model_repository")


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports (lazy imports in functions too; relative ones resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_of(path) if path.name == "__init__.py" else _module_of(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{alias.name}" for alias in node.names)
    return found


def _files(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (ROOT / f).rglob("*.py") if "__pycache__" not in p.parts)


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _violations(files: list[Path], bad) -> list[str]:
    return [f"{p.relative_to(ROOT)} imports {m}" for p in files for m in sorted(imports_of(p)) if bad(m)]


def test_the_walker_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    pkg = ROOT / "hybrid_llm" / "router"
    assert "hybrid_llm.router.config" in imports_of(pkg / "service.py")
    assert "urllib.request" in imports_of(ROOT / "hybrid_llm" / "router" / "health.py")  # imported in a function
    assert "client.packing.to_infer_inputs" in imports_of(ROOT / "client" / "stream.py")  # from .packing import


def test_only_hybrid_llm_triton_imports_triton_python_backend_utils() -> None:
    files = [p for p in _files(*SOURCES) if not _under(_module_of(p), "hybrid_llm.triton")]
    assert not _violations(files, lambda m: _under(m, "triton_python_backend_utils"))


def test_the_router_imports_nothing_from_engine_or_triton() -> None:
    bad = _violations(_files("hybrid_llm/router"),
                      lambda m: _under(m, "hybrid_llm.engine") or _under(m, "hybrid_llm.triton"))
    assert not bad


def test_contracts_import_nothing_else_of_the_product() -> None:
    bad = _violations(_files("hybrid_llm/contracts"),
                      lambda m: _under(m, "hybrid_llm") and not _under(m, "hybrid_llm.contracts"))
    assert not bad


def test_the_client_imports_only_the_contracts_of_the_product() -> None:
    product = ("hybrid_llm", "loadtests", "tests", "build_scripts", "model_repository")
    bad = _violations(_files("client"), lambda m: any(_under(m, p) for p in product)
                      and not _under(m, "hybrid_llm.contracts"))
    assert not bad


def test_the_package_imports_no_tooling() -> None:
    bad = _violations(_files("hybrid_llm"), lambda m: any(_under(m, p) for p in
                                                          ("client", "frontend", "loadtests", "tests", "build_scripts")))
    assert not bad


def test_the_frontend_talks_to_triton_only_through_the_client_and_the_contracts() -> None:
    allowed = ("hybrid_llm.contracts", "hybrid_llm.server", "hybrid_llm.watchdog", "client", "frontend")
    product = ("hybrid_llm", "loadtests", "tests", "build_scripts", "model_repository", "client")
    bad = _violations(_files("frontend"), lambda m: any(_under(m, p) for p in product)
                      and not any(_under(m, a) for a in allowed))
    assert not bad


@pytest.mark.parametrize("folder", SOURCES)
def test_nothing_reaches_into_a_model_folder(folder: str) -> None:
    for path in _files(folder):
        if path == Path(__file__).resolve():
            continue
        text = path.read_text()
        assert "hybrid_router" not in text, path
        if folder != "tests":
            assert not ("sys.path" in text and "model_repository" in text), path


def test_model_files_only_name_their_class() -> None:
    for path in (ROOT / "model_repository").glob("*/1/model.py"):
        tree = ast.parse(path.read_text())
        classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
        assert [c.name for c in classes] == ["TritonPythonModel"], path
        assert all(isinstance(b, (ast.Expr, ast.Pass)) for b in classes[0].body), f"{path}: lifecycle lives in hybrid_llm"
