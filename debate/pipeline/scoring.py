"""Scoring a run: its predictions against the claims' gold labels with eval's scorers, the reports written and
printed, the trials' summary, the evidence-only scores of --retrieve-only, and what cannot be scored without
WordNet (and how a later run adds it). The runner calls in here; eval never calls the runner."""
import logging
from pathlib import Path

from debate.data import claims as data
from debate.pipeline import grown_evidence, records, store_retrieval
from debate.pipeline.config import COURTROOM_METHODS
from eval import (
    averitec,
    evidence_score as evidence_scores,
    geval_scores,
    metrics as label_scores,
    proclaim_measures,
    report,
    trials as trial_metrics,
    wordnet,
)

log = logging.getLogger(__name__)


def meteor_scored(config, claims):
    """Whether finish() would compute METEOR-based scores for this run (AVeriTeC with gold labels)."""
    return (config.method.task != "explain" and config.data.dataset == "averitec"
            and any(c.get("label") for c in claims))


def scoring_notes(config, claims):
    """What the run will not score, said before any model loads: without WordNet, the METEOR-based scores
    (the run itself needs none; RESCORE adds them later)."""
    if meteor_scored(config, claims) and not averitec.meteor_available():
        return [f"{wordnet.missing_reason()} The run goes on: AVeriTeC@k, the evidence score and justification "
                "METEOR will be saved as not computed, every other score as usual."]
    return []


# How a run scored without WordNet gets its METEOR-based scores: the same command again finds every claim done,
# so it loads no model and debates nothing (runner._verify), and finish() scores the predictions anew.
RESCORE = ("run the same command again to add them: every claim is done, so nothing is debated and no model "
           "loads.")


def score_retrieved(config, claims):
    """--retrieve-only: the evidence-only scores of the saved file (eval/evidence_score.py) where the claims have golden
    AVeriTeC pairs, written to OUTPUT_DIR/retrieved.scores.json; None where there are none to score against."""
    references = data.as_references([c for c in claims if c.get("questions")])
    path = store_retrieval.retrieved_path(config)
    if not references:
        log.info(f"retrieved evidence saved in {path}; the split has no golden question-answer pairs to score it "
                 "against")
        return None
    wordnet.load_wordnet()
    rows = [(f"line {n}", row) for n, row in enumerate(records.read_jsonl(path), start=1)]
    scores = evidence_scores.score(rows, [(f"claim {r['claim_id']}", r) for r in references], (str(path), "the split"))
    records.write_json(path.with_name("retrieved.scores.json"), {k: v for k, v in scores.items() if k != "per_claim"})
    log.info(evidence_scores.summary_line(scores))
    return scores


def finish_trials(config, claims, top, results):
    """The trials' summary written to `top` (trial_summary of `results`, each trial's metrics), with PROClaim's
    Table 3 over the trials for the courtroom's methods."""
    trials = len(results)
    summary = trial_summary(results)
    if config.method.method in COURTROOM_METHODS:
        # PROClaim's Table 3 over the trials (eval/trials.py): each run, the vote over runs, the oracle.
        references = {c["claim_id"]: c.get("label") for c in claims if c.get("label")}
        runs = [records.read_predictions(top / f"trial-{k}") for k in range(1, trials + 1)]
        # The paper's other measures read the counsels' arguments from each trial's transcripts too.
        wanted = {c["claim_id"] for c in claims}
        digests = [proclaim_measures.read_digests(top / f"trial-{k}", wanted) for k in range(1, trials + 1)]
        summary["table3"] = trial_metrics.table3(runs, references, digests)
        log.info(trial_metrics.table3_text(summary["table3"]))
    records.write_json(top / records.METRICS, summary)
    log.info(report.trials_table(summary))
    if summary.get("not_computed"):
        log.info(wordnet.not_computed_line(RESCORE))
    return summary


def trial_summary(results):
    """Every numeric metric of the trials' metrics, as {"mean", "std", "values"}; nested dicts keep their shape.

    std is the sample standard deviation (n - 1 in the denominator), 0 for one trial. A value that is not
    a number in every trial (a label name, a list, a key some trial lacks) is kept as is when all trials
    agree on it, else as the list of the trials' values.
    """
    def merge(values):
        if all(isinstance(v, dict) for v in values):
            keys = list(dict.fromkeys(k for v in values for k in v))  # a key some trials lack gets None there
            return {k: merge([v.get(k) for v in values]) for k in keys}
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            mean = sum(values) / len(values)
            var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
            return {"mean": mean, "std": var ** 0.5, "values": list(values)}
        return values[0] if all(v == values[0] for v in values) else list(values)

    return dict(merge(results), trials=len(results))


def finish(config, claims, labels=None):
    """Score the run directory's predictions against the claims' gold labels and write the reports: AVeriTeC's
    scorer (labels, evidence score, justification METEOR) and submission.json on AVeriTeC, the label metrics
    (eval.metrics) under the dataset's `labels` elsewhere; an explanation run's explanations are summed up
    (their faithfulness is debatecv-geval's to score: debate.pipeline.geval_run)."""
    out = Path(config.output.output_dir)
    wanted = {c["claim_id"] for c in claims}
    # A directory resumed with a smaller --limit holds more claims than this run asked for.
    predictions = [p for p in records.read_predictions(out) if p["claim_id"] in wanted]
    if config.debate.debate_retrieval:  # the evidence each debate ended with, in HerO's format, scored
        grown_evidence.save(out, predictions, claims)
    if config.method.task == "explain":
        metrics = geval_scores.explanation_stats(predictions)
        records.write_json(out / records.METRICS, metrics)
        log.info(geval_scores.stats_line(metrics))
        log.info(f"faithfulness: debatecv-geval {out} --judge-model MODEL --protocol all")
        return metrics
    averitec_run = config.data.dataset == "averitec"
    if averitec_run:
        submission = records.submission(predictions, claims)
        records.write_json(out / records.SUBMISSION, submission)
    references = [c for c in claims if c.get("label")]
    if not references:
        log.info("no gold labels for this split: predictions written, nothing scored")
        return None
    if averitec_run:
        metrics = averitec.score(submission, data.as_references(references))
    else:
        metrics = label_scores.score(predictions, references, labels)
    metrics["dataset"] = config.data.dataset
    metrics["evidence_condition"] = config.data.evidence
    if config.method.method in COURTROOM_METHODS:
        # The panel's agreement, Table 5's evidence and rounds, Appendix P's tokens (eval/trials.py), and the
        # paper's other measures (eval/proclaim_measures.py, which also reads the transcripts).
        metrics.update(trial_metrics.run_extras(predictions, {c["claim_id"]: c.get("label") for c in references},
                                                proclaim_measures.read_digests(out, wanted)))
    records.write_json(out / records.METRICS, metrics)
    log.info(report.summary_table(metrics, rescore=RESCORE))
    if "proclaim" in metrics and config.generation.trials == 1:
        log.info(proclaim_measures.measures_text(metrics["proclaim"]["measures"]))
    if config.data.split == "demo":
        log.info(next_step(out))
    return metrics


def next_step(out):
    """The demo's last line: where its outputs are, how to see them, how to run on one's own claims and model."""
    written = ", ".join(name for name in records.RUN_FILES if (Path(out) / name).exists())
    return (f"next: outputs in {out} ({written}); see them with "
            f"`python -m eval.view {out} -o report.html`; your own claims and model: `python run_debate.py "
            "--dataset jsonl --data-dir DIR --split NAME --model PATH` (DIR/NAME.jsonl beside a card.json)")
