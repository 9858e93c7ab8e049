"""Search one claim's knowledge store as HerO does: BM25 over its sentences, then dense re-ranking of BM25's best,
with memory that grows with the store's sentence count (about 20-40 bytes a sentence, by the query's size), never
with its text.

- BM25 is Lucene's (k1 1.5, b 0.75, the values of rank_bm25's Okapi that HerO used) with bm25s's tokens
  (lower-cased words of two or more characters, no stop-word list and no stemmer, as HerO's nltk tokens had none),
  scored as bm25s scores it (`bm25s_scores` in the tests holds our scores against it), from one pass over the file
  that holds no text (`bm25_candidates`):
  1. CHUNK sentences at a time are lower-cased, hashed and tokenised in one regex call; of each sentence only a
     64-bit hash of its lower-cased text, its length and the query words it holds (ids and counts) are kept,
     as small integer arrays;
  2. the first of equal hashes is the distinct sentence (two distinct sentences of a million-sentence store share
     a hash, and the second is dropped, about once in 40 million stores); document frequencies and the mean
     length count the distinct sentences only, and every distinct sentence is scored from the arrays;
  3. the best `k` are read back from their pages (by byte offset, each page once) for their text and url.
  Ties keep store order. A query word counts as often as the query holds it, as bm25s counts it. Tokenising once
  and never per sentence in Python is what makes a 1 GB store a minute and a half on one core, not six.
- Re-ranking embeds the query texts (the claim and its hypothetical articles) with the sentence encoder
  (debate.engine.retrieval), averages them into one query vector, and orders BM25's candidates by cosine to it.
- HerO drops a candidate that only restates the claim: TF-IDF cosine to the claim above 0.97, or the claim inside
  it making more than 92% of its length (both on lower-cased text without punctuation).
- The embeddings of a store's sentences are cached by the sha256 of the store file and by the encoder's weights
  (`VectorCache`), only the sentences ever embedded, so a resumed or repeated retrieval and the courtroom's search of
  the same store embed nothing twice; the cache directory is bounded (debate.engine.retrieval).
"""
import hashlib
import logging
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import repeat

import numpy as np
import torch

from debate.data import knowledge_store
from debate.engine import retrieval

log = logging.getLogger(__name__)

DUPLICATE_COSINE = 0.97  # HerO's: TF-IDF cosine to the claim above which a sentence only restates it
DUPLICATE_SHARE = 0.92  # HerO's: share of a sentence's length the claim may fill before it only restates it
K1, B = 1.5, 0.75
CHUNK = 5000  # sentences read and tokenised at once: few enough that their tokens (Python strings) stay a few MB
_WORD = re.compile(r"(?u)\b\w\w+\b")
# a word as _WORD finds it (the longest run of two or more word characters), or a line break: a sentence's end
_WORD_OR_BREAK = re.compile(r"\w\w+|\n")
_BREAK = -2  # the line break's id among the query's words
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


@dataclass
class _Chunk:
    """What the one pass keeps of CHUNK sentences (every non-empty one, duplicates included), each array in the
    smallest integer type its values fit: no text, no Python object per sentence."""
    hashes: np.ndarray  # int64: the hash of each sentence's lower-cased text (which sentences are distinct)
    lengths: np.ndarray  # each sentence's token count
    matched: np.ndarray  # how many distinct query words each sentence holds
    words: np.ndarray  # those words' ids, sentence by sentence, in id order
    counts: np.ndarray  # how often the sentence holds each of them


def _smallest(values):
    values = np.asarray(values)
    return values.astype(np.min_scalar_type(int(values.max()) if values.size else 0))


def _read_chunk(texts, ids):
    """_Chunk of `texts` (non-empty sentences): their lower-cased text joined by line breaks is hashed sentence by
    sentence and tokenised in one regex call, its words mapped to the query's ids in C (map over dict.get)."""
    low = "\n".join(texts).lower()  # a tidy sentence has no line break; lower() reads one as a sentence's end
    hashes = np.fromiter(map(hash, low.split("\n")), dtype=np.int64, count=len(texts))
    found = _WORD_OR_BREAK.findall(low)
    word = np.fromiter(map(ids.get, found, repeat(-1)), dtype=np.int64, count=len(found))
    brk = word == _BREAK
    row = np.cumsum(brk)  # the sentence of each token: the breaks before it
    lengths = np.bincount(row[~brk], minlength=len(texts))
    hit = word >= 0
    pairs, counts = np.unique(row[hit] * len(ids) + word[hit], return_counts=True)  # (sentence, word) once each
    rows, words = np.divmod(pairs, len(ids))
    return _Chunk(hashes, _smallest(lengths), _smallest(np.bincount(rows, minlength=len(texts))), _smallest(words),
                  _smallest(counts))


def _best(scores, positions, k, best):
    """The best `k` of (scores, positions) and of `best` (the same pair of arrays): higher score first, then
    the earlier position (ties keep store order)."""
    scores, positions = np.concatenate([best[0], scores]), np.concatenate([best[1], positions])
    order = np.lexsort((positions, -scores))[:k]
    return scores[order], positions[order]


