"""PROClaim's evaluation (its Table 3, Appendix D, Table 5 and Appendix P) over courtroom runs, as the
paper's authors compute it; no torch, no model.

Per run (one trial): accuracy and macro-F1, the judges' agreement, per-judge agreement with the gold
labels, and the efficiency columns. Over N runs of the same claims (`--trials N`):
- each run's row;
- majority vote: per claim, the label most runs gave (a tie goes to the earliest run's label among the
  tied; runs without a verdict do not vote); its panel statistics are those of the first run's records,
  as the authors' aggregation takes a claim's other fields from its first run;
- weighted total: every run's records pooled (N x claims) and scored as one set, so each run weighs by
  its number of claims: the paper's "W. Total" row (the authors' "grand total, weighted" mode);
- oracle (best-of-N): per claim, the first run whose label is right, else the first run; the chosen
  records are scored (label and panel statistics alike).

Definitions (the authors' arithmetic):
- accuracy: right labels / claims with a gold label (no verdict counts as wrong); macro-F1: the mean F1
  over the classes present among the gold and predicted labels;
- mean kappa (the paper's kappa bar): the mean of the pairwise Cohen's kappas between the judges' raw
  verdicts (Supported / Not Supported / Inconclusive; an unreadable vote is a class of its own), over
  the claims; Cohen's kappa is 1 when the chance agreement is 1. It is not Fleiss' kappa, which the
  paper reports once, separately (Appendix O), and which each row also carries (eval/proclaim_measures.py);
- raw agreement: the mean over judge pairs of the share of claims on which the pair agree;
- unanimity: claims on which every judge gave the same verdict (3-0); split: all others (a divided vote);
- kappa_GT (Appendix D): Cohen's kappa between one judge's verdict, mapped onto the dataset's labels
  (`judge_labels` in each prediction: Supported -> the supported label, Not Supported -> the refuted
  one, Inconclusive -> the not-enough-information label or a class of its own), and the gold label.
  mean_kappa_gt is their unweighted mean over the judges (Table 9's last column).
With one judge (Standard MAD, ablation A2) there is no agreement to measure: those fields are None.

The paper's other measures (termination shares and rounds, ECE, KS stability, argument integrity) are
eval/proclaim_measures.py's, over the weighted total's records (every run pooled) and per run.
"""
from collections import Counter

from eval import proclaim_measures

UNREADABLE = "(unreadable)"  # an unreadable vote, as a class of its own in the kappas


def cohen_kappa(a, b):
    """Cohen's kappa of two raters' labels (equal-length sequences); 1.0 when chance agreement is 1,
    None for no items."""
    n = len(a)
    if n == 0:
        return None
    observed = sum(x == y for x, y in zip(a, b)) / n
    count_a, count_b = Counter(a), Counter(b)
    chance = sum(count_a[c] * count_b[c] for c in set(a) | set(b)) / (n * n)
    return 1.0 if chance == 1 else (observed - chance) / (1 - chance)


def label_scores(golds, preds):
    """Accuracy and macro-F1 (over the classes present among golds and predictions) of paired labels."""
    n = len(golds)
    if n == 0:
        return {"n": 0, "accuracy": None, "macro_f1": None}
    classes = sorted(set(golds) | {p for p in preds if p is not None})
    f1s = []
    for c in classes:
        tp = sum(g == c and p == c for g, p in zip(golds, preds))
        fp = sum(g != c and p == c for g, p in zip(golds, preds))
        fn = sum(g == c and p != c for g, p in zip(golds, preds))
        precision = tp / (tp + fp) if tp + fp else 0.0
        recall = tp / (tp + fn) if tp + fn else 0.0
        f1s.append(2 * precision * recall / (precision + recall) if precision + recall else 0.0)
    return {"n": n, "accuracy": sum(g == p for g, p in zip(golds, preds)) / n, "macro_f1": sum(f1s) / len(f1s)}


