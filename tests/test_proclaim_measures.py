"""PROClaim's other measures (eval/proclaim_measures.py), each against a hand-worked example, and against an
independent implementation where a well-kept one exists (statsmodels' Fleiss' kappa, scipy's KS test);
and their re-scoring of a saved run (python -m eval.trials RUN_DIR)."""
import json
import random

import pytest

from debate.data.prompts import render
from eval import proclaim_measures as pm, trials

S, N, I = "Supported", "Not Supported", "Inconclusive"  # noqa: E741 (the panel's three words)


# --- Fleiss' kappa (Appendix O.4) ------------------------------------------------------------------------

def test_fleiss_kappa_by_hand():
    rows = [[S, S, S], [S, S, N], [N, N, I], [S, N, I]]
    # Shares: S 6/12, N 4/12, I 2/12 -> P_e = 1/4 + 1/9 + 1/36 = 7/18. P_i: 1, 1/3, 1/3, 0 -> P_bar = 5/12.
    # kappa = (5/12 - 7/18) / (1 - 7/18) = (1/36) / (11/18) = 1/22.
    assert pm.fleiss_kappa(rows) == pytest.approx(1 / 22)
    assert pm.fleiss_kappa([[S, S, S], [S, S, S]]) == 1.0  # chance agreement 1
    assert pm.fleiss_kappa([[S], [N]]) is None  # one judge: no agreement to measure
    # An unreadable vote is a category of its own: [S, S, None] is a 2-1 split, not a 2-0 one.
    assert pm.fleiss_kappa([[S, S, None], [N, N, N]]) == pytest.approx(pm.fleiss_kappa([[S, S, I], [N, N, N]]))


def test_fleiss_kappa_matches_statsmodels():
    from statsmodels.stats.inter_rater import aggregate_raters, fleiss_kappa

    rng = random.Random(3)
    for raters in (2, 3, 5):
        rows = [[rng.choice((S, S, N, I)) for _ in range(raters)] for _ in range(40)]
        table, _ = aggregate_raters([[(S, N, I).index(v) for v in r] for r in rows])
        assert pm.fleiss_kappa(rows) == pytest.approx(fleiss_kappa(table, method="fleiss"))


# --- ECE (Appendix M, Eq. 9) -----------------------------------------------------------------------------

def test_ece_by_hand_on_the_papers_bins():
    result = pm.expected_calibration_error([0.3, 0.55, 0.58, 0.95, 1.0], [False, True, False, True, True])
    # [0, .5): one wrong at .3 -> 1/5 x .3; [.5, .6): acc .5, conf .565 -> 2/5 x .065; [.9, 1]: acc 1, conf
    # .975 -> 2/5 x .025 (1.0 itself falls in the last bin). ECE = .06 + .026 + .01 = .096.
    assert result["ece"] == pytest.approx(0.096)
    assert [b["n"] for b in result["bins"]] == [1, 2, 0, 0, 0, 2]
    assert result["bins"][2]["accuracy"] is None  # an empty bin has no accuracy, and adds nothing
    assert pm.expected_calibration_error([], [])["ece"] is None
    # Ten equal bins when asked: .55 and .58 share [.5, .6) again, .3 is alone in [.3, .4).
    ten = pm.expected_calibration_error([0.3, 0.55, 0.58], [False, True, False], [k / 10 for k in range(11)])
    assert ten["ece"] == pytest.approx((0.3 + 2 * 0.065) / 3)


def test_calibration_leaves_out_inconclusive_panels_and_claims_without_a_verdict():
    preds = [{"claim_id": 1, "label": "SUPPORT", "confidence": 0.9, "panel_verdict": S},
             {"claim_id": 2, "label": "SUPPORT", "confidence": 0.9, "panel_verdict": I},  # burden of proof's label
             {"claim_id": 3, "label": None, "confidence": 0.0, "panel_verdict": None},
             {"claim_id": 4, "label": "REFUTE", "confidence": 0.7, "panel_verdict": N}]
    result = pm.calibration(preds, {1: "SUPPORT", 2: "REFUTE", 3: "REFUTE", 4: "SUPPORT"})
    # Claim 1 right at .9 ([.9, 1]), claim 4 wrong at .7 ([.7, .8)): (.1 + .7) / 2.
    assert result["n"] == 2 and result["ece"] == pytest.approx(0.4)


# --- KS stability (Appendix E) ---------------------------------------------------------------------------

