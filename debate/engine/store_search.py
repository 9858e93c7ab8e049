"""Search one claim's knowledge store as HerO does: BM25 over its sentences, then dense re-ranking of BM25's best,
with memory that grows with the store's sentence count (about 10 bytes a sentence), never with its text.

- BM25 is Lucene's (k1 1.5, b 0.75, the values of rank_bm25's Okapi that HerO used) with bm25s's tokens
  (lower-cased words of two or more characters, no stop-word list and no stemmer, as HerO's nltk tokens had none),
  scored as bm25s scores it (`bm25s_scores` in the tests holds our scores against it), streamed from the file
  in three passes, none of which holds the store (`bm25_candidates`):
  1. which sentences are distinct: a 64-bit hash of each sentence's lower-cased text, the first of equal hashes
     kept (8 bytes a sentence; two distinct sentences of a million-sentence store share a hash, and the second is
     dropped, about once in 40 million stores);
  2. the sentence count, their mean length and the document frequency of the query's words alone;
  3. each sentence's score, 20,000 sentences at a time, keeping the best `k` (their text, url and page)
     and nothing else.
  Ties keep store order. A query word counts as often as the query holds it, as bm25s counts it.
- Re-ranking embeds the query texts (the claim and its hypothetical articles) with the sentence encoder
  (debate.engine.retrieval), averages them into one query vector, and orders BM25's candidates by cosine to it.
- HerO drops a candidate that only restates the claim: TF-IDF cosine to the claim above 0.97, or the claim inside
  it making more than 92% of its length (both on lower-cased text without punctuation).
- The embeddings of a store's sentences are cached by the sha256 of the store file and by the encoder's weights
  (`VectorCache`), only the sentences ever embedded, so a resumed or repeated retrieval and the courtroom's search of
  the same store embed nothing twice; the cache directory is bounded (debate.engine.retrieval).
"""
import hashlib
import heapq
import math
import re
from array import array
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from debate.data import knowledge_store
from debate.engine import retrieval

DUPLICATE_COSINE = 0.97  # HerO's: TF-IDF cosine to the claim above which a sentence only restates it
DUPLICATE_SHARE = 0.92  # HerO's: share of a sentence's length the claim may fill before it only restates it
K1, B = 1.5, 0.75
CHUNK = 20000  # sentences scored at once: a few MB, and enough that numpy's per-call cost vanishes
_WORD = re.compile(r"(?u)\b\w\w+\b")
_NOT_WORD = re.compile(r"[^\w\s]+")


# ---------------------------------------------------------------- BM25 over a store file, streamed


@dataclass
class Candidate:
    """One of BM25's best sentences, with what the answer and its neighbours need."""
    position: int  # its place among the store's distinct sentences
    score: float  # BM25
    text: str
    url: str
    line: int  # its page's line in the file
    offset: int  # its page's byte offset in the file
    at: int  # its place in the page


@dataclass
class Found:
    """BM25's best of one store, and what the store held."""
    path: object
    candidates: list  # Candidate, best first
    sentences: int = 0  # distinct sentences
    pages: int = 0
    empty_pages: list = field(default_factory=list)  # line numbers of pages without a sentence
    digest: str = ""  # sha256 of the file: its embeddings' cache key

    def answer(self, candidate, window):
        """A candidate's text with `window` sentences of its page on each side (0: the text alone); the page is
        read back from the file by its offset."""
        if window <= 0:
            return candidate.text
        page = knowledge_store.page_at(self.path, candidate.offset, candidate.line)
        return knowledge_store.context(page.sentences, candidate.at, window)


def tokens(text):
    """bm25s's tokens of a text: its lower-cased words of two or more characters."""
    return _WORD.findall(text.lower())


