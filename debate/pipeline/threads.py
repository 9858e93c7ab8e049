"""How many CPU threads a run's model calls use: what this process may really run on, not the machine's cores.

torch starts as many threads as the machine has cores. On a shared node (a SLURM allocation, several jobs a node)
the process may run on fewer: its CPU affinity (the cores it may be scheduled on) and its cgroup's CPU quota (the
share of them it may use) say how many; and cores other processes keep busy are not free either. Threads past
what is free wait on each other at every step: the demo took 1:00:48 under load with torch's default threads,
5:50 with one (issue 54).

    count, why = threads.available()      # (1, "2 CPUs by affinity, no cgroup quota, 1.9 busy with other work")
    threads.apply(config.generation.threads)   # --threads N wins; then OMP_NUM_THREADS; then `available`

Imports torch only in `apply`, the run's first step that needs it.
"""
import logging
import math
import os
from pathlib import Path
from typing import Callable, Optional, Tuple

log = logging.getLogger(__name__)

CGROUP = Path("/sys/fs/cgroup")


def cgroup_quota(root: Path = CGROUP, own: Optional[str] = None) -> Optional[float]:
    """The cgroup's CPU quota in CPUs (1.5 = one and a half), or None without one: v2's cpu.max ("max 100000" or
    "150000 100000"), else v1's cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us. Read in this process's own
    cgroup (`own`: /proc/self/cgroup's lines; a SLURM job's is a folder below the root), then at the root (where a
    container sees its own)."""
    v2, v1 = _own_groups(own)
    for folder in dict.fromkeys((root / v2, root)):
        try:
            quota, period = (folder / "cpu.max").read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        except (OSError, ValueError):
            continue
    for folder in dict.fromkeys((root / "cpu" / v1, root / "cpu,cpuacct" / v1, root / "cpu", root / "cpu,cpuacct")):
        try:
            quota_us = int((folder / "cpu.cfs_quota_us").read_text())
            period_us = int((folder / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
    return None


def _own_groups(own: Optional[str] = None) -> Tuple[str, str]:
    """(v2 path, v1 cpu controller's path) of this process's cgroup, relative ("" where unknown)."""
    if own is None:
        try:
            own = Path("/proc/self/cgroup").read_text()
        except OSError:
            own = ""
    v2 = v1 = ""
    for line in own.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2].lstrip("/")
        elif "cpu" in parts[1].split(","):
            v1 = parts[2].lstrip("/")
    return v2, v1


def affinity() -> int:
    """The CPUs this process may be scheduled on (os.cpu_count() where the OS cannot say)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def busy_elsewhere(load: Callable[[], Tuple[float, float, float]] = os.getloadavg) -> float:
    """CPUs other processes keep busy: the last minute's load average (this process, still importing, adds little
    to it when a run starts). 0 where the OS cannot say."""
    try:
        return max(0.0, load()[0])
    except (AttributeError, OSError):
        return 0.0


def available(root: Path = CGROUP, cpus: Callable[[], int] = affinity,
              load: Callable[[], Tuple[float, float, float]] = os.getloadavg, own: Optional[str] = None
              ) -> Tuple[int, str]:
    """(threads, why): the CPUs this process may use (its affinity, capped by the cgroup's quota, rounded up), less
    those other processes keep busy, at least 1; `why` says each figure, for the run's line."""
    mine, quota = cpus(), cgroup_quota(root, own)
    usable = min(mine, math.ceil(quota)) if quota else mine
    busy = busy_elsewhere(load)
    free = max(1, min(usable, math.floor(usable - busy + 0.5)))
    why = (f"{mine} CPU{'s' if mine != 1 else ''} by affinity, "
           + (f"a cgroup quota of {quota:g}" if quota else "no cgroup quota")
           + f", {busy:.1f} busy with other work (load average)")
    return free, why


def choose(given: Optional[int] = None, env: Optional[dict] = None, **sources) -> Tuple[Optional[int], str]:
    """(threads to set, why): --threads when given; None (torch keeps what it read) where OMP_NUM_THREADS is set,
    as the user set it; else `available`."""
    env = os.environ if env is None else env
    if given:
        return given, "--threads"
    if env.get("OMP_NUM_THREADS"):
        return None, f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}"
    return available(**sources)


def apply(given: Optional[int] = None) -> None:
    """Set torch's CPU threads for the run (`choose`) and say how many, and why, in one line."""
    count, why = choose(given)
    import torch  # the run's first import of torch: the flags and files have passed by now

    if count is not None:
        torch.set_num_threads(count)
    log.info(f"threads: {torch.get_num_threads()} ({why}; --threads N sets them)")
