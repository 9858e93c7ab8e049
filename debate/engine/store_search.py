"""Search one claim's knowledge store as HerO does: BM25 over its sentences, then dense re-ranking of BM25's best.

- BM25 is bm25s's (sparse matrices; Lucene's BM25 with k1 1.5, b 0.75, the values of rank_bm25's Okapi that HerO
  used); tokens are bm25s's own (lower-cased words of two or more characters, no stop-word list and no stemmer, as
  HerO's nltk tokens had none), so nothing is downloaded at run time.
- Re-ranking embeds the query texts (the claim and its hypothetical articles) with the sentence encoder
  (debate.engine.retrieval), averages them into one query vector, and orders BM25's candidates by cosine to it.
- HerO drops a candidate that only restates the claim: TF-IDF cosine to the claim above 0.97, or the claim inside
  it making more than 92% of its length (both on lower-cased text without punctuation).
- The embeddings of a store's sentences are cached by the sha256 of the store's texts and by the encoder
  (`VectorCache`), only the sentences ever embedded, so a resumed or repeated retrieval and the courtroom's search of
  the same store embed nothing twice.
"""
import math
import os
import re
from collections import Counter

import torch

from debate.engine import retrieval

DUPLICATE_COSINE = 0.97  # HerO's: TF-IDF cosine to the claim above which a sentence only restates it
DUPLICATE_SHARE = 0.92  # HerO's: share of a sentence's length the claim may fill before it only restates it
_WORD = re.compile(r"(?u)\b\w\w+\b")
_NOT_WORD = re.compile(r"[^\w\s]+")


# ---------------------------------------------------------------- BM25


def bm25_index(texts):
    """A bm25s index of `texts` (its positions are the texts')."""
    import bm25s

    index = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    index.index(bm25s.tokenize(list(texts), stopwords=None, show_progress=False), show_progress=False)
    return index


def bm25_top(index, query, k):
    """The positions of the `k` texts of `index` that score highest for `query` (a string), best first; [] when no
    word of the query is in the index."""
    import bm25s

    words = bm25s.tokenize([query], stopwords=None, show_progress=False, return_ids=False)[0]
    known = [w for w in words if w in index.vocab_dict]
    total = index.scores["num_docs"]
    if not known or total == 0:
        return []
    found, scores = index.retrieve([known], k=min(k, total), show_progress=False, n_threads=0)
    return [int(i) for i, s in zip(found[0], scores[0]) if s > 0]


# ---------------------------------------------------------------- claim restatements


def _plain(text):
    return _NOT_WORD.sub("", text).lower()


def tfidf_cosine(a, b):
    """Cosine of two texts' TF-IDF vectors fitted on the two alone (scikit-learn's defaults, which HerO used: smooth
    idf ln(3 / (1 + df)) + 1, raw counts, l2 norm)."""
    ca, cb = Counter(_WORD.findall(a.lower())), Counter(_WORD.findall(b.lower()))
    idf = {w: math.log(3 / (1 + (w in ca) + (w in cb))) + 1 for w in set(ca) | set(cb)}
    dot = sum(ca[w] * cb[w] * idf[w] ** 2 for w in ca.keys() & cb.keys())
    na = math.sqrt(sum((n * idf[w]) ** 2 for w, n in ca.items()))
    nb = math.sqrt(sum((n * idf[w]) ** 2 for w, n in cb.items()))
    return dot / (na * nb) if na and nb else 0.0


def restates(claim, sentence):
    """Whether `sentence` only restates `claim` (HerO's rule, see the module doc)."""
    c, s = _plain(claim), _plain(sentence)
    if not s.strip():
        return True
    return tfidf_cosine(c, s) > DUPLICATE_COSINE or (c in s and len(c) / len(s) > DUPLICATE_SHARE)


# ---------------------------------------------------------------- dense re-ranking


class VectorCache:
    """The embeddings of one store's sentences computed so far, on disk under the store's texts and the encoder."""

    def __init__(self, texts, embedder, cache_dir=None):
        self.texts, self.embedder = texts, embedder
        digest = retrieval.texts_sha256(texts)
        self.key = retrieval.cache_key(digest, embedder)
        self.path = retrieval.cache_file(digest, embedder, cache_dir, prefix="store-")
        self.rows = {}  # text position -> its vector
        if self.path.is_file():
            try:
                saved = torch.load(self.path, map_location="cpu", weights_only=True)
                if saved.get("key") == self.key:
                    self.rows = dict(zip(saved["rows"].tolist(), saved["vectors"].float()))
            except Exception:  # a torn or foreign file: embed again, overwrite it
                self.rows = {}

    def vectors(self, positions):
        """The embeddings of texts at `positions`, (len, dim) float32; those not cached are embedded and saved."""
        todo = [p for p in dict.fromkeys(positions) if p not in self.rows]
        if todo:
            for p, v in zip(todo, retrieval.embed(self.embedder, [self.texts[p] for p in todo])):
                self.rows[p] = v
            self._save()
        if not positions:
            return torch.zeros((0, self.embedder.model.config.hidden_size))
        return torch.stack([self.rows[p] for p in positions])

    def _save(self):
        rows = sorted(self.rows)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            # float32 as computed: a resumed retrieval orders the candidates exactly as an uninterrupted one
            torch.save({"key": self.key, "rows": torch.tensor(rows, dtype=torch.long),
                        "vectors": torch.stack([self.rows[r] for r in rows])}, tmp)
            os.replace(tmp, self.path)
        except OSError:
            pass  # no cache: the next run embeds again, nothing is wrong


def query_vector(embedder, queries):
    """HerO's query: the mean of the query texts' embeddings (the claim and each non-empty hypothetical article)."""
    vectors = retrieval.embed(embedder, [q for q in queries if q.strip()])
    return torch.nn.functional.normalize(vectors.mean(0, keepdim=True), dim=-1)


def rerank(cache, query, candidates, k, claim):
    """The best `k` of `candidates` (text positions) by cosine to `query` (a vector), restatements of `claim` left
    out: [(position, cosine)], best first."""
    if not candidates:
        return []
    scores = (cache.vectors(candidates) @ query.T).squeeze(1)
    chosen = []
    for i in torch.argsort(scores, descending=True, stable=True).tolist():
        if not restates(claim, cache.texts[candidates[i]]):
            chosen.append((candidates[i], float(scores[i])))
            if len(chosen) == k:
                break
    return chosen


def store_index(texts, urls, cache, log_fn=print, source="store"):
    """A retrieval.Index over every text of a store (the courtroom's search), its vectors from `cache`."""
    passages = [{"id": str(i), "text": t, "url": u} for i, (t, u) in enumerate(zip(texts, urls))]
    missing = sum(1 for i in range(len(texts)) if i not in cache.rows)
    if missing:
        log_fn(f"embedding {missing} sentences of {source} (once; cached in {cache.path})")
    return retrieval.Index(passages, cache.vectors(list(range(len(texts)))))
