"""How many CPU threads a run's model calls use: the CPUs this job was given, not the machine's cores, and not what
the host's other jobs happen to leave.

torch starts as many threads as the machine has cores. On a shared node (a SLURM allocation, several jobs a node)
the process may run on fewer, and threads past the CPUs it may really run on wait on each other at every step: the
demo took 1:00:48 under load with torch's default threads, 5:50 with one (issue 54).

The rule (`available`; `--threads N`, then OMP_NUM_THREADS, win over it, as the user set them):
- The allocation: the CPUs this process may be scheduled on (its affinity: the cpuset SLURM, a container or taskset
  gives it), capped by the tightest CPU quota on its cgroup and on every cgroup above it up to the root (v2: cpu.max
  at each level; v1: cpu.cfs_quota_us over cpu.cfs_period_us at each level of the cpu controller's tree), rounded
  down, at least 1. A limit set on a parent binds its children whatever they say ("max" included), so the nearest
  level alone is not the answer. Down, not up: the kernel stops every thread of the cgroup for the rest of a
  period (100 ms as a rule) once the quota is spent, and a CPU decode step is of that order, so with more threads
  than the quota a step stops part-way in most periods, and threads spinning at torch's barriers spend quota on no
  work; rounding down never outnumbers the quota, at the cost of the fraction unused (none where quotas are whole
  CPUs, as SLURM's and most containers' are: a quota of 1.5 gives 1 thread, 2.5 gives 2).
- Where the allocation is the process's own (fewer CPUs by affinity than the host has, or a quota below them: a
  SLURM job, a limited container), the run takes all of it whatever the host's load: the load average counts every
  job on the node, whose work runs on CPUs this job was not given or within quotas of their own, and shrinking for it
  would only leave this job's CPUs idle (a job of 8 CPUs on a 64-core node with load 30 takes 8, not 1).
- Only where the process may use the whole host (every CPU by affinity, no quota below them: a workstation, a login
  node, a container with no limit) is other work's load its concern: the run then takes the host's CPUs less those
  other work keeps busy (the last minute's load average, rounded to the nearest), never below 1: with no
  allocation of its own, one CPU is all it may count on. This is issue 54's case (2 cores, both kept busy by
  others: 1 thread). So the load never takes a run below its allocation: where it has one, the load is not counted.

cpuset.cpus.effective is not read: the kernel keeps a process's affinity inside its cpuset (and narrows it when the
cpuset shrinks), so the affinity already says it, and says a narrower taskset too. Cgroups above a container's own
cgroup namespace are out of its sight: there the quotas read are those from the process's cgroup up to the
container's.

    count, why = threads.available()      # (8, "8 of the host's 64 CPUs by affinity, no cgroup quota: ...")
    threads.apply(config.generation.threads)   # --threads N wins; then OMP_NUM_THREADS; then `available`

Imports torch only in `apply`, the run's first step that needs it.
"""
import logging
import math
import os
from pathlib import Path
from typing import Callable, Iterator, List, Mapping, Optional, Tuple

log = logging.getLogger(__name__)

CGROUP = Path("/sys/fs/cgroup")


def quotas(root: Path = CGROUP, own: Optional[str] = None) -> List[Tuple[float, Path]]:
    """Every CPU quota set on this process's cgroup or a cgroup above it, as (CPUs, the file that says it), nearest
    first: v2's cpu.max ("150000 100000"; "max": none at that level) at each level from the process's own cgroup
    (`own`: /proc/self/cgroup's lines) up to `root`, and v1's cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us
    at each level of the cpu controller's tree (a folder of `root` whose name lists "cpu": cpu, cpu,cpuacct)."""
    v2, v1 = _own_groups(own)
    found = []
    for folder in _up_from(root, v2):
        try:
            quota, period = (folder / "cpu.max").read_text().split()[:2]
            if quota != "max":
                found.append((int(quota) / int(period), folder / "cpu.max"))
        except (OSError, ValueError):
            continue
    for tree in _cpu_trees(root):
        for folder in _up_from(tree, v1):
            try:
                quota_us = int((folder / "cpu.cfs_quota_us").read_text())
                period_us = int((folder / "cpu.cfs_period_us").read_text())
            except (OSError, ValueError):
                continue
            if quota_us > 0 and period_us > 0:
                found.append((quota_us / period_us, folder / "cpu.cfs_quota_us"))
    return found


