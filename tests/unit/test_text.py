"""Incremental detokenization, the Prometheus parser and stop words."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hybrid_llm import prom
from hybrid_llm.router.detok import IncrementalDetokenizer
from hybrid_llm.router.job import find_stop
from hybrid_llm.router.relay import _stop_holdback
from hybrid_llm.router.tokens import PROBES, prompt_encoder

MODEL = Path(__file__).resolve().parents[2] / "models" / "tiny-llama"


@pytest.fixture(scope="module")
def tokenizer():
    if not (MODEL / "tokenizer.json").exists():
        pytest.skip("generated model missing: run build_scripts/setup.sh")
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(MODEL))


@pytest.mark.parametrize("text", [
    "日本語のテキストと中文文本", "emoji 😀🚀✨ and 👩‍👩‍👧", "café naïve façade Ελληνικά Русский",
    "plain ascii text, with punctuation!", "한국어 텍스트 mixed with English",
])
@pytest.mark.parametrize("step", [1, 2, 3])
def test_streamed_text_equals_full_decode(tokenizer, text, step):
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.push(ids[i:i + step]) for i in range(0, len(ids), step)]
    pieces.append(detok.flush())
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)


def test_prometheus_parser():
    text = '''# HELP x help
# TYPE x gauge
vllm:kv_cache_usage_perc{model="vllm_backend",version="1"} 0.25
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="trtllm",version="1"} 0.5
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="trtllm",version="1"} 12
h_bucket{le="+Inf",q="a \\"quoted\\" \\\\ value"} 3
plain 1e3
'''
    samples = prom.parse_text(text)
    assert prom.value(samples, "vllm:kv_cache_usage_perc", model="vllm_backend") == 0.25
    assert prom.value(samples, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="fraction") == 0.5
    assert prom.value(samples, "plain") == 1000.0
    bucket = prom.find(samples, "h_bucket")[0]
    assert bucket.label("le") == "+Inf" and bucket.label("q") == 'a "quoted" \\ value'
    assert prom.value(samples, "missing") is None
    with pytest.raises(ValueError):
        prom.parse_text('bad{label="x" 1')


def test_stop_word_helpers():
    assert find_stop("hello STOP world END", ["END", "STOP"]) == 6
    assert find_stop("nothing", ["END"]) == -1
    assert _stop_holdback("abc EN", ["END"]) == 2
    assert _stop_holdback("abc", ["END"]) == 0


# ---------------------------------------------------------------- merging streamed deltas
def test_delta_merger_sends_the_first_delta_at_once_then_every_n_tokens_then_the_rest():
    from hybrid_llm.engine.chunking import DeltaMerger

    m = DeltaMerger(4)
    deltas = [("A", 1)] + [(c, 1) for c in "bcdefghij"]  # 10 tokens, one per delta
    sent = []
    for i, (text, n) in enumerate(deltas):
        out = m.push(text, n, finished=i == len(deltas) - 1)
        if out is not None:
            sent.append(out)
    assert sent == [("A", 1), ("bcde", 4), ("fghi", 4), ("j", 1)]
    assert "".join(t for t, _ in sent) == "Abcdefghij" and sum(n for _, n in sent) == 10


def test_delta_merger_waits_for_a_real_first_token_and_flushes_on_finish():
    from hybrid_llm.engine.chunking import DeltaMerger

    m = DeltaMerger(3)
    assert m.push("", 0, finished=False) == ("", 0)  # nothing generated yet: still "first"
    assert m.push("x", 1, finished=False) == ("x", 1)
    assert m.push("y", 1, finished=False) is None
    assert m.push("z", 2, finished=False) == ("yz", 3)  # a multi-token delta counts its tokens
    assert m.push("", 0, finished=True) == ("", 0)  # the end goes even when empty
    with pytest.raises(ValueError, match=">= 1 token"):
        DeltaMerger(0)


SCRIPTS = ["日本語のテキストと中文文本", "emoji 😀🚀✨ and 👩‍👩‍👧", "café naïve façade Ελληνικά Русский",
           "plain ascii text, with punctuation!", "한국어 텍스트 mixed with English", "x" * 5000]


def test_prompt_encoder_takes_the_rust_path_with_the_same_ids(tokenizer):
    encode, path = prompt_encoder(tokenizer)
    assert path == "rust"
    for text in SCRIPTS + list(PROBES):
        assert encode(text) == tokenizer.encode(text, add_special_tokens=True), text


class _Ids:
    def __init__(self, ids):
        self.ids = ids


class _Backend:
    def __init__(self, shift):
        self.shift = shift

    def encode(self, text, add_special_tokens=True):
        return _Ids([1] + [ord(c) + self.shift for c in text])


class _Tokenizer:
    def __init__(self, backend):
        if backend is not None:
            self.backend_tokenizer = backend

    def encode(self, text, add_special_tokens=True):
        return [1] + [ord(c) for c in text]


@pytest.mark.parametrize("backend, path", [(_Backend(0), "rust"), (_Backend(1), "transformers"),
                                           (None, "transformers")])
def test_prompt_encoder_keeps_transformers_unless_the_backend_agrees(backend, path):
    encode, taken = prompt_encoder(_Tokenizer(backend))
    assert taken == path and encode("héllo") == [1] + [ord(c) for c in "héllo"]
