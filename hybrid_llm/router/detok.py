"""Incremental detokenization of streamed token ids (no Triton imports).

Byte-level BPE splits multi-byte characters across tokens; decoding ids one at a time
would emit U+FFFD halves. This keeps a window of ids and only emits text once it no
longer ends in an incomplete character, so the concatenated stream always equals the
detokenized full sequence.
"""

from __future__ import annotations

from typing import Any, Sequence

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Feed ids as they stream; get back only complete new text."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # start of the window that is re-decoded
        self._read = 0  # ids before this were already emitted

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=self._skip,
                                clean_up_tokenization_spaces=False)

    def push(self, new_ids: Sequence[int]) -> str:
        """Add ids; return the newly completed text (possibly empty)."""
        self.ids.extend(int(i) for i in new_ids)
        prefix_text = self._decode(self.ids[self._prefix:self._read])
        full_text = self._decode(self.ids[self._prefix:])
        if len(full_text) > len(prefix_text) and not full_text.endswith(REPLACEMENT):
            delta = full_text[len(prefix_text):]
            self._prefix = self._read
            self._read = len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """Emit whatever is left at the end of the stream (a trailing partial byte shows as U+FFFD)."""
        prefix_text = self._decode(self.ids[self._prefix:self._read])
        full_text = self._decode(self.ids[self._prefix:])
        self._prefix = self._read = len(self.ids)
        return full_text[len(prefix_text):]
