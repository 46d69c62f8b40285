"""Build the TensorRT-LLM engine of the gpu profile's ``trtllm`` model from a Hugging Face checkpoint.

Two upstream steps, run as commands (``--dry-run`` prints them and runs nothing):
1. checkpoint conversion: TensorRT-LLM's ``examples/models/core/llama/convert_checkpoint.py``
   (FP16 weights; ``--int8_kv_cache`` for an INT8 KV cache), or
   ``examples/quantization/quantize.py --qformat full_prec --kv_cache_dtype fp8`` for an FP8 KV
   cache (FP16 weights, calibrated KV scales);
2. ``trtllm-build``: FP16 GEMM and attention plugins, paged KV cache, packed (padding-free)
   inputs, ``--max_batch_size`` / ``--max_input_len`` / ``--max_seq_len`` / ``--max_num_tokens``.

Defaults come from ``build_scripts/profiles/gpu.json`` (max batch size, max sequence length,
engine folder), so the engine matches the rendered ``trtllm/config.pbtxt``. The examples come
from a TensorRT-LLM checkout of the container's version (``--examples-dir`` or
``TRTLLM_EXAMPLES_DIR``); docs/deploy_gpu.md shows the whole path, and the PyTorch (LLM API)
alternative that needs no engine.

Usage: python3 -m build_scripts.build_trtllm_engine --model-dir /models/hf [--kv-cache-quant int8] [--dry-run]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from build_scripts.render import load_profile

DEFAULT_EXAMPLES_DIR = "/opt/TensorRT-LLM/examples"
# Where the Llama converter lives: TensorRT-LLM >= 0.19 first, older layouts after.
LLAMA_CONVERTERS = ("models/core/llama/convert_checkpoint.py", "llama/convert_checkpoint.py")
QUANTIZE_SCRIPT = "quantization/quantize.py"
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
KV_CACHE_QUANT = ("none", "int8", "fp8")
# Room the router keeps for output tokens (router_bls max_prompt_tokens = context - 128).
OUTPUT_ROOM_TOKENS = 128
LOG = "[trtllm-engine]"


class BuildError(ValueError):
    """The build cannot start; the message names the flag or the missing piece and the fix."""


@dataclass(frozen=True)
class BuildPlan:
    """The commands of one engine build, in order, and what to tell the user after them."""

    commands: list[list[str]]
    checkpoint_dir: Path
    engine_dir: Path
    render_overrides: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def profile_defaults() -> dict[str, str]:
    """The gpu profile's values the engine must agree with."""
    return load_profile("gpu")["values"]


def read_model_config(model_dir: Path) -> dict:
    """The Hugging Face ``config.json`` of ``model_dir``, checked for a supported architecture."""
    path = model_dir / "config.json"
    if not path.is_file():
        raise BuildError(f"--model-dir {model_dir}: no config.json; pass a Hugging Face checkpoint folder")
    config = json.loads(path.read_text())
    archs = config.get("architectures") or []
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise BuildError(
            f"--model-dir {model_dir}: architecture {archs} is not handled by this script "
            f"(supported: {list(SUPPORTED_ARCHITECTURES)}); use the matching converter of examples/models"
        )
    return config


def find_script(examples_dir: Path, candidates: tuple[str, ...], required: bool) -> Path:
    """The first candidate script that exists under ``examples_dir`` (the first one when none does and not required)."""
    for rel in candidates:
        if (examples_dir / rel).is_file():
            return examples_dir / rel
    if required:
        raise BuildError(
            f"--examples-dir {examples_dir}: none of {list(candidates)} found; clone TensorRT-LLM at the "
            f"container's version (docs/deploy_gpu.md) and pass its examples/ folder"
        )
    return examples_dir / candidates[0]


