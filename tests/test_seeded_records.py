"""A seed fixes a sampled run's records: each reply draws from a random stream of its own (debate.engine.sampling),
so the same seed gives the same records at any --batch-size, with continuous batching or fixed batches, with or
without the lookahead, and after a kill and a resume; another seed gives other records.

The runs are the tiny random model on the demo claims, sampled at 0.7 with the Moderator's JSON under its schema
(sampled free text, choices and masked text beside free rows).
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import run_debate
from debate.engine import decode_batch
from debate.pipeline import records

ROOT = Path(__file__).resolve().parents[1]


def argv(model, out, *extra, seed=3, batch_size=3):
    return ["--split", "demo", "--evidence", "golden", "--model", model, "--max-new-tokens", "120", "--max-rounds", "2",
            "--temperature", "0.7", "--seed", str(seed), "--batch-size", str(batch_size), "--limit", "3",
            "--output-dir", str(out), *extra]


def claims(out):
    """{claim id: (prediction, transcript)} of a run, less the tokens each encoded (shared pages make that depend on
    the claims run before it)."""
    found = {}
    for name in (records.PREDICTIONS, records.TRANSCRIPTS):
        for line in (Path(out) / name).read_text().splitlines():
            record = json.loads(line)
            record.pop("encoded_tokens", None)  # what the pages of the claims before it saved (kv_pool): history
            found.setdefault(record["claim_id"], []).append(record)
    return {k: tuple(v) for k, v in found.items()}


@pytest.fixture(scope="module")
def whole(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "run"
    run_debate.main(argv(tiny, out))
    return claims(out)


def test_the_records_are_sampled_and_another_seed_gives_others(tiny, whole, tmp_path):
    run_debate.main(argv(tiny, tmp_path / "other", seed=4))
    other = claims(tmp_path / "other")
    assert set(other) == set(whole) and len(whole) == 3
    assert all(other[k] != whole[k] for k in whole)


@pytest.mark.parametrize("batch_size, extra", [(1, []), (2, []), (3, ["--no-continuous"]), (1, ["--no-continuous"])])
def test_the_same_seed_gives_the_same_records_at_any_batch_size_and_batching(tiny, whole, tmp_path, batch_size,
                                                                           extra):
    run_debate.main(argv(tiny, tmp_path / "run", *extra, batch_size=batch_size))
    assert claims(tmp_path / "run") == whole


def test_the_same_records_without_the_lookahead(tiny, whole, tmp_path, monkeypatch):
    """The host reading each step's packet at once (the debugging switch) idles no schema row: the same records."""
    monkeypatch.setattr(decode_batch, "LOOKAHEAD", False)
    run_debate.main(argv(tiny, tmp_path / "run"))
    assert claims(tmp_path / "run") == whole


def test_a_killed_run_resumed_gives_the_uninterrupted_records(tiny, whole, tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with open(tmp_path / "stderr", "w") as stderr:
        run = subprocess.Popen([sys.executable, "run_debate.py", *argv(tiny, out, batch_size=1)], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=stderr)
    predictions = out / records.PREDICTIONS
    try:
        while not (predictions.exists() and predictions.read_text().count("\n") >= 1):
            assert run.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
            time.sleep(0.05)
        os.kill(run.pid, signal.SIGKILL)  # no clean-up: a crash mid-run
    finally:
        run.wait()
    assert 1 <= predictions.read_text().count("\n") < 3
    run_debate.main(argv(tiny, out, batch_size=2))  # resumed, and at another batch size
    assert claims(out) == whole
