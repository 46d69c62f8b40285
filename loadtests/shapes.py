"""Load shapes as data: QPS steps with a pure ``tick(elapsed)``, trace-replay schedules, arrivals.

Locust controls users, not request rates. ``QpsStepShape`` turns a target rate per
stage into a user count plus a per-user pacing interval: ``users = ceil(qps *
user_interval_s)`` users, each starting one request every ``users / qps`` seconds
(constant pacing), which adds up to exactly ``qps`` while a request takes less than
its user's interval. A user whose request runs longer starts the next one late, so
keep ``user_interval_s`` above the slowest request you expect (the report's e2e p99).

``ReplaySchedule`` hands trace entries to a pool of users, each waiting for its
entry's arrival offset (open loop as long as a user is free at every arrival; the
lateness is reported). ``step_arrivals`` makes the same kind of open-loop schedule
(seeded Poisson or evenly spaced) for a list of QPS stages; the benchmark uses it.

Everything here is pure except ``locust_shape_class`` (imports Locust lazily:
importing Locust monkey-patches the process with gevent).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class Stage:
    """One step of a load: ``qps`` requests per second for ``duration_s`` seconds."""

    duration_s: float
    qps: float

    def __post_init__(self) -> None:
        if not self.duration_s > 0:
            raise ValueError(f"stage duration must be > 0 s, got {self.duration_s}")
        if not self.qps >= 0 or math.isinf(self.qps):
            raise ValueError(f"stage qps must be a finite number >= 0, got {self.qps}")


@dataclass(frozen=True)
class StageTick:
    """What the shape asks for at one moment."""

    index: int  # stage number; len(stages) during the final drain
    qps: float  # target request rate now (0 while draining)
    users: int  # Locust users to run
    spawn_rate: float  # users started per second when the count changes
    user_interval_s: float  # each user starts one request per this many seconds (inf: none)
    stage_elapsed_s: float  # time since this stage began


def stages_from_steps(qps_steps: Sequence[float], duration_s: float) -> tuple[Stage, ...]:
    """Equal-length stages, one per QPS value."""
    if not qps_steps:
        raise ValueError("give at least one QPS step")
    return tuple(Stage(duration_s, float(q)) for q in qps_steps)


def parse_stages(spec: str) -> tuple[Stage, ...]:
    """Parse ``"QPS:SECONDS,QPS:SECONDS,..."`` (e.g. ``"1:30,2:30,4:60"``)."""
    stages = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        qps, sep, seconds = part.partition(":")
        try:
            if not sep:
                raise ValueError
            stages.append(Stage(float(seconds), float(qps)))
        except ValueError as exc:
            detail = f" ({exc})" if str(exc) else ""
            raise ValueError(f"bad stage '{part}' in '{spec}': expected QPS:SECONDS, e.g. 2:30{detail}") from None
    if not stages:
        raise ValueError(f"no stages in '{spec}'; expected QPS:SECONDS[,QPS:SECONDS...]")
    return tuple(stages)


def parse_qps_steps(spec: str) -> list[float]:
    """Parse ``"1,2,4"`` into positive QPS values."""
    try:
        steps = [float(p) for p in spec.split(",") if p.strip()]
    except ValueError:
        raise ValueError(f"bad QPS list '{spec}': expected numbers separated by commas, e.g. 1,2,4") from None
    if not steps or any(not q > 0 for q in steps):
        raise ValueError(f"bad QPS list '{spec}': every step must be > 0")
    return steps


@dataclass(frozen=True)
class QpsStepShape:
    """Fixed request rates per stage, as Locust users with constant pacing (module docstring)."""

    stages: tuple[Stage, ...]
    user_interval_s: float = 2.0
    drain_s: float = 0.0  # after the last stage: keep users, start nothing, let requests finish

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a QpsStepShape needs at least one stage")
        if not self.user_interval_s > 0:
            raise ValueError(f"user_interval_s must be > 0, got {self.user_interval_s}")
        if self.drain_s < 0:
            raise ValueError(f"drain_s must be >= 0, got {self.drain_s}")

    @property
    def total_s(self) -> float:
        """Length of all stages plus the drain."""
        return sum(s.duration_s for s in self.stages) + self.drain_s

    def users_for(self, qps: float) -> int:
        """Users needed to start ``qps`` requests per second at ``user_interval_s`` each."""
        return 0 if qps <= 0 else max(1, math.ceil(qps * self.user_interval_s - 1e-9))

    def tick(self, elapsed: float) -> StageTick | None:
        """The stage at ``elapsed`` seconds (stage i covers [start_i, end_i)); None when done."""
        if elapsed < 0 or math.isnan(elapsed):
            raise ValueError(f"elapsed must be >= 0, got {elapsed}")
        start = 0.0
        for index, stage in enumerate(self.stages):
            end = start + stage.duration_s
            if elapsed < end:
                users = self.users_for(stage.qps)
                interval = users / stage.qps if stage.qps > 0 else math.inf
                return StageTick(index, stage.qps, users, float(max(users, 1)), interval, elapsed - start)
            start = end
        if elapsed < start + self.drain_s:
            users = self.users_for(self.stages[-1].qps)
            return StageTick(len(self.stages), 0.0, users, float(max(users, 1)), math.inf, elapsed - start)
        return None


class Pacer:
    """Constant pacing for one user: start a request every ``interval`` seconds (never early)."""

    def __init__(self) -> None:
        self.last_start: float | None = None

    def mark_start(self, now: float) -> None:
        """Record that a request starts at ``now``."""
        self.last_start = now

    def wait(self, interval: float, now: float, idle_poll_s: float = 0.5) -> float:
        """Seconds to wait before the next start (0 if the last request overran its interval).

        An infinite interval (nothing to send: a 0-QPS stage or the drain) returns
        ``idle_poll_s`` so the user looks at the shape again soon.
        """
        if math.isinf(interval):
            return idle_poll_s
        if self.last_start is None:
            return 0.0
        return max(0.0, self.last_start + interval - now)


@dataclass
class ReplayTick:
    """What a replay asks for at one moment."""

    users: int
    spawn_rate: float
    next_offset_s: float | None  # arrival time of the next unclaimed entry (None: all claimed)


class ReplaySchedule:
    """Arrival offsets handed out in order to a pool of users; ends ``drain_s`` after the last."""

    def __init__(self, offsets: Sequence[float], users: int = 32, drain_s: float = 30.0) -> None:
        if not offsets:
            raise ValueError("a replay needs at least one arrival")
        if any(b < a for a, b in zip(offsets, offsets[1:])):
            raise ValueError("replay offsets must be sorted (parse_trace sorts them)")
        if offsets[0] < 0:
            raise ValueError("replay offsets must be >= 0")
        if users < 1:
            raise ValueError(f"users must be >= 1, got {users}")
        self.offsets = tuple(float(o) for o in offsets)
        self.users = users
        self.drain_s = drain_s
        self.cursor = 0

    @property
    def total_s(self) -> float:
        """Last arrival plus the drain."""
        return self.offsets[-1] + self.drain_s

    def claim(self) -> int | None:
        """The index of the next unclaimed entry (None when every entry was handed out)."""
        if self.cursor >= len(self.offsets):
            return None
        index, self.cursor = self.cursor, self.cursor + 1
        return index

    def tick(self, elapsed: float) -> ReplayTick | None:
        """Users to run at ``elapsed`` seconds; None once the drain after the last arrival is over."""
        if elapsed < 0 or math.isnan(elapsed):
            raise ValueError(f"elapsed must be >= 0, got {elapsed}")
        if elapsed >= self.total_s:
            return None
        nxt = self.offsets[self.cursor] if self.cursor < len(self.offsets) else None
        return ReplayTick(self.users, float(self.users), nxt)


@dataclass(frozen=True)
class Arrival:
    """One open-loop arrival: when, and in which stage."""

    offset_s: float
    stage: int


def step_arrivals(stages: Sequence[Stage], process: str = "poisson", seed: int = 0) -> list[Arrival]:
    """Arrival times for QPS stages: seeded Poisson (exponential gaps) or evenly spaced ("fixed")."""
    if process not in ("poisson", "fixed"):
        raise ValueError(f"arrival process must be 'poisson' or 'fixed', not {process!r}")
    rng = random.Random(seed)
    out: list[Arrival] = []
    start = 0.0
    for index, stage in enumerate(stages):
        end = start + stage.duration_s
        if stage.qps > 0:
            if process == "fixed":
                count = int(math.floor(stage.duration_s * stage.qps + 1e-9))
                out.extend(Arrival(start + k / stage.qps, index) for k in range(count))
            else:
                t = start + rng.expovariate(stage.qps)
                while t < end:
                    out.append(Arrival(t, index))
                    t += rng.expovariate(stage.qps)
        start = end
    return out


def locust_shape_class(plan: QpsStepShape | ReplaySchedule, name: str = "PlannedShape") -> type:
    """A Locust ``LoadTestShape`` subclass driven by ``plan.tick(run_time)``.

    The instance keeps the last tick in ``last_tick`` so users can read the current
    stage's rate. Bind the returned class to a module-level name in the locustfile.
    """
    from locust import LoadTestShape  # lazy: importing locust monkey-patches with gevent

    def tick(self: Any) -> tuple[int, float] | None:
        """(users, spawn_rate) from the plan at Locust's run time; None ends the test."""
        current = plan.tick(self.get_run_time())
        self.last_tick = current
        return None if current is None else (current.users, current.spawn_rate)

    return type(name, (LoadTestShape,), {"plan": plan, "last_tick": None, "tick": tick,
                                          "__doc__": f"Locust adapter for {type(plan).__name__}."})
