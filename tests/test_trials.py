"""--trials (seeds, directories, mean and deviation, resuming), eval.compare over trial sets, --prompts DIR."""
import json
import re
from pathlib import Path

import numpy as np
import pytest

import run_debate
from debate.data import prompts
from debate.pipeline import records, runner
from eval import compare
from eval.averitec import InputError
from tests.tiny_models import build_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny"), seed=0))


@pytest.fixture(autouse=True)
def shipped_prompts():
    yield
    prompts.use_prompt_dir(None)  # a test that set --prompts must not leak it into the next


def argv(model, out, *extra):
    return ["--split", "demo", "--evidence", "golden", "--model", model, "--max-new-tokens", "6",
            "--max-rounds", "1", "--batch-size", "4", "--limit", "4", "--no-structured", "--output-dir", str(out),
            *extra]


def read(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


# --- the summary over trials -----------------------------------------------------------------------

def test_trial_summary_gives_mean_and_sample_deviation_by_hand():
    summary = runner.trial_summary([
        {"n": 4, "accuracy": 0.5, "averitec": {"0.25": 0.25}, "fpr": {"NEE": None}, "evidence_condition": "golden"},
        {"n": 4, "accuracy": 0.75, "averitec": {"0.25": 0.5}, "fpr": {"NEE": 0.1}, "evidence_condition": "golden"},
        {"n": 4, "accuracy": 1.0, "averitec": {"0.25": 0.0}, "fpr": {"NEE": 0.2}, "evidence_condition": "golden"},
    ])
    assert summary["trials"] == 3
    assert summary["accuracy"]["mean"] == pytest.approx(0.75)
    # sample deviation: sqrt(((-0.25)^2 + 0 + 0.25^2) / 2) = 0.25
    assert summary["accuracy"]["std"] == pytest.approx(0.25)
    assert summary["accuracy"]["values"] == [0.5, 0.75, 1.0]
    assert summary["averitec"]["0.25"]["mean"] == pytest.approx(0.25)
    assert summary["averitec"]["0.25"]["std"] == pytest.approx(0.25)
    assert summary["n"] == {"mean": 4, "std": 0.0, "values": [4, 4, 4]}
    assert summary["fpr"]["NEE"] == [None, 0.1, 0.2]  # not a number in every trial: the values as they are
    assert summary["evidence_condition"] == "golden"


# --- the paired bootstrap over claims and trials ---------------------------------------------------

def test_one_trial_bootstraps_exactly_as_the_per_claim_bootstrap():
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 2, 40), rng.integers(0, 2, 40)
    assert compare.paired_bootstrap([a], [b], 500, 3) == compare.paired_bootstrap(a, b, 500, 3)


def test_trial_bootstrap_finds_a_real_difference_and_none_between_equal_sets():
    rng = np.random.default_rng(0)
    b = rng.integers(0, 2, (5, 60)).astype(float)
    a = b.copy()
    a[:, :20] = 1.0  # A gets 20 more claims right than B in every trial, minus those B had right
    better = compare.paired_bootstrap(a, b, 2000, 0)
    assert better["diff"] == pytest.approx((a - b).mean()) and better["diff"] > 0.1
    assert better["p_value"] < 0.01 and better["ci95"][0] > 0
    same = compare.paired_bootstrap(b, b, 500, 0)
    assert same["diff"] == 0 and same["p_value"] == 1.0


def test_trial_variation_widens_the_interval():
    # The same per-claim difference, once stable over trials and once swinging between them.
    steady = np.tile(np.r_[np.ones(30), np.zeros(30)], (4, 1))
    swinging = steady.copy()
    swinging[0] = 1.0
    swinging[1] = 0.0
    zeros = np.zeros_like(steady)
    width = lambda r: r["ci95"][1] - r["ci95"][0]  # noqa: E731
    assert width(compare.paired_bootstrap(swinging, zeros, 2000, 0)) > width(
        compare.paired_bootstrap(steady, zeros, 2000, 0))


def test_compare_trials_refuses_unequal_trial_counts():
    rows = [{"claim_id": 0, "correct": True, "evidence_score": 1.0}]
    with pytest.raises(InputError, match="A has 2 trials and B has 1"):
        compare.compare_trials([rows, rows], [rows])


# --- run_debate.py --trials ------------------------------------------------------------------------

