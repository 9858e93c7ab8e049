"""A knowledge store in AVeriTeC's layout, and the golden question-answer pairs HerO draws its few-shot examples
from.

A store is a folder with one file per claim, `<claim_id>.json`, each line a JSON object for one web page:
`url` (a string) and `url2text` (the page's sentences, a list of strings), plus fields we do not read (`type`,
`query`, ...). A claim's sentences are read line by line (a real claim's store holds up to ~1,000 pages and 100k+
sentences), stripped, and each text kept once: HerO drops a sentence whose stripped, lower-cased text it has seen
before, keeping the first copy and its url. A page's sentence keeps its place in the page, so the answer can be
given with its neighbours (`with_context`).

Every problem names the file, the line and the field. A page with no sentences (a scrape that failed, common in
the published stores) is skipped and counted, not refused: the stage says how many in its summary.
"""
import json
from dataclasses import dataclass, field
from pathlib import Path

from debate.data.claims import json_problem, kind_of
from debate.data.inputs import DataError

SUFFIX = ".json"
EXAMPLE_CHARS = 1500  # HerO cuts each few-shot example to this many characters
NO_ANSWER = "No answer could be found."


class StoreError(DataError):
    """A store file the retrieval cannot read; the message names the file, the line and the field."""


@dataclass
class Store:
    """One claim's store: its distinct sentences with their page's url, and the pages for the neighbours."""
    path: Path
    texts: list  # distinct sentences, in store order
    urls: list  # the url of each text's page (the first page it appeared on)
    where: list  # (page number, position in the page) of each text
    pages: list = field(default_factory=list)  # every page's sentences (stripped), in store order
    lines: int = 0  # lines read (pages, empty ones included)
    empty_pages: list = field(default_factory=list)  # line numbers of pages without a sentence

    def with_context(self, i, window):
        """Text i with `window` sentences of its page before and after it, joined by spaces (0: the text alone)."""
        if window <= 0:
            return self.texts[i]
        page, at = self.where[i]
        sentences = self.pages[page]
        return " ".join(s for s in sentences[max(0, at - window):at + window + 1] if s)


def store_file(directory, claim_id):
    """Where the store of `claim_id` lives in `directory`."""
    return Path(directory) / f"{claim_id}{SUFFIX}"


def check_directory(directory, claim_ids, missing="error"):
    """The claim ids without a store file in `directory`, checked before any model loads.

    A directory that is not there, or holds a file for none of the claims (a store for another split), is one
    StoreError. A claim without a file is one StoreError naming it, unless `missing` is "skip": then the caller
    retrieves nothing for those claims and counts them.
    """
    root = Path(directory)
    if not root.is_dir():
        raise StoreError(f"--knowledge-store {root}: not a directory")
    absent = [cid for cid in claim_ids if not store_file(root, cid).is_file()]
    if claim_ids and len(absent) == len(claim_ids):
        found = sorted(p.name for p in root.glob(f"*{SUFFIX}"))
        held = (f"it holds {', '.join(found[:3])}{', ...' if len(found) > 3 else ''}" if found
                else f"it holds no *{SUFFIX} file")
        raise StoreError(f"--knowledge-store {root}: no store file for any of the {len(claim_ids)} claims (looked for "
                         f"{store_file(root, claim_ids[0]).name}, ...); {held}: a store for other claims?")
    if absent and missing != "skip":
        raise StoreError(f"{store_file(root, absent[0])}: no such store file ({len(absent)} of {len(claim_ids)} claims "
                         f"have none); --missing-store skip retrieves nothing for them and goes on")
    return absent


def read_store(path):
    """The Store of one claim's file, read line by line; a bad line is one StoreError naming file, line and field."""
    path = Path(path)
    texts, urls, where, pages, empty, seen = [], [], [], [], [], set()
    number = 0
    try:
        f = open(path, encoding="utf-8-sig")
    except OSError as e:
        raise StoreError(f"{path}: cannot read the store file ({e.strerror})") from None
    with f:
        try:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                url, sentences = _page(path, number, line)
                page = len(pages)
                pages.append(sentences)
                if not any(sentences):
                    empty.append(number)
                for at, text in enumerate(sentences):
                    key = text.lower()
                    if text and key not in seen:
                        seen.add(key)
                        texts.append(text)
                        urls.append(url)
                        where.append((page, at))
        except UnicodeDecodeError as e:
            raise StoreError(f"{path}: line {number + 1}: not UTF-8 text ({e.reason})") from None
    return Store(path, texts, urls, where, pages, number, empty)


def _page(path, number, line):
    where = f"{path}: line {number}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise StoreError(f"{where}: not valid JSON ({json_problem(e)})") from None
    if not isinstance(row, dict):
        raise StoreError(f"{where}: expected a JSON object (a page with url and url2text), got {kind_of(row)}")
    if "url2text" not in row:
        raise StoreError(f"{where}: missing field 'url2text' (the page's sentences)")
    sentences = row["url2text"]
    if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
        raise StoreError(f"{where}: field 'url2text': expected a list of strings, got {kind_of(sentences)}")
    url = row.get("url")
    if url is not None and not isinstance(url, str):
        raise StoreError(f"{where}: field 'url': expected a string, got {kind_of(url)}")
    return url or "", [" ".join(s.split()) for s in sentences]


# ---------------------------------------------------------------- few-shot examples


def qa_examples(claims, split=None):
    """HerO's few-shot pool from labelled claims' golden question-answer pairs: one example per answer, each
    {"split", "claim_id" (together they name the claim: AVeriTeC's ids restart in every split), "lookup" (the
    answer: what BM25 matches a retrieved sentence against), "text" (claim, answer as evidence, question; cut to
    EXAMPLE_CHARS)}. A Boolean answer reads "Yes, because <explanation in lower case>", as HerO writes it.
    Unanswered questions and passage evidence give none."""
    pool = []
    for c in claims:
        for item in c.get("gold_evidence") or ():
            question, answer = (item.get("question") or "").strip(), (item.get("answer") or "").strip()
            if not question or not answer or answer == NO_ANSWER or "text" in item and "question" not in item:
                continue
            if item.get("boolean"):
                said = item["boolean"]
                answer = f"{said['answer'].strip()}, because {said['explanation'].lower().strip()}"
            question += "" if question.endswith("?") else "?"
            answer += "" if answer[-1] in ".!:?" else "."
            flat = [" ".join(part.split()) for part in (c["claim"], answer, question)]  # one line each
            text = "Claim: {}\nEvidence: {}\nQuestion: {}".format(*flat)
            pool.append({"split": split, "claim_id": c["claim_id"], "lookup": answer, "text": text[:EXAMPLE_CHARS]})
    return pool
