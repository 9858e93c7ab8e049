"""BM25 and dense re-ranking over one claim's knowledge store of ~100k sentences (issue 33): time per claim and peak
memory, the language model left out (HyDE-FC and question generation are timed by the stage's own log).

    python bench/bench_knowledge_store.py [--sentences 100000] [--pages 1000] [--claims 3] [--bm25-k 500 2000]
                                          [--out bench/out/knowledge_store.json]

The store is generated once into bench/out/ks-<sentences>/ in AVeriTeC's layout (<claim_id>.json, a page a line with
url and url2text): its sentences are real AVeriTeC dev sentences (answers, justifications), each joined to half of
another so that all are distinct, as a real claim's ~1,000 scraped pages are. The query of each claim is what the
stage builds: the claim and, standing in for the eight HyDE-FC articles, its gold justification eight times (real
articles are as long: up to 512 tokens each).

Per claim and per --bm25-k: reading the store and BM25 over it (streamed, duplicates dropped: since issue 38 one
step, `bm25_candidates`; the "read" and "BM25 query" columns of older rows are inside it), the re-ranking of BM25's
best with a cold embedding cache (every candidate embedded) and again with a warm one (a resumed or repeated
retrieval, or the courtroom's later search). bench/bench_store_size.py times stores of a real store's size.
Peak memory is the process's peak resident set (ru_maxrss), with the encoder's and torch's own share measured
before the first claim.
"""
import argparse
import datetime
import json
import platform
import random
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from debate.engine import retrieval, store_search  # noqa: E402
from tests.tiny_models import averitec_dir  # noqa: E402


def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def real_sentences(dev):
    out = set()
    for c in dev:
        texts = [c.get("justification") or ""] + [a["answer"] for q in c["questions"] for a in q.get("answers") or []]
        for t in texts:
            out.update(s for s in re.split(r"(?<=[.!?])\s+", " ".join(t.split())) if len(s.split()) >= 4)
    return sorted(out)


def build_store(folder, dev, claims, sentences, pages):
    """One store file per claim, `sentences` distinct sentences over `pages` pages."""
    folder.mkdir(parents=True, exist_ok=True)
    pool = real_sentences(dev)
    for cid in claims:
        path = folder / f"{cid}.json"
        if path.is_file():
            continue
        rng = random.Random(cid)
        per_page = sentences // pages
        with open(path, "w", encoding="utf-8") as f:
            for p in range(pages):
                text = []
                for _ in range(per_page):
                    a, b = rng.choice(pool), rng.choice(pool).split()
                    text.append(f"{a} {' '.join(b[:max(2, len(b) // 2)])}")
                f.write(json.dumps({"url": f"https://example.org/{cid}/{p}", "type": "web", "query": "q",
                                    "url2text": text}) + "\n")


def build_parser():
    """The flags (tests/test_docs.py checks the documented commands against them)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sentences", type=int, default=100000)
    p.add_argument("--pages", type=int, default=1000)
    p.add_argument("--claims", type=int, default=3)
    p.add_argument("--bm25-k", type=int, nargs="+", default=[500, 2000])
    p.add_argument("--rerank-k", type=int, default=10)
    p.add_argument("--out", default=str(ROOT / "bench" / "out" / "knowledge_store.json"))
    return p


def main(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    dev = json.loads((averitec_dir() / "dev.json").read_text(encoding="utf-8"))
    claims = list(range(args.claims))
    folder = ROOT / "bench" / "out" / f"ks-{args.sentences}"
    t = time.time()
    build_store(folder, dev, claims, args.sentences, args.pages)
    print(f"store in {folder} ({time.time() - t:.1f}s to build)")
    embedder = retrieval.load_embedder()
    base = peak_mib()
    rows = []
    with tempfile.TemporaryDirectory() as cache_dir:
        for cid in claims:
            claim = dev[cid]["claim"]
            articles = [dev[cid].get("justification") or claim] * 8
            t0 = time.time()
            query = store_search.query_vector(embedder, [claim, *articles])
            t1 = time.time()
            for k in args.bm25_k:
                t2 = time.time()
                found = store_search.bm25_candidates(folder / f"{cid}.json", " ".join([claim, *articles]), k)
                t3 = time.time()
                cold = store_search.VectorCache(found.digest, embedder, cache_dir=f"{cache_dir}/{k}")
                store_search.rerank(cold, query, found.candidates, args.rerank_k, claim)
                t4 = time.time()
                warm = store_search.VectorCache(found.digest, embedder, cache_dir=f"{cache_dir}/{k}")
                store_search.rerank(warm, query, found.candidates, args.rerank_k, claim)
                t5 = time.time()
                row = {"claim_id": cid, "sentences": found.sentences, "pages": found.pages, "bm25_k": k,
                       "query_embed_s": t1 - t0, "read_bm25_s": t3 - t2, "rerank_cold_s": t4 - t3,
                       "rerank_warm_s": t5 - t4, "total_cold_s": (t1 - t0) + (t3 - t2) + (t4 - t3),
                       "total_warm_s": (t1 - t0) + (t3 - t2) + (t5 - t4)}
                rows.append(row)
                print(json.dumps({k2: round(v, 3) if isinstance(v, float) else v for k2, v in row.items()}))
    summary = {"date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, "
               f"{torch.get_num_threads()} torch threads", "encoder": embedder.path,
               "peak_rss_mib": round(peak_mib()), "rss_before_first_claim_mib": round(base), "rows": rows}
    for k in args.bm25_k:
        mine = [r for r in rows if r["bm25_k"] == k]
        summary[f"mean_total_cold_s@{k}"] = round(sum(r["total_cold_s"] for r in mine) / len(mine), 2)
        summary[f"mean_total_warm_s@{k}"] = round(sum(r["total_warm_s"] for r in mine) / len(mine), 2)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print({k: v for k, v in summary.items() if k != "rows"})


if __name__ == "__main__":
    main()
