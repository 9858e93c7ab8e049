"""PROClaim's own evaluation: its Table 3 (three runs), Table 4 (Standard MAD, single call) and Tables 5-6
(ablations A1-A4), with Appendix P's tokens, on Check-COVID's binary test claims.

    python bench/bench_proclaim.py --limit 6                         # CPU sample, embedded Gemma 3 270M
    python bench/bench_proclaim.py --model M --judge-models J1 J2 J3 --limit 121 --out bench/out/proclaim-full

Each configuration is one `run_debate.py` run with `--trials N` (default 3) into OUT/<name>/ (resumable:
a rerun picks up where it stopped): `full` (the courtroom as published), `standard-mad` and `single-call`
(Table 4), `A1` to `A4` (Table 6: --no-role-switch, --single-judge, --no-prag, --no-reflection). The data
flags default to `--dataset check-covid --split test-binary` (the 121 claims of the authors' file, the
set behind the paper's Table 3); `--data "--split demo"` checks the script on the embedded demo claims.
Every other flag after `--` goes to every run (models, --max-new-tokens, --batch-size, ...).

Printed and saved in OUT/results.json: Table 3 of the full pipeline (each run, majority vote, weighted
total, best-of-N oracle, mean inter-judge kappa, raw agreement, unanimity and split counts, per-judge
kappa against the gold labels) and one row per configuration with Table 5's columns: majority-vote
accuracy and its difference to the full pipeline, mean run accuracy, evidence per claim (passages
returned by all retrieval calls), rounds per claim (primary + role-switched), tokens per claim and their
ratio to Standard MAD's (Appendix P).
"""
import argparse
import json
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import run_debate  # noqa: E402
from eval import trials  # noqa: E402

CONFIGS = {  # name -> the flags that make it (the paper's Tables 4 and 6)
    "full": ["--method", "courtroom"],
    "standard-mad": ["--method", "standard-mad"],
    "single-call": ["--method", "single-call"],
    "A1": ["--method", "courtroom", "--no-role-switch"],
    "A2": ["--method", "courtroom", "--single-judge"],
    "A3": ["--method", "courtroom", "--no-prag"],
    "A4": ["--method", "courtroom", "--no-reflection"],
}
DEFAULT_DATA = "--dataset check-covid --split test-binary"


def run_config(name, flags, args, extra):
    """One configuration's --trials run; returns its top-level metrics (Table 3 included) and seconds."""
    out = Path(args.out) / name
    argv = [*flags, *shlex.split(args.data), "--trials", str(args.trials), "--output-dir", str(out), *extra]
    if args.limit:
        argv += ["--limit", str(args.limit)]
    start = time.perf_counter()
    summary = run_debate.main(argv)
    seconds = time.perf_counter() - start
    if summary is None:  # resumed with nothing to do, or no gold labels: read what the run wrote
        summary = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    if "table3" not in summary:
        summary["table3"] = trials.table3(*trials.read_trials(out))
    return summary, seconds


def row(name, table, full_accuracy, mad_tokens):
    eff = table["efficiency"]
    accuracy = table["majority_vote"]["accuracy"]
    tokens = eff["tokens"]["per_claim"]
    return {"config": name, "accuracy_majority": accuracy,
            "delta_pp": None if accuracy is None or full_accuracy is None else 100 * (accuracy - full_accuracy),
            "accuracy_mean_of_runs": table["mean_over_runs"]["accuracy"],
            "mean_kappa": table["weighted_total"]["mean_kappa"], "evidence": eff["avg_evidence"],
            "evidence_pool": eff["avg_evidence_pool"], "rounds": eff["avg_rounds"], "tokens_per_claim": tokens,
            "x_standard_mad": tokens / mad_tokens if tokens and mad_tokens else None}


def markdown(results):
    def pct(v):
        return "-" if v is None else f"{100 * v:.1f}"

    def num(v, fmt="{:.2f}"):
        return "-" if v is None else fmt.format(v)

    lines = ["Table 3, the full pipeline:", "", "```", trials.table3_text(results["full"]["table3"]), "```", "",
             "| config | acc (majority) | dAcc pp | acc (mean of runs) | mean kappa | evidence | pool | rounds "
             "| tokens/claim | x Standard MAD |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["rows"]:
        lines.append(f"| {r['config']} | {pct(r['accuracy_majority'])} | {num(r['delta_pp'], '{:+.1f}')} | "
                     f"{pct(r['accuracy_mean_of_runs'])} | {num(r['mean_kappa'], '{:.3f}')} | "
                     f"{num(r['evidence'], '{:.1f}')} | {num(r['evidence_pool'], '{:.1f}')} | {num(r['rounds'])} | "
                     f"{num(r['tokens_per_claim'], '{:,.0f}')} | {num(r['x_standard_mad'], '{:.1f}')} |")
    return "\n".join(lines)


def build_parser():
    """The flags (tests/test_docs.py checks the documented commands against them)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog="flags after -- go to every run_debate.py run")
    p.add_argument("--out", default=str(ROOT / "bench" / "out" / "proclaim"))
    p.add_argument("--data", default=DEFAULT_DATA, help=f"the data flags of every run (default: {DEFAULT_DATA!r})")
    p.add_argument("--limit", type=int, help="the first N claims (default: all)")
    p.add_argument("--trials", type=int, default=3, help="independent runs per configuration (the paper's 3)")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    return p


def main(argv=None):
    p = build_parser()
    args, extra = p.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    results, rows, seconds = {}, [], {}
    for name in args.configs:
        print(f"== {name}: {' '.join(CONFIGS[name])}", flush=True)
        results[name], seconds[name] = run_config(name, CONFIGS[name], args, extra)
    full = results.get("full", {}).get("table3", {}).get("majority_vote", {}).get("accuracy")
    mad = results.get("standard-mad", {}).get("table3", {}).get("efficiency", {}).get("tokens", {}).get("per_claim")
    rows = [row(name, results[name]["table3"], full, mad) for name in args.configs]
    saved = {"data": args.data, "limit": args.limit, "trials": args.trials, "extra": extra, "rows": rows,
             "seconds": seconds, **{name: {"table3": results[name]["table3"]} for name in args.configs}}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "results.json").write_text(json.dumps(saved, indent=2) + "\n", encoding="utf-8")
    if "full" in results:
        print(markdown(saved))
    return saved


if __name__ == "__main__":
    main()
