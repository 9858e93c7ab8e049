"""Static retrieval against retrieval during the debate (--debate-retrieval, issue 41), same claims, same model, same
knowledge store: the evidence score (question-only, question+answer) of the evidence each verdict was given on, label
accuracy, debate tokens per claim and seconds per claim.

    python bench/bench_debate_retrieval.py [--claims 20] [--others 3] [--start-k 4] [--rerank-k 10]
                                           [--model PATH] [--out bench/out/debate_retrieval] [-- RUN_DEBATE_FLAGS]

The claims are AVeriTeC dev claims (the shared data, or $DEBATECV_SHARED_DATA) with at least four pages of their own;
each claim's store holds its own pages (one per substantive golden answer, and its justification) and the pages of
--others other dev claims, shuffled: the tests' way of building a store (tests/test_knowledge_store.py). HerO's
retrieval runs once (--retrieve-only, its few-shot examples from the same claims' golden pairs); then three debates:

- static: DebateCV on the --rerank-k items retrieved;
- static-start: DebateCV on the first --start-k of them (what the next row starts from);
- during: DebateCV from the first --start-k, with --debate-retrieval admitting up to --rerank-k minus --start-k more
  (the evidence scorer reads at most 10 items, so the grown set and the static one are scored on the same budget).

Flags after `--` go to every run_debate.py call (e.g. --max-rounds 1 --max-new-tokens 16 --no-structured for a quick
check with a tiny model). The table is printed and saved as JSON in --out.
"""
import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import run_debate  # noqa: E402
from debate.data import claims as data  # noqa: E402
from debate.pipeline import grown_evidence, records, store_retrieval  # noqa: E402
from eval import averitec, evidence_score as evidence_scores  # noqa: E402
from tests.tiny_models import averitec_dir, build_tiny_llama, claim_pages  # noqa: E402

GPU_COMMAND = ("python bench/bench_debate_retrieval.py --claims 100 --model /models/Llama-3.1-8B-Instruct "
               "--out bench/out/debate_retrieval-8b -- --bm25-k 10000")


def build(out, n, others):
    """OUT/data/dev.json (the first `n` dev claims with four pages or more, ids their dev positions) and one store
    file per claim in OUT/store."""
    dev = json.loads((averitec_dir() / "dev.json").read_text(encoding="utf-8"))
    chosen = [i for i, c in enumerate(dev) if len(claim_pages(c)) >= 4][:n]
    data_dir, store = out / "data", out / "store"
    for d in (data_dir, store):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    claims = [dict(dev[i], claim_id=i) for i in chosen]
    (data_dir / "dev.json").write_text(json.dumps(claims), encoding="utf-8")
    rng = random.Random(0)
    for c in claims:
        found = claim_pages(c)
        for other in rng.sample([k for k in range(len(dev)) if k != c["claim_id"]], others):
            found += claim_pages(dev[other])
        rng.shuffle(found)
        (store / f"{c['claim_id']}.json").write_text("".join(json.dumps(p) + "\n" for p in found), encoding="utf-8")
    return claims, data_dir, store