def panel_stats(vote_rows):
    """The judges' agreement over claims, each row the seats' votes in seat order (see the module doc)."""
    rows = [[UNREADABLE if v is None else v for v in row] for row in vote_rows]
    judges = max((len(r) for r in rows), default=0)
    rows = [r for r in rows if len(r) == judges]
    n = len(rows)
    if judges < 2 or n == 0:
        return {"judges": judges, "claims": n, "mean_kappa": None, "pairwise_kappa": {}, "raw_agreement": None,
                "unanimous": None, "split": None, "unanimity_rate": None, "split_rate": None}
    pairs = [(i, j) for i in range(judges) for j in range(i + 1, judges)]
    kappas = {f"{i + 1}-{j + 1}": cohen_kappa([r[i] for r in rows], [r[j] for r in rows]) for i, j in pairs}
    agreement = [sum(r[i] == r[j] for r in rows) / n for i, j in pairs]
    unanimous = sum(len(set(r)) == 1 for r in rows)
    return {"judges": judges, "claims": n, "mean_kappa": sum(kappas.values()) / len(kappas), "pairwise_kappa": kappas,
            "raw_agreement": sum(agreement) / len(agreement), "unanimous": unanimous, "split": n - unanimous,
            "unanimity_rate": unanimous / n, "split_rate": (n - unanimous) / n}


def judge_gold_kappas(label_rows, golds):
    """Per judge seat, Cohen's kappa of its verdicts (mapped onto the dataset's labels) against the gold."""
    judges = max((len(r) for r in label_rows), default=0)
    out = {}
    for seat in range(judges):
        pairs = [(UNREADABLE if r[seat] is None else r[seat], g) for r, g in zip(label_rows, golds) if len(r) > seat]
        out[f"judge_{seat + 1}"] = cohen_kappa([p for p, _ in pairs], [g for _, g in pairs])
    return out


def _sum_tokens(preds):
    """Appendix P: tokens in and out summed over claims, in total, per role and per stage."""
    total = {"in": 0, "out": 0, "by_role": {}, "by_stage": {}}
    for p in preds:
        t = p.get("tokens") or {}
        total["in"] += t.get("in", 0)
        total["out"] += t.get("out", 0)
        for key in ("by_role", "by_stage"):
            for name, spent in (t.get(key) or {}).items():
                into = total[key].setdefault(name, {"in": 0, "out": 0})
                into["in"] += spent["in"]
                into["out"] += spent["out"]
    total["total"] = total["in"] + total["out"]
    total["per_claim"] = total["total"] / len(preds) if preds else None
    return total


def run_stats(predictions, references):
    """One run's PROClaim metrics: `predictions` (prediction dicts with label, votes, judge_labels, ...),
    `references` {claim_id: gold label}; claims without a gold label are left out of the label scores."""
    scored = [p for p in predictions if references.get(p["claim_id"]) is not None]
    golds = [references[p["claim_id"]] for p in scored]
    stats = label_scores(golds, [p.get("label") for p in scored])
    stats.update(panel_stats([p.get("votes") or [] for p in scored]))
    stats["kappa_gt"] = judge_gold_kappas([p.get("judge_labels") or [] for p in scored], golds)
    stats["mean_kappa_gt"] = proclaim_measures.mean_known(list(stats["kappa_gt"].values()))
    stats["fleiss_kappa"] = proclaim_measures.fleiss_kappa([p.get("votes") or [] for p in scored])
    return stats