def test_trials_run_each_seed_in_its_own_directory_and_report_mean_and_deviation(tiny, tmp_path, capsys):
    out = tmp_path / "trials"
    summary = run_debate.main(argv(tiny, out, "--trials", "2", "--seed", "5"))
    per_trial = [json.loads((out / f"trial-{k}" / records.METRICS).read_text()) for k in (1, 2)]
    configs = [json.loads((out / f"trial-{k}" / records.CONFIG).read_text()) for k in (1, 2)]
    assert [c["seed"] for c in configs] == [5, 6]
    # The DebateCV paper's sampling is the default, so the two seeds debate differently.
    assert all(c["temperature"] == 0.7 and c["top_p"] == 1.0 for c in configs)
    said = [[t["response"] for row in read(out / f"trial-{k}" / records.TRANSCRIPTS) for t in row["turns"]]
            for k in (1, 2)]
    assert said[0] != said[1]
    saved = json.loads((out / records.METRICS).read_text())
    assert saved == json.loads(json.dumps(summary)) and saved["trials"] == 2
    for key in ("accuracy", "macro_f1"):
        values = [m[key] for m in per_trial]
        assert saved[key]["mean"] == pytest.approx(sum(values) / 2)
        assert saved[key]["std"] == pytest.approx(abs(values[0] - values[1]) / 2 ** 0.5)
    top = json.loads((out / records.CONFIG).read_text())
    assert top["trial_seeds"] == [5, 6] and top["trials"] == 2
    # Each trial resumes on its own: a rerun debates nothing again.
    before = [(out / f"trial-{k}" / records.PREDICTIONS).read_text() for k in (1, 2)]
    capsys.readouterr()
    run_debate.main(argv(tiny, out, "--trials", "2", "--seed", "5"))
    assert capsys.readouterr().out.count("4 already done") == 2
    assert [(out / f"trial-{k}" / records.PREDICTIONS).read_text() for k in (1, 2)] == before
    # A trial set compares with itself: no difference, over both trials.
    result = compare.compare_files(out, out, Path(run_debate.__file__).parent / "debate/data/demo/claims.json",
                                   samples=200)
    assert result["trials"] == 2 and result["n"] == 4
    assert result["accuracy"]["diff"] == 0 and result["accuracy"]["p_value"] == 1.0
    # Golden evidence in the submissions: AVeriTeC equals accuracy, so the evidence was read.
    assert result["averitec@0.25"]["a"] == pytest.approx(result["accuracy"]["a"])
    assert result["accuracy"]["a"] == pytest.approx(saved["accuracy"]["mean"])


def test_greedy_is_one_flag_away(tiny, tmp_path):
    run_debate.main(argv(tiny, tmp_path / "g", "--temperature", "0", "--limit", "1"))
    assert json.loads((tmp_path / "g" / records.CONFIG).read_text())["temperature"] == 0


# --- --prompts DIR ---------------------------------------------------------------------------------

def test_an_override_replaces_the_shipped_prompt_and_is_part_of_the_run_identity(tiny, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "negative_opening.txt").write_text("MY OWN REBUTTAL PROMPT against:\n{opponent_argument}\n")
    out = tmp_path / "run"
    run_debate.main(argv(tiny, out, "--limit", "1", "--prompts", str(mine)))
    turns = read(out / records.TRANSCRIPTS)[0]["turns"]
    assert turns[1]["prompt"].startswith("MY OWN REBUTTAL PROMPT against:\n")
    claim = read(out / records.TRANSCRIPTS)[0]["claim"]
    assert turns[0]["prompt"] == prompts.render("affirmative_opening", claim=claim)  # the others stay shipped
    config = json.loads((out / records.CONFIG).read_text())
    assert config["prompts"] == str(mine) and set(config["prompt_files"]) == {"negative_opening"}
    assert len(config["prompts_hash"]) == 64
    # Changing the file changes the run's identity: resuming into the same directory is refused.
    (mine / "negative_opening.txt").write_text("ANOTHER ONE:\n{opponent_argument}\n")
    with pytest.raises(SystemExit) as stop:
        run_debate.main(argv(tiny, out, "--limit", "2", "--prompts", str(mine)))
    assert stop.value.code == 2 and "prompts_hash" in capsys.readouterr().err


@pytest.mark.parametrize("text, message", [
    ("Opposition: nothing to fill\n", r"negative_opening.txt: missing placeholder\(s\) \{opponent_argument\}"),
    ("{opponent_argument} and {claim}\n", r"negative_opening.txt: unexpected placeholder\(s\) \{claim\}"),
])
def test_an_override_with_the_wrong_placeholders_is_refused_before_any_model_loads(tmp_path, capsys, text, message):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "negative_opening.txt").write_text(text)
    missing_model = tmp_path / "no-such-model"  # loading it would fail: the prompt error must come first
    with pytest.raises(SystemExit) as stop:
        run_debate.main(argv(str(missing_model), tmp_path / "run", "--prompts", str(mine)))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert re.search(message, err) and str(missing_model) not in err
    assert not (tmp_path / "run").exists()


def test_an_override_must_be_named_after_a_shipped_prompt(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "moderator_finale.txt").write_text("x\n")
    with pytest.raises(prompts.PromptError, match="moderator_finale.txt: no shipped prompt is called 'moderator_fin"):
        prompts.use_prompt_dir(mine)
