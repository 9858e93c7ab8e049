"""A machine without WordNet: every run does its work and scores all it can; the METEOR-based scores are saved
as not computed (null, never 0) and the same command, once WordNet is visible, adds them without debating again.

WordNet is hidden for real, not mocked: DEBATECV_WORDNET_DIR names the only place the lookup (eval/wordnet.py)
looks at, and it points at an empty directory, so the copy that CI installs with apt is never found.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import run_debate
from debate.data import averitec as demo_data, claims as claim_data
from debate.engine import models
from debate.pipeline import records
from eval import averitec, wordnet
from tests.tiny_models import build_tiny_llama, missing

ROOT = Path(__file__).resolve().parents[1]
METEOR_KEYS = ("averitec", "evidence_score_mean", "justification_meteor")


def _wordnet_visible():
    wordnet.load_wordnet.cache_clear()
    try:
        wordnet.load_wordnet()
    except wordnet.WordNetMissingError as err:
        missing(str(err))


def _assert_not_computed(metrics):
    assert metrics["accuracy"] is not None and metrics["macro_f1"] is not None and metrics["confusion"]
    assert metrics["averitec"] and all(v is None for v in metrics["averitec"].values())
    assert metrics["evidence_score_mean"] is None and metrics["justification_meteor"] is None
    assert set(METEOR_KEYS) <= set(metrics["not_computed"])


def _assert_computed(metrics):
    assert "not_computed" not in metrics
    assert all(isinstance(v, float) for v in metrics["averitec"].values())
    assert isinstance(metrics["evidence_score_mean"], float) and metrics["evidence_score_mean"] > 0


@pytest.fixture
def hidden(tmp_path, monkeypatch):
    """WordNet hidden from this process: the lookup may only look in an empty directory."""
    empty = tmp_path / "no-wordnet"
    empty.mkdir()
    monkeypatch.setenv("DEBATECV_WORDNET_DIR", str(empty))
    wordnet.load_wordnet.cache_clear()
    yield empty
    monkeypatch.delenv("DEBATECV_WORDNET_DIR", raising=False)
    wordnet.load_wordnet.cache_clear()


def test_an_empty_wordnet_dir_hides_every_other_copy(hidden):
    reason = wordnet.missing_reason()
    assert reason and str(hidden) in reason and "DEBATECV_WORDNET_DIR" in reason
    with pytest.raises(wordnet.WordNetMissingError):
        wordnet.load_wordnet()


def test_a_run_without_wordnet_scores_the_rest_and_the_same_command_adds_meteor(tmp_path, capsys, monkeypatch,
                                                                               hidden):
    tiny = str(build_tiny_llama(tmp_path / "tiny", seed=0))

    def argv(out):
        return ["--split", "demo", "--evidence", "golden", "--model", tiny, "--max-new-tokens", "4",
                "--max-rounds", "1", "--batch-size", "2", "--limit", "2", "--output-dir", str(out),
                "--no-structured", "--temperature", "0"]

    late = tmp_path / "late"
    run_debate.main(argv(late))
    printed = capsys.readouterr().out
    # Said before any weight loads (the "N claims, ... to go" line comes before the load), and in the summary.
    assert printed.index("note: WordNet directory") < printed.index("claims, 0 already done")
    summary_line = [line for line in printed.splitlines() if line.startswith("not computed:")]
    assert len(summary_line) == 1 and "run the same command again" in summary_line[0]
    assert "docs/wordnet.md" in summary_line[0]
    _assert_not_computed(json.loads((late / records.METRICS).read_text()))
    assert len((late / "predictions.jsonl").read_text().splitlines()) == 2

    # WordNet visible again: the same command loads no model, debates nothing and fills in the scores.
    monkeypatch.delenv("DEBATECV_WORDNET_DIR")
    _wordnet_visible()
    predictions = (late / "predictions.jsonl").read_bytes()
    with monkeypatch.context() as m:
        m.setattr(models, "load_roles", lambda *a, **k: pytest.fail("a rescore loaded a model"))
        run_debate.main(argv(late))
    assert (late / "predictions.jsonl").read_bytes() == predictions
    rescored = json.loads((late / records.METRICS).read_text())
    _assert_computed(rescored)

    # ... and they are those of a run that had WordNet from the start.
    early = tmp_path / "early"
    run_debate.main(argv(early))
    assert rescored == json.loads((early / records.METRICS).read_text())


def test_scoring_without_wordnet_never_saves_meteor_as_zero(hidden):
    claims = demo_data.load_split("demo", None)[:2]
    predictions = [{"claim_id": c["claim_id"], "label": c["label"], "justification": "because",
                    "evidence": [{"question": "q", "answer": "a"}]} for c in claims]
    metrics = averitec.score(predictions, claims)
    _assert_not_computed(metrics)
    assert metrics["accuracy"] == 1.0
    with pytest.raises(wordnet.WordNetMissingError):  # asked for explicitly, it is refused, not faked
        averitec.score(predictions, claims, meteor=True)


def test_the_check_command_says_where_wordnet_is_and_whether_meteor_runs(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), DEBATECV_WORDNET_DIR=str(tmp_path))
    hidden_run = subprocess.run([sys.executable, "-m", "eval.meteor"], env=env, capture_output=True, text=True)
    assert hidden_run.returncode == 1 and "not found" in hidden_run.stdout and str(tmp_path) in hidden_run.stdout
    env.pop("DEBATECV_WORDNET_DIR")
    _wordnet_visible()
    found = subprocess.run([sys.executable, "-m", "eval.meteor"], env=env, capture_output=True, text=True)
    assert found.returncode == 0, found.stdout + found.stderr
    assert "0.9815" in found.stdout.splitlines()[1]


@pytest.mark.slow
def test_the_readme_demo_runs_without_wordnet_and_a_rerun_adds_its_meteor_scores(tmp_path):
    """The README's demo command, as a new user types it, on a machine where no WordNet can be found."""
    empty = tmp_path / "no-wordnet"
    empty.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT), DEBATECV_WORDNET_DIR=str(empty))
    env.pop("PYTHONWARNINGS", None)
    command = [sys.executable, str(ROOT / "run_debate.py"), "--split", "demo", "--limit", "3"]
    work = tmp_path / "work"
    work.mkdir()
    first = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    out = work / "runs" / "demo-golden-debatecv"
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 3
    assert "not computed:" in first.stdout and first.stdout.rstrip().splitlines()[-1].startswith("next: ")
    _assert_not_computed(json.loads((out / records.METRICS).read_text()))
    # No deprecation warning of transformers on a model call (the cache argument's name, for one).
    assert "FutureWarning" not in first.stderr and "DeprecationWarning" not in first.stderr

    env.pop("DEBATECV_WORDNET_DIR")
    _wordnet_visible()
    second = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "3 claims, 3 already done" in second.stdout and "not computed:" not in second.stdout
    rescored = json.loads((out / records.METRICS).read_text())
    _assert_computed(rescored)
    # A run that had WordNet from the start scores these predictions with the same scorer call (scoring.finish).
    claims = demo_data.load_split("demo", None)[:3]
    submission = json.loads((out / records.SUBMISSION).read_text())
    expected = averitec.score(submission, claim_data.as_references(claims), meteor=True)
    assert rescored["averitec"] == expected["averitec"]
    assert rescored["evidence_score_mean"] == pytest.approx(expected["evidence_score_mean"])
    assert rescored["justification_meteor"] == expected["justification_meteor"]
