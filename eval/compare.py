"""Paired bootstrap comparison of two prediction files over the claims both of them predict.

Each resample draws those claims with replacement and takes d = metric(A) - metric(B) on it, for
accuracy and for AVeriTeC at one level (0.25 by default; per claim: label right and evidence score
above the level). The 95% interval is the 2.5th and 97.5th percentiles of d. The p-value is
two-sided: twice the smaller of the shares of resamples with d <= 0 and with d >= 0, capped at 1,
i.e. how often the sign of the observed difference flips (a tie counts as a flip). Identical files
give d = 0 on every resample and p = 1.

Run ``python -m eval.compare A B --references R [--evidence E] [--samples 10000 --seed 0] [--json]``.
"""
import json
import sys

import numpy as np

from debate.cli import Parser
from eval.averitec import InputError, level_key, rows_from_files


def paired_bootstrap(a, b, samples=10_000, seed=0):
    """Bootstrap the mean difference of paired per-claim scores `a` and `b` (equal length)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or not len(a):
        raise ValueError("paired_bootstrap needs two equally long, non-empty 1-d sequences")
    diff = a - b
    rng = np.random.default_rng(seed)
    draws = np.empty(samples)
    chunk = max(1, 2_000_000 // len(diff))  # bound the index matrix to ~16 MB
    for start in range(0, samples, chunk):
        size = min(chunk, samples - start)
        draws[start:start + size] = diff[rng.integers(0, len(diff), (size, len(diff)))].mean(axis=1)
    flips = min(np.mean(draws <= 0), np.mean(draws >= 0))
    low, high = np.percentile(draws, [2.5, 97.5])
    return {
        "a": float(a.mean()),
        "b": float(b.mean()),
        "diff": float(diff.mean()),
        "ci95": [float(low), float(high)],
        "p_value": float(min(1.0, 2 * flips)),
    }


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

    return {
        "n": len(shared),
        "n_only_a": len(by_a.keys() - by_b.keys()),
        "n_only_b": len(by_b.keys() - by_a.keys()),
        "samples": samples,
        "seed": seed,
        "accuracy": paired_bootstrap(per_claim(by_a, False), per_claim(by_b, False), samples, seed),
        f"averitec@{level_key(level)}": paired_bootstrap(
            per_claim(by_a, True), per_claim(by_b, True), samples, seed
        ),
    }


def compare_files(path_a, path_b, references, evidence=None, samples=10_000, seed=0, level=0.25):
    """`compare_rows` on two prediction files scored against `references`."""
    rows_a, _ = rows_from_files(path_a, references, evidence)
    rows_b, _ = rows_from_files(path_b, references, evidence)
    return compare_rows(rows_a, rows_b, samples, seed, level)


def format_comparison(result, name_a="A", name_b="B"):
    """A few readable lines for a `compare_rows` result."""
    lines = [f"A = {name_a}", f"B = {name_b}",
             f"claims in common {result['n']} (only A {result['n_only_a']}, only B {result['n_only_b']}),"
             f" {result['samples']} resamples, seed {result['seed']}",
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
    parser.add_argument("a", help="predictions of system A (a run's submission.json, or JSONL)")
    parser.add_argument("b", help="predictions of system B, on the same claims")
    parser.add_argument("--references", required=True,
                        help="AVeriTeC dev.json-shaped file with the gold labels, evidence and justifications")
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
