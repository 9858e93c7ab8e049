"""Zero-shot vs D-SFT vs D-SFT + D-DPO Moderator on AVeriTeC dev folds (golden evidence).

The AVeriTeC training split is not on this machine, so the dev set stands in: its first --claims
claims are debated zero-shot once (SynDeC synthesis), corrected, and split into --folds folds by
position. For each fold, D-SFT and D-DPO train on the other folds' records and the three Moderators
re-judge the held-out fold's debates: same debate record, same prompt, greedy, only the Moderator's
final reply is generated again. That isolates what post-training changes (the Moderator's judgement)
from the Debaters, and costs one reply per claim instead of a whole debate.

    python bench/bench_moderator.py --claims 24 --folds 2 --out bench/out/moderator

Writes OUT/results.json and prints a table. Every step is skipped when its output exists.
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from debate import engine, models  # noqa: E402
from debate.models import adapter_scope  # noqa: E402
from debate.parsing import parse_moderator  # noqa: E402
from eval import averitec  # noqa: E402
from train import examples, syndec  # noqa: E402


def sh(*argv):
    print("+", " ".join(argv), flush=True)
    subprocess.run([sys.executable, *argv], cwd=ROOT, check=True)


def rejudge(role_model, rows, batch_size, max_new_tokens):
    """The Moderator's final reply to each record's debate, generated again; returns verdicts."""
    settings = engine.Settings(max_new_tokens=max_new_tokens)
    verdicts = []
    for i in range(0, len(rows), batch_size):
        batch = rows[i:i + batch_size]
        convs, prompts = zip(*(examples.conversation(role_model.tokenizer, r) for r in batch))
        with adapter_scope(role_model):
            replies = engine.generate(role_model.model, role_model.tokenizer, list(convs), list(prompts), settings)
        verdicts += [parse_moderator(reply)["verdict"] for reply in replies]
    return verdicts


def scores(rows, verdicts):
    return averitec.label_metrics([r["gold_label"] for r in rows], verdicts)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared/data/averitec"))
    p.add_argument("--claims", type=int, default=24)
    p.add_argument("--folds", type=int, default=2)
    p.add_argument("--out", default="bench/out/moderator")
    p.add_argument("--max-rounds", default="2")
    p.add_argument("--max-new-tokens", default="48", help="per debate turn during synthesis")
    p.add_argument("--judge-tokens", type=int, default=128, help="for the re-judged final reply")
    p.add_argument("--only-folds", type=int, nargs="*", help="evaluate only these held-out folds (CPU budget)")
    p.add_argument("--train", nargs=argparse.REMAINDER, default=[],
                   help="extra train_moderator.py flags for both training stages (put last)")
    args = p.parse_args()
    out = ROOT / args.out
    common = ["--out", str(out), "--split", "dev", "--data-dir", args.data_dir, "--limit", str(args.claims),
              "--max-rounds", args.max_rounds, "--max-new-tokens", args.max_new_tokens]
    timings = {}
    for stage in ("synth", "correct"):
        start = time.time()
        sh("train_moderator.py", "--stage", stage, *common)
        timings[stage] = round(time.time() - start, 1)

    rows = syndec.load(out / "syndec.corrected.jsonl")
    folds = [rows[k::args.folds] for k in range(args.folds)]
    trained = {}
    evaluated = args.only_folds if args.only_folds else list(range(args.folds))
    for k in evaluated:
        fold_dir = out / f"fold-{k}"
        train_file = fold_dir / "train.syndec.jsonl"
        syndec.write(train_file, [r for j, fold in enumerate(folds) if j != k for r in fold])
        for stage in ("sft", "dpo"):
            start = time.time()
            sh("train_moderator.py", "--stage", stage, "--out", str(fold_dir), "--syndec", str(train_file),
               *args.train)
            timings[f"fold{k}_{stage}"] = round(time.time() - start, 1)
        trained[k] = {"D-SFT": fold_dir / "sft/adapter", "D-SFT + D-DPO": fold_dir / "dpo/adapter"}

    models.set_offline()
    base = models.default_model_path()
    results, held_out = {"zero-shot (debate as run)": []}, []
    systems = ("zero-shot", "D-SFT", "D-SFT + D-DPO")
    verdicts = {s: [] for s in systems}
    for k in evaluated:
        held_out += folds[k]
        results["zero-shot (debate as run)"] += [r["predicted_label"] for r in folds[k]]
        for system in systems:
            adapter = None if system == "zero-shot" else str(trained[k][system])
            start = time.time()
            role = models.load_roles({"moderator": base}, {"moderator": adapter}, use_4bit=False)["moderator"]
            verdicts[system] += rejudge(role, folds[k], 8, args.judge_tokens)
            timings[f"fold{k}_judge_{system}"] = round(time.time() - start, 1)
    results.update(verdicts)

    table = {}
    for system, preds in results.items():
        m = scores(held_out, preds)
        table[system] = {"accuracy": m["accuracy"], "macro_f1": m["macro_f1"], "fpr": m["fpr"],
                         "unparsed": sum(p is None for p in preds)}
    train_counts = {k: json.loads((out / f"fold-{k}/sft/summary.json").read_text()) for k in evaluated}
    report = {"claims": len(held_out), "folds": args.folds, "evaluated_folds": evaluated, "table": table, "timings_s": timings,
              "labels": {lab: sum(r["gold_label"] == lab for r in held_out) for lab in
                         sorted({r["gold_label"] for r in held_out})},
              "synth_correct": sum(r["correct"] for r in rows), "train_flags": args.train,
              "sft_summary": train_counts}
    (out / "results.json").write_text(json.dumps(report, indent=2))
    print(f"{len(held_out)} held-out claims, {args.folds} folds")
    print(f"{'Moderator':28s} {'acc':>6s} {'macroF1':>8s} {'FPR NEE':>8s} {'FPR CEC':>8s} {'unparsed':>9s}")
    for system, row in table.items():
        print(f"{system:28s} {row['accuracy']:6.3f} {row['macro_f1']:8.3f} {row['fpr'].get('Not Enough Evidence', 0):8.3f} "
              f"{row['fpr'].get('Conflicting Evidence/Cherrypicking', 0):8.3f} {row['unparsed']:9d}")


if __name__ == "__main__":
    main()