def efficiency(predictions):
    """Table 5's and Appendix P's columns, per claim: rounds (primary + role-switched), evidence (passages
    returned by all retrieval calls, the authors' count; and the distinct passages of the pools),
    retrieval calls, tokens."""
    return {"claims": len(predictions),
            "avg_rounds": proclaim_measures.mean_known([p.get("total_rounds", p.get("rounds")) for p in predictions]),
            "avg_rounds_primary": proclaim_measures.mean_known([p.get("rounds") for p in predictions]),
            "avg_rounds_switched": proclaim_measures.mean_known([p.get("rounds_switched") for p in predictions]),
            "avg_evidence": proclaim_measures.mean_known([p.get("retrieved") for p in predictions]),
            "avg_evidence_pool": proclaim_measures.mean_known([p.get("evidence_pool") for p in predictions]),
            "avg_retrieval_calls": proclaim_measures.mean_known([p.get("retrieval_calls") for p in predictions]),
            "tokens": _sum_tokens(predictions)}


def run_extras(predictions, references, digests=None):
    """What a PROClaim run adds to metrics.json: {"proclaim": run_stats + efficiency + the paper's other
    measures}; `digests`: proclaim_measures.read_digests of the run (None: no transcript measures)."""
    return {"proclaim": dict(run_stats(predictions, references), efficiency=efficiency(predictions),
                             measures=proclaim_measures.measures(predictions, references, digests and [
                                 digests.get(p["claim_id"]) for p in predictions]))}


def _by_claim(run):
    return {p["claim_id"]: p for p in run}


def majority_label(labels):
    """The label most runs gave; a tie goes to the earliest run's among the tied; None when no run gave one."""
    given = [label for label in labels if label is not None]
    if not given:
        return None
    counts = Counter(given)
    top = max(counts.values())
    return next(label for label in given if counts[label] == top)


def table3(runs, references, digests=None):
    """PROClaim's Table 3 over `runs` (one list of predictions per run, the same claims) against
    `references` {claim_id: gold label}: each run, the majority vote, the weighted total and the oracle;
    with the paper's other measures over all runs pooled and per run. `digests`: one
    proclaim_measures.read_digests per run (None: no transcript measures)."""
    by_run = [_by_claim(run) for run in runs]
    claims = [c for c in dict.fromkeys(cid for run in by_run for cid in run) if references.get(c) is not None]
    per_run = [run_stats(list(run.values()), references) for run in by_run]
    majority, oracle = [], []
    for cid in claims:
        records = [run[cid] for run in by_run if cid in run]
        majority.append(dict(records[0], label=majority_label([r.get("label") for r in records])))
        oracle.append(next((r for r in records if r.get("label") == references[cid]), records[0]))
    pooled = [p for run in by_run for p in run.values()]
    return {"runs": per_run, "majority_vote": run_stats(majority, references),
            "weighted_total": run_stats(pooled, references), "oracle": run_stats(oracle, references),
            "mean_over_runs": {key: proclaim_measures.mean_known([r[key] for r in per_run])
                               for key in ("accuracy", "macro_f1", "mean_kappa", "raw_agreement")},
            "efficiency": efficiency(pooled), "n_runs": len(runs), "claims": len(claims),
            "measures": proclaim_measures.measures(pooled, references, digests and [
                digests[k].get(cid) for k, run in enumerate(by_run) for cid in run]),
            "measures_by_run": [proclaim_measures.measures(list(run.values()), references, digests and [
                digests[k].get(cid) for cid in run]) for k, run in enumerate(by_run)]}


def _cell(value, percent=False):
    if value is None:
        return "     -"
    return f"{100 * value:6.1f}" if percent else f"{value:6.3f}"


