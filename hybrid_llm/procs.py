"""Process trees and their shared-memory files from Linux ``/proc`` (no Triton imports).

One reader for the orphan guard, the server wrapper, the tests and the load tests.
"""

from __future__ import annotations

import os
from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (None when gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (None when it does not exist)."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def alive(pid: int, started: int | None = None) -> bool:
    """True while ``pid`` exists and is not a zombie (and, given ``started``, is that process)."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] == "Z":
        return False
    return started is None or int(fields[19]) == started


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` (None when it does not exist)."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[1])


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    return children


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid``."""
    return _children_map().get(pid, [])


def cmdline(pid: int) -> str:
    """The process's command line, arguments joined by spaces ("" when it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def children_named(pid: int, prefix: str) -> list[int]:
    """Direct children of ``pid`` whose command line starts with ``prefix``."""
    return [child for child in children_of(pid) if cmdline(child).startswith(prefix)]


def descendants(root: int) -> list[int]:
    """PIDs of every live process below ``root`` (one scan of /proc)."""
    children = _children_map()
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def tree(pids: list[int]) -> list[int]:
    """``pids`` and all their descendants."""
    children = _children_map()
    out, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def shm_paths(pids: list[int]) -> list[str]:
    """Files under /dev/shm mapped by ``pids`` and their descendants (vLLM's queues, semaphores)."""
    paths: set[str] = set()
    for pid in tree(pids):
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        for line in maps.splitlines():
            path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
            if path.startswith("/dev/shm/") and not path.endswith(" (deleted)"):
                paths.add(path)
    return sorted(paths)


def unlink_all(paths: list[str]) -> int:
    """Remove the files that still exist; returns how many were removed."""
    removed = 0
    for path in paths:
        try:
            os.unlink(path)
            removed += 1
        except OSError:
            pass
    return removed
