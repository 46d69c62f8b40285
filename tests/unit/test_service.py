"""RouterService with a fake transport: admission, queue bound, failover, stop words, cancel."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from hybrid_llm.router.config import RouterConfig
from hybrid_llm.router.job import RouterJob
from hybrid_llm.router.relay import EngineError
from hybrid_llm.router.service import RouterService


class FakeTokenizer:
    eos_token_id = 2

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return "".join(chr(97 + (i % 26)) for i in ids)


class FakeTransport:
    def __init__(self, fail=(), gate=None, pieces=("ab", "cd", "ef")):
        self.fail = set(fail)
        self.gate = gate
        self.pieces = pieces
        self.sent = {}
        self.errors = {}
        self.stops = []
        self.cancelled = set()
        self.checks = 0
        self.checked = []  # senders whose cancel flag was looked at
        self.started = []  # request ids of generation calls that reached an engine
        self.lock = threading.Lock()

    def stream(self, model, inputs, request_id, outputs):
        if "stop" in inputs:
            self.stops.append((model, request_id))
            return iter(())
        with self.lock:
            self.started.append(request_id)
        return self._gen(model, inputs)

    def _gen(self, model, inputs):
        if self.gate is not None:
            self.gate.wait(10)
        if model in self.fail:
            raise EngineError(f"{model} is down", "UNAVAILABLE")
        for piece in self.pieces:
            if model == "trtllm":
                yield {"output_ids": np.array([[[ord(c) - 97 for c in piece]]], dtype=np.int32)}
            else:
                yield {"text_output": np.array([piece.encode()], dtype=object),
                       "num_output_tokens": np.array([len(piece)], dtype=np.uint32)}

    def send(self, sender, outputs, final):
        with self.lock:
            entry = self.sent.setdefault(sender, {"text": "", "final": False, "backend": None})
            if outputs is not None:
                entry["text"] += outputs["text_output"].reshape(-1)[0].decode()
                entry["backend"] = outputs["backend"].reshape(-1)[0].decode()
            entry["final"] = entry["final"] or final

    def send_error(self, sender, message, code):
        with self.lock:
            self.errors[sender] = (code, message)

    def is_cancelled(self, sender):
        with self.lock:
            self.checks += 1
            self.checked.append(sender)
        return sender in self.cancelled


def job(tokens=10, sla=50.0, **kw):
    kw = {"exclude_input_in_output": False, "return_num_input_tokens": False,
          "return_num_output_tokens": False, **kw}
    return RouterJob(prompt="p" * tokens, prompt_ids=list(range(tokens)), max_tokens=8, stream=True,
                     priority=3, latency_sla_ms=sla, **kw)


def service(transport, **cfg):
    svc = RouterService(RouterConfig(metrics_poll_ms=0, server_http_url="", **cfg), transport, FakeTokenizer())
    svc.start(poll=False)
    return svc


def wait_done(transport, senders, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with transport.lock:
            if all((s in transport.errors) or transport.sent.get(s, {}).get("final") for s in senders):
                return
        time.sleep(0.01)
    raise AssertionError("requests did not finish")


def test_stream_through_each_engine():
    t = FakeTransport()
    svc = service(t)
    try:
        assert svc.admit(job(10, 50.0), "a") and svc.admit(job(3000, None), "b")
        wait_done(t, ["a", "b"])
        assert t.sent["a"]["backend"] == "vllm_backend" and t.sent["a"]["text"] == "abcdef"
        assert t.sent["b"]["backend"] == "trtllm" and t.sent["b"]["text"] == "abcdef"
    finally:
        svc.stop()


def test_queue_bound_rejects_when_capacity_and_queue_are_full():
    gate = threading.Event()
    t = FakeTransport(gate=gate)
    svc = service(t, vllm_capacity=2, trtllm_capacity=2, max_queue=3, fallback_target="vllm_backend")
    try:
        admitted = [svc.admit(job(10, 50.0), f"s{i}") for i in range(10)]
        assert admitted == [True] * 5 + [False] * 5 or sum(admitted) <= 2 + 3 + 1, admitted
        assert sum(admitted) >= 3
        gate.set()
        wait_done(t, [f"s{i}" for i, ok in enumerate(admitted) if ok])
    finally:
        svc.stop()


def test_failover_before_first_token_is_invisible():
    t = FakeTransport(fail={"vllm_backend"})
    svc = service(t)
    try:
        svc.admit(job(10, 50.0), "x")
        wait_done(t, ["x"])
        assert "x" not in t.errors and t.sent["x"]["backend"] == "trtllm"
    finally:
        svc.stop()


def test_both_engines_down_is_unavailable():
    t = FakeTransport(fail={"vllm_backend", "trtllm"})
    svc = service(t)
    try:
        svc.admit(job(10, 50.0), "x")
        wait_done(t, ["x"])
        assert t.errors["x"][0] == "UNAVAILABLE"
    finally:
        svc.stop()


def test_stop_words_cut_the_text_and_stop_the_engine():
    t = FakeTransport(pieces=("hello ", "wor", "ld STOP", " more"))
    svc = service(t)
    try:
        svc.admit(job(10, 50.0, stop_words=["STOP"]), "x")
        wait_done(t, ["x"])
        assert t.sent["x"]["text"] == "hello world "
        assert t.stops and t.stops[0][0] == "vllm_backend"
    finally:
        svc.stop()


def test_cancel_stops_the_engine_request():
    t = FakeTransport(pieces=("a",) * 50)
    t.cancelled.add("x")
    svc = service(t)
    try:
        svc.admit(job(10, 50.0), "x")
        wait_done(t, ["x"])
        assert t.stops == [("vllm_backend", t.stops[0][1])] and t.sent["x"]["text"] == ""
    finally:
        svc.stop()


# 0 ms: one check before dispatch (the request "waited" >= 0 ms) and one per response.
@pytest.mark.parametrize("interval_ms, checks", [(0, 51), (60_000, 1)])
def test_cancel_checks_are_rate_limited_per_stream(interval_ms, checks):
    # Each check is an IPC round trip in Triton: at most one per cancel_check_ms per stream.
    t = FakeTransport(pieces=("a",) * 50)
    svc = service(t, cancel_check_ms=interval_ms, cancel_checks_per_s=0)  # no overall cap
    try:
        svc.admit(job(10, 50.0), "s")
        wait_done(t, ["s"])
        assert t.checks == checks and t.sent["s"]["text"] == "a" * 50
    finally:
        svc.stop()


@pytest.mark.parametrize("cap, expected_s", [(200.0, 0.2), (0.0, 0.05), (10_000.0, 0.05)])
def test_all_streams_together_check_at_most_cancel_checks_per_s(cap, expected_s):
    # 40 streams in flight: with a cap of 200 checks/s each stream is checked every 0.2 s
    # instead of every 50 ms; no cap (0), or a cap they stay under, leaves 50 ms.
    gate = threading.Event()
    t = FakeTransport(gate=gate)
    svc = service(t, policy="vllm_only", vllm_capacity=64, cancel_check_ms=50, cancel_checks_per_s=cap)
    senders = [f"s{i}" for i in range(40)]
    try:
        assert svc.relay.cancel_interval_s() == pytest.approx(0.05)
        assert all(svc.admit(job(10, 50.0), s) for s in senders)
        deadline = time.monotonic() + 5
        while len(t.started) < 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(t.started) == 40
        assert svc.relay.cancel_interval_s() == pytest.approx(expected_s)
        gate.set()
        wait_done(t, senders)
        assert svc.relay.cancel_interval_s() == pytest.approx(0.05)
    finally:
        gate.set()
        svc.stop()


def test_cancel_check_reads_a_callable_interval_at_each_check():
    from hybrid_llm.contracts.spec import CancelCheck

    calls, interval = [], [0.0]
    check = CancelCheck(lambda: calls.append(1) or False, lambda: interval[0])
    assert not check() and not check()  # interval 0: every call checks
    interval[0] = 60.0
    check()  # checks, and the next check is 60 s away
    assert not check() and len(calls) == 3


@pytest.mark.parametrize("open_streams, per_s, expected_s", [
    (1, 200.0, 0.05),     # few streams: every 50 ms
    (10, 200.0, 0.05),    # 10 / 200 = 0.05: still the base
    (256, 200.0, 1.28),   # 256 direct streams share 200 checks a second
    (256, 0.0, 0.05),     # no cap: the base
])
def test_the_check_interval_stretches_with_the_streams_open(open_streams, per_s, expected_s):
    from hybrid_llm.contracts.spec import check_interval_s

    assert check_interval_s(0.05, open_streams, per_s) == pytest.approx(expected_s)


@pytest.mark.parametrize("client_left", [True, False])
def test_a_request_whose_client_left_while_queued_never_reaches_the_engine(client_left):
    gate = threading.Event()
    t = FakeTransport(gate=gate, pieces=())  # no responses: no per-response cancel checks either
    svc = service(t, policy="vllm_only", vllm_capacity=1, cancel_check_ms=20)
    try:
        assert svc.admit(job(10, 50.0), "first") and svc.admit(job(10, 50.0), "queued")
        if client_left:
            t.cancelled.add("queued")
        time.sleep(0.1)  # "queued" waits behind "first" for longer than cancel_check_ms
        assert svc.dispatcher.queued("vllm_backend") == 1
        gate.set()
        wait_done(t, ["first", "queued"])
        assert t.sent["first"]["final"] and "queued" in t.checked  # looked at before dispatch
        if client_left:
            assert t.sent["queued"] == {"text": "", "final": True, "backend": None}
            assert len(t.started) == 1 and t.stops == []
        else:
            assert t.sent["queued"]["backend"] == "vllm_backend" and len(t.started) == 2
        assert svc.dispatcher.in_flight == {"vllm_backend": 0, "trtllm": 0}
    finally:
        gate.set()
        svc.stop()


class QuietTransport(FakeTransport):
    """vllm_backend says nothing (a long prefill) until ``release`` is set or a stop request
    arrives; a stopped request's stream then ends without output."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()
        self.stopped = threading.Event()
        self.reached = threading.Event()

    def stream(self, model, inputs, request_id, outputs):
        if "stop" in inputs:
            self.stopped.set()
            self.release.set()
        return super().stream(model, inputs, request_id, outputs)

    def _gen(self, model, inputs):
        self.reached.set()
        self.release.wait(10)
        if self.stopped.is_set():
            return
        yield from super()._gen(model, inputs)


