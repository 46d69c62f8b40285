"""Prompt tokenization for the router's ``execute`` (no Triton imports).

``transformers``' ``tokenizer.encode`` goes through the Rust tokenizer's batch path,
which releases the GIL; in a stub where dozens of stream threads take the GIL in turn,
getting it back can take a switch interval (5 ms). Measured with one busy Python
thread beside it: 174 encodes/s through ``transformers``, 1,285/s through the Rust
tokenizer's single-text ``encode``, which keeps the GIL for its ~0.2 ms. In the router
under 64 streams on 2 saturated cores (one run each) the tokenize step of ``execute``
went from 3.3 to 2.6 ms wall per request; the rest of the wait is CPU contention.
``prompt_encoder`` uses the Rust tokenizer only when it gives the same ids.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

# Texts the fast path must encode exactly like ``tokenizer.encode`` before it is used.
PROBES: tuple[str, ...] = (
    "", " ", "Hello, world!", "  leading and trailing spaces  ", "line\nbreaks\tand tabs",
    "日本語のテキストと中文文本", "emoji 😀🚀✨ and 👩‍👩‍👧", "café naïve Ελληνικά Русский",
    "<s></s><unk> special-looking text", "1234567890 +-*/ = 42",
)


def prompt_encoder(tokenizer: Any, probes: Sequence[str] = PROBES) -> tuple[Callable[[str], list[int]], str]:
    """An ``encode(text) -> ids`` (special tokens added) and which path it takes ("rust" or "transformers")."""

    def slow(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=True))

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not callable(getattr(backend, "encode", None)):
        return slow, "transformers"

    def fast(text: str) -> list[int]:
        return backend.encode(text, add_special_tokens=True).ids

    try:
        same = all(fast(text) == slow(text) for text in probes)
    except Exception:  # noqa: BLE001 - any disagreement in behaviour means: keep the reference path
        same = False
    return (fast, "rust") if same else (slow, "transformers")


__all__ = ["PROBES", "prompt_encoder"]
