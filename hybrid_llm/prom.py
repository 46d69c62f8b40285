"""A Prometheus text-format (0.0.4) parser, enough for Triton's /metrics (no Triton imports)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


@dataclass(frozen=True)
class Sample:
    """One sample line: metric name, labels, value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str, default: str = "") -> str:
        """A label's value."""
        for k, v in self.labels:
            if k == key:
                return v
        return default


def _parse_labels(text: str, pos: int, line: str) -> tuple[tuple[tuple[str, str], ...], int]:
    labels: list[tuple[str, str]] = []
    pos += 1  # after '{'
    while True:
        while pos < len(text) and text[pos] in " ,":
            pos += 1
        if pos < len(text) and text[pos] == "}":
            return tuple(labels), pos + 1
        m = _NAME.match(text, pos)
        if not m:
            raise ValueError(f"bad label name in: {line!r}")
        key = m.group(0)
        pos = m.end()
        if text[pos:pos + 2] != '="':
            raise ValueError(f"expected =\" after label {key} in: {line!r}")
        pos += 2
        value = []
        while pos < len(text) and text[pos] != '"':
            if text[pos] == "\\" and pos + 1 < len(text):
                nxt = text[pos + 1]
                value.append({"n": "\n", "\\": "\\", '"': '"'}.get(nxt, "\\" + nxt))
                pos += 2
            else:
                value.append(text[pos])
                pos += 1
        if pos >= len(text):
            raise ValueError(f"unterminated label value in: {line!r}")
        labels.append((key, "".join(value)))
        pos += 1


def _parse_value(token: str) -> float:
    token = token.strip()
    if token in ("+Inf", "Inf"):
        return math.inf
    if token == "-Inf":
        return -math.inf
    return float(token)


def parse_text(text: str) -> list[Sample]:
    """Parse exposition text into samples; comments and blank lines are skipped."""
    samples: list[Sample] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _NAME.match(line)
        if not m:
            raise ValueError(f"bad metric line: {line!r}")
        name, pos = m.group(0), m.end()
        labels: tuple[tuple[str, str], ...] = ()
        if pos < len(line) and line[pos] == "{":
            labels, pos = _parse_labels(line, pos, line)
        rest = line[pos:].split()
        if not rest:
            raise ValueError(f"metric line without a value: {line!r}")
        samples.append(Sample(name, labels, _parse_value(rest[0])))
    return samples


def find(samples: Iterable[Sample], name: str, **labels: str) -> list[Sample]:
    """Samples of a metric whose labels include the given ones."""
    return [s for s in samples if s.name == name and all(s.label(k) == v for k, v in labels.items())]


def value(samples: Iterable[Sample], name: str, default: float | None = None, **labels: str) -> float | None:
    """Sum of the matching samples' values (None/default when there are none)."""
    hits = find(samples, name, **labels)
    return sum(s.value for s in hits) if hits else default
