"""One claim's knowledge store at a real store's size (issue 38): read + BM25 + re-rank seconds and peak memory
for a given code tree, so the same generated store can be timed under the old code and the new one.

    python bench/bench_store_size.py --size-mb 100 [--tree DIR] [--bm25-k 500] [--rerank-k 10] [--seed 0]
                                     [--courtroom] [--out bench/out/store_size.json]

The store is generated once, deterministically from --seed, into bench/out/ks-size-<MB>mb-s<seed>/0.json in
AVeriTeC's layout (a page a line with url and url2text): words drawn from a Zipf law (exponent 1.07) over the
vocabulary of the shared AVeriTeC data's texts ranked by their count there, sentence lengths drawn from that
data's real sentence lengths, pages of a log-normal number of sentences (median 120), one page in twenty empty
(a failed scrape) and one sentence in thirty a boilerplate line repeated across pages (kept once).

The measured part runs in a fresh process with PYTHONPATH=DIR (--tree, default: this checkout), so it imports that
tree's `debate`; it adapts to the tree's API (before issue 38: read_store, bm25s's index and query, VectorCache
over the store's texts; after: bm25_candidates streamed, VectorCache by the file's digest). The query is what the
stage builds: AVeriTeC dev claim 0 and, standing in for the eight HyDE-FC articles, its gold justification eight
times. The encoder is the shipped all-MiniLM-L6-v2, its cache cold (a temporary DEBATECV_CACHE). Printed per
tree: read + BM25 seconds, re-rank seconds, their total, the resident set before the claim (Python, torch, the
encoder), the peak during it, the peak above the encoder and that over the file's size (the memory factor), and
the same for reading and BM25 alone (bm25_factor; the peak is restarted before the claim through
/proc/self/clear_refs where the kernel allows).
--courtroom also times the courtroom's index of the store (new trees only: an old tree embeds every sentence).

To compare, extract the old commit and run both, one after the other, on an idle machine:

    git archive b4c5c3a | tar -x -C /tmp/base
    python bench/bench_store_size.py --size-mb 100 --tree /tmp/base
    python bench/bench_store_size.py --size-mb 100
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZIPF = 1.07
BOILERPLATE = ["Share this article on Facebook.", "Click here to subscribe to our newsletter.",
               "All rights reserved.", "This article was updated with additional reporting.",
               "Sign up for our daily briefing.", "Advertisement"]


def build_parser():
    """The flags (tests/test_docs.py checks the documented commands against them)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mb", type=float, default=100, help="the generated store file's size (one claim)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tree", default=str(ROOT), help="the code tree whose `debate` is measured (PYTHONPATH)")
    p.add_argument("--bm25-k", type=int, default=500)
    p.add_argument("--rerank-k", type=int, default=10)
    p.add_argument("--courtroom", action="store_true", help="also time the courtroom's index of the store")
    p.add_argument("--out", default=str(ROOT / "bench" / "out" / "store_size.json"))
    p.add_argument("--measure", metavar="STORE", help=argparse.SUPPRESS)  # the child process's part
    return p


# ---------------------------------------------------------------- the store


def _data_dir():
    env = os.environ.get("DEBATECV_SHARED_DATA")
    base = Path(env) if env else ROOT.parents[1] / "shared" / "data"
    for candidate in (base, base / "averitec", Path("/work/shared/data/averitec")):
        if (candidate / "dev.json").is_file():
            return candidate
    raise SystemExit(f"no AVeriTeC dev.json under {base} (set DEBATECV_SHARED_DATA)")


def _texts(dev):
    for c in dev:
        yield c["claim"]
        yield c.get("justification") or ""
        for q in c.get("questions") or []:
            yield q.get("question") or ""
            for a in q.get("answers") or []:
                yield a.get("answer") or ""


def generate(path, size_mb, seed):
    """Write a store of about `size_mb` MB at `path` (see the module doc); kept when already there."""
    import re
    from collections import Counter

    import numpy as np

    if path.is_file():
        return
    dev = json.loads((_data_dir() / "dev.json").read_text(encoding="utf-8"))
    counts, lengths = Counter(), []
    for text in _texts(dev):
        for sentence in re.split(r"(?<=[.!?])\s+", " ".join(text.split())):
            words = re.findall(r"[\w'-]+", sentence)
            if words:
                counts.update(w.lower() for w in words)
                lengths.append(len(words))
    vocab = np.array([w for w, _ in counts.most_common()])
    cdf = np.cumsum(1.0 / np.arange(1, len(vocab) + 1) ** ZIPF)
    cdf /= cdf[-1]
    lengths = np.array(lengths)
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    target, written, page = int(size_mb * 2**20), 0, 0
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        while written < target:
            n = 0 if rng.random() < 0.05 else int(min(5000, max(1, rng.lognormal(np.log(120), 1.0))))
            sizes = rng.choice(lengths, size=n).tolist()
            words = vocab[np.searchsorted(cdf, rng.random(sum(sizes)))].tolist()
            plate = (rng.random(n) < 1 / 30).tolist()
            which = rng.integers(len(BOILERPLATE), size=n).tolist()
            sentences, at = [], 0
            for size, boiler, b in zip(sizes, plate, which):
                sentences.append(BOILERPLATE[b] if boiler else " ".join(words[at:at + size]).capitalize() + ".")
                at += size
            line = json.dumps({"url": f"https://example.org/{seed}/{page}", "type": "web", "query": "generated",
                               "url2text": sentences}) + "\n"
            f.write(line)
            written += len(line.encode("utf-8"))
            page += 1
    os.replace(tmp, path)


