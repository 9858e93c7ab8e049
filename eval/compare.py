"""Paired bootstrap comparison of two prediction files over the claims both of them predict.

Each resample draws those claims with replacement and takes d = metric(A) - metric(B) on it, for
accuracy and, with AVeriTeC references, for the AVeriTeC score at one level (0.25 by default; per claim: label
right and evidence score above the level). Without --references (runs of any dataset) the gold label each
run's predictions.jsonl records is used, and accuracy is compared. The 95% interval is the 2.5th and 97.5th percentiles
of d. The p-value is
two-sided: twice the smaller of the shares of resamples with d <= 0 and with d >= 0, capped at 1,
i.e. how often the sign of the observed difference flips (a tie counts as a flip). Identical files
give d = 0 on every resample and p = 1.

A and B may also be run directories. One made with ``--trials N`` (trial-1/, trial-2/, ...) is a trial
set: the bootstrap then resamples trials as well as claims (each draw picks the claims and, with
replacement, the trial indices, the same ones for A and B, so trial k of A is paired with trial k of B)
and both sets must hold the same number of trials. A directory without trials, or a predictions file,
is a set of one trial.

Run ``python -m eval.compare A B [--references R [--evidence E]] [--samples 10000 --seed 0] [--json]``.
"""
import json
import sys
from pathlib import Path

import numpy as np

from debate.data.flags import Parser
from eval.averitec import InputError, level_key, read_records, rows_from_files


