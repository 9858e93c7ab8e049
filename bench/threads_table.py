"""The run's CPU threads under each allocation and load (debate/pipeline/threads.py), on fake cgroup trees: no
timing, only the choice `threads.available` makes for a process with this affinity, these cgroups and this load.

    python bench/threads_table.py                                   # the table, as docs/BENCHMARKS.md has it
    git show e09519c:debate/pipeline/threads.py > /tmp/threads_before.py
    python bench/threads_table.py --before /tmp/threads_before.py   # beside the choice of another copy of the module

Each case writes its cgroup files in a folder of its own (cgroup v2's cpu.max, v1's cpu.cfs_quota_us and
cpu.cfs_period_us), names the process's cgroup as /proc/self/cgroup would, and gives the affinity, the host's CPUs
and the load average as the OS would. `--threads N` and OMP_NUM_THREADS are not in it: they win over all of it.
"""
import argparse
import importlib.util
import inspect
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from debate.pipeline import threads  # noqa: E402

V1_STEP = "cpu,cpuacct/slurm/uid_1000/job_7"
# (the process, its affinity, the host's CPUs, cgroup files, /proc/self/cgroup, quotas said in the table, load)
CASES = [
    ("workstation, idle", 16, 16, {}, "0::/user.slice\n", "none", 0.5),
    ("workstation, other work running", 16, 16, {}, "0::/user.slice\n", "none", 12.0),
    ("issue 54: 2 cores, both kept busy", 2, 2, {}, "0::/\n", "none", 2.1),
    ("whole host, overloaded", 64, 64, {}, "0::/\n", "none", 70.0),
    ("SLURM job, cpuset of 8, quiet node", 8, 64, {}, "0::/slurm/job_7\n", "none", 0.0),
    ("SLURM job, cpuset of 8, shared node", 8, 64, {}, "0::/slurm/job_7\n", "none", 30.0),
    ("cpuset of 8 and a quota of 4", 8, 64, {"slurm/job_7/cpu.max": "400000 100000"}, "0::/slurm/job_7\n", "4",
     30.0),
    ("container, quota of 8 (v2)", 64, 64, {"pod/cpu.max": "800000 100000"}, "0::/pod\n", "8", 30.0),
    ("v2 nested: own max under a parent of 2, quiet", 64, 64,
     {"slurm/cpu.max": "200000 100000", "slurm/job_7/cpu.max": "max 100000"}, "0::/slurm/job_7\n", "max, then 2",
     0.0),
    ("v2 nested: own max under a parent of 2, shared", 64, 64,
     {"slurm/cpu.max": "200000 100000", "slurm/job_7/cpu.max": "max 100000"}, "0::/slurm/job_7\n", "max, then 2",
     30.0),
    ("v1 nested: step -1 under a job of 4", 64, 64,
     {f"{V1_STEP}/cpu.cfs_quota_us": "400000", f"{V1_STEP}/cpu.cfs_period_us": "100000",
      f"{V1_STEP}/step_0/cpu.cfs_quota_us": "-1", f"{V1_STEP}/step_0/cpu.cfs_period_us": "100000"},
     "4:cpu,cpuacct:/slurm/uid_1000/job_7/step_0\n", "-1, then 4", 30.0),
    ("container, quota of 1.5", 16, 64, {"pod/cpu.max": "150000 100000"}, "0::/pod\n", "1.5", 0.0),
    ("container, quota of 2.5", 16, 64, {"pod/cpu.max": "250000 100000"}, "0::/pod\n", "2.5", 0.0),
    ("container, quota of the whole host", 64, 64, {"pod/cpu.max": "6400000 100000"}, "0::/pod\n", "64", 30.0),
]


def choice(module, case, folder):
    """The threads `module`'s `available` picks for `case`, its cgroup files written under `folder`."""
    _, mine, host, files, own, _, busy = case
    for path, text in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text + "\n")
    sources = dict(cpus=lambda: mine, load=lambda: (busy, busy, busy), own=own)
    if "host" in inspect.signature(module.available).parameters:  # copies before issue 60 took no host
        sources["host"] = lambda: host
    return module.available(folder, **sources)[0]


def table(before=None, before_name="before"):
    """The markdown table: one row a case, the threads `threads.available` picks (and `before`'s, given one)."""
    head = "| the process | CPUs by affinity | cgroup quotas, own first | load average | threads |"
    rule = "|---|---:|---|---:|---:|"
    if before is not None:
        head, rule = head + f" {before_name} |", rule + "---:|"
    rows = [head, rule]
    for case in CASES:
        name, mine, host, _, _, quotas, busy = case
        with tempfile.TemporaryDirectory() as folder:
            row = f"| {name} | {mine} of {host} | {quotas} | {busy:g} | {choice(threads, case, Path(folder))} |"
        if before is not None:
            with tempfile.TemporaryDirectory() as folder:
                row += f" {choice(before, case, Path(folder))} |"
        rows.append(row)
    return "\n".join(rows)


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", help="another copy of debate/pipeline/threads.py, its choice in a last column")
    return p


def main():
    args = build_parser().parse_args()
    before = None
    if args.before:
        spec = importlib.util.spec_from_file_location("_threads_before", args.before)
        before = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(before)
    print(table(before, "before"))


if __name__ == "__main__":
    main()
