"""Many processes, one run (debate/pipeline/shards.py): the split, the merge, and a real two-process torchrun on CPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import run_debate
from debate.engine import models
from debate.pipeline import records, shards
from debate.pipeline.config import ConfigError
from debate.pipeline.shards import World
from tests.conftest import run_argv

ROOT = Path(__file__).resolve().parents[1]


def argv(model, out, *extra):
    # Greedy, so the sharded run is compared with the one-process run line for line.
    return run_argv(model, out, *extra, limit=5, temperature=0)


def read(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def by_id(rows):
    # encoded_tokens counts a batch's shared prompt prefix once per batch: it follows the batching, which
    # sharding changes; every other field (label, justification, every turn) must be the same.
    return {r["claim_id"]: {k: v for k, v in r.items() if k != "encoded_tokens"} for r in rows}


def test_world_comes_from_the_launchers_variables():
    assert shards.world({}) == World(0, 1, 0)
    assert shards.world({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"}) == World(3, 4, 1)
    for bad in ({"WORLD_SIZE": "two"}, {"WORLD_SIZE": "2", "RANK": "2"}):
        with pytest.raises(ConfigError):
            shards.world(bad)


def test_split_gives_every_claim_to_one_rank_and_keeps_it_there_under_another_limit():
    claims = list(range(11))
    parts = [shards.split(claims, World(r, 3)) for r in range(3)]
    assert sorted(sum(parts, [])) == claims and parts[1] == [1, 4, 7, 10]
    # --limit keeps a prefix: a claim stays in its shard, so a resumed shard finds its own claims done.
    assert all(set(shards.split(claims[:7], World(r, 3))) <= set(parts[r]) for r in range(3))


def write_shard(out, w, ids):
    d = shards.shard_dir(out, w)
    d.mkdir(parents=True)
    (d / records.PREDICTIONS).write_text("".join(json.dumps({"claim_id": i, "label": "Refuted"}) + "\n" for i in ids))
    (d / records.TRANSCRIPTS).write_text("".join(json.dumps({"claim_id": i, "turns": []}) + "\n" for i in ids))


def test_merge_writes_one_line_per_claim_of_every_shard(tmp_path):
    write_shard(tmp_path, World(0, 2), [0, 2, 4])
    write_shard(tmp_path, World(1, 2), [1, 3])
    shards.merge(tmp_path, 2)
    for name in (records.PREDICTIONS, records.TRANSCRIPTS):
        assert sorted(r["claim_id"] for r in read(tmp_path / name)) == [0, 1, 2, 3, 4]
    shards.merge(tmp_path, 2)  # merging again (a resumed run) rewrites, never appends
    assert len(read(tmp_path / records.PREDICTIONS)) == 5


def test_another_process_count_is_refused_and_overwrite_clears_it(tmp_path):
    write_shard(tmp_path, World(0, 2), [0])
    shards.check(tmp_path, 2)
    for size in (1, 3):
        with pytest.raises(records.RunConflict, match="2 processes, not %d" % size):
            shards.check(tmp_path, size)
    shards.check(tmp_path, 3, overwrite=True)
    shards.clear(tmp_path, keep=3)
    assert shards.counts(tmp_path) == set()
    one = tmp_path / "one"
    one.mkdir()
    (one / records.PREDICTIONS).write_text('{"claim_id": 0}\n')
    with pytest.raises(records.RunConflict, match="one-process run"):
        shards.check(one, 2)


def test_device_map_auto_is_refused_under_torchrun(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as stop:
        run_debate.main(argv(tiny, tmp_path / "run", "--device-map", "auto"))
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --device-map auto") and "\n" not in err
    assert not (tmp_path / "run").exists()
    with pytest.raises(SystemExit):
        run_debate.parse_args(argv(tiny, tmp_path / "run", "--device-map", "balanced"))


def test_device_map_reaches_the_loader_and_a_cpu_ignores_it(tiny):
    assert run_debate.parse_args(argv(tiny, "x", "--device-map", "auto")).models.device_map == "auto"
    assert run_debate.parse_args(argv(tiny, "x")).models.device_map is None
    loaded = models.load_model(tiny, device_map="auto")
    assert loaded.device == "cpu" and next(loaded.model.parameters()).device.type == "cpu"


def test_device_map_auto_asks_transformers_to_spread_the_model_on_cuda(monkeypatch):
    import torch

    # No GPU here: the from_pretrained arguments chosen for CUDA, without loading anything.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    cuda = torch.device("cuda", 0)
    assert models._load_settings(cuda, None, False, "m", "auto")[0]["device_map"] == "auto"
    assert models._load_settings(cuda, None, False, "m")[0]["device_map"] == {"": cuda}
    assert "device_map" not in models._load_settings(torch.device("cpu"), None, False, "m", "auto")[0]


def torchrun(model, out, *extra):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
                           "run_debate.py", *argv(model, out, *extra)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_two_processes_equal_one_and_resume_redoes_only_the_missing_claim(tiny, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    metrics = run_debate.main(argv(tiny, one))
    torchrun(tiny, two)

    rank0, rank1 = (shards.shard_dir(two, World(r, 2)) for r in range(2))
    assert sorted(p["claim_id"] for p in read(rank1 / records.PREDICTIONS)) == [1, 3]
    for name in (records.PREDICTIONS, records.TRANSCRIPTS):
        merged = read(two / name)
        assert len(merged) == 5 and by_id(merged) == by_id(read(one / name))
    assert json.loads((two / records.METRICS).read_text()) == metrics
    assert json.loads((two / records.CONFIG).read_text())["shards"] == 2
    submitted = {s["claim_id"]: (s["pred_label"], s["justification"]) for s in
                 json.loads((two / records.SUBMISSION).read_text())}
    assert submitted == {s["claim_id"]: (s["pred_label"], s["justification"]) for s in
                         json.loads((one / records.SUBMISSION).read_text())}

    # Rank 1 was killed before its last claim was written: the rerun redoes that claim, and only it.
    kept0 = (rank0 / records.PREDICTIONS).read_text()
    for name in (records.PREDICTIONS, records.TRANSCRIPTS):
        lines = (rank1 / name).read_text().splitlines(keepends=True)
        (rank1 / name).write_text("".join(lines[:-1]))
    kept1 = (rank1 / records.PREDICTIONS).read_text()
    torchrun(tiny, two)
    assert (rank0 / records.PREDICTIONS).read_text() == kept0
    after = (rank1 / records.PREDICTIONS).read_text()
    assert after.startswith(kept1) and len(after.splitlines()) == 2
    for name in (records.PREDICTIONS, records.TRANSCRIPTS):
        merged = read(two / name)
        assert len(merged) == 5 and by_id(merged) == by_id(read(one / name))
    assert json.loads((two / records.METRICS).read_text()) == metrics

    # One process on a two-process directory: refused in one line, nothing changed.
    with pytest.raises(SystemExit) as stop:
        run_debate.main(argv(tiny, two))
    assert stop.value.code == 2


def test_a_killed_two_process_run_resumes_to_the_one_process_result(tiny, tmp_path):
    import signal
    import time

    # One claim at a time per rank, so that when the first line is on disk most claims are still to go: with all
    # of them in flight at once they end within a few milliseconds of each other, faster than the kill.
    slow = ("--limit", "8", "--max-new-tokens", "40", "--max-rounds", "2", "--batch-size", "1")
    one, two = tmp_path / "one", tmp_path / "two"
    run_debate.main(argv(tiny, one) + list(slow))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        env.pop(name, None)
    launch = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
                               "run_debate.py", *argv(tiny, two), *slow], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    shard_files = [shards.shard_dir(two, World(r, 2)) / records.PREDICTIONS for r in range(2)]
    deadline = time.time() + 600
    while time.time() < deadline and not any(f.exists() and f.read_text().strip() for f in shard_files):
        time.sleep(0.05)
    os.killpg(launch.pid, signal.SIGKILL)  # every process of the launch, mid-claim, as a node loss would
    launch.wait()
    written = sum(len(f.read_text().splitlines()) for f in shard_files if f.exists())
    assert 1 <= written < 8 and not (two / records.PREDICTIONS).exists()

    torchrun(tiny, two, *slow)
    for name in (records.PREDICTIONS, records.TRANSCRIPTS):
        merged = read(two / name)
        assert len(merged) == 8 and by_id(merged) == by_id(read(one / name))