def test_ks_statistic_by_hand_and_against_scipy():
    from scipy.stats import ks_2samp

    assert pm.ks_statistic([0.1, 0.2], [0.3]) == 1.0
    assert pm.ks_statistic([1, 2, 3], [2]) == pytest.approx(1 / 3)  # F_a - F_b: 1/3 at 1, -1/3 at 2, 0 at 3
    assert pm.ks_statistic([0.5], []) is None
    rng = random.Random(7)
    for _ in range(20):
        a = [round(rng.random(), 1) for _ in range(rng.randint(1, 15))]  # ties on purpose
        b = [round(rng.random(), 1) for _ in range(rng.randint(1, 15))]
        assert pm.ks_statistic(a, b) == pytest.approx(ks_2samp(a, b).statistic)


def test_ks_stability_per_aggregate_round():
    preds = [{"confidence": 0.9, "hearings": [{"round_confidence": [0.5, 0.9]}, {"round_confidence": [0.8]}]},
             {"confidence": 0.6, "hearings": [{"round_confidence": [0.6]}]}]
    per_round = [pm.aggregate_rounds(p, "round_confidence") for p in preds]
    assert per_round == [[0.5, 0.9, 0.8], [0.6]]
    d = pm.ks_stability(per_round, [0.9, 0.6])
    # Round 1: {.5, .6} vs final {.6, .9}: F at .5 is 1/2 vs 0 -> 1/2. Round 2: {.9} vs {.6, .9} -> 1/2.
    # Round 3: {.8} vs {.6, .9}: at .6 0 vs 1/2, at .8 1 vs 1/2 -> 1/2.
    assert d == {"1": {"D": 0.5, "claims": 2}, "2": {"D": 0.5, "claims": 1}, "3": {"D": 0.5, "claims": 1}}
    # Records without per-round confidence (every run so far): not available, never 0.
    assert pm.aggregate_rounds({"hearings": [{"rounds": 2}]}, "round_confidence") is None
    assert pm.measures([{"claim_id": 1, "confidence": 0.5, "hearings": [{"rounds": 1}]}], {})["ks_stability"] is None


# --- argument integrity (Appendix O) ---------------------------------------------------------------------

def test_reflection_changes_by_hand():
    result = pm.reflection_changes([[[1.0, 1.2, 1.15], [0.8, 0.9]], [[1.0, None, 1.3]]])
    # |dS| within hearings: .2, .05 (claim 1 primary), .1 (its role-switched hearing); claim 2's None
    # breaks both of its pairs. Mean .35 / 3.
    assert result["pairs"] == 3 and result["mean_abs_change"] == pytest.approx(0.35 / 3)
    # The authors' signed deltas from 0 at each hearing's start: 1.0, .2, -.05, .8, .1 and claim 2's 1.0.
    assert result["mean_signed_from_zero"] == pytest.approx(3.05 / 6)
    assert result["signed_by_round"] == pytest.approx({"1": 1.0, "2": 0.2, "3": -0.05, "4": 0.8, "5": 0.1})


def test_concession_rate_per_thousand_words():
    texts = ["I concede that the trial was small. You make a good point about dosage, yet the data stand.",
             "We   AGREE on nothing; i  agree only that the sample was small. Agreement is not the issue."]
    result = pm.concession_rate(texts)
    # "I concede", "You make a good point", "i  agree" (case and spacing blind); "We AGREE" and "Agreement"
    # are not concessions. 18 + 17 = 35 words.
    assert (result["concessions"], result["words"]) == (3, 35)
    assert result["per_1000"] == pytest.approx(3000 / 35)
    assert pm.concession_rate([])["per_1000"] is None


def _argument(side, text):
    return {"round": "first-1", "role": side, "response": text,
            "prompt": render("counsel_argument", round=1, claim="C", side=side, instruction="i", evidence="e",
                             history="h")}


def test_transcript_digest_reads_arguments_and_the_consistency_analyzer():
    row = {"claim_id": 7, "turns": [
        {"round": "first-1", "role": "plaintiff", "prompt": render("counsel_gap", round=1, side="P", context="c"),
         "response": "I concede nothing: a gap request", "schema": "counsel_gap"},
        _argument("plaintiff", "I concede the point."),
        _argument("defense", "No concession here."),
        {"round": "switched-1", "role": "plaintiff", "response": "You are right.",
         "prompt": _argument("x", "")["prompt"]},
        {"round": "role-switch", "role": "critic", "prompt": "...",
         "response": '{"Model A": 8, "Model B": "6/10", "Contradictions": "none", "Consistency": 7}'}]}
    digest = pm.digest_transcript(row)
    assert digest["arguments"] == {"plaintiff": ["I concede the point.", "You are right."],
                                   "defense": ["No concession here."]}
    assert digest["consistency"] == (8.0, 6.0)
    m = pm.measures([{"claim_id": 7, "votes": [S, S, N]}], {}, [digest])
    assert m["role_play_consistency"] == {"plaintiff": 8.0, "defense": 6.0, "claims": 1}
    assert m["concession_rate"]["plaintiff"]["concessions"] == 2
    # Saved analyzer fields win over the transcript; without digests the transcript measures are n/a.
    saved = pm.measures([{"claim_id": 7, "consistency_fields": {"Model A": 9, "Model B": 4}}], {}, [digest])
    assert saved["role_play_consistency"]["plaintiff"] == 9.0
    assert pm.measures([{"claim_id": 7}], {})["concession_rate"] is None


