"""The RAM this process may still take before the kernel kills it: the memory budget's measure on a CPU.

On a CPU nothing raises an out-of-memory error a batch could be split on: past the limit the kernel's OOM
killer ends the process (exit 137, no message). So batches are sized before they run from what is left:
the kernel's MemAvailable (free memory plus the cache it can drop), or less where the process's cgroup
(a batch scheduler's job, a container) has a memory limit closer to its usage. Linux only; elsewhere the
free physical pages from sysconf, or nothing known.
"""
import os
from pathlib import Path

# cgroup v1's "no limit" is a huge page-aligned number; anything above this is no limit in practice.
NO_LIMIT = 1 << 60


def available(meminfo="/proc/meminfo", cgroups="/proc/self/cgroup", root="/sys/fs/cgroup"):
    """Bytes this process can still allocate, or None when nothing says. The arguments are where Linux keeps
    what is read (tests point them at files of their own)."""
    found = [n for n in (_mem_available(meminfo), _cgroup_room(cgroups, root)) if n is not None]
    if not found:
        try:
            found = [os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")]
        except (ValueError, OSError, AttributeError):
            return None
    return max(0, min(found))


def _mem_available(meminfo):
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # given in kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read_int(path):
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return None if text == "max" or not text.lstrip("-").isdigit() else int(text)


def _stat(path, key):
    try:
        for line in Path(path).read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _cgroup_room(cgroups, root):
    """The least room (limit - usage, reclaimable file cache not counted as used) of the memory cgroup this
    process is in and of every cgroup above it: a scheduler may set the limit on the job, not the step."""
    try:
        lines = Path(cgroups).read_text().splitlines()
    except OSError:
        return None
    root = Path(root)
    places = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy
            places.append((root, path, "memory.max", "memory.current", "inactive_file"))
        elif "memory" in controllers.split(","):  # v1: the memory controller's own hierarchy
            places.append((root / "memory", path, "memory.limit_in_bytes", "memory.usage_in_bytes",
                           "total_inactive_file"))
    rooms = []
    for mount, path, limit_file, usage_file, cache_key in places:
        here = mount / path.lstrip("/")
        while True:
            limit, usage = _read_int(here / limit_file), _read_int(here / usage_file)
            if limit is not None and usage is not None and limit < NO_LIMIT:
                rooms.append(limit - max(0, usage - _stat(here / "memory.stat", cache_key)))
            if here == mount or mount not in here.parents:
                break
            here = here.parent
    return min(rooms) if rooms else None
