"""Check-COVID (Wang et al., Findings of ACL 2023), PROClaim's main benchmark: news claims about COVID-19
checked against sentences of scientific abstracts.

As its repository ships it (github posuer/Check-COVID), DATA_DIR holds `corpus.json` (JSON Lines despite the
name: one abstract a line, {cord_id, title, abstract: [sentences]}), `train/`, `dev/` and `test/` with
`covidCheck_<split>_{extracted,composed,composed+extracted}.json` (JSON Lines: {id, claim, cord_id, label,
evidence_set: [{sent_index, type}], is_auth}), and `variants_for_experiments/abstracts/` with per-claim
abstract retrievals. A claim's golden evidence is the sentences of its `cord_id`'s abstract that its
`evidence_set` names, in the abstract's order.

Splits: train and dev (their composed+extracted files), test (composed and extracted together: the test
split has no combined file), and test-binary: the 121 test claims with a definitive label that PROClaim
evaluated (its Table 3, "120 claims"), read from PROClaim's `checkcovid_test_binary.jsonl` (records of the
same shape), found in DATA_DIR or in a `proclaim/` folder beside it. test-binary has two labels, SUPPORT
and REFUTE; the others add NOTENOUGHINFO.
"""
import os
from pathlib import Path
from typing import Any, Dict, List, Set, Union

from debate.data.claims import claim_fields, expect, read_jsonl, record, required, split_file
from debate.data.inputs import DataError
from debate.data.labels import LabelSet

LABELS = LabelSet(
    name="check-covid",
    labels=("SUPPORT", "REFUTE", "NOTENOUGHINFO"),
    definitions=("the scientific evidence backs the claim.",
                 "the scientific evidence contradicts the claim.",
                 "the scientific evidence does not say enough to back the claim or to contradict it."),
    supported="SUPPORT", refuted="REFUTE", nei="NOTENOUGHINFO",
    aliases=(("supported", "SUPPORT"), ("supports", "SUPPORT"), ("refuted", "REFUTE"), ("refutes", "REFUTE"),
             ("notenoughinformation", "NOTENOUGHINFO"), ("notenoughevidence", "NOTENOUGHINFO"),
             ("nei", "NOTENOUGHINFO")),
)
BINARY = LabelSet(
    name="check-covid-binary",
    labels=("SUPPORT", "REFUTE"),
    definitions=LABELS.definitions[:2],
    supported="SUPPORT", refuted="REFUTE",
    aliases=tuple((k, v) for k, v in LABELS.aliases if v != "NOTENOUGHINFO"),
)
SPLITS = ("train", "dev", "test", "test-binary")
BINARY_FILE = "checkcovid_test_binary.jsonl"
RETRIEVALS = "variants_for_experiments/abstracts"


def labels_of(split: str) -> LabelSet:
    return BINARY if split == "test-binary" else LABELS


def split_files(data_dir: Union[str, os.PathLike], split: str) -> List[Path]:
    """The files of `split` under the dataset's folder (PROClaim's folder for test-binary)."""
    root = Path(data_dir)
    if split == "test-binary":
        for place in (root / BINARY_FILE, root.parent / "proclaim" / BINARY_FILE):
            if place.is_file():
                return [place]
        raise DataError(f"{root / BINARY_FILE}: no such file (nor in {root.parent / 'proclaim'}): test-binary is "
                        "PROClaim's sample of the Check-COVID test claims, data/checkcovid_test_binary.jsonl in "
                        "its repository (github mnc13/PROClaim); put it in --data-dir or in a proclaim/ folder "
                        "beside it")
    if split == "test":
        names = ["covidCheck_test_composed.json", "covidCheck_test_extracted.json"]
    elif split in ("train", "dev"):
        names = [f"covidCheck_{split}_composed+extracted.json"]
    else:
        raise DataError(f"--split {split!r}: Check-COVID has the splits {', '.join(SPLITS)}")
    return [split_file(root / split / name, "Check-COVID", "github posuer/Check-COVID", "corpus.json")
            for name in names]


