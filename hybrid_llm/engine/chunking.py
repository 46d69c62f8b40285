"""Merging streamed deltas into fewer responses (no Triton imports).

vLLM's ``stream_interval`` engine argument does this inside vLLM from 0.11.1 on; with an
older vLLM (0.11.0 in the GPU image) ``vllm_backend`` merges the deltas itself with
``DeltaMerger``, so the profile value means the same on both.
"""

from __future__ import annotations


class DeltaMerger:
    """Holds streamed text until ``every`` tokens are pending; the first delta and the last go at once."""

    def __init__(self, every: int) -> None:
        if every < 1:
            raise ValueError(f"stream interval must be >= 1 token, got {every}")
        self.every = every
        self._text: list[str] = []
        self._tokens = 0
        self._started = False

    def push(self, text: str, n_tokens: int, finished: bool) -> tuple[str, int] | None:
        """Add one delta; returns (text, tokens) to send now, or None to hold it."""
        self._text.append(text)
        self._tokens += n_tokens
        if not (finished or not self._started or self._tokens >= self.every):
            return None
        out = ("".join(self._text), self._tokens)
        self._text, self._tokens = [], 0
        self._started = self._started or out[1] > 0
        return out


__all__ = ["DeltaMerger"]
