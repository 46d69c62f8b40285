"""The OpenAI frontend's request mapping, error mapping and SSE framing (no server)."""

from __future__ import annotations

import json

import pytest

from frontend import mapping as m
from hybrid_llm.contracts import HIGH, NORMAL, URGENT

D = m.Defaults("tiny")


def render(messages):
    return "".join(f"<|{x['role']}|>\n{x['content']}</s>\n" for x in messages) + "<|assistant|>\n"


def completion(**kw):
    return m.completion_request({"model": "tiny", "prompt": "hi", **kw}, {}, D)


def chat(headers=None, **kw):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **kw}
    return m.chat_request(body, headers or {}, D, render)


def test_a_completion_maps_each_field_to_the_router_request():
    r = completion(max_tokens=7, temperature=0.5, top_p=0.9, seed=3, stop=["END", ""], stream=True,
                   stream_options={"include_usage": True}, user="u1", priority="high", latency_sla_ms=250)
    g = r.generation
    assert (g.prompt, g.max_tokens, g.temperature, g.top_p, g.seed, g.stop_words) == ("hi", 7, 0.5, 0.9, 3, ["END"])
    assert (g.stream, g.priority, g.latency_sla_ms, g.exclude_input_in_output) == (True, HIGH, 250.0, True)
    assert r.include_usage and r.user == "u1" and r.kind == "completion"


def test_penalties_reach_the_router_request():
    g = completion(presence_penalty=0.5, frequency_penalty=-1).generation
    assert (g.presence_penalty, g.frequency_penalty) == (0.5, -1)
    assert completion(min_tokens=4, max_tokens=8).generation.min_tokens == 4
    assert completion().generation.min_tokens is None


def test_completion_defaults_and_echo():
    r = completion()
    assert r.generation.max_tokens == 16 and not r.stream and r.generation.priority == NORMAL
    assert completion(echo=True).generation.exclude_input_in_output is False
    assert completion(prompt=["one"]).generation.prompt == "one"
    assert completion(stop="x").generation.stop_words == ["x"]


def test_chat_renders_the_template_once_and_takes_max_completion_tokens():
    r = chat(max_completion_tokens=5, max_tokens=9)
    assert r.generation.prompt == "<|user|>\nhi</s>\n<|assistant|>\n" and r.generation.max_tokens == 5
    assert chat(max_tokens=9).generation.max_tokens == 9
    assert chat().generation.max_tokens == D.chat_max_tokens
    parts = chat(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert "ab" in parts.generation.prompt


@pytest.mark.parametrize("value, expected", [("urgent", URGENT), ("HIGH", HIGH), (3, NORMAL), ("1", URGENT)])
def test_priority_from_the_body_or_the_header(value, expected):
    assert completion(priority=value).generation.priority == expected
    assert chat(headers={m.PRIORITY_HEADER: str(value)}).generation.priority == expected


def test_the_body_wins_over_the_headers():
    r = chat(headers={m.PRIORITY_HEADER: "urgent", m.SLA_HEADER: "10"}, priority="normal", latency_sla_ms=99)
    assert r.generation.priority == NORMAL and r.generation.latency_sla_ms == 99
    assert chat(headers={m.SLA_HEADER: "12.5"}).generation.latency_sla_ms == 12.5


@pytest.mark.parametrize("body, param", [
    ({"n": 2}, "n"), ({"n": True}, "n"), ({"priority": 4}, "priority"), ({"priority": "soon"}, "priority"),
    ({"latency_sla_ms": 0}, "latency_sla_ms"), ({"latency_sla_ms": "x"}, "latency_sla_ms"),
    ({"temperature": -0.1}, "temperature"), ({"temperature": 2.5}, "temperature"), ({"temperature": "1"}, "temperature"),
    ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"seed": -1}, "seed"), ({"seed": 1.5}, "seed"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": "8"}, "max_tokens"), ({"stop": [1]}, "stop"),
    ({"stream": "yes"}, "stream"), ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"logprobs": 2}, "logprobs"), ({"best_of": 2}, "best_of"), ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"min_tokens": 9, "max_tokens": 8}, "min_tokens"), ({"min_tokens": -1}, "min_tokens"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"logit_bias": {"1": 5}}, "logit_bias"), ({"prompt": ""}, "prompt"), ({"prompt": [1, 2]}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"), ({"echo": True, "stream": True}, "echo"), ({"model": ""}, "model"),
])
def test_invalid_completion_fields_get_a_400_naming_them(body, param):
    with pytest.raises(m.ApiError) as err:
        completion(**body)
    assert err.value.status == 400 and err.value.param == param
    assert err.value.body()["error"]["type"] == "invalid_request_error"


