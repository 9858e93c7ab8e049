"""Label metrics for any dataset's label set, with bootstrap intervals.

Accuracy, macro-F1, per-class precision / recall / F1, the confusion matrix, the false-positive rate of each
neutral label (the label set's `nei` and `mixed`: AVeriTeC's NEE and CEC, the DebateCV paper's FPRs), and where
predictions carry label probabilities the expected calibration error and the Brier score. Every one of these
gets a 95% percentile interval from a bootstrap over claims (`intervals`). A prediction that names no label
("unparsed") is wrong and is never mapped to a default class.
"""
import math
from collections import Counter
from typing import Any, Optional, Sequence

import numpy as np

UNPARSED = "unparsed"
ECE_BINS = 15
BOOTSTRAP_SAMPLES = 1000


def _ratio(num, den):
    return num / den if den else None


def neutral_labels(labels):
    """The labels whose false-positive rate is reported: the label set's nei and mixed ones."""
    return [label for label in (labels.nei, labels.mixed) if label is not None]


def label_metrics(golds: Sequence[str], preds: Sequence[Optional[str]], labels: Any) -> dict:
    """Accuracy, macro-F1, per-class precision / recall / F1 and support, confusion (gold -> predicted -> count,
    with an "unparsed" column), the neutral labels' false-positive rates and the count of unparsed predictions.

    `golds` and `preds` hold labels of `labels` (a LabelSet); a pred that is None or outside the set is unparsed.
    F1 of a class with no gold and no predicted instance is 0.
    """
    golds, preds, names = list(golds), list(preds), labels.labels
    n = len(golds)
    confusion = {g: {p: 0 for p in (*names, UNPARSED)} for g in names}
    for g, p in zip(golds, preds):
        confusion[g][p if p in names else UNPARSED] += 1
    per_class, f1 = {}, {}
    for label in names:
        tp = confusion[label][label]
        predicted = sum(confusion[g][label] for g in names)
        actual = sum(confusion[label].values())
        f1[label] = 2 * tp / (predicted + actual) if predicted + actual else 0.0
        per_class[label] = {"precision": _ratio(tp, predicted), "recall": _ratio(tp, actual), "f1": f1[label],
                            "support": actual}
    fpr = {}
    for label in neutral_labels(labels):
        others = [g for g in names if g != label]
        fpr[label] = _ratio(sum(confusion[g][label] for g in others), sum(sum(confusion[g].values()) for g in others))
    correct = sum(g == p for g, p in zip(golds, preds))
    return {"n": n, "labels": list(names), "accuracy": _ratio(correct, n),
            "macro_f1": sum(f1.values()) / len(names) if n else None, "per_class_f1": f1, "per_class": per_class,
            "confusion": confusion, "fpr": fpr, "n_unparsed": sum(p not in names for p in preds)}


def _calibration_terms(golds, probs, labels, bins):
    """Per claim with probabilities: (bin of its top label's probability, that probability, top label right,
    its Brier term); claims without probabilities are left out."""
    terms = []
    for gold, p in zip(golds, probs):
        if not p:
            continue
        p = {labels.canonical(k): v for k, v in p.items()}
        top = max(labels.labels, key=lambda label: p.get(label, 0.0))
        confidence = p.get(top, 0.0)
        b = min(bins - 1, max(0, math.ceil(confidence * bins) - 1))  # (k/bins, (k+1)/bins] -> bin k
        brier = sum((p.get(label, 0.0) - (label == gold)) ** 2 for label in labels.labels)
        terms.append((b, confidence, top == gold, brier))
    return terms


def calibration(golds: Sequence[str], probs: Sequence[Optional[dict]], labels: Any,
                bins: int = ECE_BINS) -> Optional[dict]:
    """{"ece", "brier", "n"} over the claims whose label probabilities are known (`probs`: a dict label ->
    probability, or None), or None when none are.

    ECE: the claims are put into `bins` equal-width bins (lower, upper] by the probability of their top
    label; ECE = sum over bins of (claims in bin / n) x |accuracy of the top label - mean top probability|.
    Brier: the mean over claims of sum over the labels of (p - 1 if gold else p)^2, in [0, 2].
    """
    terms = _calibration_terms(golds, probs, labels, bins)
    if not terms:
        return None
    sums = [[0, 0.0, 0] for _ in range(bins)]  # per bin: claims, summed confidence, top label right
    for b, confidence, right, _ in terms:
        sums[b][0] += 1
        sums[b][1] += confidence
        sums[b][2] += right
    n = len(terms)
    ece = sum(count / n * abs(right / count - conf / count) for count, conf, right in sums if count)
    return {"ece": ece, "brier": sum(t[3] for t in terms) / n, "n": n}


