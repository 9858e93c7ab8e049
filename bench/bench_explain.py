"""MADR's Table 2 on a sample: Zero-shot, CoT, Self-Refine and MADR explanations, scored by G-Eval's four protocols.

    python bench/bench_explain.py --limit 8                                  # PolitiHop test, embedded model, CPU
    python bench/bench_explain.py --limit 0 --model GEN --judge-model JUDGE  # the whole test split, your models

Each method runs as `run_debate.py --task explain --method NAME` with the data flags of --data (default
`--dataset politihop --split test --evidence ruling`: PolitiHop's claims, each one's whole PolitiFact ruling
as evidence, as the paper's explanations had, and their gold labels; add `--data-dir DIR` inside it when the
data is elsewhere), in its own resumable run directory OUT/<method>; then the faithfulness judge
(debate.pipeline.geval_run) rates every explanation under
the four protocols with --judge-model (default: the embedded Gemma 3 270M, which also generates by
default: a 270M judge's ratings say little about faithfulness; they show the pipeline runs). A rerun
resumes both the runs and the ratings.

Printed and saved in OUT/results.json: the paper's Table 2 layout (mean [95% bootstrap interval] per method
and protocol), and per method its seconds and tokens per claim, mean explanation length and stop reasons.
"""
import argparse
import datetime
import json
import platform
import re
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from debate.pipeline import (  # noqa: E402
    cli,
    geval_run as judge_run,  # noqa: E402
    progress,
    runner,
)
from eval import geval_scores  # noqa: E402

METHODS = ("zero-shot", "cot", "self-refine", "madr")


def run_method(method, args, out, log):
    """Run (or resume) one method's explanations; (seconds spent generating, metrics of the run)."""
    flags = [*shlex.split(args.data), "--task", "explain", "--method", method, "--output-dir", str(out),
             "--batch-size", str(args.batch_size)]
    flags += ["--limit", str(args.limit)] if args.limit else []
    flags += ["--model", args.model] if args.model else []
    flags += ["--max-new-tokens", str(args.max_new_tokens)] if args.max_new_tokens else []
    config = cli.parse_run_args(flags)
    seconds = []

    def keep(text):
        found = re.match(r"verified (\d+) claims in ([\d.]+)s", text)
        if found:
            seconds.append(float(found.group(2)))
        log(f"{method}: {text}")

    with progress.lines(keep, keep):
        metrics = runner.main_guard(lambda: runner.run(config))
    return sum(seconds), metrics


def cost_table(rows):
    lines = ["| method | claims | s / claim | tokens / claim | words / explanation | stop reasons |",
             "|---|---|---|---|---|---|"]
    for name, row in rows.items():
        stats = row["stats"]
        reasons = "; ".join(f"{k} {v}" for method in ("self_refine", "madr") if method in stats
                            for k, v in sorted(stats[method]["stop_reasons"].items())) or "-"
        per_claim = f"{row['seconds'] / stats['n']:.1f}" if row["seconds"] and stats["n"] else "(resumed)"
        lines.append(f"| {name} | {stats['n']} | {per_claim} | {stats['tokens_per_claim']:.0f} | "
                     f"{stats['mean_words']:.1f} | {reasons} |")
    return "\n".join(lines)


def build_parser():
    """The flags (tests/test_docs.py checks the documented commands against them)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="--dataset politihop --split test --evidence ruling",
                   help="run_debate.py's data flags, quoted (default: %(default)s)")
    p.add_argument("--limit", type=int, default=8, help="claims (0: all; default: %(default)s)")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--model", help="the generator (default: the embedded Gemma 3 270M)")
    p.add_argument("--judge-model", help="the G-Eval judge (default: the embedded Gemma 3 270M)")
    p.add_argument("--max-new-tokens", type=int, help="per turn (default: run_debate.py's)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--out", default=str(ROOT / "bench/out/explain"))
    return p


def main():
    p = build_parser()
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def log(text):
        print(text, file=sys.stderr, flush=True)

    rows = {}
    for method in args.methods:
        seconds, stats = run_method(method, args, out / method, log)
        rows[method] = {"seconds": seconds, "stats": stats, "run_dir": str(out / method)}
    start = time.perf_counter()
    with progress.lines(log, log):
        result = judge_run.evaluate([rows[m]["run_dir"] for m in args.methods], args.judge_model,
                                    geval_scores.PROTOCOLS, names=list(args.methods), batch_size=args.batch_size)
    judge_seconds = time.perf_counter() - start
    summary = {"date": datetime.date.today().isoformat(), "machine": platform.platform(),
               "processor": platform.processor(), "data": args.data, "limit": args.limit,
               "model": args.model or "embedded Gemma 3 270M", "judge": result["judge"],
               "judge_seconds": judge_seconds, "methods": rows,
               "geval": {row["name"]: row["scores"] for row in result["methods"]}}
    (out / "results.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(f"G-Eval faithfulness, judge {result['judge']} ({judge_seconds:.0f} s for every rating not already made)")
    print(geval_scores.table(result))
    print()
    print(cost_table(rows))


if __name__ == "__main__":
    main()