# ---------------------------------------------------------------- the measured part (a child process)


def _rss_mib(field="VmRSS"):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak():
    """Start the kernel's peak resident set (VmHWM) again from now, where Linux lets a process do it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def measure(store, args):
    """Time one claim's search of `store` with the `debate` on sys.path; print one JSON line."""
    import torch

    import debate
    from debate.data import knowledge_store
    from debate.engine import retrieval, store_search

    torch.set_num_threads(max(1, torch.get_num_threads()))
    dev = json.loads((_data_dir() / "dev.json").read_text(encoding="utf-8"))
    claim = dev[0]["claim"]
    articles = [dev[0].get("justification") or claim] * 8
    query_text = " ".join([claim, *articles])
    embedder = retrieval.load_embedder()
    query = store_search.query_vector(embedder, [claim, *articles])
    before = _rss_mib()
    row = {"tree": str(Path(debate.__file__).parents[1]), "store": str(store),
           "file_mib": round(Path(store).stat().st_size / 2**20, 1), "bm25_k": args.bm25_k,
           "rss_before_mib": round(before)}
    resets = _reset_peak()
    t0 = time.time()
    if hasattr(store_search, "bm25_candidates"):  # issue 38 on: streamed
        found = store_search.bm25_candidates(store, query_text, args.bm25_k)
        t1 = time.time()
        bm25_peak = _rss_mib("VmHWM")
        cache = store_search.VectorCache(found.digest, embedder)
        store_search.rerank(cache, query, found.candidates, args.rerank_k, claim)
        row["sentences"] = found.sentences
    else:  # before: the whole store read, bm25s's index of it
        held = knowledge_store.read_store(store)
        index = store_search.bm25_index(held.texts)
        candidates = store_search.bm25_top(index, query_text, args.bm25_k)
        t1 = time.time()
        bm25_peak = _rss_mib("VmHWM")
        cache = store_search.VectorCache(held.texts, embedder)
        store_search.rerank(cache, query, candidates, args.rerank_k, claim)
        row["sentences"] = len(held.texts)
    t2 = time.time()
    peak = _rss_mib("VmHWM")
    row.update(read_bm25_s=round(t1 - t0, 2), rerank_s=round(t2 - t1, 2), total_s=round(t2 - t0, 2),
               peak_rss_mib=round(peak), above_mib=round(peak - before),
               factor=round((peak - before) / max(row["file_mib"], 1e-9), 3))
    if resets:  # the peak of reading and BM25 alone: what grows with the store (re-ranking's is --bm25-k's)
        row.update(bm25_peak_above_mib=round(bm25_peak - before),
                   bm25_factor=round((bm25_peak - before) / max(row["file_mib"], 1e-9), 3))
    if args.courtroom:
        if hasattr(store_search, "bm25_candidates"):
            t3 = time.time()
            store_search.store_index(store, claim, args.bm25_k, embedder)
            row["courtroom_index_s"] = round(time.time() - t3, 2)
        else:
            row["courtroom_index_s"] = None  # the old courtroom embeds every sentence: hours at this size
    print(json.dumps(row), flush=True)


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.measure:
        return measure(args.measure, args)
    store = ROOT / "bench" / "out" / f"ks-size-{args.size_mb:g}mb-s{args.seed}" / "0.json"
    t = time.time()
    generate(store, args.size_mb, args.seed)
    print(f"store {store}: {store.stat().st_size / 2**20:.1f} MiB ({time.time() - t:.1f}s to generate or find)")
    tree = Path(args.tree).resolve()
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, PYTHONPATH=str(tree), DEBATECV_CACHE=cache)
        command = [sys.executable, str(Path(__file__).resolve()), "--measure", str(store),
                   "--bm25-k", str(args.bm25_k), "--rerank-k", str(args.rerank_k)] + ["--courtroom"] * args.courtroom
        done = subprocess.run(command, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"the measured process failed (exit {done.returncode})")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps(row))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = json.loads(out.read_text(encoding="utf-8")) if out.is_file() else []
    rows.append(dict(row, size_mb=args.size_mb, seed=args.seed, date=time.strftime("%Y-%m-%d %H:%M")))
    out.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
