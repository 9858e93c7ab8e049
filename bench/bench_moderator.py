"""Zero-shot vs D-SFT vs D-SFT + D-DPO Moderator on AVeriTeC dev folds (golden evidence), structured.

The AVeriTeC training split is not on this machine, so the dev set stands in: its first --claims
claims are debated zero-shot once (SynDeC synthesis, structured decoding), corrected, and split into
--folds folds by position. For each fold, D-SFT and D-DPO train on the other folds' records only, and
the three Moderators re-judge the held-out fold's debates: same debate record, same prompt, greedy,
structured; only the Moderator's deciding reply is generated again. That isolates what post-training
changes (the Moderator's judgement) from the Debaters. Every claim is held out exactly once.

Reported per system: accuracy and macro-F1 with 95% bootstrap intervals (claims resampled), per-class
F1, NEE and CEC false-positive rates, ECE and Brier of the label probabilities, the predicted-label
counts, beside the majority-class baseline (always Refuted).

    python bench/bench_moderator.py --claims 160 --folds 2 --out bench/out/moderator

Writes OUT/results.json and prints a markdown table. Resumable: synthesis resumes claim by claim, a
stage whose output exists is skipped, each re-judged fold is saved as it finishes. `--report-only` runs
nothing and tabulates the folds judged so far.
"""
import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from debate.data.labels import CEC, LABELS, NEE, REFUTED  # noqa: E402
from debate.data.parsing import parse_moderator  # noqa: E402
from debate.engine import engine, gguf, models, offline, schema_program  # noqa: E402
from debate.engine.models import adapter_scope  # noqa: E402
from debate.pipeline import records
from eval import averitec  # noqa: E402
from train import examples, syndec  # noqa: E402

TRAIN_FLAGS = ["--sft-include-corrected", "--lora-r", "8", "--lora-alpha", "16", "--lr", "2e-4", "--epochs", "1",
               "--grad-accum", "4", "--max-length", "640", "--no-gradient-checkpointing", "--save-every", "1000"]


def sh(*argv):
    print("+", " ".join(argv), flush=True)
    subprocess.run([sys.executable, *argv], cwd=ROOT, check=True)


def rejudge(role_model, rows, batch_size, max_new_tokens):
    """The Moderator's deciding reply to each record's debate, generated again under its schema:
    [(verdict, label_probs)]."""
    settings = engine.Settings(max_new_tokens=max_new_tokens)
    out = []
    for i in range(0, len(rows), batch_size):
        batch = rows[i:i + batch_size]
        for final in (False, True):  # a round reply and a final reply answer different schemas
            part = [r for r in batch if examples.dialogue(r)[3] == final]
            if not part:
                continue
            compiled = schema_program.compile_for("moderator_final" if final else "moderator_round",
                                                  role_model.tokenizer)
            convs, prompts = zip(*(examples.conversation(role_model.tokenizer, r) for r in part))
            with adapter_scope(role_model):
                engine.generate(role_model.model, role_model.tokenizer, list(convs), list(prompts), settings,
                                schemas=[compiled] * len(part))
            for r, conv in zip(part, convs):
                result = dict(conv.structured)
                if not final:
                    # Re-judging the turn that ended the debate: its verdict is what counts, "Yes" or not.
                    result["fields"] = dict(result["fields"], **{"Proceeding Necessity": "No"})
                parsed = parse_moderator("", result)
                out.append((r["claim_id"], parsed["verdict"], parsed["label_probs"]))
    order = {r["claim_id"]: k for k, r in enumerate(rows)}
    return [(v, p) for _, v, p in sorted(out, key=lambda x: order[x[0]])]


def bootstrap_ci(golds, preds, metric, samples=2000, seed=0):
    rng = np.random.default_rng(seed)
    n = len(golds)
    values = []
    for _ in range(samples):
        idx = rng.integers(0, n, n)
        values.append(metric([golds[i] for i in idx], [preds[i] for i in idx]))
    return [float(x) for x in np.percentile(values, [2.5, 97.5])]


def row_of(golds, preds, probs):
    m = averitec.label_metrics(golds, preds)
    cal = averitec.calibration(golds, probs)

    def metric(name):
        return lambda g, p: averitec.label_metrics(g, p)[name]

    return {"accuracy": m["accuracy"], "accuracy_ci95": bootstrap_ci(golds, preds, metric("accuracy")),
            "macro_f1": m["macro_f1"], "macro_f1_ci95": bootstrap_ci(golds, preds, metric("macro_f1")),
            "per_class_f1": m["per_class_f1"], "fpr": m["fpr"], "ece": cal["ece"] if cal else None,
            "brier": cal["brier"] if cal else None, "predicted": dict(Counter(str(p) for p in preds)),
            "unparsed": sum(p is None for p in preds)}


