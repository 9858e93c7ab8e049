"""A knowledge store in AVeriTeC's layout, and the golden question-answer pairs HerO draws its few-shot examples
from.

A store is a folder with one file per claim, `<claim_id>.json`, each line a JSON object for one web page:
`url` (a string) and `url2text` (the page's sentences, a list of strings), plus fields we do not read (`type`,
`query`, ...). A real claim's store holds up to ~1,000 pages and a million sentences (hundreds of MB), so nothing
here keeps a store in memory: `pages` streams it a line at a time from a binary read (each line decoded on its
own, so a bad byte is named on its own line), `check_store` reads it once to refuse a bad line before any model
loads, and `page_at` reads back one page by its byte offset (an answer's neighbours, `--context`). A sentence is
stripped and its spaces collapsed; HerO drops a sentence whose lower-cased text it has seen before, keeping the
first copy: a sentence's position is its place among the distinct ones, in store order (debate.engine.store_search
finds them without a set of every text).

Every problem names the file, the line and the field or byte. A page with no sentences (a scrape that failed,
common in the published stores) is skipped and counted, not refused: the stage says how many in its summary.
`read_store` holds a whole store in memory: for small stores and as the tests' reference only.
"""
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple, Union

from debate.data.claims import kind_of, line_problem
from debate.data.inputs import DataError

SUFFIX = ".json"
EXAMPLE_CHARS = 1500  # HerO cuts each few-shot example to this many characters
NO_ANSWER = "No answer could be found."
BOM = b"\xef\xbb\xbf"


class StoreError(DataError):
    """A store file the retrieval cannot read; the message names the file, the line and the field or byte."""


@dataclass
class Page:
    number: int  # line number in the file, from 1
    offset: int  # byte offset of the line in the file
    url: str
    sentences: List[str]  # stripped, spaces collapsed; "" where the page had only spaces


@dataclass
class StoreInfo:
    """What check_store found in one file."""
    path: Path
    bytes: int = 0
    lines: int = 0  # lines read (pages, empty ones included; blank lines not counted)
    sentences: int = 0  # non-empty sentences, duplicates included
    empty_pages: int = 0  # pages without a sentence


def store_file(directory: Union[str, os.PathLike], claim_id: Any) -> Path:
    """Where the store of `claim_id` lives in `directory`."""
    return Path(directory) / f"{claim_id}{SUFFIX}"


def check_directory(directory: Union[str, os.PathLike], claim_ids: Sequence[Any], missing: str = "error") -> List[Any]:
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


def _open(path: Union[str, os.PathLike]) -> BinaryIO:
    try:
        return open(path, "rb")
    except OSError as e:
        raise StoreError(f"{path}: cannot read the store file ({e.strerror})") from None


def _decode(path: Union[str, os.PathLike], number: int, offset: int, raw: bytes) -> str:
    """One line's text: decoded on its own, so an undecodable byte is named on its line, at its offset."""
    if number == 1 and raw.startswith(BOM):
        raw, offset = raw[len(BOM):], offset + len(BOM)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise StoreError(f"{path}: line {number}: not UTF-8 text (byte 0x{raw[e.start]:02x} at byte {e.start + 1} of "
                         f"the line, offset {offset + e.start} of the file: {e.reason})") from None


def pages(path: Union[str, os.PathLike], digest: Any = None) -> Iterator[Page]:
    """Every page of a store file, in order (blank lines skipped), one line in memory at a time; `digest` (a
    hashlib object) is fed every byte of the file. A bad line is one StoreError naming the file, line and field."""
    path = Path(path)
    offset = 0
    with _open(path) as f:
        for number, raw in enumerate(f, start=1):
            if digest is not None:
                digest.update(raw)
            at, offset = offset, offset + len(raw)
            text = _decode(path, number, at, raw)
            if text.strip():
                url, sentences = _page(path, number, text)
                yield Page(number, at, url, sentences)


def page_at(path: Union[str, os.PathLike], offset: int, number: int) -> Page:
    """The page on line `number`, read back at its byte `offset` (as `pages` gave it)."""
    with _open(path) as f:
        f.seek(offset)
        raw = f.readline()
    return Page(number, offset, *_page(path, number, _decode(path, number, offset, raw)))


