"""CPU seconds per process role (server, each model's stub, engines, load generator) from /proc.

On a CPU-bound machine every CPU second the router spends is taken from the engines,
so a router's cost is best stated as CPU time per output token; this module samples
it around a measurement. Linux only (``/proc/<pid>/stat``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Mapping

TICKS = os.sysconf("SC_CLK_TCK")
ROLES = ("server", "stub:router_bls", "stub:vllm_backend", "stub:trtllm", "engines", "load generator")


def role_of(cmdline: str) -> str:
    """The role of a server-tree process from its command line."""
    if "triton_python_backend_stub" in cmdline:
        for model in ("router_bls", "vllm_backend", "trtllm"):
            if f"/{model}/" in cmdline:
                return f"stub:{model}"
        return "stub:other"
    if "tritonserver" in cmdline.split(" ", 1)[0]:
        return "server"
    return "engines"  # vLLM EngineCore and workers, and anything else they spawn


def _read(pid: int) -> tuple[float, str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS, cmdline  # utime + stime


def sample(pids: Iterable[int]) -> dict[int, tuple[float, str]]:
    """CPU seconds and command line of each live pid, plus this process (pid 0 = load generator)."""
    out = {pid: got for pid in pids if (got := _read(pid)) is not None}
    t = os.times()
    out[0] = (t.user + t.system, "load generator")
    return out


def by_role(before: Mapping[int, tuple[float, str]], after: Mapping[int, tuple[float, str]]) -> dict[str, float]:
    """CPU seconds spent between two samples, summed per role."""
    roles: dict[str, float] = {}
    for pid, (cpu, cmdline) in after.items():
        role = "load generator" if pid == 0 else role_of(cmdline)
        spent = cpu - before.get(pid, (0.0, ""))[0]
        roles[role] = roles.get(role, 0.0) + max(spent, 0.0)
    return roles
