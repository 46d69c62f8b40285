"""Unit tests (no server) for loadtests/: load shapes, workload mixes, traces, packing glue, summaries."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from hybrid_llm.contracts import HIGH, NORMAL, URGENT, GenerationRequest
from loadtests.perf_inputs import ask_for_every_output, input_data, tensors_to_entry
from hybrid_llm.contracts.router import RETURN_FLAGS
from loadtests.run_perf_analyzer import genai_perf_command, run_keeping_export
from loadtests.runner import RequestRecord, contract_for, pack, percentile, summarize
from loadtests.shapes import (
    Pacer, QpsStepShape, ReplaySchedule, Stage, parse_qps_steps, parse_stages, stages_from_steps,
    step_arrivals,
)
from loadtests.workload import (
    DEFAULT_TOKENIZER, HYBRID_MIX, PromptFactory, RequestClass, SampledRequest, TokenRange, TraceEntry,
    TraceError, WorkloadMix, WorkloadSampler, parse_trace, read_trace, request_from_entry,
    trace_from_samples, write_trace,
)

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- shapes


SHAPE = QpsStepShape((Stage(10, 1.0), Stage(5, 4.0), Stage(20, 2.5)), user_interval_s=2.0)


@pytest.mark.parametrize("elapsed, index, qps", [
    (0.0, 0, 1.0), (9.999, 0, 1.0), (10.0, 1, 4.0), (10.001, 1, 4.0), (14.999, 1, 4.0),
    (15.0, 2, 2.5), (34.999, 2, 2.5),
])
def test_tick_picks_the_stage_at_and_around_boundaries(elapsed: float, index: int, qps: float) -> None:
    tick = SHAPE.tick(elapsed)
    assert tick is not None
    assert (tick.index, tick.qps) == (index, qps)


def test_tick_ends_at_total_time_without_drain() -> None:
    assert SHAPE.total_s == 35
    assert SHAPE.tick(35.0) is None
    assert SHAPE.tick(1e6) is None


def test_tick_stage_elapsed_restarts_per_stage() -> None:
    assert SHAPE.tick(12.5).stage_elapsed_s == pytest.approx(2.5)
    assert SHAPE.tick(15.0).stage_elapsed_s == pytest.approx(0.0)


@pytest.mark.parametrize("qps, users", [(1.0, 2), (4.0, 8), (2.5, 5), (0.3, 1), (0.75, 2), (10.0, 20)])
def test_users_and_pacing_add_up_to_the_stage_rate(qps: float, users: int) -> None:
    shape = QpsStepShape((Stage(10, qps),), user_interval_s=2.0)
    tick = shape.tick(1.0)
    assert tick.users == users
    assert tick.users / tick.user_interval_s == pytest.approx(qps)  # aggregate rate is exact
    assert tick.spawn_rate >= 1


def test_drain_keeps_users_and_sends_nothing() -> None:
    shape = QpsStepShape((Stage(10, 2.0), Stage(10, 3.0)), user_interval_s=2.0, drain_s=5.0)
    drain = shape.tick(20.0)
    assert drain is not None and drain.index == 2 and drain.qps == 0
    assert drain.users == shape.tick(19.9).users  # no user churn when draining
    assert math.isinf(drain.user_interval_s)
    assert shape.tick(24.999) is not None
    assert shape.tick(25.0) is None


def test_zero_qps_stage_has_no_users() -> None:
    shape = QpsStepShape((Stage(5, 0.0), Stage(5, 1.0)))
    assert shape.tick(0.0).users == 0
    assert shape.tick(5.0).users == 2


def test_tick_rejects_negative_time_and_bad_shapes() -> None:
    with pytest.raises(ValueError):
        SHAPE.tick(-0.1)
    with pytest.raises(ValueError):
        QpsStepShape(())
    with pytest.raises(ValueError):
        Stage(0, 1.0)
    with pytest.raises(ValueError):
        Stage(5, -1.0)
    with pytest.raises(ValueError):
        QpsStepShape((Stage(1, 1),), user_interval_s=0)


def test_parse_stages_and_steps() -> None:
    assert parse_stages("1:30, 2.5:10") == (Stage(30, 1.0), Stage(10, 2.5))
    assert stages_from_steps([1, 2], 7) == (Stage(7, 1.0), Stage(7, 2.0))
    assert parse_qps_steps("2,4,8") == [2.0, 4.0, 8.0]
    for bad in ("1", "a:3", "1:0", ""):
        with pytest.raises(ValueError, match="QPS:SECONDS"):
            parse_stages(bad)
    for bad in ("", "1,x", "0,1"):
        with pytest.raises(ValueError):
            parse_qps_steps(bad)


def test_pacer_waits_out_the_rest_of_the_interval() -> None:
    pacer = Pacer()
    assert pacer.wait(2.0, now=100.0) == 0.0  # first request: no wait
    pacer.mark_start(100.0)
    assert pacer.wait(2.0, now=100.5) == pytest.approx(1.5)
    assert pacer.wait(2.0, now=103.0) == 0.0  # the request overran: start at once
    assert pacer.wait(math.inf, now=100.5, idle_poll_s=0.25) == 0.25


def test_replay_schedule_hands_out_entries_in_order_and_ends_after_drain() -> None:
    sched = ReplaySchedule([0.0, 0.5, 0.5, 2.0], users=3, drain_s=1.0)
    assert sched.total_s == 3.0
    assert sched.tick(0.0).users == 3
    assert [sched.claim() for _ in range(5)] == [0, 1, 2, 3, None]
    assert sched.tick(2.999).next_offset_s is None
    assert sched.tick(3.0) is None
    with pytest.raises(ValueError, match="sorted"):
        ReplaySchedule([1.0, 0.5])
    with pytest.raises(ValueError):
        ReplaySchedule([])


def test_fixed_arrivals_are_evenly_spaced_per_stage() -> None:
    arrivals = step_arrivals((Stage(10, 2.0), Stage(5, 4.0)), process="fixed")
    per_stage = Counter(a.stage for a in arrivals)
    assert per_stage == {0: 20, 1: 20}
    assert arrivals[0].offset_s == 0.0 and arrivals[1].offset_s == pytest.approx(0.5)
    assert arrivals[20].offset_s == pytest.approx(10.0)
    assert all(0 <= a.offset_s < 15 for a in arrivals)


def test_poisson_arrivals_are_seeded_and_near_the_rate() -> None:
    stages = (Stage(200, 2.0), Stage(100, 8.0))
    a = step_arrivals(stages, "poisson", seed=7)
    assert a == step_arrivals(stages, "poisson", seed=7)
    assert a != step_arrivals(stages, "poisson", seed=8)
    counts = Counter(x.stage for x in a)
    assert abs(counts[0] - 400) < 4 * math.sqrt(400)
    assert abs(counts[1] - 800) < 4 * math.sqrt(800)
    assert all(x.offset_s < 200 for x in a if x.stage == 0)
    assert all(200 <= x.offset_s < 300 for x in a if x.stage == 1)
    assert [x.offset_s for x in a] == sorted(x.offset_s for x in a)


def test_locust_adapter_returns_users_and_spawn_rate() -> None:
    # Importing Locust monkey-patches the process with gevent: keep it out of this one.
    code = (
        "from loadtests.shapes import QpsStepShape, Stage, locust_shape_class\n"
        "cls = locust_shape_class(QpsStepShape((Stage(5, 3.0),), user_interval_s=2.0), 'S')\n"
        "s = cls()\n"
        "print(s.tick(), s.last_tick.qps)\n"
        "s.start_time -= 10\n"
        "print(s.tick())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["(6, 6.0) 3.0", "None"]


# --------------------------------------------------------------------------- mixes


@pytest.fixture(scope="module")
def prompts() -> PromptFactory:
    if not (DEFAULT_TOKENIZER / "tokenizer.json").exists():
        pytest.skip(f"{DEFAULT_TOKENIZER} missing: run build_scripts/setup.sh")
    from loadtests.workload import load_tokenizer

    return PromptFactory(load_tokenizer())


@pytest.mark.parametrize("n", [1, 2, 31, 200, 2048, 3000])
def test_prompts_have_exact_token_counts(prompts: PromptFactory, n: int) -> None:
    text = prompts.make(n, random.Random(n))
    assert len(prompts.tokenizer.encode(text, add_special_tokens=True)) == n


def test_sampler_is_deterministic(prompts: PromptFactory) -> None:
    def draw(seed: int) -> list[tuple]:
        return [(s.klass, s.prompt_tokens, s.request.prompt, s.request.max_tokens, s.request.priority,
                 s.request.latency_sla_ms, s.request.seed)
                for s in WorkloadSampler(HYBRID_MIX, prompts, seed=seed).take(30)]

    assert draw(3) == draw(3)
    assert draw(3) != draw(4)


def test_sampled_prompts_match_their_class(prompts: PromptFactory) -> None:
    classes = {c.name: c for c in HYBRID_MIX.classes}
    for s in WorkloadSampler(HYBRID_MIX, prompts, seed=1).take(60):
        c = classes[s.klass]
        assert isinstance(s.request, GenerationRequest)
        assert len(prompts.tokenizer.encode(s.request.prompt, add_special_tokens=True)) == s.prompt_tokens
        assert c.prompt_tokens.low <= s.prompt_tokens <= c.prompt_tokens.high
        assert c.max_tokens.low <= s.request.max_tokens <= c.max_tokens.high
        assert s.request.latency_sla_ms == c.latency_sla_ms
        if s.klass == "short":
            assert s.request.priority in (URGENT, HIGH) and s.request.latency_sla_ms == 120
        else:
            assert s.prompt_tokens >= 2048 and s.request.priority == NORMAL


def test_priority_and_class_mix_proportions(prompts: PromptFactory) -> None:
    mix = WorkloadMix("t", (
        RequestClass("a", 3.0, TokenRange(4, 8), TokenRange(8, 8), {URGENT: 0.2, HIGH: 0.3, NORMAL: 0.5}),
        RequestClass("b", 1.0, TokenRange(4, 8), TokenRange(8, 8), {NORMAL: 1.0}, latency_sla_ms=50),
    ))
    n = 4000
    drawn = WorkloadSampler(mix, prompts, seed=11).take(n)
    classes = Counter(s.klass for s in drawn)
    assert classes["a"] / n == pytest.approx(0.75, abs=0.03)
    a = [s for s in drawn if s.klass == "a"]
    prio = Counter(s.request.priority for s in a)
    for p, share in ((URGENT, 0.2), (HIGH, 0.3), (NORMAL, 0.5)):
        assert prio[p] / len(a) == pytest.approx(share, abs=0.03)
    assert {s.request.priority for s in drawn if s.klass == "b"} == {NORMAL}


def test_mix_validation() -> None:
    with pytest.raises(ValueError):
        TokenRange(0, 4)
    with pytest.raises(ValueError):
        TokenRange(8, 4)
    with pytest.raises(ValueError, match="priority_mix"):
        RequestClass("x", 1, TokenRange(1, 2), TokenRange(1, 2), {4: 1.0})
    with pytest.raises(ValueError, match="weight"):
        RequestClass("x", 0, TokenRange(1, 2), TokenRange(1, 2))
    with pytest.raises(ValueError, match="duplicate"):
        c = RequestClass("x", 1, TokenRange(1, 2), TokenRange(1, 2))
        WorkloadMix("m", (c, c))
    assert "short: 80% of requests" in HYBRID_MIX.describe()


# --------------------------------------------------------------------------- traces


GOOD_TRACE = """\
# a comment, then a blank line