def check_store(path: Union[str, os.PathLike]) -> StoreInfo:
    """StoreInfo of a store file, every line parsed and its fields checked; a bad line is one StoreError."""
    info = StoreInfo(Path(path))
    for page in pages(path):
        info.lines += 1
        n = sum(1 for s in page.sentences if s)
        info.sentences += n
        info.empty_pages += not n
    try:
        info.bytes = Path(path).stat().st_size
    except OSError:
        pass
    return info


def first_sentences(path: Union[str, os.PathLike], n: int) -> List[str]:
    """The first `n` non-empty sentences of a store file (fewer if it holds fewer), reading only as far as they are:
    whether a store is empty, or a sample of its sentences, without a pass over all of it."""
    found: List[str] = []
    for page in pages(path):
        found += [s for s in page.sentences if s][:n - len(found)]
        if len(found) >= n:
            break
    return found


def _page(path: Union[str, os.PathLike], number: int, line: str) -> Tuple[str, List[str]]:
    where = f"{path}: line {number}"
    line = line.rstrip("\r\n")  # a column counted from the line's own start, never from after its break
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise StoreError(f"{where}: not valid JSON ({line_problem(e)})") from None
    if not isinstance(row, dict):
        raise StoreError(f"{where}: expected a JSON object (a page with url and url2text), got {kind_of(row)}")
    if "url2text" not in row:
        raise StoreError(f"{where}: missing field 'url2text' (the page's sentences)")
    sentences = row["url2text"]
    if not isinstance(sentences, list):
        raise StoreError(f"{where}: field 'url2text': expected a list of strings, got {kind_of(sentences)}")
    for i, s in enumerate(sentences):
        if not isinstance(s, str):
            raise StoreError(f"{where}: field 'url2text': url2text[{i}] is {kind_of(s)}, expected a string")
    url = row.get("url")
    if url is not None and not isinstance(url, str):
        raise StoreError(f"{where}: field 'url': expected a string, got {kind_of(url)}")
    return url or "", [" ".join(s.split()) for s in sentences]


# ---------------------------------------------------------------- a whole store in memory (small stores, tests)


@dataclass
class Store:
    """One claim's store held whole: its distinct sentences with their page's url, and the pages."""
    path: Path
    texts: List[str]  # distinct sentences, in store order
    urls: List[str]  # the url of each text's page (the first page it appeared on)
    where: List[Tuple[int, int]]  # (page number, position in the page) of each text
    pages: List[List[str]] = field(default_factory=list)  # every page's sentences (stripped), in store order
    lines: int = 0  # pages read (empty ones included)
    empty_pages: List[int] = field(default_factory=list)  # line numbers of pages without a sentence

    def with_context(self, i: int, window: int) -> str:
        """Text i with `window` sentences of its page before and after it, joined by spaces (0: the text alone)."""
        if window <= 0:
            return self.texts[i]
        page, at = self.where[i]
        return context(self.pages[page], at, window)


def context(sentences: Sequence[str], at: int, window: int) -> str:
    """Sentence `at` of a page with `window` sentences before and after it, joined by spaces."""
    return " ".join(s for s in sentences[max(0, at - window):at + window + 1] if s)


def read_store(path: Union[str, os.PathLike]) -> Store:
    """The whole Store of one claim's file (memory grows with the store: small stores and tests only)."""
    texts: List[str]
    urls: List[str]
    where: List[Tuple[int, int]]
    kept: List[List[str]]
    empty: List[int]
    seen: Set[str]
    texts, urls, where, kept, empty, seen = [], [], [], [], [], set()
    for page in pages(path):
        number = len(kept)
        kept.append(page.sentences)
        if not any(page.sentences):
            empty.append(page.number)
        for at, text in enumerate(page.sentences):
            key = text.lower()
            if text and key not in seen:
                seen.add(key)
                texts.append(text)
                urls.append(page.url)
                where.append((number, at))
    return Store(Path(path), texts, urls, where, kept, len(kept), empty)


# ---------------------------------------------------------------- few-shot examples


def qa_examples(claims: Iterable[Dict[str, Any]], split: Optional[str] = None) -> List[Dict[str, Any]]:
    """HerO's few-shot pool from labelled claims' golden question-answer pairs: one example per answer, each
    {"split", "claim_id" (together they name the claim: AVeriTeC's ids restart in every split), "lookup" (the
    answer: what BM25 matches a retrieved sentence against), "text" (claim, answer as evidence, question; cut to
    EXAMPLE_CHARS)}. A Boolean answer reads "Yes, because <explanation in lower case>", as HerO writes it.
    Unanswered questions and passage evidence give none."""
    pool: List[Dict[str, Any]] = []
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
