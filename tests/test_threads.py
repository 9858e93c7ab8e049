"""The run's CPU threads (debate/pipeline/threads.py): what the process may use (affinity, cgroup quota) less what
other work keeps busy, --threads and OMP_NUM_THREADS first."""
import pytest

from debate.pipeline import threads


def quiet():
    return (0.0, 0.0, 0.0)


def test_a_cgroup_v2_quota_caps_the_threads(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert threads.cgroup_quota(tmp_path, own="") == 1.5
    count, why = threads.available(tmp_path, cpus=lambda: 16, load=quiet, own="")
    assert count == 2 and why.startswith("16 CPUs by affinity, a cgroup quota of 1.5, 0.0 busy")
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert threads.cgroup_quota(tmp_path, own="") is None
    assert threads.available(tmp_path, cpus=lambda: 16, load=quiet, own="")[0] == 16


def test_a_slurm_jobs_own_cgroup_is_read_before_the_root(tmp_path):
    job = tmp_path / "slurm" / "job_7"
    job.mkdir(parents=True)
    (job / "cpu.max").write_text("400000 100000\n")
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert threads.cgroup_quota(tmp_path, own="0::/slurm/job_7\n") == 4.0


def test_a_cgroup_v1_quota_and_its_no_quota(tmp_path):
    cpu = tmp_path / "cpu"
    cpu.mkdir()
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    (cpu / "cpu.cfs_quota_us").write_text("200000\n")
    assert threads.cgroup_quota(tmp_path, own="3:cpu,cpuacct:/\n") == 2.0
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")
    assert threads.cgroup_quota(tmp_path, own="") is None


def test_cores_other_work_keeps_busy_are_left_to_it(tmp_path):
    """Issue 54: two processes kept both cores of a 2-core machine busy; torch's 2 threads ran the demo 10x slower than
    one thread did."""
    assert threads.available(tmp_path, cpus=lambda: 2, load=lambda: (2.1, 1.0, 0.5), own="")[0] == 1
    assert threads.available(tmp_path, cpus=lambda: 8, load=lambda: (2.6, 1.0, 0.5), own="")[0] == 5
    assert threads.available(tmp_path, cpus=lambda: 2, load=lambda: (9.0, 9.0, 9.0), own="")[0] == 1  # at least one


@pytest.mark.parametrize("given, env, expected", [(3, {"OMP_NUM_THREADS": "1"}, 3), (None, {"OMP_NUM_THREADS": "1"},
                                                                                        None)])
def test_the_flag_wins_then_omp_num_threads(tmp_path, given, env, expected):
    count, why = threads.choose(given, env=env, root=tmp_path, cpus=lambda: 4, load=quiet, own="")
    assert count == expected and why == ("--threads" if given else "OMP_NUM_THREADS=1")
    assert threads.choose(None, env={}, root=tmp_path, cpus=lambda: 4, load=quiet, own="")[0] == 4