def paired_bootstrap(a, b, samples=10_000, seed=0):
    """Bootstrap the mean difference of paired scores `a` and `b`: per claim (1-d, equal length) or per
    trial and claim (2-d, trials x claims), resampling claims and, for 2-d, trials too."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim not in (1, 2) or not a.size:
        raise ValueError("paired_bootstrap needs two equally shaped, non-empty 1-d or 2-d arrays")
    diff = (a - b).reshape(-1, a.shape[-1])  # trials x claims
    trials, claims = diff.shape
    rng = np.random.default_rng(seed)
    draws = np.empty(samples)
    chunk = max(1, 2_000_000 // (claims * trials))  # bound the index matrix to ~16 MB
    for start in range(0, samples, chunk):
        size = min(chunk, samples - start)
        picked = diff[:, rng.integers(0, claims, (size, claims))].mean(axis=2)  # trials x size
        if trials > 1:
            which = rng.integers(0, trials, (size, trials))
            draws[start:start + size] = picked[which, np.arange(size)[:, None]].mean(axis=1)
        else:
            draws[start:start + size] = picked[0]
    flips = min(np.mean(draws <= 0), np.mean(draws >= 0))
    low, high = np.percentile(draws, [2.5, 97.5])
    return {
        "a": float(a.mean()),
        "b": float(b.mean()),
        "diff": float(diff.mean()),
        "ci95": [float(low), float(high)],
        "p_value": float(min(1.0, 2 * flips)),
    }


def trial_files(path, name="submission.json"):
    """The predictions of each trial of `path`: a run directory with trial-*/, a run directory, or a file.

    A run directory's submission.json is read (it carries the evidence the AVeriTeC score needs), or with
    `name` another of its files (predictions.jsonl: any dataset's, with each claim's gold label)."""
    path = Path(path)
    if not path.is_dir():
        return [path]
    trials = sorted((p for p in path.glob("trial-*") if p.is_dir() and p.name[6:].isdigit()),
                    key=lambda p: int(p.name[6:]))
    found = []
    for run in trials or [path]:
        if not (run / name).is_file():
            raise InputError(f"{run}: no {name} in it (is the run finished?)")
        found.append(run / name)
    return found


def label_rows(path):
    """Per-claim rows {claim_id, correct} of a predictions file whose records carry their `gold_label` (a run's
    predictions.jsonl, whatever the dataset); the AVeriTeC score needs --references instead."""
    rows = []
    for where, record in read_records(path):
        if "gold_label" not in record or "claim_id" not in record:
            raise InputError(f"{path}: {where}: no claim_id and gold_label (compare AVeriTeC submissions with "
                             "--references)")
        if record["gold_label"] is not None:
            rows.append({"claim_id": record["claim_id"], "correct": record.get("label") == record["gold_label"]})
    return rows


def compare_trials(trials_a, trials_b, samples=10_000, seed=0, level=0.25):
    """Bootstrap accuracy and AVeriTeC@level over claims and trials: two equally long lists of row lists."""
    if len(trials_a) != len(trials_b):
        raise InputError(f"A has {len(trials_a)} trials and B has {len(trials_b)}: pairing needs as many of each")
    by_a = [{r["claim_id"]: r for r in rows} for rows in trials_a]
    by_b = [{r["claim_id"]: r for r in rows} for rows in trials_b]
    all_a, all_b = set().union(*by_a), set().union(*by_b)
    shared = sorted(set.intersection(*(set(t) for t in by_a + by_b)))
    if not shared:
        raise InputError("the two prediction sets have no claim in common")

    def scores(trials, averitec):
        return [[float(t[c]["correct"] and (not averitec or t[c]["evidence_score"] > level)) for c in shared]
                for t in trials]

    result = {
        "n": len(shared),
        "trials": len(trials_a),
        "n_only_a": len(all_a - set(shared)),
        "n_only_b": len(all_b - set(shared)),
        "samples": samples,
        "seed": seed,
        "accuracy": paired_bootstrap(scores(by_a, False), scores(by_b, False), samples, seed),
    }
    if all("evidence_score" in r for t in by_a + by_b for r in t.values()):
        result[f"averitec@{level_key(level)}"] = paired_bootstrap(scores(by_a, True), scores(by_b, True), samples, seed)
    return result


def compare_rows(rows_a, rows_b, samples=10_000, seed=0, level=0.25):
    """Bootstrap accuracy and AVeriTeC@level over the claim_ids present in both row lists."""
    by_a = {r["claim_id"]: r for r in rows_a}
    by_b = {r["claim_id"]: r for r in rows_b}
    shared = sorted(by_a.keys() & by_b.keys())
    if not shared:
        raise InputError("the two prediction files have no claim in common")

    def per_claim(rows, averitec):
        return [
            float(rows[c]["correct"] and (not averitec or rows[c]["evidence_score"] > level))
            for c in shared
        ]

    result = {
        "n": len(shared),
        "n_only_a": len(by_a.keys() - by_b.keys()),
        "n_only_b": len(by_b.keys() - by_a.keys()),
        "samples": samples,
        "seed": seed,
        "accuracy": paired_bootstrap(per_claim(by_a, False), per_claim(by_b, False), samples, seed),
    }
    if all("evidence_score" in r for r in [*by_a.values(), *by_b.values()]):  # AVeriTeC references were given
        result[f"averitec@{level_key(level)}"] = paired_bootstrap(
            per_claim(by_a, True), per_claim(by_b, True), samples, seed)
    return result


def compare_files(path_a, path_b, references=None, evidence=None, samples=10_000, seed=0, level=0.25):
    """`compare_rows` on two prediction files scored against AVeriTeC `references` or, without them, against the
    gold labels the predictions record (any dataset's runs); `compare_trials` when either is a run directory of
    several trials."""
    name = "submission.json" if references else "predictions.jsonl"
    files_a, files_b = trial_files(path_a, name), trial_files(path_b, name)

    def rows(path):
        return rows_from_files(path, references, evidence)[0] if references else label_rows(path)

    if len(files_a) == 1 and len(files_b) == 1:
        return compare_rows(rows(files_a[0]), rows(files_b[0]), samples, seed, level)
    return compare_trials([rows(f) for f in files_a], [rows(f) for f in files_b], samples, seed, level)


def format_comparison(result, name_a="A", name_b="B"):
    """A few readable lines for a `compare_rows` result."""
    lines = [f"A = {name_a}", f"B = {name_b}",
             f"claims in common {result['n']} (only A {result['n_only_a']}, only B {result['n_only_b']}),"
             + (f" {result['trials']} paired trials," if "trials" in result else "")
             + f" {result['samples']} resamples, seed {result['seed']}",
             f"{'metric (in %)':<16}{'A':>7}{'B':>7}{'A-B':>8}   95% CI of A-B       p"]
    for key, stats in result.items():
        if isinstance(stats, dict):
            low, high = stats["ci95"]
            lines.append(
                f"{key:<16}{100 * stats['a']:7.1f}{100 * stats['b']:7.1f}{100 * stats['diff']:+8.1f}"
                f"   [{100 * low:+5.1f}, {100 * high:+5.1f}]   {stats['p_value']:.4f}"
            )
    return "\n".join(lines)


def build_parser():
    parser = Parser(prog="python -m eval.compare", description=__doc__.split("\n")[0])
    parser.add_argument("a", help="predictions of system A (a run's submission.json, JSONL, or a run directory, "
                        "with trials or not)")
    parser.add_argument("b", help="predictions of system B, on the same claims (likewise)")
    parser.add_argument("--references",
                        help="AVeriTeC dev.json-shaped file with the gold labels, evidence and justifications, for the "
                        "AVeriTeC score (default: the gold labels in the runs' predictions.jsonl, any dataset)")
    parser.add_argument("--evidence", help="evidence for predictions that carry none (default: none)")
    parser.add_argument("--samples", type=int, default=10_000, help="paired bootstrap resamples")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap resampling")
    parser.add_argument("--level", type=float, default=0.25, help="AVeriTeC evidence-score level")
    parser.add_argument("--json", action="store_true", help="print one JSON object (fractions, not percentages)")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error("--samples must be positive")
    from eval.wordnet import WordNetMissingError

    try:
        result = compare_files(args.a, args.b, args.references, args.evidence,
                               args.samples, args.seed, args.level)
    except (InputError, WordNetMissingError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, sort_keys=True) if args.json else format_comparison(result, args.a, args.b))
    return 0


if __name__ == "__main__":
    sys.exit(main())