def table3_text(table):
    """Table 3 as text: one row per run, the majority vote, the weighted total and the oracle; then the
    paper's other measures over all runs pooled."""
    lines = ["PROClaim Table 3     acc%    mF1%   kappa    agr%   unan  split  Fleiss   kappa_GT per judge (mean)"]
    rows = [(f"run {k}", r) for k, r in enumerate(table["runs"], 1)]
    rows += [("majority vote", table["majority_vote"]), ("weighted total", table["weighted_total"]),
             (f"oracle (best of {table['n_runs']})", table["oracle"])]
    for name, r in rows:
        gt = " ".join(_cell(v).strip() for v in r["kappa_gt"].values()) or "-"
        if r.get("mean_kappa_gt") is not None:
            gt += f" ({r['mean_kappa_gt']:.3f})"
        lines.append(f"{name:<18}{_cell(r['accuracy'], True)}  {_cell(r['macro_f1'], True)}  "
                     f"{_cell(r['mean_kappa'])}  {_cell(r['raw_agreement'], True)}  "
                     f"{'-' if r['unanimous'] is None else r['unanimous']:>5}  "
                     f"{'-' if r['split'] is None else r['split']:>5}  {_cell(r.get('fleiss_kappa'))}   {gt}")
    total = table["weighted_total"]
    if total["unanimity_rate"] is not None:
        lines.append(f"unanimity rate {100 * total['unanimity_rate']:.1f}%, "
                     f"split rate {100 * total['split_rate']:.1f}% "
                     "(weighted total)")
    eff = table["efficiency"]
    lines.append(f"per claim: rounds {eff['avg_rounds'] or 0:.2f} (primary + switched), evidence "
                 f"{eff['avg_evidence'] or 0:.1f} passages returned by all calls (Table 5's unit, paper "
                 f"{proclaim_measures.PAPER['evidence_pool']}), {eff['avg_evidence_pool'] or 0:.1f} distinct, "
                 f"tokens {eff['tokens']['per_claim'] or 0:,.0f}")
    if table.get("measures"):
        lines.append(f"the paper's other measures, all {table['n_runs']} run(s) pooled:")
        lines.append(proclaim_measures.measures_text(table["measures"]))
    return "\n".join(lines)


def trial_dirs(run_dir):
    """The trial directories (trial-1, trial-2, ...) of a --trials run, in order; a run of one trial (no
    trial-k directories) is its own."""
    from pathlib import Path

    return sorted(Path(run_dir).glob("trial-*"), key=lambda d: int(d.name.split("-")[1])) or [Path(run_dir)]


def read_trials(run_dir):
    """The predictions of each trial directory (trial_dirs) of a --trials run, and the gold labels they carry
    ({claim_id: gold_label})."""
    import json

    runs = []
    for d in trial_dirs(run_dir):
        path = d / "predictions.jsonl"
        if not path.is_file():
            raise SystemExit(f"error: {path}: no such file")
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        runs.append([json.loads(line) for line in lines])
    references = {p["claim_id"]: p.get("gold_label") for run in runs for p in run if p.get("gold_label")}
    return runs, references


def build_parser():
    """The flags of `python -m eval.trials` (tests/test_docs.py checks the documented commands against them)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m eval.trials", description=main.__doc__)
    parser.add_argument("run_dir")
    parser.add_argument("--json", action="store_true", help="print the whole table as JSON")
    parser.add_argument("--no-save", action="store_true", help="print only; leave metrics.json as it is")
    return parser


def main(argv=None):
    """python -m eval.trials RUN_DIR [--json] [--no-save]: PROClaim's Table 3 and the paper's other measures
    over the trials of a courtroom run (or one run), recomputed from its saved records and saved into
    RUN_DIR/metrics.json under "table3" (the rest of the file is kept)."""
    import json
    from pathlib import Path

    parser = build_parser()
    args = parser.parse_args(argv)
    runs, references = read_trials(args.run_dir)
    digests = [proclaim_measures.read_digests(d, {p["claim_id"] for p in run})
               for d, run in zip(trial_dirs(args.run_dir), runs)]
    table = table3(runs, references, digests)
    print(json.dumps(table, indent=2) if args.json else table3_text(table))
    if not args.no_save:
        path = Path(args.run_dir) / "metrics.json"
        try:
            saved = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        except json.JSONDecodeError as err:
            raise SystemExit(f"error: {path}: not JSON ({err}); nothing saved")
        saved["table3"] = table
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(saved, indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)  # whole or not at all
        print(f"saved under \"table3\" in {path}")
    return table


if __name__ == "__main__":
    main()
