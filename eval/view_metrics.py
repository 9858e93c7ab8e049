"""The numbers the HTML report (eval/view.py) shows, apart from the page that shows them: every metric of a
metrics.json as a row with its interval, the paired bootstrap of accuracy between two runs, and the claims
whose verdict differs between runs. Reads the runs as eval/rundir.py gives them; writes no HTML.
"""
import json
import math

# ---------------------------------------------------------------- numbers


def fmt(value):
    """A metric as the report prints it: ints with separators, fractions to four places."""
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "-"}[value]
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.4f}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


# ---------------------------------------------------------------- metrics


def _pair(value):
    return isinstance(value, (list, tuple)) and len(value) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)


POINT_KEYS = ("value", "estimate", "point", "mean", "diff")
INTERVAL_KEYS = ("ci95", "ci", "interval")
SIBLING_SUFFIXES = ("_ci95", "_ci", "_interval")


def _stat(node):
    """(value, interval text) of a metric recorded with its spread, else None. Understands a trials summary
    {"mean", "std", "values"}, {point, "ci95"|"ci"|"interval": [low, high]} and {point, "low", "high"}."""
    if not isinstance(node, dict):
        return None
    point = next((node[k] for k in POINT_KEYS if isinstance(node.get(k), (int, float))), None)
    if "mean" in node and "std" in node and isinstance(node.get("std"), (int, float)):
        values = node.get("values")
        spread = f"± {fmt(node['std'])} (sd)"
        if isinstance(values, list):
            spread += f" over {len(values)} trials: " + ", ".join(fmt(v) for v in values)
        return node["mean"], spread
    interval = next((node[k] for k in INTERVAL_KEYS if _pair(node.get(k))), None)
    if interval is None and _pair([node.get("low"), node.get("high")]):
        interval = [node["low"], node["high"]]
    if interval is not None and point is not None:
        return point, f"[{fmt(interval[0])}, {fmt(interval[1])}]"
    return None


def _bootstrap_interval(intervals, path):
    """The interval eval.metrics' `intervals` holds for the metric at `path` (keys from the top), or None:
    accuracy, macro_f1, per_class_f1 / label, and calibration's ece and brier."""
    if path[:1] == ("calibration",):
        path = path[1:]
    node = intervals
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node if _pair(node) else None


def metric_rows(metrics, skip=()):
    """[(name, value text, interval text)] for every metric of a metrics.json, nested ones by their path
    ("per_class_f1 / Supported"), with the interval where the file has one (beside the metric, or in the
    bootstrap `intervals` of eval.metrics)."""
    rows = []
    intervals = (metrics or {}).get("intervals") or {}

    def walk(name, node, sibling=None, path=()):
        sibling = sibling or _bootstrap_interval(intervals, path)
        stat = _stat(node)
        if stat is not None:
            rows.append((name, fmt(stat[0]), stat[1]))
        elif isinstance(node, dict) and node:
            for key, value in node.items():
                if str(key).endswith(SIBLING_SUFFIXES) and _pair(value) and str(key).rsplit("_", 1)[0] in node:
                    continue  # shown beside its metric
                near = next((node[f"{key}{s}"] for s in SIBLING_SUFFIXES if _pair(node.get(f"{key}{s}"))), None)
                walk(f"{name} / {key}" if name else str(key), value, near, (*path, str(key)))
        else:
            interval = f"[{fmt(sibling[0])}, {fmt(sibling[1])}]" if sibling else ""
            rows.append((name, fmt(node), interval))

    kept = {k: v for k, v in (metrics or {}).items() if k not in skip and k != "intervals"}
    if kept:
        walk("", kept)
    return rows


# ---------------------------------------------------------------- the paired test


def paired_accuracy(run_a, run_b, samples, seed):
    """The paired bootstrap of accuracy (eval.compare.paired_bootstrap) over the claims both runs decided
    against a gold label; over trials too when both are `--trials` runs of as many trials. None without
    a claim in common."""
    from eval.compare import paired_bootstrap

    if run_a["trials"] > 1 and run_a["trials"] == run_b["trials"]:
        by_a, by_b = run_a["trial_correct"], run_b["trial_correct"]
    else:
        by_a = [{c["id"]: c["correct"] for c in run_a["claims"] if c["correct"] is not None}]
        by_b = [{c["id"]: c["correct"] for c in run_b["claims"] if c["correct"] is not None}]
    shared = sorted(set.intersection(*(set(t) for t in by_a + by_b)))
    if not shared:
        return None
    result = paired_bootstrap([[float(t[c]) for c in shared] for t in by_a],
                              [[float(t[c]) for c in shared] for t in by_b], samples, seed)
    return dict(result, n=len(shared), trials=len(by_a))


def differing_claims(runs):
    """[(claim key, claim text, gold, [(run index, row index, label) or None per run])] of the claims on
    which the runs holding them do not all give the same verdict (a run asked for none, with no label in
    its records, is left out)."""
    index = [{c["id"]: c for c in run["claims"] if "label" in c["prediction"]} for run in runs]
    out = []
    for key in dict.fromkeys(k for table in index for k in table):
        rows = [table.get(key) for table in index]
        present = [r for r in rows if r is not None]
        if len(present) > 1 and len({json.dumps(r["pred"]) for r in present}) > 1:
            first = present[0]
            out.append((key, first["claim"], next((r["gold"] for r in present if r["gold"] is not None), None),
                        [(k, r["i"], r["pred"]) if r else None for k, r in enumerate(rows)]))
    return out