def validate(args: argparse.Namespace, model_config: dict) -> None:
    """Check the size options against each other and the model (raises BuildError naming the flag)."""
    for name in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "tp_size"):
        if getattr(args, name) < 1:
            raise BuildError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.max_input_len >= args.max_seq_len:
        raise BuildError(
            f"--max-input-len ({args.max_input_len}) must be below --max-seq-len ({args.max_seq_len}): "
            f"the sequence holds the prompt and the output"
        )
    limit = model_config.get("max_position_embeddings")
    if limit and args.max_seq_len > limit:
        raise BuildError(f"--max-seq-len {args.max_seq_len} exceeds the model's max_position_embeddings {limit}")
    heads = model_config.get("num_key_value_heads") or model_config.get("num_attention_heads")
    if heads and heads % args.tp_size:
        raise BuildError(f"--tp-size {args.tp_size} must divide the model's {heads} KV heads")


def plan(args: argparse.Namespace, dry_run: bool) -> BuildPlan:
    """Turn parsed options into the exact conversion and build commands."""
    model_dir = args.model_dir.resolve()
    model_config = read_model_config(model_dir)
    validate(args, model_config)
    engine_dir = args.output_dir
    checkpoint_dir = args.checkpoint_dir or engine_dir.with_name(engine_dir.name + "_checkpoint")
    python = args.python
    if args.kv_cache_quant == "fp8":
        script = find_script(args.examples_dir, (QUANTIZE_SCRIPT,), required=not dry_run)
        convert = [python, str(script), "--model_dir", str(model_dir), "--output_dir", str(checkpoint_dir),
                   "--dtype", "float16", "--qformat", "full_prec", "--kv_cache_dtype", "fp8",
                   "--tp_size", str(args.tp_size), "--calib_size", str(args.calib_size)]
    else:
        script = find_script(args.examples_dir, LLAMA_CONVERTERS, required=not dry_run)
        convert = [python, str(script), "--model_dir", str(model_dir), "--output_dir", str(checkpoint_dir),
                   "--dtype", "float16", "--tp_size", str(args.tp_size)]
        if args.kv_cache_quant == "int8":
            convert += ["--int8_kv_cache", "--calib_size", str(args.calib_size)]
    if args.kv_cache_quant != "none" and args.calib_dataset:
        convert += ["--calib_dataset", args.calib_dataset]
    # Paged context FMHA (needed by KV-cache reuse and chunked context) refuses an INT8 KV
    # cache, and with FP8 it needs FP8 weights too; a quantized KV cache turns it off.
    paged_context = "enable" if args.kv_cache_quant == "none" else "disable"
    build = [
        args.trtllm_build, "--checkpoint_dir", str(checkpoint_dir), "--output_dir", str(engine_dir),
        "--gemm_plugin", "float16", "--gpt_attention_plugin", "float16",
        "--kv_cache_type", "paged", "--remove_input_padding", "enable", "--context_fmha", "enable",
        "--use_paged_context_fmha", paged_context,
        "--max_batch_size", str(args.max_batch_size), "--max_beam_width", "1",
        "--max_input_len", str(args.max_input_len), "--max_seq_len", str(args.max_seq_len),
        "--max_num_tokens", str(args.max_num_tokens),
    ]
    overrides = {"trtllm_engine_dir": str(engine_dir)}
    notes: list[str] = []
    if paged_context == "disable":
        overrides.update(trtllm_enable_kv_cache_reuse="false", trtllm_enable_chunked_context="false")
        notes.append("a quantized KV cache disables paged context FMHA: render with KV-cache reuse "
                     "and chunked context off (the --set below)")
    if args.kv_cache_quant != "none" and not args.calib_dataset:
        notes.append("calibration reads the converter's default dataset from the Hugging Face hub; "
                     "offline, pass --calib-dataset with a local dataset folder")
    if args.kv_cache_quant == "fp8":
        notes.append("an FP8 KV cache needs an Ada, Hopper or newer GPU (SM 8.9+)")
    if str(args.max_batch_size) != profile_defaults()["trtllm_max_batch_size"]:
        overrides["trtllm_max_batch_size"] = str(args.max_batch_size)
    if args.tp_size > 1:
        notes.append(f"a {args.tp_size}-way engine needs {args.tp_size} GPUs in trtllm_gpu_device_ids and "
                     f"TRTLLM_ORCHESTRATOR=1 in the server's environment (docs/deploy_gpu.md)")
    return BuildPlan([convert, build], checkpoint_dir, engine_dir, overrides, notes)


