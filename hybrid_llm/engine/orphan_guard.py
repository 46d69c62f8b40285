"""Kill a model's engine processes when the model's stub dies without shutting them down.

vLLM spawns its EngineCore (and the core its workers) with multiprocessing "spawn", so
nothing ties them to the Triton Python stub that owns them: if the stub is SIGKILLed
(or crashes), they live on holding their memory and cores while Triton starts a new
stub with a new engine. ``start_guard`` launches this file as a small separate process
that polls the stub once a second; when the stub is gone it SIGKILLs the engine
processes and everything below them, then exits (a normal unload stops it first). It
also watches the stub's parent, the tritonserver: when the server crashes, its stubs
are reparented and live on (seen: a stub and its engine, 3 GB, still running minutes
after a SIGSEGV of the server), so then the stub is killed along with everything below
it. Processes are identified by pid and start time, so a recycled pid is never killed.
Linux only (/proc). No Triton imports.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from hybrid_llm.procs import alive, children_named, shm_paths, start_time, tree, unlink_all


def discovered(owner: int, prefix: str, known: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The owner's direct children whose command line starts with ``prefix`` that ``known`` lacks."""
    have = {pid for pid, _ in known}
    return [(pid, st) for pid in children_named(owner, prefix)
            if pid not in have and (st := start_time(pid)) is not None]


def guard(owner: tuple[int, int], targets: list[tuple[int, int]], period_s: float = 1.0,
          server: tuple[int, int] | None = None, discover: str | None = None) -> int:
    """Wait for the owner (or the server above it) to die, then SIGKILL the targets' trees;
    returns how many processes were killed.

    With ``discover`` (a command-line prefix, e.g. ``VLLM::``), the owner's children that
    match it become targets as they appear, so an engine still starting (a first load or a
    restart) is guarded before anyone knows its pid.

    When the server died first, the owner is killed too, with everything below it. While
    a server is watched, the guard stays after the targets end on their own: a stub whose
    engine already stopped can still hang on after a server crash (its shutdown waits on
    IPC to the dead server). Shared-memory files the targets map (at the start, and again
    just before the kill, as engines create queues later) are removed after the kill;
    when the server died, so are the owner's.
    """
    shm = set(shm_paths([pid for pid, _ in targets]))
    targets = list(targets)
    while True:
        if discover is not None and alive(*owner):
            targets += discovered(owner[0], discover, targets)
        live = [(pid, st) for pid, st in targets if alive(pid, st)]
        owner_dead = not alive(*owner)
        server_dead = server is not None and not alive(*server)
        if owner_dead or server_dead:
            roots = [pid for pid, _ in live]
            if not owner_dead:
                roots.append(owner[0])  # its files go too: nobody else will use them
            if not roots:
                return 0
            shm |= set(shm_paths(roots))
            # This guard is a child of the owner: never in its own kill list, or it could
            # die halfway through it (and leave the rest, and the files, behind).
            victims = [pid for pid in tree(roots) if pid != os.getpid()]
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.5)
            unlink_all(sorted(shm))
            return len(victims)
        if not live and server is None and discover is None:
            return 0
        time.sleep(period_s)


def start_guard(targets: list[int], python: str = sys.executable,
                watch_parent: bool = True, discover: str | None = None) -> subprocess.Popen | None:
    """Launch the guard for ``targets`` (pids) and, with ``discover``, for this process's
    children whose command line starts with it; owned by this process (and, with
    ``watch_parent``, by its parent, the tritonserver); None when nothing to guard."""
    pairs = [(pid, st) for pid in targets if (st := start_time(pid)) is not None]
    owner = start_time(os.getpid())
    if (not pairs and discover is None) or owner is None:
        return None
    args = [python, "-m", "hybrid_llm.engine.orphan_guard", f"{os.getpid()}:{owner}"] + [f"{p}:{s}" for p, s in pairs]
    if discover is not None:
        args += ["--discover", discover]
    parent = os.getppid()
    if watch_parent and parent > 1 and (parent_start := start_time(parent)) is not None:
        args += ["--server", f"{parent}:{parent_start}"]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds hybrid_llm/
    return subprocess.Popen(args, stdin=subprocess.DEVNULL, close_fds=True, start_new_session=True, cwd=root)


def _pid_start(arg: str) -> tuple[int, int]:
    pid, started = arg.split(":")
    return int(pid), int(started)


def main(argv: list[str]) -> int:
    """``python -m hybrid_llm.engine.orphan_guard OWNER_PID:START [TARGET_PID:START ...] [--server PID:START]
    [--discover PREFIX]``"""
    server, discover = None, None
    if "--server" in argv:
        i = argv.index("--server")
        server = _pid_start(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    if "--discover" in argv:
        i = argv.index("--discover")
        discover = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    owner, *targets = [_pid_start(a) for a in argv]
    killed = guard(owner, targets, server=server, discover=discover)
    if killed:
        who = "server" if server is not None and not alive(*server) else "owner"
        print(f"orphan_guard: {who} of {owner[0]} died; killed {killed} processes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