def test_role_play_consistency_averages_each_model():
    assert pm.role_play_consistency([(8.0, 6.0), (6.0, None), (None, 7.0)]) == {
        "plaintiff": 7.0, "defense": 6.5, "claims": 3}


# --- debate dynamics (section 4.2) -----------------------------------------------------------------------

def test_termination_shares_and_mean_rounds():
    preds = [{"rounds": 2, "rounds_switched": 3, "total_rounds": 5, "stop_reason": "reflection_plateau",
              "hearings": [{"stop_reason": "reflection_plateau"}, {"stop_reason": "court_ready"}]},
             {"rounds": 3, "rounds_switched": 2, "total_rounds": 5, "stop_reason": "court_ready",
              "hearings": [{"stop_reason": "court_ready"}, {"stop_reason": "court_ready"}]},
             {"rounds": 1, "rounds_switched": 0, "total_rounds": 1, "stop_reason": "reflection_plateau",
              "hearings": [{"stop_reason": "reflection_plateau"}]},
             {"rounds": 4, "rounds_switched": 1, "total_rounds": 5, "stop_reason": "novelty_exhausted",
              "hearings": [{"stop_reason": "novelty_exhausted"}, {"stop_reason": "max_rounds"}]}]
    t = pm.termination(preds)
    assert t["primary"] == {"n": 4, "shares": {"reflection_plateau": 0.5, "court_ready": 0.25,
                                               "novelty_exhausted": 0.25}}
    assert t["switched"] == {"n": 3, "shares": pytest.approx({"court_ready": 2 / 3, "max_rounds": 1 / 3})}
    assert t["all"]["n"] == 7 and t["all"]["shares"]["court_ready"] == pytest.approx(3 / 7)
    assert (t["rounds_primary"], t["rounds_switched"], t["rounds_total"]) == (2.5, 1.5, 4.0)



def _round(n, retrieved, admitted, pool, novelty):
    return {"round": n, "queries": [{"retrieved": k} for k in retrieved], "admitted": list(range(admitted)),
            "pool_size": pool, "novelty": novelty}


def test_discovery_by_round_averages_each_round_over_the_hearings_that_held_it():
    preds = [{"claim_id": 1, "hearings": [{"round_log": [_round(1, [3, 3], 4, 9, 0.5), _round(2, [3, 3], 2, 11, 0.3),
                                          _round(3, [3, 3], 0, 11, 0.1)]},
                           {"round_log": [_round(1, [3], 1, 12, 0.2)]}]},
             {"claim_id": 2, "hearings": [{"round_log": [_round(1, [3, 3], 2, 7, 0.7), _round(2, [], 0, 7, None)]}]},
             {"claim_id": 3, "hearings": [{}]}]  # an older record: no round log, left out
    d = pm.discovery_by_round(preds)
    # Round 1 of the primary hearings: retrieved (6 + 6) / 2, admitted (4 + 2) / 2, pool (9 + 7) / 2,
    # novelty (0.5 + 0.7) / 2. Round 2: novelty only from the hearing that retrieved (None is unknown).
    assert d["primary"]["1"] == {"hearings": 2, "retrieved": 6.0, "admitted": 3.0, "pool_size": 8.0,
                                 "novelty": pytest.approx(0.6)}
    assert d["primary"]["2"] == {"hearings": 2, "retrieved": 3.0, "admitted": 1.0, "pool_size": 9.0,
                                 "novelty": pytest.approx(0.3)}
    assert d["primary"]["3"]["hearings"] == 1 and d["primary"]["3"]["admitted"] == 0.0
    assert d["switched"] == {"1": {"hearings": 1, "retrieved": 3.0, "admitted": 1.0, "pool_size": 12.0,
                                   "novelty": 0.2}}
    assert pm.discovery_by_round([{"hearings": [{}]}]) is None
    text = pm.measures_text(pm.measures(preds, {}))
    assert "P-RAG by round, primary  r1: pool 8.0, +3.0 of 6.0, novelty 0.60 (2) | r2: pool 9.0" in text
    assert "67.5" not in text  # no record says how many passages its calls returned: no pool line


