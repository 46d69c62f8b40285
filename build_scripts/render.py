"""Render the committed ``model_repository/`` templates into a ready repository for a profile.

Templates use ``${name}`` placeholders (the fill_template convention of
tensorrtllm_backend). Values come from ``build_scripts/profiles/<profile>.json``,
then from ``--set name=value`` overrides. Files named ``*.cpu.*`` / ``*.gpu.*`` are
kept (without the infix) only for profiles of that template variant (a profile's
``templates`` key, default its name: gpu-vllm uses the cpu variant's stand-in files); a profile's ``exclude`` list drops
files it does not use. Every model gets its version folder ``1/`` even when the
profile keeps no file in it. The model.py files import the ``hybrid_llm`` package, which
reaches the stubs through the venv (setup.sh's .pth file); nothing is copied into a
model folder. A rendered repository has no unfilled
placeholder: an unknown or missing name is an error that names the file.

Usage: python -m build_scripts.render --profile cpu --out build/repository [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Iterable, Mapping

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "model_repository"
PROFILES = ROOT / "build_scripts" / "profiles"
PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
TEXT_SUFFIXES = {".pbtxt", ".json", ".txt", ".yaml", ".yml"}
PROFILE_NAMES = ("cpu", "gpu", "gpu-vllm")
# Template variants (the infix of ``*.cpu.*`` / ``*.gpu.*`` files). A profile picks one with
# its ``templates`` key (default: its own name): gpu-vllm runs the Python stand-in for trtllm,
# as cpu does, but on GPU vLLM.
VARIANTS = ("cpu", "gpu")


class RenderError(ValueError):
    """A template could not be rendered; the message names the file and the fix."""


def load_profile(profile: str) -> dict:
    """Read a profile's values and file selection."""
    path = PROFILES / f"{profile}.json"
    if profile not in PROFILE_NAMES or not path.exists():
        raise RenderError(f"unknown profile '{profile}'; choose one of {list(PROFILE_NAMES)}")
    data = json.loads(path.read_text())
    data.setdefault("values", {})
    data.setdefault("exclude", [])
    data.setdefault("models", [])
    data.setdefault("templates", profile)
    if data["templates"] not in VARIANTS:
        raise RenderError(f"{path.name}: 'templates' = {data['templates']!r}; choose one of {list(VARIANTS)}")
    return data


def default_values(profile: str, model_folder: str = "tiny-llama") -> dict[str, str]:
    """Values computed from the checkout (paths), before the profile's and the user's."""
    return {
        "model_dir": str(ROOT / "models" / model_folder),
        "tokenizer_dir": str(ROOT / "models" / model_folder),
        "cache_root": str(ROOT / ".cache"),
        "profile": profile,
    }


def parse_overrides(items: Iterable[str]) -> dict[str, str]:
    """Turn ``key=value`` strings into a dict (raises RenderError on a malformed item)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise RenderError(f"--set expects key=value, got '{item}'")
        out[key.strip()] = value
    return out


def fill(text: str, values: Mapping[str, str], where: str) -> str:
    """Replace every ``${name}``; raise RenderError naming unknown placeholders."""
    missing = sorted({m.group(1) for m in PLACEHOLDER.finditer(text)} - set(values))
    if missing:
        raise RenderError(
            f"{where}: no value for placeholder(s) {', '.join('${' + m + '}' for m in missing)}; "
            f"add them to the profile or pass --set NAME=VALUE"
        )
    return PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), text)


def _selected(rel: Path, variant: str, exclude: list[str]) -> Path | None:
    """The output path of a template file for this template variant, or None when not used."""
    parts = rel.name.split(".")
    if len(parts) >= 3 and parts[-2] in VARIANTS:
        if parts[-2] != variant:
            return None
        rel = rel.with_name(".".join(parts[:-2] + parts[-1:]))
    if rel.as_posix() in exclude or any(rel.as_posix().startswith(e.rstrip("/") + "/") for e in exclude):
        return None
    if "__pycache__" in rel.parts:
        return None
    return rel


def render(profile: str, out: Path, overrides: Mapping[str, str] | None = None,
           models: Iterable[str] | None = None) -> Path:
    """Render the repository for ``profile`` into ``out`` (replaced if present)."""
    prof = load_profile(profile)
    values = {**default_values(profile, prof.get("model_folder", "tiny-llama")),
              **{k: str(v) for k, v in prof["values"].items()}}
    overrides = dict(overrides or {})
    known = set(values)
    used: set[str] = set()
    values.update(overrides)
    mode = values.get("decoupled_mode", "true")
    if mode not in ("true", "false"):
        raise RenderError(f"decoupled_mode = {mode!r}: use true (streaming, the default) or false "
                          "(unary: one response per request, for ModelInfer and HTTP /infer clients)")
    wanted = set(models) if models else set(prof["models"]) or None
    staging = out.with_name(out.name + ".partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    rendered_models: set[str] = set()
    for src in sorted(p for p in TEMPLATES.rglob("*") if p.is_file()):
        rel = _selected(src.relative_to(TEMPLATES), prof["templates"], prof["exclude"])
        if rel is None:
            continue
        model = rel.parts[0]
        if wanted is not None and model not in wanted:
            continue
        dst = staging / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.suffix in TEXT_SUFFIXES:
            text = src.read_text()
            used |= {m.group(1) for m in PLACEHOLDER.finditer(text)}
            dst.write_text(fill(text, values, str(src.relative_to(ROOT))))
        else:
            shutil.copy2(src, dst)
        rendered_models.add(model)
    unknown = sorted(set(overrides) - known - used)
    if unknown:
        shutil.rmtree(staging)
        raise RenderError(f"unknown value(s) {unknown}: no template uses them (typo?)")
    if wanted is not None and wanted - rendered_models:
        shutil.rmtree(staging)
        raise RenderError(f"unknown model(s) {sorted(wanted - rendered_models)}")
    # Triton needs a version folder even when a profile keeps no file in it (the gpu
    # profile's tensorrtllm backend reads its engine from gpt_model_path); git cannot
    # track an empty folder, so make it here.
    for config in staging.glob("*/config.pbtxt"):
        (config.parent / "1").mkdir(exist_ok=True)
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description="Render the model repository for a profile.")
    parser.add_argument("--profile", default="cpu", choices=PROFILE_NAMES)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--models", nargs="*", help="render only these models")
    args = parser.parse_args(argv)
    try:
        out = render(args.profile, args.out, parse_overrides(args.overrides), args.models)
    except RenderError as exc:
        print(f"render: {exc}", file=sys.stderr)
        return 2
    print(f"[render] {args.profile} profile -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
