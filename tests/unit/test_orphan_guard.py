"""The orphan guard kills engine processes whose owner died, and nothing else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from hybrid_llm.engine import orphan_guard as og
from hybrid_llm import procs


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _gone(proc: subprocess.Popen, timeout: float = 10.0) -> bool:
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def _guard_process(owner: subprocess.Popen, target: subprocess.Popen,
                   server: subprocess.Popen | None = None) -> subprocess.Popen:
    """Launch orphan_guard.py as a process, the way ``start_guard`` does."""
    args = [sys.executable, "-m", "hybrid_llm.engine.orphan_guard", f"{owner.pid}:{og.start_time(owner.pid)}",
            f"{target.pid}:{og.start_time(target.pid)}"]
    if server is not None:
        args += ["--server", f"{server.pid}:{og.start_time(server.pid)}"]
    return subprocess.Popen(args)


def _mapper(name: str) -> subprocess.Popen:
    """A process that creates and maps a /dev/shm file, then sleeps."""
    code = ("import mmap,os,time; fd=os.open(%r, os.O_CREAT|os.O_RDWR); os.ftruncate(fd, 4096); "
            "m=mmap.mmap(fd, 4096); print('ok', flush=True); time.sleep(60)") % name
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ok"
    return p


def test_targets_die_with_their_owner() -> None:
    owner, target = _sleeper(), _sleeper()
    try:
        guard = _guard_process(owner, target)
        time.sleep(1.5)
        assert target.poll() is None  # owner alive: nothing happens
        owner.kill()
        owner.wait()
        assert _gone(target), "target survived its owner"
        assert guard.wait(10) == 0
    finally:
        for p in (owner, target):
            p.kill()


def test_owner_and_targets_die_when_the_server_above_them_dies() -> None:
    server, owner, target = _sleeper(), _sleeper(), _sleeper()
    try:
        guard = _guard_process(owner, target, server)
        time.sleep(1.5)
        assert owner.poll() is None and target.poll() is None  # server alive: nothing happens
        server.kill()
        server.wait()
        assert _gone(target), "engine survived the server"
        assert _gone(owner), "stub survived the server"
        assert guard.wait(10) == 0
    finally:
        for p in (server, owner, target):
            p.kill()


def test_a_dead_owner_does_not_take_the_server_down() -> None:
    server, owner, target = _sleeper(), _sleeper(), _sleeper()
    try:
        guard = _guard_process(owner, target, server)
        owner.kill()
        owner.wait()
        assert _gone(target)
        assert guard.wait(10) == 0
        assert server.poll() is None
    finally:
        for p in (server, owner, target):
            p.kill()


def test_guard_exits_when_targets_end_on_their_own() -> None:
    owner, target = _sleeper(), _sleeper()
    try:
        guard = _guard_process(owner, target)
        target.kill()
        target.wait()
        assert guard.wait(10) == 0
        assert owner.poll() is None
    finally:
        for p in (owner, target):
            p.kill()


def test_a_recycled_pid_is_not_the_same_process() -> None:
    p = _sleeper()
    try:
        started = og.start_time(p.pid)
        assert started is not None and og.alive(p.pid, started)
        assert not og.alive(p.pid, started + 1)
    finally:
        p.kill()
        p.wait()
    assert not og.alive(p.pid, started)
    assert og.start_time(p.pid) is None


def test_tree_includes_descendants() -> None:
    parent = subprocess.Popen([sys.executable, "-c",
                               "import subprocess,sys,time; subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)']); time.sleep(60)"])
    try:
        deadline = time.monotonic() + 10
        while not procs.children_of(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        kids = procs.children_of(parent.pid)
        assert len(kids) == 1
        assert set(og.tree([parent.pid])) == {parent.pid, kids[0]}
        assert og.guard((parent.pid, og.start_time(parent.pid)), []) == 0  # nothing to guard
    finally:
        for pid in og.tree([parent.pid]):
            subprocess.run(["kill", "-9", str(pid)])
        parent.wait()


def test_shm_files_mapped_by_a_process_are_found_and_removed(tmp_path) -> None:
    import os
    from pathlib import Path

    name = f"/dev/shm/hybrid_test_{os.getpid()}"
    p = _mapper(name)
    try:
        assert name in og.shm_paths([p.pid])
    finally:
        p.kill()
        p.wait()
    assert og.unlink_all([name, name + "_missing"]) == 1
    assert not Path(name).exists()


def test_after_a_server_crash_the_stubs_shared_memory_goes_too() -> None:
    import os
    from pathlib import Path

    owner_file = f"/dev/shm/hybrid_owner_{os.getpid()}"
    server, owner, target = _sleeper(), _mapper(owner_file), _sleeper()
    try:
        guard = _guard_process(owner, target, server)
        time.sleep(1.5)
        assert Path(owner_file).exists()  # server alive: the stub's files are left alone
        server.kill()
        server.wait()
        assert _gone(owner) and _gone(target)
        assert guard.wait(10) == 0
        assert not Path(owner_file).exists(), "the stub's shared memory was left behind"
    finally:
        for p in (server, owner, target):
            p.kill()
        try:
            os.unlink(owner_file)
        except OSError:
            pass


def test_queues_an_engine_maps_after_the_guard_started_are_removed_too() -> None:
    import os
    import threading
    from pathlib import Path

    late_file = f"/dev/shm/hybrid_late_{os.getpid()}"
    code = ("import mmap,os,time; time.sleep(0.5); fd=os.open(%r, os.O_CREAT|os.O_RDWR); "
            "os.ftruncate(fd, 4096); m=mmap.mmap(fd, 4096); time.sleep(60)") % late_file
    owner, target = _sleeper(), subprocess.Popen([sys.executable, "-c", code])
    result: list[int] = []
    try:
        t = threading.Thread(target=lambda: result.append(og.guard(
            (owner.pid, og.start_time(owner.pid)), [(target.pid, og.start_time(target.pid))],
            period_s=0.1)))
        t.start()
        deadline = time.monotonic() + 5
        while not Path(late_file).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        owner.kill()
        owner.wait()
        t.join(10)
        assert result and result[0] >= 1 and _gone(target)
        assert not Path(late_file).exists(), "a queue created after the guard started was left behind"
    finally:
        for p in (owner, target):
            p.kill()
        try:
            os.unlink(late_file)
        except OSError:
            pass


# A stub as Triton runs it: it starts an engine process and a helper child (like
# multiprocessing's resource tracker), then its guard with start_guard, which watches the
# stub and the stub's parent (here: the "server" process that launched it).
_STUB = """
import subprocess, sys, time
sys.path.insert(0, {pkg!r})
from hybrid_llm.engine import orphan_guard as og
sleep = [sys.executable, '-c', 'import time; time.sleep(120)']
engine, helper = subprocess.Popen(sleep), subprocess.Popen(sleep)
g = og.start_guard([engine.pid])
print(engine.pid, helper.pid, g.pid, flush=True)
time.sleep(120)
"""


def test_a_crashed_server_takes_its_stub_and_everything_the_stub_started() -> None:
    import os
    from pathlib import Path

    pkg = str(Path(og.__file__).resolve().parents[2])
    stub_code = _STUB.format(pkg=pkg)
    server_code = ("import subprocess,sys,time; p=subprocess.Popen([sys.executable,'-c',%r]); "
                   "print(p.pid, flush=True); time.sleep(120)") % stub_code
    server = subprocess.Popen([sys.executable, "-c", server_code], stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        stub = int(server.stdout.readline())
        deadline = time.monotonic() + 20
        while len(og.tree([stub])) < 4 and time.monotonic() < deadline:  # stub, engine, helper, guard
            time.sleep(0.1)
        pids = og.tree([stub])
        assert len(pids) == 4, pids
        started = {pid: og.start_time(pid) for pid in pids}
        time.sleep(1.5)
        assert all(og.alive(pid, st) for pid, st in started.items())  # server alive: nothing happens
        server.kill()
        server.wait()
        deadline = time.monotonic() + 15
        while any(og.alive(pid, st) for pid, st in started.items()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid, st in started.items() if og.alive(pid, st)], "processes outlived the crashed server"
    finally:
        server.kill()
        for pid in pids:
            try:
                os.kill(pid, 9)
            except OSError:
                pass


def test_a_stub_whose_engine_already_ended_still_dies_with_the_server() -> None:
    server, owner, target = _sleeper(), _sleeper(), _sleeper()
    try:
        guard = _guard_process(owner, target, server)
        target.kill()
        target.wait()
        time.sleep(1.5)
        assert guard.poll() is None and owner.poll() is None  # the guard keeps watching
        server.kill()
        server.wait()
        assert _gone(owner), "stub survived the server after its engine had ended"
        assert guard.wait(10) == 0
    finally:
        for p in (server, owner, target):
            p.kill()


def test_a_child_started_after_the_guard_is_adopted_and_dies_with_its_owner(tmp_path) -> None:
    # The owner starts its "engine" (cmdline prefix ENGINE_MARK) 1.5 s after the guard: the
    # case of an engine still starting when its stub dies (a restart).
    pidfile = tmp_path / "child.pid"
    code = ("import subprocess,sys,time; time.sleep(1.5); "
            "c=subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)','ENGINE_MARK']); "
            f"open({str(pidfile)!r},'w').write(str(c.pid)); time.sleep(60)")
    owner = subprocess.Popen([sys.executable, "-c", code])
    guard = subprocess.Popen([sys.executable, "-m", "hybrid_llm.engine.orphan_guard",
                              f"{owner.pid}:{og.start_time(owner.pid)}", "--discover", sys.executable])
    child = None
    try:
        deadline = time.monotonic() + 10
        while not pidfile.exists() or not pidfile.read_text():
            assert time.monotonic() < deadline, "the owner never started its child"
            time.sleep(0.1)
        child = int(pidfile.read_text())
        child_start = og.start_time(child)
        time.sleep(1.5)  # at least one guard round with the child there
        assert guard.poll() is None and procs.alive(child, child_start)
        owner.kill()
        owner.wait()
        assert guard.wait(10) == 0
        deadline = time.monotonic() + 5
        while procs.alive(child, child_start) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not procs.alive(child, child_start), "a child started after the guard outlived its owner"
    finally:
        owner.kill()
        guard.kill()
        if child is not None:
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass


def test_discovered_names_only_new_children_with_the_prefix() -> None:
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    other = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.3)
        found = og.discovered(os.getpid(), sys.executable, [])
        pids = [pid for pid, _ in found]
        assert mine.pid in pids and other.pid not in pids
        assert mine.pid not in [pid for pid, _ in og.discovered(os.getpid(), sys.executable, found)]
    finally:
        mine.kill()
        other.kill()