def load_corpus(data_dir: Union[str, os.PathLike]) -> Dict[str, Dict[str, Any]]:
    """{cord_id: {"title", "abstract": [sentences]}} of corpus.json."""
    path = Path(data_dir) / "corpus.json"
    if not path.is_file():
        raise DataError(f"{path}: no such file: Check-COVID's abstracts (corpus.json) must sit in --data-dir")
    corpus: Dict[str, Dict[str, Any]] = {}
    for where, row in read_jsonl(path):
        cord = required(path, where, row, "cord_id", str)
        abstract = required(path, where, row, "abstract", list)
        for i, sentence in enumerate(abstract):
            expect(path, where, f"abstract[{i}]", sentence, str)
        corpus[cord] = {"title": expect(path, where, "title", row.get("title") or "", str), "abstract": abstract}
    return corpus


def load_split(split: str, data_dir: Union[str, os.PathLike]) -> List[Dict[str, Any]]:
    corpus = load_corpus(data_dir)
    labels = labels_of(split)
    claims: List[Dict[str, Any]] = []
    for path in split_files(data_dir, split):
        for where, row in read_jsonl(path):
            claims.append(_claim(path, where, row, corpus, labels))
    return claims


def source(cord_id: str, title: str) -> str:
    """How a passage of an abstract names where it comes from."""
    return f"CORD-19 {cord_id}: {title}" if title else f"CORD-19 {cord_id}"


def _claim(path: Path, where: str, row: Dict[str, Any], corpus: Dict[str, Dict[str, Any]],
           labels: LabelSet) -> Dict[str, Any]:
    claim_id, where, claim, label = claim_fields(path, where, row, labels)
    cord = required(path, where, row, "cord_id", str)
    if cord not in corpus:
        raise DataError(f"{path}: {where}: field 'cord_id': {cord!r} is not an abstract of corpus.json")
    abstract = corpus[cord]["abstract"]
    indices: List[int] = []
    for k, item in enumerate(required(path, where, row, "evidence_set", list)):
        expect(path, where, f"evidence_set[{k}]", item, dict)
        index = required(path, where, item, "sent_index", int, prefix=f"evidence_set[{k}].")
        if not 0 <= index < len(abstract):
            raise DataError(f"{path}: {where}: field 'evidence_set[{k}].sent_index': {index} is past the end of "
                            f"abstract {cord} ({len(abstract)} sentences)")
        indices.append(index)
    url = source(cord, corpus[cord]["title"])
    gold = [{"text": abstract[i], "url": url} for i in sorted(set(indices))]
    return record(claim_id, claim, label, gold, "passages", cord_id=cord)


def corpus_passages(data_dir: Union[str, os.PathLike]) -> List[Dict[str, Any]]:
    """The retrieval corpus: every abstract of corpus.json and every abstract the repository's retrieval files
    carry (the offline stand-in for the PubMed index PROClaim searched), once each: {id, text, url, title}."""
    passages: List[Dict[str, Any]]
    seen: Set[str]  # cord ids added
    passages, seen = [], set()

    def add(cord: str, title: str, sentences: List[Any]) -> None:
        if cord in seen or not sentences:
            return
        seen.add(cord)
        passages.append({"id": cord, "title": title, "url": source(cord, title),
                         "text": " ".join(s.strip() for s in sentences if isinstance(s, str))})

    for cord, entry in load_corpus(data_dir).items():
        add(cord, entry["title"], entry["abstract"])
    folder = Path(data_dir) / RETRIEVALS
    for path in sorted(folder.glob("abstract_retrieval_*.jsonl")) if folder.is_dir() else ():
        for where, row in read_jsonl(path):
            for cord, sentences in (row.get("abstracts") or {}).items():
                if isinstance(sentences, list) and sentences and all(isinstance(s, str) for s in sentences):
                    # The retrieval files put the title first, then the abstract's sentences.
                    add(str(cord), sentences[0], sentences[1:])
    return passages
