"""What every reader of a user's file shares: the error it raises, the file's text, and unique claim ids.

Every dataset reader (a split, retrieved evidence, a corpus, prompt files, SynDeC files, predictions) reads
a file a user gives through `read_text` or `open_text`: UTF-8, with a leading byte-order mark (U+FEFF, as
spreadsheet and Windows tools write it) dropped, where json and jsonlines would take it for a stray
character. A reader that gives claims ids calls `check_unique_ids`: resume, the scorer and retrieved
evidence key on the id, so two claims under one id would silently become one.
"""
import os
from pathlib import Path
from typing import Any, Dict, Iterable, TextIO, Tuple, Union


class DataError(ValueError):
    """A split or evidence file that cannot be used as it is; the message names the file, entry and field."""


def read_text(path: Union[str, os.PathLike]) -> str:
    """The whole text of the UTF-8 file `path`, without a leading byte-order mark (universal newlines, as
    Path.read_text). A file that is not UTF-8 raises UnicodeDecodeError, as read_text does."""
    return Path(path).read_text(encoding="utf-8-sig")


def open_text(path: Union[str, os.PathLike]) -> TextIO:
    """`path` open for reading line by line, without a leading byte-order mark; lines end at "\\n" only, as
    debate.data.jsonl reads them."""
    return open(path, encoding="utf-8-sig", newline="\n")


def check_unique_ids(path: Union[str, os.PathLike], located: Iterable[Tuple[str, Any]],
                     field: str = "claim_id") -> None:
    """Refuse a claim id given twice. `located` is [(where, id)] in file order, `where` as the reader's
    messages name an entry ("entry 3 (claim_id 17)", "line 4"). Ids are compared as strings, as retrieved
    evidence and the scorer take them (7 and "7" are one claim). Raises DataError naming both entries."""
    first: Dict[str, str] = {}  # id -> where it was first
    for where, value in located:
        key = str(value)
        if key in first:
            raise DataError(f"{path}: {where}: field '{field}': {value!r} is already the id of {first[key]}; "
                            "every claim needs its own id (resume and the scorer key on it)")
        first[key] = where
