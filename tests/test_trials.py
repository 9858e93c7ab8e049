"""--trials (seeds, directories, mean and deviation, resuming), eval.compare over trial sets, --prompts DIR."""
import json
import re
from pathlib import Path

import numpy as np
import pytest

import run_debate
from debate.data import prompts
from debate.pipeline import records, scoring
from eval import compare
from eval.averitec import InputError
from tests.conftest import run_argv
from tests.tiny_models import needs_wordnet


@pytest.fixture(autouse=True)
def shipped_prompts():
    yield
    assert prompts.in_use().directory is None  # a run's --prompts ends with the run


def argv(model, out, *extra):
    return run_argv(model, out, *extra, max_new_tokens=6, batch_size=4, limit=4)


def read(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


# --- the summary over trials -----------------------------------------------------------------------

def test_trial_summary_gives_mean_and_sample_deviation_by_hand():
    summary = scoring.trial_summary([
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
    # A trial set compares with itself: no difference, over both trials (its AVeriTeC score needs WordNet).
    needs_wordnet()
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
    # Said with the missing model, in one message, before anything loads (issue 54's preflight).
    assert stop.value.code == 2 and err.startswith("error: 2 things stop this run")
    assert len(err.strip().splitlines()) == 3
    assert re.search(message, err) and str(missing_model) in err
    assert not (tmp_path / "run").exists()


def test_an_override_must_be_named_after_a_shipped_prompt(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "moderator_finale.txt").write_text("x\n")
    with pytest.raises(prompts.PromptError, match="moderator_finale.txt: no shipped prompt is called 'moderator_fin"):
        prompts.checked_set(mine)


# --- PROClaim's Table 3 (eval/trials.py) on hand-made runs ---------------------------------------------

S, N, I = "Supported", "Not Supported", "Inconclusive"  # noqa: E741 (the panel's three words)
GOLD = {1: "SUPPORT", 2: "REFUTE", 3: "REFUTE", 4: "SUPPORT"}
AS_LABEL = {S: "SUPPORT", N: "REFUTE", I: "Inconclusive"}


def proclaim_run(labels, votes):
    return [{"claim_id": cid, "label": label, "votes": v, "judge_labels": [AS_LABEL[x] for x in v]}
            for cid, label, v in zip(GOLD, labels, votes)]


MIXED = [[S, S, S], [N, N, I], [S, N, S], [N, N, N]]
RUNS = [proclaim_run(["SUPPORT", "REFUTE", "SUPPORT", "REFUTE"], MIXED),
        proclaim_run(["SUPPORT", "SUPPORT", "REFUTE", "REFUTE"], [[S, S, S]] * 4),
        proclaim_run(["REFUTE", "REFUTE", "SUPPORT", "SUPPORT"], MIXED)]


def test_cohen_kappa_and_the_panels_agreement_by_hand():
    from eval import trials

    assert trials.cohen_kappa("SSNN", "SNNN") == pytest.approx(0.5)  # p_o 3/4, p_e 1/2
    assert trials.cohen_kappa("SS", "SS") == 1.0  # chance agreement 1: kappa 1, as the authors define it
    stats = trials.panel_stats(MIXED)
    # Pairs 1-2: p_o .75, p_e .5 -> .5; 1-3: p_o .75, p_e .375 -> .6; 2-3: p_o .5, p_e .3125 -> .2727...
    assert stats["pairwise_kappa"] == pytest.approx({"1-2": 0.5, "1-3": 0.6, "2-3": 0.1875 / 0.6875})
    assert stats["mean_kappa"] == pytest.approx((0.5 + 0.6 + 0.1875 / 0.6875) / 3)
    assert stats["raw_agreement"] == pytest.approx((0.75 + 0.75 + 0.5) / 3)
    assert (stats["unanimous"], stats["split"], stats["unanimity_rate"]) == (2, 2, 0.5)
    assert trials.panel_stats([[S], [N]])["mean_kappa"] is None  # one judge: nothing to agree on
    assert trials.majority_label(["A", "B"]) == "A" and trials.majority_label([None, "B", "A", "B"]) == "B"
    assert trials.majority_label([None, None]) is None


def test_table3_runs_majority_weighted_total_and_oracle_by_hand():
    from eval import trials

    table = trials.table3(RUNS, GOLD)
    # Each run gets two of four right; each class's F1 is 1/2 in run 1.
    assert [r["accuracy"] for r in table["runs"]] == [0.5, 0.5, 0.5]
    assert table["runs"][0]["macro_f1"] == pytest.approx(0.5)
    # kappa_GT of run 1's judges: j1 S R S R -> 0; j2 S R R R -> .5; j3 S I S R -> (.25 - .375) / .625.
    assert table["runs"][0]["kappa_gt"] == pytest.approx({"judge_1": 0.0, "judge_2": 0.5, "judge_3": -0.2})
    assert table["runs"][1]["mean_kappa"] == 1.0 and table["runs"][1]["unanimous"] == 4
    # Majority over runs: claim 1 S S R -> S (right), 2 R S R -> R (right), 3 S R S -> S, 4 R R S -> R (wrong).
    majority = table["majority_vote"]
    assert (majority["accuracy"], majority["unanimous"]) == (0.5, 2)  # its panel statistics are run 1's
    # Weighted total: the 12 records pooled, 6 right; 2 + 4 + 2 unanimous panels.
    total = table["weighted_total"]
    assert (total["n"], total["accuracy"], total["unanimous"], total["split"]) == (12, 0.5, 8, 4)
    # Oracle: every claim has a run that got it right (1 from run 1, 2 from run 1, 3 from run 2, 4 from run 3).
    oracle = table["oracle"]
    assert (oracle["accuracy"], oracle["macro_f1"], oracle["unanimous"]) == (1.0, 1.0, 3)
    assert table["mean_over_runs"]["accuracy"] == 0.5 and table["claims"] == 4
    text = trials.table3_text(table)
    assert "majority vote" in text and "oracle (best of 3)" in text
    assert "unanimity rate 66.7%, split rate 33.3% (weighted total)" in text  # 8 and 4 of 12
    # The evidence pool in both units, Table 5's (passages returned by all calls) beside the paper's 67.5.
    table["efficiency"].update(avg_evidence=20.0, avg_evidence_pool=7.0)
    assert "evidence 20.0 passages returned by all calls (Table 5's unit, paper 67.5), 7.0 distinct" in \
        trials.table3_text(table)


def test_read_trials_takes_the_trial_directories_or_a_one_trial_run_itself(tmp_path):
    from eval import trials

    def write(folder, run):
        folder.mkdir(parents=True)
        (folder / "predictions.jsonl").write_text("".join(json.dumps(dict(p, gold_label=GOLD[p["claim_id"]])) + "\n"
                                                          for p in run))

    for k, run in enumerate(RUNS, 1):
        write(tmp_path / "three" / f"trial-{k}", run)
    runs, gold = trials.read_trials(tmp_path / "three")
    assert [[p["label"] for p in r] for r in runs] == [[p["label"] for p in r] for r in RUNS] and gold == GOLD
    write(tmp_path / "one", RUNS[1])  # --trials 1 writes no trial-k directory
    runs, gold = trials.read_trials(tmp_path / "one")
    assert len(runs) == 1 and trials.table3(runs, gold)["majority_vote"]["accuracy"] == 0.5
    with pytest.raises(SystemExit, match="predictions.jsonl: no such file"):
        trials.read_trials(tmp_path / "nothing")


def test_a_runs_efficiency_and_tokens_are_summed_over_claims():
    from eval import trials

    preds = [{"claim_id": 1, "rounds": 2, "rounds_switched": 2, "total_rounds": 4, "retrieved": 30, "evidence_pool": 9,
              "retrieval_calls": 10, "tokens": {"in": 100, "out": 10, "by_role": {"plaintiff": {"in": 60, "out": 6}},
                                                "by_stage": {"panel": {"in": 100, "out": 10}}}},
             {"claim_id": 2, "rounds": 3, "rounds_switched": 0, "total_rounds": 3, "retrieved": 10, "evidence_pool": 5,
              "retrieval_calls": 4, "tokens": {"in": 50, "out": 5, "by_role": {"plaintiff": {"in": 20, "out": 2}},
                                               "by_stage": {"panel": {"in": 50, "out": 5}}}}]
    eff = trials.efficiency(preds)
    assert (eff["avg_rounds"], eff["avg_rounds_switched"], eff["avg_evidence"], eff["avg_evidence_pool"]) == \
        (3.5, 1.0, 20.0, 7.0)
    assert eff["tokens"] == {"in": 150, "out": 15, "total": 165, "per_claim": 82.5,
                             "by_role": {"plaintiff": {"in": 80, "out": 8}},
                             "by_stage": {"panel": {"in": 150, "out": 15}}}