def test_a_client_that_leaves_during_a_long_prefill_is_noticed_and_the_engine_stopped():
    t = QuietTransport()
    t.cancelled.add("x")
    svc = service(t, policy="vllm_only", cancel_check_ms=50)  # quiet attempts: checked every 0.5 s
    try:
        t0 = time.monotonic()
        svc.admit(job(10, 50.0), "x")
        wait_done(t, ["x"])
        assert time.monotonic() - t0 < 3.0
        assert t.sent["x"] == {"text": "", "final": True, "backend": None}
        assert [m for m, _ in t.stops] == ["vllm_backend"]  # one stop, for this request
        deadline = time.monotonic() + 2
        while svc.dispatcher.in_flight["vllm_backend"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert svc.dispatcher.in_flight == {"vllm_backend": 0, "trtllm": 0}
    finally:
        t.release.set()
        svc.stop()


def test_a_quiet_attempt_whose_client_stays_is_looked_at_but_left_alone():
    t = QuietTransport()
    svc = service(t, policy="vllm_only", cancel_check_ms=50)
    try:
        svc.admit(job(10, 50.0), "y")
        assert t.reached.wait(5)
        time.sleep(1.3)  # two or more watcher rounds
        assert t.checked.count("y") >= 1 and t.stops == [] and "y" not in t.sent
        t.release.set()
        wait_done(t, ["y"])
        assert t.sent["y"] == {"text": "abcdef", "final": True, "backend": "vllm_backend"}
    finally:
        t.release.set()
        svc.stop()


def test_an_engine_that_reports_itself_down_gets_no_traffic():
    t = FakeTransport()
    svc = service(t)
    try:
        svc.health.apply_metrics('hybrid_engine_ready{model="vllm_backend"} 0\nhybrid_engine_ready{model="trtllm"} 1\n')
        svc.health.refresh_health()
        assert not svc.engines["vllm_backend"].ready and svc.engines["trtllm"].ready
        svc.admit(job(10, 50.0), "down")
        wait_done(t, ["down"])
        assert t.sent["down"]["backend"] == "trtllm"
        svc.health.apply_metrics('hybrid_engine_ready{model="vllm_backend"} 1\n')
        svc.health.refresh_health()
        svc.admit(job(10, 50.0), "up")
        wait_done(t, ["up"])
        assert t.sent["up"]["backend"] == "vllm_backend"
        svc.health.apply_metrics("")  # gauge absent (engine model not yet serving): readiness decides
        svc.health.refresh_health()
        assert svc.engines["vllm_backend"].ready
    finally:
        svc.stop()


class StuckTransport(FakeTransport):
    """vllm_backend streams one piece, then its final response never arrives (as a dead
    engine's error through BLS in Triton 2.51) until ``release`` is set."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()
        self.reached = threading.Event()

    first = (b"ab",)  # what vllm_backend streams before it gets stuck

    def _gen(self, model, inputs):
        if model != "vllm_backend":
            yield from super()._gen(model, inputs)
            return
        for piece in self.first:
            yield {"text_output": np.array([piece], dtype=object), "num_output_tokens": np.array([2], dtype=np.uint32)}
        self.reached.set()
        self.release.wait(10)
        yield {"text_output": np.array([b"zz"], dtype=object), "num_output_tokens": np.array([2], dtype=np.uint32)}


def test_requests_with_nothing_sent_move_to_the_other_engine_when_theirs_dies():
    t = StuckTransport()
    t.first = ()  # stuck before the first token
    svc = service(t)
    try:
        svc.admit(job(10, 50.0), "moved")
        assert t.reached.wait(5)
        svc.health.apply_metrics('hybrid_engine_ready{model="vllm_backend"} 0\n')
        wait_done(t, ["moved"])
        assert "moved" not in t.errors
        assert t.sent["moved"] == {"text": "abcdef", "final": True, "backend": "trtllm"}
        assert svc.dispatcher.in_flight == {"vllm_backend": 0, "trtllm": 0}
        t.release.set()  # the stuck reader wakes up later: nothing of it reaches the client
        time.sleep(0.2)
        assert t.sent["moved"]["text"] == "abcdef" and "moved" not in t.errors
        assert svc.dispatcher.in_flight == {"vllm_backend": 0, "trtllm": 0}
    finally:
        t.release.set()
        svc.stop()


def test_a_request_already_failed_over_is_not_moved_again():
    t = StuckTransport()
    t.first = ()
    svc = service(t)
    try:
        svc.admit(job(10, 50.0), "once")
        assert t.reached.wait(5)
        svc.relay._live[next(iter(svc.relay._live))].failed_over = True  # as if it were already a failover
        svc.health.apply_metrics('hybrid_engine_ready{model="vllm_backend"} 0\n')
        wait_done(t, ["once"])
        code, message = t.errors["once"]
        assert code == "UNAVAILABLE" and "died before the first token" in message
    finally:
        t.release.set()
        svc.stop()


def test_a_failing_attempt_and_end_streams_on_never_both_take_a_request():
    """Whichever comes first owns the request: the attempt that failed (its failover) or
    end_streams_on (which moves it). The other leaves it alone: no UNAVAILABLE in the
    middle of a failover, no second failover."""
    for first in ("attempt", "end_streams_on"):
        t = StuckTransport()
        t.first = ()  # stuck before the first token
        svc = service(t)
        try:
            svc.admit(job(10, 50.0), "r")
            assert t.reached.wait(5)
            p = next(iter(svc.relay._live.values()))
            if first == "attempt":
                assert svc._claim_failover(p, "vllm_backend")  # as the failed attempt does
                assert svc.end_streams_on("vllm_backend") == 0
                assert "r" not in t.errors and not p.ended
            else:
                assert svc.end_streams_on("vllm_backend") == 1  # moves it to trtllm
                assert not svc._claim_failover(p, "vllm_backend")
                wait_done(t, ["r"])
                assert "r" not in t.errors and t.sent["r"] == {"text": "abcdef", "final": True, "backend": "trtllm"}
                assert sum(rid.endswith("-trtllm") for rid in t.started) == 1
        finally:
            t.release.set()
            svc.stop()


def test_streams_on_an_engine_that_reports_itself_dead_are_ended_once():
    t = StuckTransport()
    svc = service(t)
    try:
        svc.admit(job(10, 50.0), "cut")
        assert t.reached.wait(5)
        assert svc.dispatcher.in_flight["vllm_backend"] == 1
        svc.health.apply_metrics('hybrid_engine_ready{model="vllm_backend"} 0\n')
        wait_done(t, ["cut"])
        code, message = t.errors["cut"]
        assert code == "UNAVAILABLE" and "died after 2 characters were streamed" in message
        assert t.sent["cut"]["text"] == "ab"
        assert svc.dispatcher.in_flight["vllm_backend"] == 0  # the slot is free at once
        t.release.set()  # the stuck reader wakes up later: nothing more reaches the client
        time.sleep(0.2)
        assert t.sent["cut"]["text"] == "ab" and not t.sent["cut"]["final"]
        assert svc.dispatcher.in_flight["vllm_backend"] == 0  # and the slot is not freed twice
        assert svc.health.apply_metrics('hybrid_engine_ready{model="vllm_backend"} 0\n') is None
        assert svc.end_streams_on("vllm_backend") == 0  # nothing left to end
    finally:
        t.release.set()
        svc.stop()


class RecordingTransport(FakeTransport):
    """Keeps every response's text, in order."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.responses = []

    def send(self, sender, outputs, final):
        super().send(sender, outputs, final)
        text = "" if outputs is None else outputs["text_output"].reshape(-1)[0].decode()
        self.responses.append((text, final))


@pytest.mark.parametrize("engine_tokens,sla", [(10, 50.0), (3000, None)])  # vllm_backend, trtllm
@pytest.mark.parametrize("interval_ms,expected", [
    (0.0, [("ab", False), ("cd", False), ("ef", False), ("", True)]),  # every piece at once
    (60_000.0, [("ab", False), ("cdef", True)]),  # first piece at once, the rest with FINAL
])
def test_stream_interval_sends_the_first_piece_at_once_and_merges_the_rest(engine_tokens, sla, interval_ms, expected):
    t = RecordingTransport()
    svc = service(t, stream_interval_ms=interval_ms)
    try:
        svc.admit(job(engine_tokens, sla), "s")
        wait_done(t, ["s"])
        assert t.responses == expected
        assert t.sent["s"]["text"] == "abcdef"
    finally:
        svc.stop()


def test_a_request_may_pick_its_policy_when_the_server_allows_it():
    t = FakeTransport()
    svc = service(t, policy_override=True)
    try:
        # hybrid (the configured policy) sends a short SLA-bound prompt to vLLM; trtllm_only
        # sends the same request to trtllm; the policy objects are kept (round robin has state).
        assert svc.admit(job(10, 50.0), "hybrid") and svc.admit(job(10, 50.0, policy="trtllm_only"), "forced")
        wait_done(t, ["hybrid", "forced"])
        assert t.sent["hybrid"]["backend"] == "vllm_backend" and t.sent["forced"]["backend"] == "trtllm"
        assert svc.policy_for(job(policy="round_robin")) is svc.policy_for(job(policy="round_robin"))
        assert svc.policy_for(job()) is svc.policy
    finally:
        svc.stop()


class FinalGuardTransport(FakeTransport):
    """Fails a cancellation query on a stream that already got its FINAL: in Python backend
    r24.10 the parent has freed that response factory (seen: tritonserver SIGSEGV)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.late_queries = []

    def is_cancelled(self, sender):
        with self.lock:
            if self.sent.get(sender, {}).get("final") or sender in self.errors:
                self.late_queries.append(sender)
        return super().is_cancelled(sender)


def test_the_cancel_flag_of_an_ended_stream_is_never_queried():
    t = FinalGuardTransport(pieces=("a",) * 40)
    # Every response and every watcher round looks at the flag; 32 streams at once.
    svc = service(t, policy="vllm_only", cancel_check_ms=1, cancel_checks_per_s=0, vllm_capacity=8)
    try:
        senders = [f"s{i}" for i in range(32)]
        for s in senders:
            assert svc.admit(job(10, 50.0), s)
        wait_done(t, senders, timeout=20)
        time.sleep(0.3)  # watcher rounds after the last FINAL
        assert t.checks > 0 and t.late_queries == [], len(t.late_queries)
        from hybrid_llm.router.relay import Pending
        ended = Pending(job=job(), sender="s0", decision=None, arrived=0.0, ended=True)
        checks = t.checks
        assert svc.relay.client_gone(ended) is False and t.checks == checks
    finally:
        svc.stop()


class SlowTransport(FakeTransport):
    """vllm_backend streams one piece every 20 ms until a stop request for the stream arrives."""

    def __init__(self):
        super().__init__(pieces=("a",) * 500)
        self.first = threading.Event()

    def stream(self, model, inputs, request_id, outputs):
        if "stop" in inputs:
            return super().stream(model, inputs, request_id, outputs)
        stops = len(self.stops)

        def gen():
            for piece in super(SlowTransport, self)._gen(model, inputs):
                if len(self.stops) > stops:
                    return
                self.first.set()
                yield piece
                time.sleep(0.02)
        with self.lock:
            self.started.append(request_id)
        return gen()


def test_a_stop_request_ends_a_streaming_request_and_stops_its_engine_request():
    t = SlowTransport()
    svc = service(t, policy="vllm_only", cancel_check_ms=20, cancel_checks_per_s=0)
    try:
        assert svc.admit(job(10, 50.0, request_id="r-1"), "x")
        assert t.first.wait(5)
        assert svc.stop_request("r-2") is None  # no such request in flight
        assert svc.stop_request("r-1") == "vllm_backend"
        wait_done(t, ["x"])
        assert t.sent["x"]["final"] and len(t.sent["x"]["text"]) < 500
        assert [m for m, _ in t.stops] == ["vllm_backend"]
        assert svc.stop_request("r-1") is None  # it has ended
    finally:
        svc.stop()


def test_a_stop_request_for_a_queued_request_keeps_it_from_the_engine():
    gate = threading.Event()
    t = FakeTransport(gate=gate, pieces=("ab",))
    svc = service(t, policy="vllm_only", vllm_capacity=1, cancel_check_ms=10_000)  # no queue check by time
    try:
        assert svc.admit(job(10, 50.0, request_id="first"), "first")
        assert svc.admit(job(10, 50.0, request_id="queued"), "queued")
        assert svc.stop_request("queued") == "vllm_backend"
        gate.set()
        wait_done(t, ["first", "queued"])
        assert t.sent["queued"] == {"text": "", "final": True, "backend": None}
        assert t.started == [t.started[0]] and t.sent["first"]["backend"] == "vllm_backend"
    finally:
        gate.set()
        svc.stop()