def bootstrap_intervals(golds, preds, probs, labels, samples=BOOTSTRAP_SAMPLES, seed=0, bins=ECE_BINS):
    """95% percentile intervals, over `samples` resamplings of the claims (with replacement, fixed `seed`), of
    accuracy, macro-F1, each class's F1 and, where label probabilities exist, ECE and Brier:
    {"accuracy": [low, high], "macro_f1": [...], "per_class_f1": {label: [...]}, "ece": [...], "brier": [...]}.
    """
    n, names = len(golds), labels.labels
    if n == 0:
        return {}
    rng = np.random.default_rng(seed)
    # Each resampling as the number of times it draws each claim: every statistic below is then a weighted sum.
    weights = rng.multinomial(n, np.full(n, 1.0 / n), size=samples).astype(float)
    gold = np.array([[g == label for label in names] for g in golds], dtype=float)
    pred = np.array([[p == label for label in names] for p in preds], dtype=float)
    tp, predicted, actual = weights @ (gold * pred), weights @ pred, weights @ gold
    with np.errstate(invalid="ignore", divide="ignore"):
        f1 = np.where(predicted + actual > 0, 2 * tp / (predicted + actual), 0.0)
    correct = np.array([g == p for g, p in zip(golds, preds)], dtype=float)

    def interval(values):
        low, high = np.percentile(values, [2.5, 97.5])
        return [float(low), float(high)]

    out = {"accuracy": interval(weights @ correct / n), "macro_f1": interval(f1.mean(axis=1)),
           "per_class_f1": {label: interval(f1[:, k]) for k, label in enumerate(names)}}
    with_probs = [i for i, p in enumerate(probs) if p]
    if with_probs:
        terms = _calibration_terms([golds[i] for i in with_probs], [probs[i] for i in with_probs], labels, bins)
        w = weights[:, with_probs]
        counts = w.sum(axis=1)
        in_bin = np.zeros((len(terms), bins))
        in_bin[np.arange(len(terms)), [t[0] for t in terms]] = 1.0
        per_bin = w @ in_bin
        conf = w @ (in_bin * np.array([t[1] for t in terms])[:, None])
        right = w @ (in_bin * np.array([float(t[2]) for t in terms])[:, None])
        with np.errstate(invalid="ignore", divide="ignore"):
            gaps = np.where(per_bin > 0, np.abs(right - conf) / counts[:, None], 0.0)
        out["ece"] = interval(gaps.sum(axis=1))
        out["brier"] = interval(w @ np.array([t[3] for t in terms]) / counts)
    return out


def scored(golds, preds, probs, labels):
    """label_metrics, with calibration where probabilities exist and every interval under `intervals`."""
    metrics = label_metrics(golds, preds, labels)
    calibrated = calibration(golds, probs, labels)
    if calibrated:
        metrics["calibration"] = calibrated
    metrics["intervals"] = bootstrap_intervals(golds, preds, probs, labels)
    return metrics


def run_stats(records):
    """Rounds, token and parse-status summaries for our own predictions.jsonl records."""
    out = {}
    rounds = [r["rounds"] for r in records if "rounds" in r]
    rounds = [len(x) if isinstance(x, list) else x for x in rounds]
    rounds = [x for x in rounds if isinstance(x, int) and not isinstance(x, bool)]
    if rounds:
        counts = Counter(rounds)
        out["rounds"] = {
            "distribution": {str(k): counts[k] for k in sorted(counts)},
            "mean": sum(rounds) / len(rounds),
        }
    tokens = {}
    for key in ("prompt_tokens", "completion_tokens"):
        values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
        if values:
            tokens[key] = {"total": sum(values), "mean": sum(values) / len(values)}
    if tokens:
        out["tokens"] = tokens
    statuses = [r["parse_status"] for r in records if "parse_status" in r]
    if statuses:
        out["parse_status"] = dict(Counter(str(s) for s in statuses).most_common())
    return out


def score(predictions: Sequence[dict], references: Sequence[dict], labels: Any) -> dict:
    """The metrics of `predictions` (records with claim_id, label and optionally label_probs, rounds, tokens,
    parse_status) against `references` (records with claim_id and the gold label) under `labels`, a LabelSet.

    Only predicted claims are scored; `n_missing` counts references with no prediction. Ids compare as strings.
    """
    gold = {str(r["claim_id"]): r["label"] for r in references}
    rows = [p for p in predictions if str(p["claim_id"]) in gold]
    out = scored([gold[str(p["claim_id"])] for p in rows], [labels.canonical(p.get("label")) for p in rows],
                 [p.get("label_probs") for p in rows], labels)
    out.update(n_references=len(gold), n_missing=len(gold) - len(rows))
    out.update(run_stats(rows))
    return out