def _distinct(path):
    """(a bool per non-empty sentence of the file: the first of its lower-cased text, the file's sha256, pages,
    empty pages' line numbers)."""
    digest = hashlib.sha256()
    hashes, pages, empty = array("q"), 0, []  # 8 bytes a sentence, where a list of ints takes 36
    for page in knowledge_store.pages(path, digest):
        pages += 1
        texts = [s for s in page.sentences if s]
        if not texts:
            empty.append(page.number)
        hashes.extend(hash(s.lower()) for s in texts)
    keys = np.frombuffer(hashes, dtype=np.int64)
    first = np.zeros(len(keys), dtype=bool)
    if len(keys):
        first[np.unique(keys, return_index=True)[1]] = True
    return first, digest.hexdigest(), pages, empty


def _sentences(path, keep):
    """(page, place in the page, text) of each distinct sentence, in store order; the text's spaces as the file
    has them (its words are the same)."""
    i = 0
    for page in knowledge_store.pages(path, tidy=False):
        for at, text in enumerate(page.sentences):
            if text and not text.isspace():
                if keep[i]:
                    yield page, at, text
                i += 1


def bm25_candidates(path, query, k):
    """Found: the `k` distinct sentences of the store file at `path` that score highest under BM25 for `query`
    (a string), best first, those scoring 0 left out; three streamed passes (see the module doc)."""
    keep, digest, pages, empty = _distinct(path)
    weights = Counter(tokens(query))
    words = list(weights)
    ids = {w: i for i, w in enumerate(words)}
    df = [0] * len(words)
    n = total = 0
    known = ids.keys()
    for _, _, text in _sentences(path, keep):
        found = tokens(text)
        n += 1
        total += len(found)
        for w in known & found:  # the query's words in the sentence, each once
            df[ids[w]] += 1
    found = Found(path, [], n, pages, empty, digest)
    if not n or not k or not words:
        return found
    avg = total / n
    idf = np.array([math.log(1 + (n - d + 0.5) / (d + 0.5)) if d else 0.0 for d in df], dtype=np.float32)
    count = np.array([weights[w] for w in words], dtype=np.float64)
    best = []  # (score, -position, Candidate): a heap whose smallest is the first to go
    chunk = []
    position = 0
    for page, at, text in _sentences(path, keep):
        chunk.append((position, page, at, text))
        position += 1
        if len(chunk) == CHUNK:
            _score_chunk(chunk, ids, idf, count, avg, k, best)
            chunk = []
    _score_chunk(chunk, ids, idf, count, avg, k, best)
    found.candidates = [c for _, _, c in sorted(best, key=lambda e: (-e[0], -e[1]))]
    return found


def _score_chunk(chunk, ids, idf, count, avg, k, best):
    """Score a chunk's sentences as bm25s does and keep the best `k` of them and of `best` in `best`."""
    if not chunk:
        return
    rows, cols, lengths = array("i"), array("i"), array("d")  # 4-8 bytes an entry, where a list takes 36
    get = ids.get
    for r, (_, _, _, text) in enumerate(chunk):
        found = tokens(text)
        lengths.append(len(found))
        matched = [i for i in map(get, found) if i is not None]
        if matched:
            cols.extend(matched)
            rows.extend([r] * len(matched))
    if not rows:
        return
    pairs, tf = np.unique(np.frombuffer(rows, np.int32).astype(np.int64) * len(ids) + np.frombuffer(cols, np.int32),
                          return_counts=True)  # each (sentence, word) once, with its count
    rows, cols, tf = pairs // len(ids), pairs % len(ids), tf.astype(np.float32)
    lengths = np.frombuffer(lengths, np.float64)
    # bm25s: term frequency as float32, the length norm in float64, each term's score rounded to float32
    norm = K1 * ((1 - B) + B * lengths[rows] / avg)
    term = (idf[cols].astype(np.float64) * (tf / (norm + tf))).astype(np.float32)
    scores = np.bincount(rows, weights=term.astype(np.float64) * count[cols], minlength=len(chunk))
    scores = scores.astype(np.float32)
    floor = best[0][0] if len(best) >= k else 0.0
    for r in np.nonzero(scores > floor)[0] if floor > 0 else np.nonzero(scores > 0)[0]:
        position, page, at, text = chunk[r]
        entry = (float(scores[r]), -position, Candidate(position, float(scores[r]), " ".join(text.split()), page.url,
                                                        page.number, page.offset, at))
        if len(best) < k:
            heapq.heappush(best, entry)
        elif entry[:2] > best[0][:2]:
            heapq.heapreplace(best, entry)