def seeded(source, target, k):
    """A run directory whose retrieved file is `source`'s first `k` items per claim, under the settings of a
    retrieval with --rerank-k k (HerO's items come best first), so the run resumes it and retrieves nothing."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    rows = records.read_jsonl(source / store_retrieval.RETRIEVED)
    (target / store_retrieval.RETRIEVED).write_text(
        "".join(json.dumps(dict(r, evidence=r["evidence"][:k])) + "\n" for r in rows), encoding="utf-8")
    settings = json.loads((source / store_retrieval.SETTINGS).read_text(encoding="utf-8"))
    records.write_json(target / store_retrieval.SETTINGS, dict(settings, rerank_k=k))


def evidence_score(path, references):
    if not averitec.meteor_available():
        return {"question_only": None, "question_answer": None}
    rows = [(f"line {n}", r) for n, r in enumerate(records.read_jsonl(path), start=1)]
    s = evidence_scores.score(rows, [(f"claim {r['claim_id']}", r) for r in references], (str(path), "the split"))
    return {"question_only": round(s["question_only"], 4), "question_answer": round(s["question_answer"], 4)}


def row(name, out, evidence_file, references, seconds):
    predictions = records.read_predictions(out)
    n = len(predictions)
    metrics = json.loads((out / records.METRICS).read_text(encoding="utf-8"))
    tokens = sum(p.get("prompt_tokens", 0) + p.get("completion_tokens", 0) for p in predictions)
    grown = [p.get("debate_retrieval", {}).get("admitted", 0) for p in predictions]
    return {"run": name, "claims": n, **evidence_score(evidence_file, references),
            "accuracy": metrics.get("accuracy"), "tokens_per_claim": round(tokens / n) if n else None,
            "seconds_per_claim": round(seconds / n, 2) if n else None,
            "admitted_per_claim": round(sum(grown) / n, 2) if n else None,
            "evidence_items_per_claim": round(sum(len(p.get("evidence") or []) for p in predictions) / n, 2)
            if n and any("evidence" in p for p in predictions) else None}


def build_parser():
    p = argparse.ArgumentParser(prog="bench/bench_debate_retrieval.py", description=__doc__.split("\n")[0])
    p.add_argument("--claims", type=int, default=20, help="AVeriTeC dev claims (with four own pages or more)")
    p.add_argument("--others", type=int, default=3, help="other claims whose pages join each claim's store")
    p.add_argument("--rerank-k", type=int, default=10, help="items of the static retrieval (HerO's 10)")
    p.add_argument("--start-k", type=int, default=4, help="items the debate that retrieves starts from")
    p.add_argument("--model", help="every agent's model (default: the embedded Gemma 3 270M)")
    p.add_argument("--tiny", action="store_true", help="a tiny random-weight model instead (checks that the "
                   "benchmark runs; its figures mean nothing)")
    p.add_argument("--out", default=str(ROOT / "bench/out/debate_retrieval"), help="working and output directory")
    return p


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = build_parser()
    args = p.parse_args(argv)
    if not 1 <= args.start_k < args.rerank_k:
        p.error("--start-k must be at least 1 and below --rerank-k")
    if not (averitec_dir() / "dev.json").is_file():
        p.error(f"no AVeriTeC dev split at {averitec_dir()}: set DEBATECV_SHARED_DATA to the shared data folder")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    claims, data_dir, store = build(out, args.claims, args.others)
    model = str(build_tiny_llama(out / "tiny", seed=0)) if args.tiny else args.model
    common = ["--split", "dev", "--data-dir", str(data_dir), "--evidence", "retrieved", "--knowledge-store", str(store),
              "--few-shot-split", "dev", "--method", "debatecv", *(["--model", model] if model else []), *extra]

    def run(out_dir, *flags):
        start = time.time()
        code = run_debate.main(common + ["--output-dir", str(out_dir), *flags])
        if isinstance(code, int) and code:
            raise SystemExit(f"run_debate.py failed for {out_dir}")
        return time.time() - start

    retrieved = out / "retrieved"
    shutil.rmtree(retrieved, ignore_errors=True)
    retrieval_seconds = run(retrieved, "--rerank-k", str(args.rerank_k), "--retrieve-only")
    references = data.as_references(claims)
    rows = []
    for name, k, flags in (("static", args.rerank_k, []), ("static-start", args.start_k, []),
                           ("during", args.start_k, ["--debate-retrieval", "--admit-per-claim",
                                                     str(args.rerank_k - args.start_k)])):
        target = out / name
        seeded(retrieved, target, k)
        seconds = run(target, "--rerank-k", str(k), *flags)
        scored = target / (grown_evidence.FILE if flags else store_retrieval.RETRIEVED)
        rows.append(row(name, target, scored, references, seconds))
    result = {"claims": len(claims), "others": args.others, "model": model or "embedded Gemma 3 270M",
              "extra_flags": extra, "retrieval_seconds_per_claim": round(retrieval_seconds / len(claims), 2),
              "rows": rows}
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    keys = ("run", "claims", "question_only", "question_answer", "accuracy", "tokens_per_claim", "seconds_per_claim",
            "admitted_per_claim")
    print("\n" + " | ".join(keys))
    for r in rows:
        print(" | ".join(str(r[k]) for k in keys))
    print(f"HerO's retrieval (once, shared by the rows): {result['retrieval_seconds_per_claim']} s per claim")
    print(f"saved {out / 'result.json'}")
    print(f"on an 8B model on a GPU: {GPU_COMMAND}")
    return result


if __name__ == "__main__":
    main()