def test_neutral_values_of_refused_fields_pass_and_unknown_fields_are_ignored():
    r = completion(logprobs=None, best_of=1, presence_penalty=0, frequency_penalty=0.0, logit_bias={},
                   response_format={"type": "text"}, metadata={"a": "b"}, store=False, service_tier="auto")
    assert r.generation.prompt == "hi"


def test_an_unknown_model_is_a_404():
    with pytest.raises(m.ApiError) as err:
        completion(model="gpt-4")
    assert err.value.status == 404 and err.value.code == "model_not_found"


@pytest.mark.parametrize("messages", [[], [{"role": "robot", "content": "x"}], [{"role": "user", "content": 5}],
                                      [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], ["x"]])
def test_invalid_chat_messages_get_a_400(messages):
    with pytest.raises(m.ApiError) as err:
        chat(messages=messages)
    assert err.value.status == 400 and err.value.param == "messages"


def test_a_template_that_refuses_the_messages_is_a_400():
    def strict(_):
        raise ValueError("roles must alternate")
    with pytest.raises(m.ApiError, match="roles must alternate"):
        m.chat_request({"model": "tiny", "messages": [{"role": "user", "content": "x"}]}, {}, D, strict)


@pytest.mark.parametrize("code, message, status, retry", [
    ("INVALID_ARG", "[INVALID_ARG] router_bls: input 'max_tokens' is 5000; send 1..1024", 400, None),
    ("UNAVAILABLE", "[UNAVAILABLE] router_bls: the router queue is full (8 requests waiting); retry later", 503, "1"),
    ("UNAVAILABLE", "[UNAVAILABLE] engine vllm_backend died before the first token", 503, "5"),
    ("CANCELLED", "[CANCELLED] cancelled", 499, None),
    ("INTERNAL", "boom", 500, None),
    (None, "no code", 500, None),
])
def test_router_errors_map_to_http_with_the_message_passed_through(code, message, status, retry):
    err = m.http_error_of(code, message)
    assert err.status == status and err.headers().get("Retry-After") == retry
    assert not err.message.startswith("[") and err.message in message
    assert set(err.body()["error"]) == {"message", "type", "param", "code"}


def test_sse_framing():
    assert m.sse("[DONE]") == b"data: [DONE]\n\n"
    raw = m.sse({"a": 1})
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n") and json.loads(raw[6:]) == {"a": 1}


def test_bodies_usage_and_finish_reason():
    req = completion(max_tokens=4)
    out = m.Outcome("abc", "trtllm", prompt_tokens=2, completion_tokens=4)
    body = m.response_body(req, out)
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == "abc"
    assert body["choices"][0]["finish_reason"] == "length" and body["backend"] == "trtllm"
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}
    out.completion_tokens = 3
    assert m.response_body(req, out)["choices"][0]["finish_reason"] == "stop"
    c = chat(stream=True, stream_options={"include_usage": True})
    assert m.delta_chunk(c, "", first=True)["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    last, use = m.final_chunks(c, m.Outcome("xy", "vllm_backend", 1, 2), "y")
    assert last["object"] == "chat.completion.chunk" and last["choices"][0]["delta"] == {"content": "y"}
    assert last["backend"] == "vllm_backend" and use["choices"] == [] and use["usage"]["total_tokens"] == 3
    assert len(m.final_chunks(chat(stream=True), m.Outcome(), "")) == 1