# ---------------------------------------------------------------- BM25 over a few texts in memory (few-shot pool)


def bm25_index(texts):
    """A bm25s index of `texts` (its positions are the texts'): for small lists held in memory."""
    import bm25s

    index = bm25s.BM25(k1=K1, b=B, method="lucene")
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
    """The embeddings of one store's sentences computed so far, on disk under the store file's sha256 and the
    encoder's weights (retrieval.cache_key); rows are the sentences' positions."""

    def __init__(self, digest, embedder, cache_dir=None):
        self.embedder = embedder
        self.key = retrieval.cache_key(digest, embedder)
        self.path = retrieval.cache_file(digest, embedder, cache_dir, prefix="store-")
        self.rows = {}  # position -> its vector
        saved = retrieval.load_cached(self.path, self.key)
        if saved is not None and "rows" in saved:
            self.rows = dict(zip(saved["rows"].tolist(), saved["vectors"].float()))

    def vectors(self, candidates):
        """The embeddings of `candidates` (Candidate), (len, dim) float32; those not cached are embedded and saved."""
        todo = list({c.position: c for c in candidates if c.position not in self.rows}.values())
        if todo:
            for c, v in zip(todo, retrieval.embed(self.embedder, [c.text for c in todo])):
                self.rows[c.position] = v
            self._save()
        if not candidates:
            return torch.zeros((0, self.embedder.model.config.hidden_size))
        return torch.stack([self.rows[c.position] for c in candidates])

    def _save(self):
        rows = sorted(self.rows)
        # float32 as computed: a resumed retrieval orders the candidates exactly as an uninterrupted one
        retrieval.save_cached(self.path, {"key": self.key, "rows": torch.tensor(rows, dtype=torch.long),
                                          "vectors": torch.stack([self.rows[r] for r in rows])})


def query_vector(embedder, queries):
    """HerO's query: the mean of the query texts' embeddings (the claim and each non-empty hypothetical article)."""
    vectors = retrieval.embed(embedder, [q for q in queries if q.strip()])
    return torch.nn.functional.normalize(vectors.mean(0, keepdim=True), dim=-1)


def rerank(cache, query, candidates, k, claim):
    """The best `k` of `candidates` (Candidate) by cosine to `query` (a vector), restatements of `claim` left
    out: [(Candidate, cosine)], best first."""
    if not candidates:
        return []
    scores = (cache.vectors(candidates) @ query.T).squeeze(1)
    chosen = []
    for i in torch.argsort(scores, descending=True, stable=True).tolist():
        if not restates(claim, candidates[i].text):
            chosen.append((candidates[i], float(scores[i])))
            if len(chosen) == k:
                break
    return chosen


def store_index(path, query, k, embedder, log_fn=print):
    """The courtroom's index of a claim's store: BM25's `k` best sentences for `query` (the claim), as the debate
    stage finds them, with their embeddings (cached); no other sentence of the store is embedded."""
    found = bm25_candidates(path, query, k)
    cache = VectorCache(found.digest, embedder)
    missing = sum(1 for c in found.candidates if c.position not in cache.rows)
    if missing:
        log_fn(f"embedding {missing} of the {found.sentences} sentences of {path} (BM25's best for the claim; "
               f"cached in {cache.path})")
    passages = [{"id": str(c.position), "text": c.text, "url": c.url} for c in found.candidates]
    return retrieval.Index(passages, cache.vectors(found.candidates))
