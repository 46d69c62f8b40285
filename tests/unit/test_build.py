"""The model generator is deterministic; rendering fills every placeholder or fails clearly."""

from __future__ import annotations

import json

import pytest

from build_scripts.make_tiny_model import TinyModelSpec, generate, tree_digest
from build_scripts.render import PLACEHOLDER, RenderError, fill, parse_overrides, render


def test_generator_is_deterministic(tmp_path):
    spec = TinyModelSpec(seed=7, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         vocab_size=512, corpus_files=20)
    a = generate(tmp_path / "a", spec)
    b = generate(tmp_path / "b", spec)
    assert tree_digest(a) == tree_digest(b)
    names = {p.name for p in a.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= names
    config = json.loads((a / "config.json").read_text())
    assert config["max_position_embeddings"] == 4096 and config["eos_token_id"] == 2
    assert json.loads((a / "generation_config.json").read_text())["eos_token_id"] == 2
    other = generate(tmp_path / "c", TinyModelSpec(**{**spec.__dict__, "seed": 8}))
    assert tree_digest(other) != tree_digest(a)


def test_generate_skips_when_present(tmp_path):
    spec = TinyModelSpec(hidden_size=64, intermediate_size=128, num_hidden_layers=1, vocab_size=300, corpus_files=5)
    out = generate(tmp_path / "m", spec)
    stamp = (out / "tiny_model.json").stat().st_mtime_ns
    generate(out, spec)
    assert (out / "tiny_model.json").stat().st_mtime_ns == stamp


def test_render_cpu_fills_every_placeholder(tmp_path):
    out = render("cpu", tmp_path / "repo")
    for path in out.rglob("*"):
        if path.is_file() and path.suffix in (".pbtxt", ".json"):
            assert not PLACEHOLDER.search(path.read_text()), path
    assert (out / "trtllm" / "config.pbtxt").exists()
    assert not list(out.rglob("*.cpu.*")) and not list(out.rglob("*.gpu.*"))
    assert (out / "vllm_backend" / "1" / "model.py").exists()
    assert not list(out.rglob("hybrid_llm")), "the package reaches the stubs through the venv, not copies"
    json.loads((out / "vllm_backend" / "1" / "model.json").read_text())


def test_render_overrides_and_model_subset(tmp_path):
    out = render("cpu", tmp_path / "repo", {"router_policy": "round_robin"}, ["router_bls"])
    assert [p.name for p in out.iterdir()] == ["router_bls"]
    assert 'string_value: "round_robin"' in (out / "router_bls" / "config.pbtxt").read_text()


def test_render_errors_are_clear(tmp_path):
    with pytest.raises(RenderError, match="no_such_value"):
        render("cpu", tmp_path / "r", {"no_such_value": "1"})
    with pytest.raises(RenderError, match=r"tpl.pbtxt.*\$\{missing\}"):
        fill("a: ${missing}", {}, "tpl.pbtxt")
    with pytest.raises(RenderError, match="unknown profile"):
        render("tpu", tmp_path / "r")
    with pytest.raises(RenderError, match="key=value"):
        parse_overrides(["novalue"])
    with pytest.raises(RenderError, match="unknown model"):
        render("cpu", tmp_path / "r", None, ["nope"])