def build_parser():
    """The flags (tests/test_docs.py checks the documented commands against them)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared/data/averitec"))
    p.add_argument("--claims", type=int, default=160)
    p.add_argument("--folds", type=int, default=2)
    p.add_argument("--out", default="bench/out/moderator")
    p.add_argument("--max-rounds", default="1")
    p.add_argument("--max-new-tokens", default="80", help="per debate turn during synthesis")
    p.add_argument("--judge-tokens", type=int, default=96, help="for the re-judged reply")
    p.add_argument("--batch-size", default="8")
    p.add_argument("--model", help="the base model of every role, synthesis to judging (default: the embedded "
                   "Gemma 3 270M); 4-bit on CUDA as the run's loader decides")
    p.add_argument("--train", nargs=argparse.REMAINDER, default=TRAIN_FLAGS,
                   help="train_moderator.py flags for both training stages (put last; default: CPU-sized)")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: tabulate the folds whose three Moderators are judged so far (an interim table)")
    return p


def main():
    p = build_parser()
    args = p.parse_args()
    out = ROOT / args.out
    common = ["--out", str(out), "--split", "dev", "--data-dir", args.data_dir, "--limit", str(args.claims),
              "--max-rounds", args.max_rounds, "--max-new-tokens", args.max_new_tokens,
              "--batch-size", args.batch_size, "--temperature", "0"] + (["--model", args.model] if args.model else [])
    timings = {}
    for stage in () if args.report_only else ("synth", "correct"):
        start = time.time()
        sh("train_moderator.py", "--stage", stage, *common)
        timings[stage] = round(time.time() - start, 1)

    rows = syndec.load(out / "syndec.corrected.jsonl")
    zero_probs = {r["claim_id"]: r.get("label_probs") for r in records.read_predictions(out / "debates")}
    folds = [rows[k::args.folds] for k in range(args.folds)]
    offline.set_offline()
    base = args.model or gguf.default_model_path()
    systems = ("zero-shot", "D-SFT", "D-SFT + D-DPO")
    judged = {s: {} for s in systems}
    finished = []  # the folds every system has judged
    for k in range(args.folds):
        fold_dir = out / f"fold-{k}"
        if args.report_only:
            saved = [fold_dir / f"judged-{s.replace(' ', '').replace('+', '-')}.json" for s in systems]
            if not all(f.exists() for f in saved):
                continue
            for system, f in zip(systems, saved):
                for r, (verdict, probs) in zip(folds[k], json.loads(f.read_text())):
                    judged[system][r["claim_id"]] = (verdict, probs)
            finished.append(k)
            continue
        train_file = fold_dir / "train.syndec.jsonl"
        syndec.write(train_file, [r for j, fold in enumerate(folds) if j != k for r in fold])
        for stage in ("sft", "dpo"):
            start = time.time()
            sh("train_moderator.py", "--stage", stage, "--out", str(fold_dir), "--syndec", str(train_file),
               *(["--model", args.model] if args.model else []), *args.train)
            timings[f"fold{k}_{stage}"] = round(time.time() - start, 1)
        adapters = {"zero-shot": None, "D-SFT": fold_dir / "sft/adapter", "D-SFT + D-DPO": fold_dir / "dpo/adapter"}
        for system in systems:
            saved = fold_dir / f"judged-{system.replace(' ', '').replace('+', '-')}.json"
            if not saved.exists():
                start = time.time()
                role = models.load_roles({"moderator": base}, {"moderator": adapters[system] and str(adapters[system])},
                                         use_4bit=None)["moderator"]  # NF4 on CUDA, float32 on a CPU (models.py)
                saved.write_text(json.dumps(rejudge(role, folds[k], 8, args.judge_tokens)))
                timings[f"fold{k}_judge_{system}"] = round(time.time() - start, 1)
            for r, (verdict, probs) in zip(folds[k], json.loads(saved.read_text())):
                judged[system][r["claim_id"]] = (verdict, probs)
        finished.append(k)

    if not finished:
        sys.exit(f"error: no fold of {out} has all three Moderators judged yet")
    held = [r for k in finished for r in folds[k]]
    golds = [r["gold_label"] for r in held]
    table = {"always Refuted (majority class)": row_of(golds, [REFUTED] * len(held), [None] * len(held)),
             "zero-shot (debate as run)": row_of(golds, [r["predicted_label"] for r in held],
                                                 [zero_probs.get(r["claim_id"]) for r in held])}
    for system in systems:
        table[f"{system} (re-judged)"] = row_of(golds, [judged[system][r["claim_id"]][0] for r in held],
                                                [judged[system][r["claim_id"]][1] for r in held])
    report = {"claims": len(held), "folds": args.folds, "folds_judged": finished, "labels": dict(Counter(golds)),
              "table": table, "timings_s": timings, "synth_correct": sum(r["correct"] for r in rows),
              "train_flags": args.train,
              "settings": {"max_rounds": args.max_rounds, "max_new_tokens": args.max_new_tokens,
                           "judge_tokens": args.judge_tokens}}
    (out / ("results.interim.json" if args.report_only else "results.json")).write_text(json.dumps(report, indent=2))
    short = {"Supported": "SUP", "Refuted": "REF", NEE: "NEE", CEC: "CEC"}
    print(f"{len(held)} held-out claims (folds {finished} of {args.folds}); gold labels {dict(Counter(golds))}")
    print("| Moderator | accuracy [95% CI] | macro-F1 [95% CI] | F1 SUP / REF / NEE / CEC | FPR NEE | FPR CEC "
          "| ECE | Brier | predicted |")
    print("|---|---|---|---|---|---|---|---|---|")
    fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    for system, row in table.items():
        f1 = " / ".join(f"{row['per_class_f1'][label]:.2f}" for label in LABELS)
        predicted = ", ".join(f"{short.get(k, k)} {v}" for k, v in sorted(row["predicted"].items()))
        print(f"| {system} | {row['accuracy']:.3f} [{row['accuracy_ci95'][0]:.3f}, {row['accuracy_ci95'][1]:.3f}] "
              f"| {row['macro_f1']:.3f} [{row['macro_f1_ci95'][0]:.3f}, {row['macro_f1_ci95'][1]:.3f}] | {f1} "
              f"| {fmt(row['fpr'][NEE])} | {fmt(row['fpr'][CEC])} | {fmt(row['ece'])} | {fmt(row['brier'])} "
              f"| {predicted} |")


if __name__ == "__main__":
    main()