def test_the_evidence_pool_is_given_in_both_units_beside_the_papers():
    preds = [{"claim_id": 1, "retrieved": 30, "evidence_pool": 9}, {"claim_id": 2, "retrieved": 12, "evidence_pool": 5}]
    assert pm.evidence_pool(preds) == {"returned": 21.0, "distinct": 7.0}
    text = pm.measures_text(pm.measures(preds, {}))
    assert "evidence pool a claim  21.0 passages returned by all retrieval calls (paper 67.5, Table 5's unit), " \
           "7.0 distinct" in text


# --- re-scoring a saved run ------------------------------------------------------------------------------

GOLD = {1: "SUPPORT", 2: "REFUTE"}


def _prediction(cid, label, votes, confidence, totals):
    return {"claim_id": cid, "label": label, "gold_label": GOLD[cid], "votes": votes,
            "judge_labels": [{S: "SUPPORT", N: "REFUTE", I: "Inconclusive"}[v] for v in votes],
            "panel_verdict": S if label == "SUPPORT" else N, "confidence": confidence, "rounds": len(totals[0]),
            "rounds_switched": len(totals[1]), "total_rounds": len(totals[0]) + len(totals[1]),
            "stop_reason": "court_ready", "hearings": [{"stop_reason": "court_ready", "reflection_totals": totals[0]},
                                                       {"stop_reason": "max_rounds", "reflection_totals": totals[1]}]}


def test_eval_trials_rescoring_a_saved_run_prints_and_saves_every_measure(tmp_path, capsys):
    runs = [[_prediction(1, "SUPPORT", [S, S, S], 1.0, ([1.0, 1.1], [0.9])),
             _prediction(2, "SUPPORT", [S, N, S], 0.6, ([1.2, 1.4], [1.0]))],
            [_prediction(1, "SUPPORT", [S, S, N], 0.7, ([1.0], [0.9])),
             _prediction(2, "REFUTE", [N, N, N], 1.0, ([0.8, 1.0], [1.0]))]]
    for k, run in enumerate(runs, 1):
        folder = tmp_path / f"trial-{k}"
        folder.mkdir()
        (folder / "predictions.jsonl").write_text("".join(json.dumps(p) + "\n" for p in run))
        rows = [{"claim_id": p["claim_id"], "turns": [_argument("plaintiff", "I concede. " + "word " * 8),
                                                       _argument("defense", "word " * 10)]} for p in run]
        (folder / "transcripts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "metrics.json").write_text(json.dumps({"trials": 2, "accuracy": {"mean": 0.75}}))
    table = trials.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "Fleiss' kappa" in out and "ECE (Eq. 9)" in out and "concessions /1000w" in out
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["accuracy"] == {"mean": 0.75}  # the rest of the file is kept
    assert saved["table3"] == json.loads(json.dumps(table))
    m = saved["table3"]["measures"]
    # Pooled: panels SSS, SNS, SSN, NNN -> shares S 7/12, N 5/12; P_i 1, 1/3, 1/3, 1 -> P_bar 2/3;
    # P_e = 49/144 + 25/144 = 74/144; kappa = (96 - 74) / (144 - 74) = 22/70.
    assert m["fleiss_kappa"] == pytest.approx(22 / 70)
    assert saved["table3"]["weighted_total"]["fleiss_kappa"] == pytest.approx(22 / 70)
    # Calibration: right at 1.0, wrong at .6, right at .7, right at 1.0 -> bins [.6,.7): 1 x .6,
    # [.7,.8): 1 x .3, [.9,1]: 2 x 0 -> (.6 + .3) / 4.
    assert m["calibration"]["ece"] == pytest.approx(0.225)
    # |dS|: .1, .2 (run 1), .2 (run 2 claim 2) -> .5 / 3.
    assert m["reflection_change"]["mean_abs_change"] == pytest.approx(0.5 / 3)
    assert m["termination"]["primary"]["shares"] == {"court_ready": 1.0}
    assert m["termination"]["rounds_total"] == pytest.approx(11 / 4)
    # 4 plaintiff arguments of 10 words with one "I concede" each: 100 per 1,000 words.
    assert m["concession_rate"]["plaintiff"] == {"concessions": 4, "words": 40, "per_1000": 100.0}
    assert m["concession_rate"]["defense"]["per_1000"] == 0.0
    assert m["ks_stability"] is None and m["role_play_consistency"] is None  # not in these records: n/a
    assert len(saved["table3"]["measures_by_run"]) == 2
    assert "n/a (the records hold no per-round confidence)" in out
