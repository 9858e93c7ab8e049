"""The run's CPU threads (debate/pipeline/threads.py): the job's allocation (affinity, capped by the tightest cgroup
quota of its cgroup and every cgroup above it); the host's load only where the process may use the whole host;
--threads and OMP_NUM_THREADS first. Cgroup trees are fakes in tmp_path, affinity, host and load are given."""
import importlib.util
import logging
from pathlib import Path

import pytest

from debate.pipeline import threads


def files(root, **paths):
    """Write a fake cgroup tree: files(root, **{"slurm/cpu.max": "200000 100000"})."""
    for path, text in paths.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text + "\n")
    return root


def loaded(busy):
    return lambda: (busy, busy, busy)


def run(root, own="", affinity=16, host=16, busy=0.0):
    return threads.available(root, cpus=lambda: affinity, load=loaded(busy), own=own, host=lambda: host)


def test_a_limit_on_a_parent_cgroup_binds_a_child_whose_own_says_max(tmp_path):
    """The issue's case: the process's cgroup says "max", its parent allows 2 CPUs; only the nearest level and the
    root were read, so it read as no quota and took all 16 CPUs."""
    files(tmp_path, **{"slurm/cpu.max": "200000 100000", "slurm/job_7/cpu.max": "max 100000",
                       "slurm/job_7/step_0/cpu.max": "max 100000"})
    own = "0::/slurm/job_7/step_0\n"
    assert threads.cgroup_quota(tmp_path, own=own) == 2.0
    count, why = run(tmp_path, own, busy=30.0)
    assert count == 2
    assert why == (f"16 of the host's 16 CPUs by affinity, a cgroup quota of 2 ({tmp_path}/slurm/cpu.max): the job's "
                   "own, the host's load (30.0) not counted")


def test_the_tightest_level_wins_not_the_nearest_one_that_has_a_quota(tmp_path):
    files(tmp_path, **{"cpu.max": "max 100000", "a/cpu.max": "100000 100000", "a/b/cpu.max": "600000 100000",
                       "a/b/c/cpu.max": "max 100000", "elsewhere/cpu.max": "50000 100000"})
    found = threads.quotas(tmp_path, own="0::/a/b/c\n")
    assert found == [(6.0, tmp_path / "a/b/cpu.max"), (1.0, tmp_path / "a/cpu.max")]  # a sibling's is not ours
    assert threads.cgroup_quota(tmp_path, own="0::/a/b/c\n") == 1.0
    assert run(tmp_path, "0::/a/b/c\n")[0] == 1
    # periods differ between levels: each level's quota over its own period
    files(tmp_path, **{"a/cpu.max": "max 100000", "a/b/c/cpu.max": "1500000 500000"})
    assert threads.cgroup_quota(tmp_path, own="0::/a/b/c\n") == 3.0


def test_a_cgroup_v1_tree_is_read_at_every_level(tmp_path):
    """SLURM's v1 layout: the job's step says -1 (none), the job above it allows 4 CPUs."""
    job = "cpu,cpuacct/slurm/uid_1000/job_7"
    files(tmp_path, **{f"{job}/cpu.cfs_quota_us": "400000", f"{job}/cpu.cfs_period_us": "100000",
                       f"{job}/step_0/cpu.cfs_quota_us": "-1", f"{job}/step_0/cpu.cfs_period_us": "100000",
                       "cpu,cpuacct/cpu.cfs_quota_us": "-1", "cpu,cpuacct/cpu.cfs_period_us": "100000",
                       "memory/slurm/uid_1000/job_7/memory.limit_in_bytes": "1000000"})
    own = "5:memory:/slurm/uid_1000/job_7\n4:cpu,cpuacct:/slurm/uid_1000/job_7/step_0\n1:name=systemd:/x\n"
    assert threads.cgroup_quota(tmp_path, own=own) == 4.0
    assert run(tmp_path, own, busy=30.0)[0] == 4
    # a v1 mount named "cpu" alone (as on hosts that mount cpu and cpuacct apart), quota at its root only
    files(tmp_path / "alone", **{"cpu/cpu.cfs_quota_us": "250000", "cpu/cpu.cfs_period_us": "100000",
                                 "cpuacct/cpu.cfs_quota_us": "100000", "cpuacct/cpu.cfs_period_us": "100000"})
    assert threads.cgroup_quota(tmp_path / "alone", own="2:cpuacct:/\n1:cpu:/\n") == 2.5  # cpuacct is not cpu


def test_no_cgroup_files_at_all_is_no_quota(tmp_path):
    assert threads.cgroup_quota(tmp_path / "absent", own="garbage\n0::/x/y\n3:cpu:/z\n") is None
    assert threads.cgroup_quota(tmp_path, own="") is None
    files(tmp_path, **{"x/cpu.max": "not a quota", "cpu/cpu.cfs_quota_us": "", "cpu/cpu.cfs_period_us": "100000"})
    assert threads.cgroup_quota(tmp_path, own="0::/x\n3:cpu:/\n") is None  # unreadable values are no quota
    # a cgroup outside the namespace (/proc/self/cgroup says "/../.."): nothing above the mount is read
    files(tmp_path / "ns", **{"cpu.max": "max 100000"})
    files(tmp_path, **{"cpu.max": "100000 100000"})
    assert threads.cgroup_quota(tmp_path / "ns", own="0::/../ns\n") is None
    count, why = run(tmp_path / "absent", "0::/x/y\n", affinity=4, host=4)
    assert count == 4 and why == "4 of the host's 4 CPUs by affinity, no cgroup quota, 0.0 busy with other work " \
                                 "(load average)"


