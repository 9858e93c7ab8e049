"""WordNet for METEOR without any download; ``python -m eval.meteor`` says where it was found and checks it.

Order of preference:
1. a dictionary directory named by ``DEBATECV_WORDNET_DIR`` (or WordNet's own ``WNSEARCHDIR``): when set,
   it is the only place looked at, so a copy carried from another machine is used as it is, and a
   directory without WordNet (``DEBATECV_WORDNET_DIR=/nonexistent``) hides every other copy;
2. nltk's own ``corpora/wordnet`` data, when it is installed;
3. Debian's dictionary in ``/usr/share/wordnet`` (packages ``wordnet-base`` and
   ``wordnet-sense-index``).

Debian ships every file nltk's ``WordNetCorpusReader`` reads except ``lexnames`` (the fixed list of
45 lexicographer file names), so that one is served from memory. The files are read in place:
recent nltk refuses symlinks that point outside a corpus root, and copying 36 MB into a cache buys
nothing. Recent nltk also only opens files under a directory listed in ``nltk.data.path``, so the
dictionary directory is appended there.
"""
import io
import os
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any, List, Optional, Union

INSTALL_HINT = "apt-get install wordnet-base wordnet-sense-index"
# Scores that need WordNet (METEOR), as metrics.json names them; everything else is scored without it.
METEOR_SCORES = ("averitec", "evidence_score_mean", "justification_meteor", "justification_meteor_unrefined")
DOCS = "docs/wordnet.md"
DEBIAN_DIR = "/usr/share/wordnet"

# What nltk opens at start-up or on a synonym lookup. index.sense and cntlist.rev are read only by
# sense-key and count queries, which METEOR never makes.
REQUIRED_FILES = tuple(
    f"{kind}.{pos}" for kind in ("index", "data") for pos in ("noun", "verb", "adj", "adv")
) + tuple(f"{pos}.exc" for pos in ("noun", "verb", "adj", "adv"))

# WordNet 3.0 lexicographer files, in file-number order (see lexnames(5WN)).
LEXNAMES = (
    "adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute "
    "noun.body noun.cognition noun.communication noun.event noun.feeling noun.food noun.group "
    "noun.location noun.motive noun.object noun.person noun.phenomenon noun.plant "
    "noun.possession noun.process noun.quantity noun.relation noun.shape noun.state "
    "noun.substance noun.time verb.body verb.change verb.cognition verb.communication "
    "verb.competition verb.consumption verb.contact verb.creation verb.emotion verb.motion "
    "verb.perception verb.possession verb.social verb.stative verb.weather adj.ppl"
).split()

_CATEGORY = {"noun": 1, "verb": 2, "adj": 3, "adv": 4}


class WordNetMissingError(RuntimeError):
    """No usable WordNet on this machine."""


def lexnames_text() -> str:
    """The ``lexnames`` file: number, name and syntactic category, tab-separated."""
    return "".join(
        f"{i:02d}\t{name}\t{_CATEGORY[name.split('.')[0]]}\n" for i, name in enumerate(LEXNAMES)
    )


def missing_files(directory: Union[str, os.PathLike]) -> List[str]:
    """Required dictionary files absent from `directory` (all of them if it does not exist)."""
    directory = Path(directory)
    return [name for name in REQUIRED_FILES if not (directory / name).is_file()]


def _nltk_wordnet() -> Optional[str]:
    """Where nltk's own WordNet data is, or None."""
    import nltk

    for resource in ("corpora/wordnet", "corpora/wordnet.zip"):
        try:
            return str(nltk.data.find(resource))
        except (LookupError, OSError, ValueError):
            continue
    return None


def _nltk_has_wordnet() -> bool:
    return _nltk_wordnet() is not None


def reader_for_directory(directory: Union[str, os.PathLike]) -> Any:
    """An nltk WordNet reader over a plain WordNet dictionary directory (Debian layout)."""
    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    directory = str(Path(directory).resolve())
    lost = missing_files(directory)
    if lost:
        what = "holds no WordNet" if len(lost) == len(REQUIRED_FILES) else f"lacks {', '.join(lost)}"
        raise WordNetMissingError(
            f"WordNet directory {directory} {what}; run `{INSTALL_HINT}` or point DEBATECV_WORDNET_DIR at "
            f"a WordNet 3.0 dictionary directory copied from any machine ({DOCS})"
        )
    if directory not in nltk.data.path:
        nltk.data.path.append(directory)
    has_lexnames = os.path.isfile(os.path.join(directory, "lexnames"))

    class _DictionaryReader(WordNetCorpusReader):
        def open(self, file: str) -> Any:
            if file == "lexnames" and not has_lexnames:
                return io.StringIO(lexnames_text())
            return super().open(file)

        def map_wn(self, version: str = "wordnet") -> None:
            # nltk would map from its own "wordnet" corpus (absent here) onto this one; both are
            # WordNet 3.0, so the identity mapping (None) is right and needs no download.
            return None

    with warnings.catch_warnings():
        # "multilingual functions are not available": expected, METEOR is English only.
        warnings.simplefilter("ignore", UserWarning)
        return _DictionaryReader(directory, None)


def source() -> str:
    """Where load_wordnet() reads WordNet from, in words; raises WordNetMissingError as it would."""
    explicit_name = next((n for n in ("DEBATECV_WORDNET_DIR", "WNSEARCHDIR") if os.environ.get(n)), None)
    if explicit_name:
        return f"{os.environ[explicit_name]} (from ${explicit_name}, the only place looked at)"
    load_wordnet()
    found = _nltk_wordnet()
    return f"{found} (nltk's data)" if found else f"{DEBIAN_DIR} (Debian's packages)"


def missing_reason() -> Optional[str]:
    """Why METEOR cannot run here (the lookup's own message), or None when WordNet is there."""
    try:
        load_wordnet()
    except WordNetMissingError as err:
        return str(err)
    return None


def not_computed_line(rescore: str) -> str:
    """The one line a summary prints when the METEOR-based scores were left out; `rescore` says how to add
    them to the finished run."""
    return (f"not computed: AVeriTeC@k, evidence score, justification METEOR (no WordNet here; "
            f"`python -m eval.meteor` says where it looks, {DOCS} how to add a copy without apt). "
            f"With WordNet visible, {rescore}")


@lru_cache(maxsize=1)
def load_wordnet() -> Any:
    """Return a WordNet reader (loaded once per process); raise WordNetMissingError if none."""
    explicit = os.environ.get("DEBATECV_WORDNET_DIR") or os.environ.get("WNSEARCHDIR")
    if explicit:
        return reader_for_directory(explicit)
    if _nltk_has_wordnet():
        from nltk.corpus import wordnet

        wordnet.ensure_loaded()
        return wordnet
    if not missing_files(DEBIAN_DIR):
        return reader_for_directory(DEBIAN_DIR)
    raise WordNetMissingError(
        "METEOR needs WordNet and none was found: nltk has no 'corpora/wordnet' data and "
        f"{DEBIAN_DIR} holds none. Install it with `{INSTALL_HINT}`, or, without an administrator, "
        f"set DEBATECV_WORDNET_DIR to a WordNet 3.0 dictionary directory copied from any machine ({DOCS})."
    )
