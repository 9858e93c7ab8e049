"""METEOR between two evidence strings, the way the AVeriTeC scorer computes it.

The official scorer calls ``nltk.translate.meteor_score.single_meteor_score`` on
``nltk.word_tokenize`` output. ``word_tokenize`` first splits sentences with Punkt, whose model
(``punkt``/``punkt_tab``) is a download. When that model is installed we use ``word_tokenize``
itself; otherwise we split sentences with the small rule below (a break after ``.``, ``!`` or
``?`` followed by space, unless the word before is a common abbreviation or an initial) and run
nltk's Treebank-style ``NLTKWordTokenizer`` -- the same word tokenizer ``word_tokenize`` uses --
on each sentence. The two agree except where Punkt and the rule disagree about a sentence break;
such a disagreement only changes whether a period becomes a token of its own.
"""
import re
from functools import lru_cache

import numpy as np
from nltk.stem.api import StemmerI
from nltk.stem.porter import PorterStemmer
from nltk.translate.meteor_score import single_meteor_score

from eval.wordnet import load_wordnet

_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st jr sr vs etc e.g i.e u.s u.k u.n inc ltd co corp no gov sen rep gen "
    "lt col sgt jan feb mar apr jun jul aug sep sept oct nov dec approx est dept fig".split()
)
_BREAK = re.compile(r"""(?<=[.!?])["')\]]*\s+""")


def split_sentences(text):
    """Split `text` into sentences with a small rule (used only when Punkt is not installed)."""
    sentences, start = [], 0
    for match in _BREAK.finditer(text):
        head = text[start:match.start()].rstrip("\"')]")
        last_word = head.split()[-1].lower().rstrip(".!?") if head.split() else ""
        if head.endswith(".") and (last_word in _ABBREVIATIONS or re.fullmatch(r"[a-z]", last_word)):
            continue
        sentences.append(text[start:match.end()].strip())
        start = match.end()
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


@lru_cache(maxsize=1)
def _tokenizer():
    import nltk

    for resource in ("tokenizers/punkt_tab/english/", "tokenizers/punkt"):
        try:
            nltk.data.find(resource)
        except (LookupError, OSError, ValueError):
            continue
        try:
            nltk.word_tokenize("Punkt works. Check.")
            return nltk.word_tokenize
        except (LookupError, OSError, ValueError):
            break
    from nltk.tokenize.destructive import NLTKWordTokenizer

    words = NLTKWordTokenizer()
    return lambda text: [tok for sent in split_sentences(text) for tok in words.tokenize(sent)]


@lru_cache(maxsize=200_000)
def tokenize(text):
    """Tokens of `text` as a tuple (cached: evidence strings recur across pairs)."""
    return tuple(_tokenizer()(text))


class _MemoStemmer(StemmerI):
    """Porter stemmer with a memo; METEOR stems the same words over and over."""

    def __init__(self):
        self._porter = PorterStemmer()
        self._memo = {}

    def stem(self, token):
        stem = self._memo.get(token)
        if stem is None:
            stem = self._memo[token] = self._porter.stem(token)
        return stem


class _MemoWordNet:
    """Wraps a WordNet reader and remembers synsets(word), the only call METEOR makes."""

    def __init__(self, reader):
        self._reader = reader
        self._memo = {}

    def synsets(self, word, *args, **kwargs):
        if args or kwargs:
            return self._reader.synsets(word, *args, **kwargs)
        found = self._memo.get(word)
        if found is None:
            found = self._memo[word] = self._reader.synsets(word)
        return found


@lru_cache(maxsize=1)
def _resources():
    return _MemoStemmer(), _MemoWordNet(load_wordnet())


@lru_cache(maxsize=500_000)
def pairwise_meteor(candidate, reference):
    """nltk METEOR of `candidate` (hypothesis) against `reference`, both raw strings."""
    stemmer, wordnet = _resources()
    return single_meteor_score(
        tokenize(reference), tokenize(candidate), stemmer=stemmer, wordnet=wordnet
    )


def meteor_matrix(candidates, references):
    """Matrix M with M[i, j] = pairwise_meteor(candidates[i], references[j])."""
    matrix = np.zeros((len(candidates), len(references)))
    for i, cand in enumerate(candidates):
        for j, ref in enumerate(references):
            matrix[i, j] = pairwise_meteor(cand, ref)
    return matrix
