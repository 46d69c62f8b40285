"""Locust scenario: a workload mix at fixed request rates per stage, or the replay of a trace.

Run headless through ``python -m loadtests.run_locust`` (writes CSV + HTML), or
directly from the repository root::

    LOADTEST_QPS_STEPS=1,2 LOADTEST_STEP_S=10 .venv/bin/locust -f loadtests/locustfile.py \\
        --headless --host 127.0.0.1:8001

Environment:
  LOADTEST_MODEL       router_bls (default), vllm_backend or trtllm
  LOADTEST_CONTRACT    router | vllm | trtllm (default: from the model name)
  LOADTEST_MIX         workload mix name (workload.MIXES; default chat)
  LOADTEST_STAGES      "QPS:SECONDS,..." (wins over the next two)
  LOADTEST_QPS_STEPS   "1,2" with LOADTEST_STEP_S seconds each (default 1,2 and 10 s)
  LOADTEST_USER_INTERVAL_S  pacing interval per user (default 2; keep above e2e p99)
  LOADTEST_DRAIN_S     seconds after the last stage/arrival to let requests finish (default 10)
  LOADTEST_TRACE       a JSONL trace: replay it instead of QPS steps
  LOADTEST_REPLAY_USERS  users serving the replay (default 32; open loop while one is free)
  LOADTEST_SEED        sampling seed (default 0)
  LOADTEST_TOKENIZER   tokenizer folder (default models/tiny-llama)

Fixed rates: the shape runs ``ceil(qps * interval)`` users and each user starts one
request every ``users / qps`` seconds (``shapes.QpsStepShape``), after a random
initial phase so a new stage does not start with a burst.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from locust import task  # noqa: E402

from loadtests.shapes import (  # noqa: E402
    Pacer, QpsStepShape, ReplaySchedule, ReplayTick, StageTick, locust_shape_class, parse_qps_steps,
    parse_stages, stages_from_steps,
)
from loadtests.triton_user import TritonStreamUser  # noqa: E402
from loadtests.workload import (  # noqa: E402
    DEFAULT_TOKENIZER, PromptFactory, WorkloadSampler, get_mix, load_tokenizer, read_trace,
    request_from_entry,
)

SEED = int(os.environ.get("LOADTEST_SEED", "0"))
DRAIN_S = float(os.environ.get("LOADTEST_DRAIN_S", "10"))
TRACE = os.environ.get("LOADTEST_TRACE") or None

TOKENIZER = load_tokenizer(os.environ.get("LOADTEST_TOKENIZER") or DEFAULT_TOKENIZER)
PROMPTS = PromptFactory(TOKENIZER)

if TRACE:
    ENTRIES = read_trace(TRACE)
    PLAN: QpsStepShape | ReplaySchedule = ReplaySchedule(
        [e.offset_s for e in ENTRIES], users=int(os.environ.get("LOADTEST_REPLAY_USERS", "32")),
        drain_s=DRAIN_S)
    SAMPLER = None
    Shape = locust_shape_class(PLAN, "TraceReplayShape")
else:
    ENTRIES = []
    stages_spec = os.environ.get("LOADTEST_STAGES")
    stages = parse_stages(stages_spec) if stages_spec else stages_from_steps(
        parse_qps_steps(os.environ.get("LOADTEST_QPS_STEPS", "1,2")), float(os.environ.get("LOADTEST_STEP_S", "10")))
    PLAN = QpsStepShape(stages, user_interval_s=float(os.environ.get("LOADTEST_USER_INTERVAL_S", "2")),
                        drain_s=DRAIN_S)
    SAMPLER = WorkloadSampler(get_mix(os.environ.get("LOADTEST_MIX", "chat")), PROMPTS, seed=SEED)
    Shape = locust_shape_class(PLAN, "QpsStepsShape")


class ScenarioUser(TritonStreamUser):
    """Paced requests from the mix (QPS steps) or trace entries at their offsets (replay)."""

    tokenizer = TOKENIZER

    def on_start(self) -> None:
        """Per-user pacing state and a random initial phase within one interval."""
        self.pacer = Pacer()
        tick = self._tick()
        if SAMPLER is not None and tick is not None and tick.qps > 0:
            time.sleep(random.uniform(0.0, tick.user_interval_s))

    def wait_time(self) -> float:
        """Replay: none (the task waits for its arrival); QPS steps: constant pacing."""
        if TRACE:
            return 0.0
        tick = self._tick()
        return 0.5 if tick is None else self.pacer.wait(tick.user_interval_s, time.monotonic())

    def _tick(self) -> StageTick | ReplayTick | None:
        shape = self.environment.shape_class
        return getattr(shape, "last_tick", None) if shape is not None else None

    @task
    def fire(self) -> None:
        """Send the next request."""
        if TRACE:
            self._replay_next()
            return
        tick = self._tick()
        if SAMPLER is None or tick is None or tick.qps <= 0:
            return  # between stages or draining: wait_time polls again
        self.pacer.mark_start(time.monotonic())
        self.stream(SAMPLER.sample(), context={"stage": tick.index, "qps": tick.qps})

    def _replay_next(self) -> None:
        shape = self.environment.shape_class
        index = PLAN.claim() if isinstance(PLAN, ReplaySchedule) else None
        if index is None:
            time.sleep(0.5)  # every entry handed out: idle until the shape ends the run
            return
        entry = ENTRIES[index]
        delay = entry.offset_s - shape.get_run_time()
        if delay > 0:
            time.sleep(delay)
        lag_ms = max(0.0, shape.get_run_time() - entry.offset_s) * 1000.0
        # Seeded per entry, so a prompt_tokens entry becomes the same prompt in every run.
        sample = request_from_entry(entry, PROMPTS, random.Random(SEED * 1_000_003 + index))
        self.stream(sample, context={"trace_index": index, "lag_ms": lag_ms})