def test_an_affinity_narrower_than_the_host_is_the_jobs_and_the_hosts_load_is_not_counted(tmp_path):
    """The issue's case: a job with 8 CPUs of its own (cpuset) on a shared 64-core node with load 30 took 1 thread."""
    count, why = run(tmp_path, affinity=8, host=64, busy=30.0)
    assert count == 8
    assert why == ("8 of the host's 64 CPUs by affinity, no cgroup quota: the job's own, the host's load (30.0) not "
                   "counted")
    assert run(tmp_path, affinity=8, host=64, busy=200.0)[0] == 8
    assert run(tmp_path, affinity=1, host=64, busy=0.0)[0] == 1


def test_a_quota_smaller_than_the_affinity_caps_it_rounded_down(tmp_path):
    files(tmp_path, **{"job/cpu.max": "250000 100000"})
    assert run(tmp_path, "0::/job\n", affinity=16, host=64)[0] == 2  # 2.5 CPUs: 2 threads never outrun the quota
    files(tmp_path, **{"job/cpu.max": "50000 100000"})
    assert run(tmp_path, "0::/job\n", affinity=16, host=64)[0] == 1  # half a CPU: still one thread
    files(tmp_path, **{"job/cpu.max": "3200000 100000"})
    assert run(tmp_path, "0::/job\n", affinity=16, host=64)[0] == 16  # a quota above the affinity: the affinity


def test_a_quota_is_the_jobs_own_and_the_hosts_load_is_not_counted(tmp_path):
    """Every CPU by affinity, a quota of 8 of the node's 64, load 30: 8 (the quota), not 64 - 30 nor 8 - 30."""
    files(tmp_path, **{"pod/cpu.max": "800000 100000"})
    count, why = run(tmp_path, "0::/pod\n", affinity=64, host=64, busy=30.0)
    assert count == 8 and why.endswith(": the job's own, the host's load (30.0) not counted")
    assert run(tmp_path, "0::/pod\n", affinity=64, host=64, busy=63.0)[0] == 8


@pytest.mark.parametrize("affinity, busy, expected", [(64, 30.0, 34), (64, 29.6, 34), (64, 29.4, 35), (64, 70.0, 1),
                                                      (2, 2.1, 1), (8, 2.6, 5), (2, 9.0, 1), (4, 0.0, 4)])
def test_the_whole_host_leaves_what_other_work_keeps_busy(tmp_path, affinity, busy, expected):
    """No allocation of its own (every CPU of the host, no quota): the host's CPUs less those other work keeps busy,
    rounded to the nearest, at least 1. Issue 54: two processes kept both cores of a 2-core machine busy; torch's 2
    threads ran the demo 10x slower than one thread did."""
    count, why = run(tmp_path, affinity=affinity, host=affinity, busy=busy)
    assert count == expected and why.endswith(f", {busy:.1f} busy with other work (load average)")


def test_a_quota_not_below_the_hosts_cpus_is_no_allocation(tmp_path):
    """A container "limited" to every CPU of its host shares that host like any other process: its load counts."""
    files(tmp_path, **{"box/cpu.max": "6400000 100000"})
    count, why = run(tmp_path, "0::/box\n", affinity=64, host=64, busy=30.0)
    assert count == 34 and why.startswith(f"64 of the host's 64 CPUs by affinity, a cgroup quota of 64 ({tmp_path}")


@pytest.mark.parametrize("given, env, expected, why", [
    (3, {"OMP_NUM_THREADS": "1"}, 3, "--threads"),
    (12, {}, 12, "--threads"),  # more than the allocation: the user's word
    (None, {"OMP_NUM_THREADS": "1"}, None, "OMP_NUM_THREADS=1"),
    (None, {}, 2, None)])
def test_the_flag_wins_then_omp_num_threads_then_the_allocation(tmp_path, given, env, expected, why):
    files(tmp_path, **{"job/cpu.max": "200000 100000"})
    count, said = threads.choose(given, env=env, root=tmp_path, cpus=lambda: 8, load=loaded(0.0), own="0::/job\n",
                                 host=lambda: 8)
    assert count == expected and said == (why or said) and (why or "quota of 2") in said


@pytest.mark.parametrize("chosen, why", [(1, "8 of the host's 64 CPUs by affinity, ..."), (None, "OMP_NUM_THREADS=3")])
def test_the_threads_line_says_what_torch_runs(monkeypatch, caplog, chosen, why):
    """The run's `threads:` line reports torch's count once set (the one it read from OMP_NUM_THREADS where `choose`
    leaves it), and the reason `choose` gave."""
    import torch

    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "choose", lambda given: (chosen, why))
    try:
        torch.set_num_threads(3)  # what torch read at import, say: neither the choice nor this machine's default
        with caplog.at_level(logging.INFO, logger=threads.__name__):
            threads.apply(None)
        runs = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert runs == (chosen or 3)
    assert caplog.messages == [f"threads: {runs} ({why}; --threads N sets them)"]


def test_the_benchmarks_table_is_the_choice_made_now():
    """docs/BENCHMARKS.md's "Issue 60: threads" table: its rows (less the commit before's column) are what
    bench/threads_table.py prints from this module today, so a change of the rule shows there or fails here."""
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("_threads_table", root / "bench/threads_table.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    shown = (root / "docs/BENCHMARKS.md").read_text().split("<!-- bench/threads_table.py -->\n")[1]
    rows = shown.split("\n<!-- end -->")[0].splitlines()
    assert [row.rsplit("|", 2)[0] + "|" for row in rows] == script.table().splitlines()
