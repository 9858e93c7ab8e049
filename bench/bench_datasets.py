"""A zero-shot table over every dataset: one method, a seeded sample of each split, beside its majority class.

    python bench/bench_datasets.py [--shared ../shared/data] [--claims 12] [--method rag-cot] [--model M]
                                   [--out bench/out/datasets]

For each benchmark split the papers use (AVeriTeC dev with HerO's retrieved evidence, Check-COVID test and
PROClaim's test-binary with golden evidence, HealthVer test, PolitiHop test, PROClaim's FEVEROUS and SciFact
samples without evidence) it runs `--method` through run_debate's own code on `--claims` claims drawn with
seed 0 (`--limit N --sample-seed 0`, the same claims for every method), greedy, and reads its metrics.json.
Beside it: the majority-class baseline, the label most frequent in the whole split, scored on the same claims.
Runs are resumable (one output directory per dataset under --out); `--report-only` prints the table from
what is there. With the embedded Gemma 3 270M (a base model) the numbers show the pipeline on each dataset's
labels, not a result.
"""
import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from debate import build, run  # noqa: E402
from debate.data import datasets  # noqa: E402
from eval import metrics as label_scores  # noqa: E402

SPLITS = [  # (dataset, split, shared folder, evidence)
    ("averitec", "dev", "averitec", "retrieved"),
    ("check-covid", "test", "check-covid", "golden"),
    ("check-covid", "test-binary", "check-covid", "golden"),
    ("healthver", "test", "healthver", "golden"),
    ("politihop", "test", "politihop", "golden"),
    ("feverous", "sample", "proclaim", "none"),
    ("scifact", "sample", "proclaim", "none"),
]


def majority_class(dataset, split, data_dir, sample_ids):
    """The whole split's most frequent gold label, and its metrics on the sampled claims."""
    d = datasets.get(dataset)
    claims = d.read(split, data_dir)
    labels = d.labels(split, data_dir)
    top = collections.Counter(c["label"] for c in claims).most_common(1)[0][0]
    sample = [c for c in claims if str(c["claim_id"]) in sample_ids]
    scored = label_scores.label_metrics([c["label"] for c in sample], [top] * len(sample), labels)
    return {"label": top, "accuracy": scored["accuracy"], "macro_f1": scored["macro_f1"], "split_size": len(claims)}


def build_parser():
    """The flags (tests/test_docs.py checks the documented commands against them)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shared", default=str(ROOT.parent / "shared" / "data"), help="the folder holding each dataset's")
    p.add_argument("--claims", type=int, default=12, help="claims per split (a seeded sample; 0: the whole split)")
    p.add_argument("--method", default="rag-cot", help="the method to run zero-shot")
    p.add_argument("--model", help="HF directory or .gguf (default: the embedded Gemma 3 270M)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--out", default="bench/out/datasets")
    p.add_argument("--report-only", action="store_true", help="print the table from the runs already made")
    return p


def main(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    rows = []
    for dataset, split, folder, evidence in SPLITS:
        data_dir = Path(args.shared) / folder
        out = Path(args.out) / f"{dataset}-{split}-{args.method}"
        config = build(dataset=dataset, split=split, data_dir=str(data_dir), evidence=evidence, method=args.method,
                       model=args.model, limit=args.claims or None, sample_seed=0, temperature=0,
                       max_new_tokens=args.max_new_tokens, output_dir=str(out))
        if not args.report_only:
            run(config, log=lambda *a, **k: None)
        metrics = json.loads((out / "metrics.json").read_text())
        sample_ids = {str(json.loads(line)["claim_id"]) for line in (out / "predictions.jsonl").open()}
        rows.append({"dataset": dataset, "split": split, "evidence": evidence, "n": metrics["n"],
                     "method": {k: metrics.get(k) for k in ("accuracy", "macro_f1")},
                     "intervals": {k: metrics["intervals"].get(k) for k in ("accuracy", "macro_f1")},
                     "predicted": dict(collections.Counter(
                         json.loads(line)["label"] for line in (out / "predictions.jsonl").open())),
                     "majority": majority_class(dataset, split, data_dir, sample_ids)})
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(f"| dataset / split (evidence) | n | {args.method} accuracy [95% CI] | macro-F1 [95% CI] | predicted | "
          "majority class | its accuracy | its macro-F1 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ci = r["intervals"]
        print(f"| {r['dataset']} {r['split']} ({r['evidence']}) | {r['n']} | {r['method']['accuracy']:.3f} "
              f"[{ci['accuracy'][0]:.2f}, {ci['accuracy'][1]:.2f}] | {r['method']['macro_f1']:.3f} "
              f"[{ci['macro_f1'][0]:.2f}, {ci['macro_f1'][1]:.2f}] | "
              f"{', '.join(f'{k} {v}' for k, v in sorted(r['predicted'].items()))} | {r['majority']['label']} | "
              f"{r['majority']['accuracy']:.3f} | {r['majority']['macro_f1']:.3f} |")


if __name__ == "__main__":
    main()