def missing_tensorrt_llm(python: str, trtllm_build: str) -> str | None:
    """Why TensorRT-LLM cannot run here, or None when it can."""
    if Path(python).resolve() == Path(sys.executable).resolve():
        found = importlib.util.find_spec("tensorrt_llm") is not None
    else:
        found = subprocess.run([python, "-c", "import tensorrt_llm"], capture_output=True).returncode == 0
    if not found:
        return f"the Python package tensorrt_llm is not installed for {python}"
    if shutil.which(trtllm_build) is None:
        return f"the {trtllm_build} command is not on PATH"
    return None


def render_command(overrides: dict[str, str]) -> str:
    """The render command that points the gpu profile at this engine."""
    sets = " ".join(f"--set {shlex.quote(f'{k}={v}')}" for k, v in overrides.items())
    return f"python3 -m build_scripts.render --profile gpu --out <repository> {sets}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options; size defaults come from the gpu profile."""
    values = profile_defaults()
    seq = int(values["max_model_len"])
    parser = argparse.ArgumentParser(description="HF checkpoint -> TensorRT-LLM engine for the gpu profile.")
    parser.add_argument("--model-dir", type=Path, required=True, help="Hugging Face checkpoint folder")
    parser.add_argument("--output-dir", type=Path, default=Path(values["trtllm_engine_dir"]),
                        help="engine folder (default: the gpu profile's trtllm_engine_dir)")
    parser.add_argument("--checkpoint-dir", type=Path, default=None,
                        help="TensorRT-LLM checkpoint folder (default: <output-dir>_checkpoint)")
    parser.add_argument("--examples-dir", type=Path,
                        default=Path(os.environ.get("TRTLLM_EXAMPLES_DIR", DEFAULT_EXAMPLES_DIR)),
                        help="examples/ of a TensorRT-LLM checkout matching the installed version")
    parser.add_argument("--kv-cache-quant", choices=KV_CACHE_QUANT, default="none")
    parser.add_argument("--calib-dataset", default="", help="local dataset folder for KV-cache calibration")
    parser.add_argument("--calib-size", type=int, default=512)
    parser.add_argument("--tp-size", type=int, default=1, help="tensor-parallel GPUs of the engine")
    parser.add_argument("--max-batch-size", type=int, default=int(values["trtllm_max_batch_size"]))
    parser.add_argument("--max-seq-len", type=int, default=seq, help="prompt + output tokens")
    parser.add_argument("--max-input-len", type=int, default=seq - OUTPUT_ROOM_TOKENS)
    parser.add_argument("--max-num-tokens", type=int, default=8192, help="tokens per engine iteration")
    parser.add_argument("--python", default="python3", help="interpreter that has tensorrt_llm")
    parser.add_argument("--trtllm-build", default="trtllm-build")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    args = parse_args(argv)
    if not args.dry_run:
        reason = missing_tensorrt_llm(args.python, args.trtllm_build)
        if reason:
            print(
                f"{LOG} TensorRT-LLM is not installed here: {reason}. Build engines inside the Triton "
                f"TRT-LLM container (build_scripts/Dockerfile) on the GPU type that will serve them; "
                f"--dry-run prints the commands without it.",
                file=sys.stderr,
            )
            return 2
    try:
        build_plan = plan(args, args.dry_run)
    except BuildError as exc:
        print(f"{LOG} {exc}", file=sys.stderr)
        return 2
    total = len(build_plan.commands)
    for step, cmd in enumerate(build_plan.commands, 1):
        print(f"{LOG} step {step}/{total}: {shlex.join(cmd)}", flush=True)
        if not args.dry_run:
            code = subprocess.run(cmd).returncode
            if code:
                print(f"{LOG} step {step}/{total} failed (exit code {code}); its output is above", file=sys.stderr)
                return code
    for note in build_plan.notes:
        print(f"{LOG} note: {note}")
    print(f"{LOG} then render: {render_command(build_plan.render_overrides)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
