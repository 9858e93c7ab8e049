"""One-screen text summary of a metrics dict (`eval.averitec.score`, `eval.metrics.score`), any label set."""
from typing import Any, List, Mapping, Optional, Union

from debate.data.labels import CEC, LABELS, NEE
from eval import wordnet

_SHORT = {"Supported": "SUP", "Refuted": "REF", NEE: "NEE", CEC: "CEC", "unparsed": "unparsed"}


def _short(label: str) -> str:
    return _SHORT.get(label, label[:8])


def _pct(value: Optional[float]) -> str:
    # Shown in percent, marked so: metrics.json and --json keep fractions in [0, 1].
    return "     -" if value is None else f"{100 * value:5.1f}%"


def _num(value: Union[int, float]) -> str:
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.1f}"
    return f"{int(value):,}"


def summary_table(metrics: Mapping[str, Any], rescore: str = "score the predictions again to add them.") -> str:
    """Accuracy, macro-F1, AVeriTeC levels, justification METEOR, FPRs, per-class F1, confusion, rounds
    and tokens. Scores left out for want of WordNet get one line, ending with `rescore` (how to add them)."""
    lines: List[str] = []
    n = metrics.get("n", 0)
    head = f"claims scored {n}"
    if metrics.get("n_missing"):
        head += f" (missing {metrics['n_missing']} of {metrics.get('n_references')})"
    if metrics.get("n_unparsed"):
        head += f", unparsed {metrics['n_unparsed']}"
    lines.append(head)
    lines.append(f"accuracy        {_pct(metrics.get('accuracy'))}")
    lines.append(f"macro-F1        {_pct(metrics.get('macro_f1'))}")
    averitec = metrics.get("averitec") or {}
    if metrics.get("not_computed"):
        # Saved as null, said in one line: a score that could not be computed is not a score of 0.
        lines.append(wordnet.not_computed_line(rescore))
    elif averitec:
        lines.append(f"AVeriTeC@0.25   {_pct(averitec.get('0.25'))}")
        lines.append("AVeriTeC levels " + "  ".join(f"@{k} {_pct(v).strip()}" for k, v in averitec.items()))
    if metrics.get("evidence_score_mean") is not None:
        lines.append(f"evidence score  {metrics['evidence_score_mean']:.3f} (mean Q+A METEOR match)")
    if metrics.get("justification_meteor") is not None:
        line = (f"justification   METEOR {metrics['justification_meteor']:.3f}"
                f" ({metrics.get('n_with_gold_justification')} claims with a gold one)")
        if metrics.get("justification_meteor_unrefined") is not None:
            line += f", before MADR {metrics['justification_meteor_unrefined']:.3f}"
        lines.append(line)
    if metrics.get("calibration"):
        cal = metrics["calibration"]
        lines.append(f"calibration     ECE {cal['ece']:.3f}   Brier {cal['brier']:.3f}   "
                     f"({cal['n']} claims with label probabilities)")
    labels = metrics.get("labels") or list(LABELS)  # metrics written before they named their labels: AVeriTeC's
    fpr = metrics.get("fpr") or {}
    if fpr:
        lines.append("FPR  " + "   ".join(f"{_short(label)} {_pct(v).strip()}" for label, v in fpr.items()))
    per_class = metrics.get("per_class_f1") or {}
    lines.append("F1   " + "   ".join(f"{_short(label)} {_pct(per_class.get(label)).strip()}" for label in labels))
    intervals = metrics.get("intervals") or {}
    if intervals.get("accuracy"):
        lines.append("95% CI          " + "   ".join(
            f"{name} [{100 * intervals[key][0]:.1f}, {100 * intervals[key][1]:.1f}]"
            for key, name in (("accuracy", "accuracy"), ("macro_f1", "macro-F1")) if intervals.get(key)))

    confusion = metrics.get("confusion")
    if confusion:
        columns = [*labels, "unparsed"]
        lines.append("confusion (rows gold, columns predicted)")
        lines.append("         " + "".join(f"{_short(c):>9}" for c in columns))
        for gold in labels:
            row = confusion.get(gold, {})
            lines.append(f"  {_short(gold):<7}" + "".join(f"{row.get(c, 0):>9}" for c in columns))

    rounds = metrics.get("rounds")
    if rounds:
        spread = "  ".join(f"{k}:{v}" for k, v in rounds["distribution"].items())
        lines.append(f"rounds          mean {rounds['mean']:.2f}   {spread}")
    for key, name in (("prompt_tokens", "prompt tokens"), ("completion_tokens", "output tokens")):
        stats = (metrics.get("tokens") or {}).get(key)
        if stats:
            lines.append(f"{name:<16}total {_num(stats['total'])}   mean {_num(stats['mean'])}")
    if metrics.get("parse_status"):
        lines.append("parse status    " + "  ".join(f"{k}:{v}" for k, v in metrics["parse_status"].items()))
    return "\n".join(lines)


def trials_table(summary: Mapping[str, Any]) -> str:
    """The headline metrics of a `scoring.trial_summary` as mean +- standard deviation over trials."""
    def stat(node: Any) -> str:
        if isinstance(node, dict) and "mean" in node and "std" in node:
            return f"{100 * node['mean']:5.1f} +- {100 * node['std']:4.1f}"
        return "    -"

    averitec = summary.get("averitec") or {}
    fpr = summary.get("fpr") or {}
    lines = [f"{summary.get('trials')} trials (mean +- sample standard deviation, in %)",
             f"accuracy        {stat(summary.get('accuracy'))}",
             f"macro-F1        {stat(summary.get('macro_f1'))}",
             f"AVeriTeC@0.25   {stat(averitec.get('0.25'))}",
             f"FPR NEE         {stat(fpr.get(NEE))}",
             f"FPR CEC         {stat(fpr.get(CEC))}"]
    rounds = (summary.get("rounds") or {}).get("mean")
    if isinstance(rounds, dict) and "std" in rounds:
        lines.append(f"rounds          {rounds['mean']:5.2f} +- {rounds['std']:4.2f}")
    return "\n".join(lines)
