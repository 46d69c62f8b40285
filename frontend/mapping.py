"""OpenAI requests to router_bls requests and router results to OpenAI bodies (no I/O).

What is accepted, refused and ignored is decided here, in one place, and unit-tested:
``completion_request`` and ``chat_request`` validate a body (and the router's header
extensions) into a ``FrontendRequest``; ``http_error_of`` maps a Triton error of the
router to the HTTP status and OpenAI error JSON a client expects; ``completion_body``,
``chat_body`` and the ``*_chunk`` functions build responses; ``sse`` frames events.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from hybrid_llm.contracts import PRIORITY_NAMES, GenerationRequest

# Headers for clients that cannot add body fields (the body wins when both are given).
PRIORITY_HEADER = "x-priority"
SLA_HEADER = "x-latency-sla-ms"
ENGINE_HEADER = "x-hybrid-engine"  # which engine served the request (response header)

# Fields refused unless they have their neutral value: the router cannot honour them.
_REFUSED: dict[str, Callable[[Any], bool]] = {
    "logprobs": lambda v: v in (None, False, 0),
    "top_logprobs": lambda v: v in (None, 0),
    "best_of": lambda v: v in (None, 1),
    "logit_bias": lambda v: not v,
    "suffix": lambda v: v in (None, ""),
    "tools": lambda v: not v,
    "functions": lambda v: not v,
    "response_format": lambda v: v in (None, {}) or (isinstance(v, dict) and v.get("type") == "text"),
    "audio": lambda v: v is None,
    "prediction": lambda v: v is None,
}
# Accepted and ignored (they change nothing the router does): user, metadata, store,
# service_tier, parallel_tool_calls, tool_choice "none", stream_options other than
# include_usage, and any field this list does not name.
CHAT_ROLES = ("system", "developer", "user", "assistant")


class ApiError(Exception):
    """An error answered with the OpenAI error JSON."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, Any]:
        """The OpenAI error object."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        """Retry-After for a 503."""
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}


def bad(message: str, param: str | None = None) -> ApiError:
    """A 400 naming the field."""
    return ApiError(400, message, param=param)


@dataclass
class FrontendRequest:
    """A validated OpenAI request and the router request it becomes."""

    kind: str  # "completion" | "chat"
    model: str
    generation: GenerationRequest
    stream: bool
    include_usage: bool = False
    user: str | None = None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass(frozen=True)
class Defaults:
    """The frontend's settings that shape requests."""

    model: str
    completion_max_tokens: int = 16  # OpenAI's default for /v1/completions
    chat_max_tokens: int = 256  # when a chat request names no max_completion_tokens / max_tokens


def _number(body: Mapping[str, Any], name: str, lo: float, hi: float, integer: bool = False,
            lo_open: bool = False) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise bad(f"'{name}' must be {'an integer' if integer else 'a number'}; got {value!r}", name)
    if value < lo or value > hi or (lo_open and value == lo):
        raise bad(f"'{name}' is {value}; send a value in {'(' if lo_open else '['}{lo}, {hi}]", name)
    return value


def _priority(body: Mapping[str, Any], headers: Mapping[str, str]) -> int:
    raw = body.get("priority", headers.get(PRIORITY_HEADER))
    if raw is None:
        return PRIORITY_NAMES["normal"]
    if isinstance(raw, str) and raw.strip().lower() in PRIORITY_NAMES:
        return PRIORITY_NAMES[raw.strip().lower()]
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = 0
    if isinstance(raw, bool) or value not in (1, 2, 3):
        raise bad(f"'priority' is {raw!r}; send \"urgent\", \"high\", \"normal\" or 1-3 "
                  f"(body field or the {PRIORITY_HEADER} header)", "priority")
    return value


def _sla(body: Mapping[str, Any], headers: Mapping[str, str]) -> float | None:
    raw = body.get("latency_sla_ms", headers.get(SLA_HEADER))
    if raw is None:
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if isinstance(raw, bool) or not value > 0 or value != value:
        raise bad(f"'latency_sla_ms' is {raw!r}; send a positive number of milliseconds "
                  f"(body field or the {SLA_HEADER} header)", "latency_sla_ms")
    return value