def tightest(root: Path = CGROUP, own: Optional[str] = None) -> Optional[Tuple[float, Path]]:
    """The quota that binds this process, (CPUs, its file): the smallest of `quotas`, or None without one."""
    return min(quotas(root, own), key=lambda found: found[0], default=None)


def cgroup_quota(root: Path = CGROUP, own: Optional[str] = None) -> Optional[float]:
    """The effective CPU quota in CPUs (1.5 = one and a half), or None without one."""
    binding = tightest(root, own)
    return None if binding is None else binding[0]


def _up_from(top: Path, relative: str) -> Iterator[Path]:
    """`top`/`relative` and each folder above it, up to `top` itself. A path with ".." (a cgroup outside this
    process's cgroup namespace, as /proc/self/cgroup shows one) is out of sight: `top` alone."""
    parts = [p for p in relative.split("/") if p and p != "."]
    if ".." in parts:
        parts = []
    for depth in range(len(parts), -1, -1):
        yield top.joinpath(*parts[:depth])


def _cpu_trees(root: Path) -> List[Path]:
    """The cgroup v1 hierarchies the cpu controller is mounted in (cpu, cpu,cpuacct, ...; none under v2)."""
    try:
        return sorted(d for d in root.iterdir() if "cpu" in d.name.split(",") and d.is_dir())
    except OSError:
        return []


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


def host_cpus() -> int:
    """The host's CPUs, whatever this process may use of them."""
    return os.cpu_count() or 1


def busy_elsewhere(load: Callable[[], Tuple[float, float, float]] = os.getloadavg) -> float:
    """CPUs other processes keep busy: the last minute's load average (this process, still importing, adds little
    to it when a run starts). 0 where the OS cannot say."""
    try:
        return max(0.0, load()[0])
    except (AttributeError, OSError):
        return 0.0


def available(root: Path = CGROUP, cpus: Callable[[], int] = affinity,
              load: Callable[[], Tuple[float, float, float]] = os.getloadavg, own: Optional[str] = None,
              host: Callable[[], int] = host_cpus) -> Tuple[int, str]:
    """(threads, why) by the module's rule: the allocation (affinity, capped by the tightest cgroup quota, rounded
    down) where it is the process's own; the host's CPUs less those other work keeps busy where the process may use
    the whole host; at least 1. `why` says each figure, for the run's `threads:` line."""
    mine = cpus()
    machine = max(host(), mine)
    quota, where = tightest(root, own) or (None, None)
    allowed = mine if quota is None else max(1, min(mine, math.floor(quota)))
    busy = busy_elsewhere(load)
    said = (f"{mine} of the host's {machine} CPU{'s' if machine != 1 else ''} by affinity, "
            + (f"a cgroup quota of {quota:g} ({where})" if quota is not None else "no cgroup quota"))
    if mine < machine or (quota is not None and quota < machine):
        return allowed, f"{said}: the job's own, the host's load ({busy:.1f}) not counted"
    free = max(1, min(allowed, math.floor(allowed - busy + 0.5)))
    return free, f"{said}, {busy:.1f} busy with other work (load average)"


def choose(given: Optional[int] = None, env: Optional[Mapping[str, str]] = None, **sources
           ) -> Tuple[Optional[int], str]:
    """(threads to set, why): --threads when given; None (torch keeps what it read) where OMP_NUM_THREADS is set,
    as the user set it; else `available`."""
    omp = (os.environ if env is None else env).get("OMP_NUM_THREADS")
    if given:
        return given, "--threads"
    if omp:
        return None, f"OMP_NUM_THREADS={omp}"
    return available(**sources)


def apply(given: Optional[int] = None) -> None:
    """Set torch's CPU threads for the run (`choose`) and say how many, and why, in one line."""
    count, why = choose(given)
    import torch  # the run's first import of torch: the flags and files have passed by now

    if count is not None:
        torch.set_num_threads(count)
    log.info(f"threads: {torch.get_num_threads()} ({why}; --threads N sets them)")