{"offset_s": 1.5, "prompt": "hello there", "max_tokens": 16, "priority": "urgent", "latency_sla_ms": 120}
{"offset_s": 0.0, "prompt_tokens": 100, "max_tokens": 32}
{"offset_s": 0.75, "prompt_tokens": 2048, "max_tokens": 64, "priority": 2}
"""


def test_parse_good_trace_sorted_with_defaults() -> None:
    entries = parse_trace(GOOD_TRACE.splitlines())
    assert [e.offset_s for e in entries] == [0.0, 0.75, 1.5]
    assert entries[0] == TraceEntry(0.0, 32, NORMAL, 100, None, None)
    assert entries[1].priority == HIGH and entries[1].prompt_tokens == 2048
    assert entries[2].prompt == "hello there" and entries[2].priority == URGENT
    assert entries[2].latency_sla_ms == 120.0


def test_trace_write_read_roundtrip(tmp_path: Path) -> None:
    entries = parse_trace(GOOD_TRACE.splitlines())
    path = write_trace(tmp_path / "t.jsonl", entries)
    assert read_trace(path) == entries
    assert all(json.loads(line) for line in path.read_text().splitlines())


@pytest.mark.parametrize("line, message", [
    ('{"offset_s": 0, "prompt_tokens": 5', "not valid JSON"),
    ('[1, 2]', "expected a JSON object"),
    ('{"prompt_tokens": 5, "max_tokens": 4}', "missing required field 'offset_s'"),
    ('{"offset_s": -1, "prompt_tokens": 5, "max_tokens": 4}', "'offset_s' must be >= 0"),
    ('{"offset_s": 0, "prompt_tokens": 5}', "missing required field 'max_tokens'"),
    ('{"offset_s": 0, "prompt_tokens": 5.5, "max_tokens": 4}', "'prompt_tokens' must be an integer"),
    ('{"offset_s": 0, "max_tokens": 4}', "exactly one of 'prompt_tokens' or 'prompt'"),
    ('{"offset_s": 0, "prompt": "x", "prompt_tokens": 3, "max_tokens": 4}', "exactly one of"),
    ('{"offset_s": 0, "prompt_tokens": 5, "max_tokens": 4, "priority": 7}', "'priority' must be"),
    ('{"offset_s": 0, "prompt_tokens": 5, "max_tokens": 4, "prio": 1}', "unknown field"),
    ('{"offset_s": "soon", "prompt_tokens": 5, "max_tokens": 4}', "'offset_s' must be a number"),
    ('{"offset_s": 0, "prompt_tokens": 5, "max_tokens": true}', "'max_tokens' must be an integer"),
])
def test_bad_trace_line_names_its_line_number(line: str, message: str) -> None:
    lines = ['{"offset_s": 0, "prompt_tokens": 5, "max_tokens": 4}', "", line]
    with pytest.raises(TraceError) as err:
        parse_trace(lines, "trace.jsonl")
    assert "trace.jsonl, line 3" in str(err.value)
    assert message in str(err.value)


def test_bad_trace_file_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"offset_s": 0, "prompt_tokens": 5, "max_tokens": 4}\n{"offset_s": 1}\n')
    with pytest.raises(TraceError, match=r"bad\.jsonl, line 2: missing required field 'max_tokens'"):
        read_trace(path)


def test_empty_trace_is_an_error() -> None:
    with pytest.raises(TraceError, match="no requests"):
        parse_trace(["# only a comment", ""])


def test_trace_entries_become_requests(prompts: PromptFactory) -> None:
    samples = WorkloadSampler(HYBRID_MIX, prompts, seed=2).take(5)
    entries = trace_from_samples([0.0, 0.1, 0.2, 0.3, 0.4], samples)
    for e, s in zip(entries, samples):
        back = request_from_entry(e, prompts, random.Random(0))
        assert back.prompt_tokens == s.prompt_tokens
        assert len(prompts.tokenizer.encode(back.request.prompt)) == s.prompt_tokens
        assert (back.request.priority, back.request.max_tokens, back.request.latency_sla_ms) == (
            s.request.priority, s.request.max_tokens, s.request.latency_sla_ms)
    text = request_from_entry(TraceEntry(0.0, 8, prompt=" def return"), prompts, random.Random(0))
    assert text.request.prompt == " def return" and text.prompt_tokens == 2


# --------------------------------------------------------------------------- packing glue and summaries


def test_pack_uses_each_contract() -> None:
    req = GenerationRequest(prompt="hi", max_tokens=8, priority=URGENT, latency_sla_ms=120)
    assert contract_for("router_bls") == "router" and contract_for("x", "vllm") == "vllm"
    with pytest.raises(ValueError):
        contract_for("unknown_model")
    router = pack("router", req)
    assert router["text_input"].shape == (1, 1) and router["latency_sla_ms"].shape == (1, 1)
    vllm = pack("vllm", req)
    assert vllm["text_input"].shape == (1,) and "sampling_parameters" in vllm

    class Tok:
        eos_token_id = 2

        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            return [5, 6, 7]

    trt = pack("trtllm", req, Tok())
    assert trt["input_ids"].tolist() == [[5, 6, 7]] and trt["end_id"].tolist() == [[2]]
    with pytest.raises(ValueError, match="tokenizer"):
        pack("trtllm", req)


def test_perf_analyzer_entries_drop_the_batch_dim_for_batched_models() -> None:
    req = GenerationRequest(prompt="hello", max_tokens=8, priority=HIGH)
    router = tensors_to_entry(pack("router", req), batched=True)
    assert router["text_input"] == {"content": ["hello"], "shape": [1]}
    assert router["max_tokens"] == {"content": [8], "shape": [1]}
    assert router["stream"] == {"content": [True], "shape": [1]}
    vllm = tensors_to_entry(pack("vllm", req), batched=False)
    assert vllm["text_input"] == {"content": ["hello"], "shape": [1]}
    assert json.loads(vllm["sampling_parameters"]["content"][0])["max_tokens"] == 8
    sample = SampledRequest(req, "x", 1)
    doc = input_data([sample, sample], "router")
    assert len(doc["data"]) == 2
    json.dumps(doc)  # serializable as perf_analyzer reads it


def test_perf_inputs_ask_for_every_optional_output_of_each_contract() -> None:
    req = GenerationRequest(prompt="hello", max_tokens=8, return_num_input_tokens=False)
    ask_for_every_output(req)
    router = tensors_to_entry(pack("router", req), batched=True)
    assert all(router[flag]["content"] == [True] for flag in RETURN_FLAGS)
    vllm = tensors_to_entry(pack("vllm", req), batched=False)
    for flag in ("return_num_input_tokens", "return_num_output_tokens", "return_logprobs",
                 "return_cumulative_logprob", "return_finish_reason"):
        assert vllm[flag]["content"] == [True], flag


def test_genai_perf_asks_the_router_for_every_optional_output() -> None:
    cmd = genai_perf_command("127.0.0.1:8001")
    asked = {cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--extra-inputs"}
    assert asked == {f"{flag}:true" for flag in RETURN_FLAGS}
    assert "--extra-inputs" not in genai_perf_command("http://127.0.0.1:9000", endpoint_type="chat")


def _fake_profiler(tmp_path: Path, empty_runs: int, code: int = 0) -> list[str]:
    """A command that writes an empty export on its first ``empty_runs`` runs, then a full one."""
    script = (f"import pathlib, sys; d = pathlib.Path({str(tmp_path)!r}); c = d / 'count'; "
              "n = int(c.read_text()) + 1 if c.exists() else 1; c.write_text(str(n)); "
              "e = d / 'a' / 'profile_export.json'; e.parent.mkdir(exist_ok=True); "
              "assert not e.exists(), 'export path exists'; "
              f"e.write_text('' if n <= {empty_runs} else '{{}}'); print('run', n); "
              f"sys.exit({code} if n <= {empty_runs} else 0)")
    return [sys.executable, "-c", script]


def test_an_empty_profile_export_is_run_again_and_the_log_says_why(tmp_path: Path) -> None:
    log = tmp_path / "pa.log"
    code = run_keeping_export(_fake_profiler(tmp_path, empty_runs=1, code=1), tmp_path, {}, log, tmp_path, 30)
    assert code == 0
    assert (tmp_path / "a" / "profile_export.json").read_text() == "{}"
    text = log.read_text()
    assert "run 1" in text and "run 2" in text and "attempt 2 of 3" in text and "was empty" in text


def test_an_export_that_stays_empty_fails_after_the_last_attempt(tmp_path: Path) -> None:
    code = run_keeping_export(_fake_profiler(tmp_path, empty_runs=9), tmp_path, {}, tmp_path / "pa.log", tmp_path,
                              30, attempts=2)
    assert code == 1  # perf_analyzer said 0, but there is no export to read
    assert (tmp_path / "count").read_text() == "2" and not (tmp_path / "a" / "profile_export.json").exists()


def _rec(i: int, ttft: float | None, sla: float | None = 120.0, lag: float = 0.0, error: str | None = None,
         tokens: int = 10, klass: str = "short") -> RequestRecord:
    return RequestRecord(i, 0, klass, 1, 50, 10, sla, scheduled_s=float(i), start_s=float(i) + lag,
                         ttft_s=ttft, tpot_s=0.01 if ttft else None, e2e_s=1.0, output_tokens=tokens,
                         backend="vllm_backend", error=error)


def test_summary_counts_lag_in_ttft_and_errors_as_sla_misses() -> None:
    recs = [_rec(0, 0.05), _rec(1, 0.05, lag=0.1), _rec(2, None, error="boom"), _rec(3, 0.3, sla=None)]
    s = summarize(recs)
    assert s.requests == 4 and s.errors == 1
    assert s.sla_requests == 3 and s.sla_met == 1  # lagged one misses (0.15 s > 120 ms), error misses
    assert s.sla_attainment == pytest.approx(1 / 3)
    assert s.output_tokens == 30
    assert s.wall_s == pytest.approx(4.0)  # first arrival 0 -> last end 3 + 1
    assert s.tps == pytest.approx(7.5)
    assert percentile([1, 2, 3, None], 50) == 2 and percentile([], 50) is None


def test_benchmark_ratios_and_goal_check() -> None:
    from loadtests.benchmark import BenchSettings, ConfigResult, figures, goal_check, table_rows

    settings = BenchSettings([1.0], 10.0, ["round_robin", "hybrid"])
    rr = ConfigResult("round_robin", [_rec(i, 0.2) for i in range(8)] + [_rec(8, 0.05), _rec(9, 0.05)])
    hy = ConfigResult("hybrid", [_rec(i, 0.05) for i in range(10)])
    figs = {"round_robin": figures(rr, settings), "hybrid": figures(hy, settings)}
    rows = {r[0]: r for r in table_rows(figs, {})}
    assert rows["(c) round-robin baseline"][-1] == "1.00x"
    assert rows["(d) router_bls hybrid"][-1] == "5.00x"  # SLA attainment 100% vs 20%
    checks = goal_check(figs)
    assert any("TTFT p99" in c and "met" in c for c in checks)
    assert any("SLA attainment" in c and "5.00x" in c for c in checks)


def test_goal_check_also_compares_ttft_from_send_without_client_lag() -> None:
    from loadtests.benchmark import BenchSettings, ConfigResult, figures, goal_check

    settings = BenchSettings([1.0], 10.0, ["round_robin", "hybrid"])
    # Round-robin's requests left the client 2 s late (a starved load generator), served as fast.
    rr = ConfigResult("round_robin", [_rec(i, 0.1, lag=2.0) for i in range(10)])
    hy = ConfigResult("hybrid", [_rec(i, 0.1) for i in range(10)])
    checks = goal_check({"round_robin": figures(rr, settings), "hybrid": figures(hy, settings)})
    from_send = [c for c in checks if "from send" in c]
    assert len(from_send) == 1 and "= 1.00x" in from_send[0] and "round-robin 2000 ms" in from_send[0]
    assert any("TTFT p99: hybrid 100 ms vs round-robin 2100 ms" in c for c in checks)


def test_cpu_roles_from_command_lines() -> None:
    from loadtests.proc_cpu import role_of

    stub = "/x/backends/python/triton_python_backend_stub /repo/{}/1/model.py triton_python_backend_shm 1 1"
    assert role_of(stub.format("router_bls")) == "stub:router_bls"
    assert role_of(stub.format("vllm_backend")) == "stub:vllm_backend"
    assert role_of(stub.format("trtllm")) == "stub:trtllm"
    assert role_of("/x/bin/tritonserver --model-repository=/repo/trtllm") == "server"
    assert role_of("VLLM::EngineCore") == "engines"


def test_cpu_by_role_sums_deltas_and_counts_new_processes_from_zero() -> None:
    from loadtests.proc_cpu import by_role, sample

    stub = "stub triton_python_backend_stub /r/router_bls/1/model.py"
    before = {1: (10.0, "/bin/tritonserver x"), 2: (5.0, stub), 0: (1.0, "load generator")}
    after = {1: (12.5, "/bin/tritonserver x"), 2: (5.5, stub), 3: (4.0, "VLLM::Worker"), 0: (3.0, "load generator")}
    assert by_role(before, after) == {"server": 2.5, "stub:router_bls": 0.5, "engines": 4.0, "load generator": 2.0}
    own = sample([])
    assert set(own) == {0} and own[0][0] > 0


# --------------------------------------------------------------------------- overhead attribution


def _scrape(router_n: int, queue_us: int, ttft_sum: float) -> str:
    return "\n".join([
        f'nv_inference_count{{model="router_bls",version="1"}} {router_n}',
        f'nv_inference_queue_duration_us{{model="router_bls",version="1"}} {queue_us}',
        f'nv_inference_compute_infer_duration_us{{model="router_bls",version="1"}} {2 * queue_us}',
        f'nv_inference_count{{model="vllm_backend",version="1"}} {router_n + 5}',
        f'nv_inference_queue_duration_us{{model="vllm_backend",version="1"}} {queue_us // 2}',
        f'router_ttft_seconds_bucket{{model="router_bls",engine="vllm_backend",le="0.1"}} {router_n}',
        f'router_ttft_seconds_bucket{{model="router_bls",engine="vllm_backend",le="+Inf"}} {router_n}',
        f'router_ttft_seconds_sum{{model="router_bls",engine="vllm_backend"}} {ttft_sum}',
        f'router_ttft_seconds_count{{model="router_bls",engine="vllm_backend"}} {router_n}',
    ]) + "\n"


def test_overhead_attribution_differences_sums_and_counts_between_scrapes():
    from loadtests.overhead import attribution_deltas

    got = attribution_deltas(_scrape(10, 1000, 0.5), _scrape(30, 5000, 1.5), "router_bls")
    assert got["Triton queue, entry model"] == pytest.approx((0.004, 20))
    assert got["Triton execute(), entry model"] == pytest.approx((0.008, 20))
    assert got["Triton queue, vllm_backend (BLS)"] == pytest.approx((0.002, 20))
    assert got["router TTFT (arrival at router -> first token sent)"] == pytest.approx((1.0, 20))
    assert "router queue wait" not in got  # no samples of that family in either scrape


def test_overhead_attribution_of_the_direct_path_has_no_bls_row():
    from loadtests.overhead import attribution_deltas

    got = attribution_deltas(_scrape(10, 1000, 0.5), _scrape(30, 5000, 1.5), "vllm_backend")
    assert got["Triton queue, entry model"] == pytest.approx((0.002, 20))
    assert "Triton queue, vllm_backend (BLS)" not in got


def test_overhead_table_shows_each_round_pairs_ratio():
    from loadtests.overhead import HEADER, format_rows, round_ratios, row
    from loadtests.runner import summarize

    assert round_ratios([100.0, 200.0, 0.0], [90.0, 220.0, 5.0]) == pytest.approx([0.9, 1.1])
    empty = summarize([], wall_s=1.0, from_arrival=False)
    cells = format_rows([row(64, empty, empty, ratios=[0.9, 1.1])])
    assert cells[0][HEADER.index("per round")] == "0.90/1.10"
    assert format_rows([row(1, empty, empty)])[0][HEADER.index("per round")] == "-"
    assert cells[0][HEADER.index("rounds vs target")] == "undecided"


@pytest.mark.parametrize("ratios, expected", [
    ([0.98, 1.2], "meets"), ([0.97, 0.97], "meets"), ([0.5, 0.96], "below"), ([0.9, 1.1], "undecided"),
    ([1.5], "-"), ([], "-"),
])
def test_overhead_verdict_needs_every_round_pair_on_one_side_of_the_target(ratios, expected):
    from loadtests.overhead import verdict

    assert verdict(ratios, 0.97) == expected


def test_overhead_cpu_lines_give_busy_cores_and_the_stub_relay_rate():
    from loadtests.overhead import cpu_bound_lines

    rows = [{"concurrency": 64, "direct": {"tps": 1000.0}, "router": {"tps": 800.0}, "cpu_us_per_token": {
        "direct": {"server": 200.0, "stub:vllm_backend": 300.0, "engines": 1500.0},
        "router": {"server": 300.0, "stub:router_bls": 400.0, "stub:vllm_backend": 300.0, "engines": 1500.0}}},
        {"concurrency": 1, "direct": {"tps": 1.0}, "router": {"tps": 1.0}, "cpu_us_per_token": {}}]
    assert cpu_bound_lines(rows, 2) == [
        "64 streams: cores busy direct 2.00 / router 2.00 of 2; "
        "router stub 400 µs per token = 2,500 tokens/s per core"]


def test_overhead_server_pid_must_be_a_live_tritonserver(tmp_path: Path) -> None:
    import os
    import shutil
    import time

    from loadtests.overhead import main, server_url, tritonserver_pid

    with pytest.raises(ValueError, match="not tritonserver"):
        tritonserver_pid(os.getpid())  # this is python
    with pytest.raises(ValueError, match="no such process"):
        tritonserver_pid(2**22 + 1)  # above Linux's pid_max
    assert main(["--server-pid", str(os.getpid())]) == 2  # without --url
    # A shell started as "tritonserver" with one child: the CPU table samples both.
    fake = tmp_path / "tritonserver"
    shutil.copy(shutil.which("sh") or "/bin/sh", fake)
    proc = subprocess.Popen([str(fake), "-c", "sleep 30 & wait"])
    tree: list[int] = []
    try:
        for _ in range(100):  # until the child has exec'd (its command line is empty before)
            if Path(f"/proc/{proc.pid}/cmdline").read_bytes():
                break
            time.sleep(0.05)
        assert tritonserver_pid(proc.pid) == proc.pid
        with server_url("127.0.0.1:1", server_pid=proc.pid) as (url, pids, metrics_url):
            assert url == "127.0.0.1:1" and metrics_url is None and pids is not None
            for _ in range(100):
                tree = pids()
                if len(tree) == 2:
                    break
                time.sleep(0.05)
            assert tree[0] == proc.pid and len(tree) == 2, tree
        with server_url("127.0.0.1:1") as (_, no_pids, _):
            assert no_pids is None
    finally:
        for child in tree[1:]:
            os.kill(child, 9)
        proc.kill()
        proc.wait()