def _min_tokens(body: Mapping[str, Any], max_tokens: Any) -> int | None:
    """vLLM's extension ``min_tokens``: at least this many tokens before EOS may end the output."""
    value = _number(body, "min_tokens", 0, 2**31 - 1, integer=True)
    if value is not None and isinstance(max_tokens, int) and value > max_tokens:
        raise bad(f"'min_tokens' is {value}; send at most the maximum number of tokens ({max_tokens})", "min_tokens")
    return value


def _stop(body: Mapping[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return [s for s in stop if s]
    raise bad("'stop' must be a string or a list of strings", "stop")


def _common(body: Any, headers: Mapping[str, str], defaults: Defaults, kind: str, prompt: str,
            max_tokens: Any, exclude_input: bool = True) -> FrontendRequest:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("'model' is required; GET /v1/models lists the served model", "model")
    if model != defaults.model:
        raise ApiError(404, f"the model '{model}' does not exist; this server serves '{defaults.model}'",
                       param="model", code="model_not_found")
    for name, neutral in _REFUSED.items():
        if name in body and not neutral(body[name]):
            raise bad(f"'{name}' is not supported by this server (router_bls); leave it out", name)
    n = body.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise bad(f"'n' is {n!r}; this server returns one choice per request: send n = 1", "n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("'stream' must be true or false", "stream")
    options = body.get("stream_options")
    if options is not None and not stream:
        raise bad("'stream_options' is only allowed with stream = true", "stream_options")
    include_usage = bool((options or {}).get("include_usage", False))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise bad(f"the maximum number of tokens is {max_tokens!r}; send a positive integer", "max_tokens")
    seed = _number(body, "seed", 0, 2**63 - 1, integer=True)
    user = body.get("user")
    gen = GenerationRequest(
        prompt=prompt,
        max_tokens=max_tokens,
        stream=stream,
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_number(body, "top_p", 0.0, 1.0, lo_open=True),
        seed=seed,
        stop_words=_stop(body),
        exclude_input_in_output=exclude_input,
        priority=_priority(body, headers),
        latency_sla_ms=_sla(body, headers),
        presence_penalty=_number(body, "presence_penalty", -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", -2.0, 2.0),
        min_tokens=_min_tokens(body, max_tokens),
    )
    return FrontendRequest(kind, model, gen, stream, include_usage, user if isinstance(user, str) else None)


def completion_request(body: Any, headers: Mapping[str, str], defaults: Defaults) -> FrontendRequest:
    """Validate a /v1/completions body."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise bad("'prompt' must be one string (or a list of one string); token-id prompts and "
                      "batches of prompts are not supported", "prompt")
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt.strip():
        raise bad("'prompt' is required: send a non-empty string", "prompt")
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise bad("'echo' must be true or false", "echo")
    if echo and body.get("stream"):
        raise bad("'echo' with stream = true is not supported; send echo = false", "echo")
    max_tokens = body.get("max_tokens", defaults.completion_max_tokens)
    return _common(body, headers, defaults, "completion", prompt,
                   defaults.completion_max_tokens if max_tokens is None else max_tokens, exclude_input=not echo)


def message_text(message: Any, index: int) -> dict[str, str]:
    """One chat message as {role, content} with text content (parts joined), or a 400."""
    if not isinstance(message, dict):
        raise bad(f"messages[{index}] must be an object with 'role' and 'content'", "messages")
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise bad(f"messages[{index}].role is {role!r}; send one of {list(CHAT_ROLES)}", "messages")
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(f"messages[{index}].content: only text parts are supported", "messages")
            texts.append(part["text"])
        content = "".join(texts)
    if content is None and role == "assistant":
        content = ""
    if not isinstance(content, str):
        raise bad(f"messages[{index}].content must be a string or a list of text parts", "messages")
    return {"role": "system" if role == "developer" else role, "content": content}


def chat_request(body: Any, headers: Mapping[str, str], defaults: Defaults,
                 render: Callable[[list[dict[str, str]]], str]) -> FrontendRequest:
    """Validate a /v1/chat/completions body; ``render`` applies the model's chat template."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' is required: send a non-empty list of {role, content} objects", "messages")
    texts = [message_text(m, i) for i, m in enumerate(messages)]
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    try:
        prompt = render(texts)
    except Exception as exc:  # noqa: BLE001 - a template that refuses the conversation is the client's 400
        raise bad(f"the model's chat template cannot render these messages: {exc}", "messages") from None
    return _common(body, headers, defaults, "chat", prompt,
                   defaults.chat_max_tokens if max_tokens is None else max_tokens)


# ------------------------------------------------------------------ errors from the router
def http_error_of(code: str | None, message: str) -> ApiError:
    """The HTTP answer to a router error (its Triton code and message)."""
    text = message.split("] ", 1)[1] if message.startswith("[") and "] " in message else message
    if code == "INVALID_ARG":
        return ApiError(400, text, "invalid_request_error", code="invalid_value")
    if code == "UNAVAILABLE":
        overloaded = "queue is full" in text
        return ApiError(503, text, "server_error", code="overloaded" if overloaded else "unavailable",
                        retry_after_s=1 if overloaded else 5)
    if code == "CANCELLED":
        return ApiError(499, text, "server_error", code="cancelled")
    return ApiError(500, text, "server_error", code="internal_error")


# ------------------------------------------------------------------ responses
@dataclass
class Outcome:
    """What the router answered for one request."""

    text: str = ""
    backend: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


def finish_reason(req: FrontendRequest, out: Outcome) -> str:
    """'length' when the request used up its max tokens, else 'stop' (EOS or a stop string)."""
    n = out.completion_tokens
    return "length" if n is not None and n >= req.generation.max_tokens else "stop"


def usage(out: Outcome) -> dict[str, int]:
    """The OpenAI usage object from the router's counts."""
    p, c = out.prompt_tokens or 0, out.completion_tokens or 0
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _head(req: FrontendRequest, obj: str) -> dict[str, Any]:
    prefix = "cmpl" if req.kind == "completion" else "chatcmpl"
    return {"id": f"{prefix}-{req.request_id}", "object": obj, "created": int(time.time()), "model": req.model}


def response_body(req: FrontendRequest, out: Outcome) -> dict[str, Any]:
    """The non-streaming response (text_completion or chat.completion)."""
    reason = finish_reason(req, out)
    if req.kind == "completion":
        choice: dict[str, Any] = {"index": 0, "text": out.text, "logprobs": None, "finish_reason": reason}
        body = _head(req, "text_completion")
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": out.text}, "logprobs": None,
                  "finish_reason": reason}
        body = _head(req, "chat.completion")
    return {**body, "choices": [choice], "usage": usage(out), "backend": out.backend}


def delta_chunk(req: FrontendRequest, text: str, first: bool = False) -> dict[str, Any]:
    """One streamed piece of text."""
    if req.kind == "completion":
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
        return {**_head(req, "text_completion"), "choices": [choice]}
    delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
    return {**_head(req, "chat.completion.chunk"), "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                                 "finish_reason": None}]}


def final_chunks(req: FrontendRequest, out: Outcome, text: str) -> list[dict[str, Any]]:
    """The last chunk (remaining text, finish_reason, the engine) and the usage chunk if asked."""
    reason = finish_reason(req, out)
    if req.kind == "completion":
        last = {**_head(req, "text_completion"),
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}]}
    else:
        delta = {"content": text} if text else {}
        last = {**_head(req, "chat.completion.chunk"),
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]}
    last["backend"] = out.backend
    chunks = [last]
    if req.include_usage:
        obj = "text_completion" if req.kind == "completion" else "chat.completion.chunk"
        chunks.append({**_head(req, obj), "choices": [], "usage": usage(out)})
    return chunks


def sse(event: Mapping[str, Any] | str) -> bytes:
    """One server-sent event: ``data: <json>`` (or ``data: [DONE]``) and a blank line."""
    data = event if isinstance(event, str) else json.dumps(event, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def models_body(name: str, created: int) -> dict[str, Any]:
    """GET /v1/models."""
    return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "hybrid-llm"}]}


def header_map(items: Sequence[tuple[str, str]] | Mapping[str, str]) -> dict[str, str]:
    """Lower-cased request headers."""
    pairs = items.items() if isinstance(items, Mapping) else items
    return {k.lower(): v for k, v in pairs}
