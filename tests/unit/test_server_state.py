"""A start cleans up what an earlier crashed run of its own left: its processes and /dev/shm files."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from hybrid_llm.procs import alive, start_time
from hybrid_llm.server import clean_stale_run


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_stale_run_is_killed_and_its_shared_memory_removed(tmp_path: Path) -> None:
    dead = _sleeper()
    dead_start = start_time(dead.pid)
    dead.kill()
    dead.wait()
    leftover, stranger = _sleeper(), _sleeper()
    prefix = f"hybrid_test_{uuid.uuid4().hex[:8]}_"
    region, mapped, other = (Path(f"/dev/shm/{prefix}region"), Path(f"/dev/shm/sem.test_{uuid.uuid4().hex[:8]}"),
                             Path(f"/dev/shm/hybrid_other_{uuid.uuid4().hex[:8]}"))
    for f in (region, mapped, other):
        f.write_bytes(b"x")
    try:
        state = tmp_path / "serve.state.json"
        state.write_text(json.dumps({"prefix": prefix, "shm": [str(mapped)],
                                     "processes": [[dead.pid, dead_start], [leftover.pid, start_time(leftover.pid)],
                                                   [stranger.pid, start_time(stranger.pid) + 1]]}))
        killed, removed = clean_stale_run(state)
        leftover.wait(timeout=5)
        assert (killed, removed) == (1, 2) and not state.exists()
        assert not region.exists() and not mapped.exists() and other.exists()
        assert alive(stranger.pid)  # same pid, other start time: not ours, untouched
    finally:
        for p in (leftover, stranger):
            p.kill()
        other.unlink(missing_ok=True)


def test_a_run_that_is_still_serving_is_not_touched(tmp_path: Path) -> None:
    live = _sleeper()
    try:
        state = tmp_path / "serve.state.json"
        state.write_text(json.dumps({"prefix": "x_", "shm": [], "processes": [[live.pid, start_time(live.pid)]]}))
        with pytest.raises(RuntimeError, match="still running"):
            clean_stale_run(state)
        assert alive(live.pid) and state.exists()
    finally:
        live.kill()


def test_no_record_means_nothing_to_clean(tmp_path: Path) -> None:
    assert clean_stale_run(tmp_path / "absent.json") == (0, 0)