def bm25_candidates(path, query, k):
    """Found: the `k` distinct sentences of the store file at `path` that score highest under BM25 for `query`
    (a string), best first, those scoring 0 left out; one pass over the file, then its winners' pages read back
    (see the module doc)."""
    weights = Counter(tokens(query))
    words = list(weights)
    ids = {w: i for i, w in enumerate(words)}
    ids["\n"] = _BREAK
    digest = hashlib.sha256()
    pages, empty, chunks, texts = [], [], [], []  # pages: (line, offset, its first sentence's index)
    held = 0  # non-empty sentences read, duplicates included
    for page in knowledge_store.pages(path, digest):
        kept = [s for s in page.sentences if s]
        if not kept:
            empty.append(page.number)
            continue
        pages.append((page.number, page.offset, held))
        held += len(kept)
        texts.extend(kept)
        if len(texts) >= CHUNK:
            chunks.append(_read_chunk(texts, ids))
            texts = []
    if texts:
        chunks.append(_read_chunk(texts, ids))
    page_count = len(pages) + len(empty)
    keys = np.concatenate([c.hashes for c in chunks]) if chunks else np.zeros(0, np.int64)
    first = np.zeros(len(keys), dtype=bool)
    first[np.unique(keys, return_index=True)[1]] = True  # the first of equal hashes is the distinct sentence
    del keys
    n = int(first.sum())
    found = Found(path, [], n, page_count, empty, digest.hexdigest())
    if not n or not k or not words:
        return found
    # Document frequency and mean length over the distinct sentences only, then every sentence's score.
    df = np.zeros(len(words), dtype=np.int64)
    total, start = 0, 0
    for c in chunks:
        mine = first[start:start + len(c.lengths)]
        df += np.bincount(c.words[np.repeat(mine, c.matched)].astype(np.int64), minlength=len(words))
        total += int(c.lengths[mine].sum(dtype=np.int64))
        start += len(c.lengths)
    avg = total / n
    idf = np.array([math.log(1 + (n - d + 0.5) / (d + 0.5)) if d else 0.0 for d in df], dtype=np.float32)
    count = np.array([weights[w] for w in words], dtype=np.float64)
    best = (np.zeros(0, np.float32), np.zeros(0, np.int64))
    start = 0
    for c in chunks:
        size = len(c.lengths)
        scores = _score_chunk(c, idf, count, avg)
        keep = first[start:start + size] & (scores > 0)
        best = _best(scores[keep], np.nonzero(keep)[0] + start, k, best)
        start += size
    position = np.cumsum(first, dtype=np.int64)[best[1]] - 1  # the winners' places among the distinct sentences
    found.candidates = _fetch(path, pages, [(float(s), int(i), int(at)) for s, i, at in zip(*best, position)])
    return found


def _score_chunk(c, idf, count, avg):
    """Each sentence's BM25 score, as bm25s computes it (float32)."""
    rows = np.repeat(np.arange(len(c.lengths)), c.matched)
    cols, tf = c.words.astype(np.int64), c.counts.astype(np.float32)
    # bm25s: term frequency as float32, the length norm in float64, each term's score rounded to float32
    norm = K1 * ((1 - B) + B * c.lengths[rows].astype(np.float64) / avg)
    term = (idf[cols].astype(np.float64) * (tf / (norm + tf))).astype(np.float32)
    scores = np.bincount(rows, weights=term.astype(np.float64) * count[cols], minlength=len(c.lengths))
    return scores.astype(np.float32)


def _fetch(path, pages, winners):
    """Candidate of each (score, sentence index, position) in `winners`, in their order: each page holding one is
    read back once, by its byte offset."""
    starts = np.array([p[2] for p in pages], dtype=np.int64)
    by_page = {}
    for score, index, position in winners:
        by_page.setdefault(int(np.searchsorted(starts, index, side="right")) - 1, []).append((score, index, position))
    found = {}
    for p, items in by_page.items():
        number, offset, base = pages[p]
        page = knowledge_store.page_at(path, offset, number)
        places = [at for at, s in enumerate(page.sentences) if s]  # the page's non-empty sentences
        for score, index, position in items:
            at = places[index - base]
            found[index] = Candidate(position, score, page.sentences[at], page.url, number, offset, at)
    return [found[index] for _, index, _ in winners]


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


def store_index(path, query, k, embedder):
    """The courtroom's index of a claim's store: BM25's `k` best sentences for `query` (the claim), as the debate
    stage finds them, with their embeddings (cached); no other sentence of the store is embedded."""
    found = bm25_candidates(path, query, k)
    cache = VectorCache(found.digest, embedder)
    missing = sum(1 for c in found.candidates if c.position not in cache.rows)
    if missing:
        log.info(f"embedding {missing} of the {found.sentences} sentences of {path} (BM25's best for the claim; "
                 f"cached in {cache.path})")
    passages = [{"id": str(c.position), "text": c.text, "url": c.url} for c in found.candidates]
    return retrieval.Index(passages, cache.vectors(found.candidates))
