"""The generated tokenizer loads with transformers 4.x (Triton's containers) and 5.x (ours),
and carries the chat template the OpenAI frontend applies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "tiny-llama"
TF4 = ROOT / ".runtime" / "transformers4"

_LOAD = """
import json, sys, transformers
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
print(json.dumps({"version": transformers.__version__, "class": type(tok).__name__, "chat": text,
                  "ids": tok.encode("hello world", add_special_tokens=False), "eos": tok.eos_token_id}))
"""


def _load(extra_path: Path | None) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if extra_path is not None:
        env["PYTHONPATH"] = str(extra_path)
    out = subprocess.run([sys.executable, "-c", _LOAD, str(MODEL)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not TF4.is_dir(), reason="setup.sh installs transformers 4.x into .runtime/transformers4")
def test_the_generated_tokenizer_loads_with_transformers_4_and_5_alike():
    v4, v5 = _load(TF4), _load(None)
    assert v4["version"].startswith("4.") and v5["version"].startswith("5.")
    assert v4["class"] == "PreTrainedTokenizerFast"
    assert v4["ids"] == v5["ids"] and v4["eos"] == v5["eos"] == 2
    assert v4["chat"] == v5["chat"] == "<|user|>\nhi</s>\n<|assistant|>\n"


def test_the_tokenizer_config_names_a_class_both_majors_have():
    config = json.loads((MODEL / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and config["chat_template"]
