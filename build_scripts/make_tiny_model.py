"""Generate the project's tiny, deterministic Llama-architecture model.

No model hub is reachable from our machines, so the CPU profile's model is made
here: a byte-level BPE tokenizer trained on local text (the Python standard
library's sources) and a Llama checkpoint with seeded random weights, saved in
Hugging Face format. Output is gibberish, but every engine path (tokenize,
prefill, decode, stream, detokenize) is real, and the folder is a valid input for
GPU vLLM and for the TensorRT-LLM checkpoint converter.

Usage: python -m build_scripts.make_tiny_model --out models/tiny-llama [--seed 0] [--size tiny|1b]

``--size 1b`` makes the gpu-vllm profile's ~0.9B model (hidden 2048, 16 layers, 16 heads /
8 KV heads): big enough that a GPU engine's batching, KV cache and CUDA graphs behave as
they do for real checkpoints, with the same gibberish output.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
# A plain chat template (role tags, EOS after each turn), applied by the OpenAI frontend.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
UNK_ID, BOS_ID, EOS_ID, PAD_ID = 0, 1, 2, 3
STAMP = "tiny_model.json"


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the generated model; the defaults are the CPU profile's model."""

    seed: int = 0
    vocab_size: int = 8192
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 4096
    corpus_files: int = 400
    # 2: tokenizer_config.json names a class transformers 4.x and 5.x both load, and has a chat template
    tokenizer_format: int = 2


SIZES = {
    "tiny": TinyModelSpec(),
    "1b": TinyModelSpec(vocab_size=16384, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                        num_attention_heads=16, num_key_value_heads=8),
}


def _corpus_files(limit: int) -> list[Path]:
    """The standard library's top-level .py files, sorted, so every run reads the same text."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.is_file())
    if not files:
        raise RuntimeError(f"no Python sources found under {stdlib} to train the tokenizer on")
    return files[:limit]


def _corpus(files: list[Path]) -> Iterator[str]:
    """Yield the corpus text, one file at a time."""
    for path in files:
        yield path.read_text(encoding="utf-8", errors="replace")
    # Non-Latin scripts so that multi-byte characters get some merged tokens too.
    yield "日本語のテキスト。中文文本。한국어 텍스트. Ελληνικά. Русский текст. café naïve 😀🚀✨" * 50


def train_tokenizer(spec: TinyModelSpec, out: Path) -> None:
    """Train a byte-level BPE tokenizer and save it in Hugging Face format."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(_corpus_files(spec.corpus_files)), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=spec.max_position_embeddings,
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(out))
    # transformers 5 writes its own class name (TokenizersBackend), which transformers 4.x
    # (what Triton's containers ship) does not have; PreTrainedTokenizerFast loads in both.
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("backend", None)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def write_weights(spec: TinyModelSpec, out: Path) -> None:
    """Write a seeded random-weight Llama checkpoint (bf16 safetensors) and its configs."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    # The embedding covers exactly the trained vocabulary: a sampled id past it would
    # have no text (BPE training can stop short of spec.vocab_size on a small corpus).
    vocab = len(PreTrainedTokenizerFast.from_pretrained(str(out)))
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID).save_pretrained(
        str(out)
    )


def tree_digest(folder: Path) -> str:
    """SHA-256 over every file's name and bytes in a folder (sorted), excluding the stamp."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != STAMP):
        h.update(path.relative_to(folder).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def generate(out: Path, spec: TinyModelSpec = TinyModelSpec(), force: bool = False) -> Path:
    """Generate the model into ``out`` unless a complete one with the same spec is there."""
    stamp = out / STAMP
    if not force and stamp.exists():
        recorded = json.loads(stamp.read_text())
        if recorded.get("spec") == asdict(spec):
            return out
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    t0 = time.monotonic()
    print(f"[model] training a {spec.vocab_size}-token byte-level BPE tokenizer ...", flush=True)
    train_tokenizer(spec, tmp)
    print(f"[model] writing seeded random Llama weights (seed {spec.seed}) ...", flush=True)
    write_weights(spec, tmp)
    (tmp / STAMP).write_text(json.dumps({"spec": asdict(spec), "sha256": tree_digest(tmp)}, indent=2))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    os.replace(tmp, out)
    print(f"[model] {out} ready in {time.monotonic() - t0:.1f} s", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="regenerate even if present")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny",
                        help="tiny: the CPU profile's 7M model; 1b: the gpu-vllm profile's ~0.9B model")
    args = parser.parse_args(argv)
    spec = dataclasses.replace(SIZES[args.size], seed=args.seed)
    generate(args.out, spec, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
