"""JSON Lines files, read and written through the jsonlines package (the design card's), one way for all.

Lines are split on "\\n" only: a JSON string may hold U+2028 or U+0085 as written (ensure_ascii=False),
which str.splitlines() would take for line ends. What each caller adds stays with it: a run's durable
appends and torn-line repair (debate/pipeline/records.py), the error messages naming file, line and field.
"""
import functools
import io
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, List, Tuple, Union

import jsonlines

# UTF-8 as written and json's default separators, as the toolkit's files have always been written.
_dumps = functools.partial(json.dumps, ensure_ascii=False)


class BadLine(ValueError):
    """A line that is not JSON: `lineno` (from 1) and `error`, the json.JSONDecodeError."""

    def __init__(self, lineno, error):
        super().__init__(f"line {lineno}: {error}")
        self.lineno, self.error = lineno, error


def numbered(lines: Union[str, Iterable[str]]) -> Iterator[Tuple[int, Any]]:
    """(line number, value) for each non-blank line of `lines`: an open text file, a str (split on "\\n"
    only) or any iterable of lines. A `null` line gives None (the caller says what it expected); a line
    that is not JSON raises BadLine."""
    if isinstance(lines, str):
        lines = io.StringIO(lines, newline="\n")
    count = 0

    def counted():  # jsonlines' Reader keeps its line number to itself; the callers need it for every value
        nonlocal count
        for count, line in enumerate(lines, 1):
            # Without its break, so that json's column of a fault at the end of the line is on the line itself
            # (an unclosed brace), not column 1 of the next.
            yield line.rstrip("\r\n")

    reader = jsonlines.Reader(counted(), loads=json.loads)
    while True:
        try:
            value = reader.read(allow_none=True, skip_empty=True)
        except EOFError:
            return
        except jsonlines.InvalidLineError as err:
            raise BadLine(err.lineno, err.__cause__) from None
        yield count, value


def read(path: Union[str, os.PathLike]) -> List[Any]:
    """Every value of the JSONL file `path`, in order (see numbered)."""
    with open(path, encoding="utf-8", newline="\n") as f:
        return [value for _, value in numbered(f)]


def writer(f: Any) -> jsonlines.Writer:
    """A jsonlines Writer on the open text file `f` (left open when the writer is closed)."""
    return jsonlines.Writer(f, dumps=_dumps)


def append_durably(f: Any, rows: Iterable[Any]) -> None:
    """Write `rows` to the open file `f` and make them durable (flush, fsync) before returning: after a
    crash a row is either whole on disk or at most a torn last line, which the reader cuts off."""
    writer(f).write_all(rows)
    f.flush()
    os.fsync(f.fileno())


def write(path: Union[str, os.PathLike], rows: Iterable[Any]) -> None:
    """Write the file atomically (a temporary file, then renamed): a reader never sees half of it."""
    write_atomically(path, lambda f: writer(f).write_all(rows))


def write_atomically(path: Union[str, os.PathLike], fill: Callable[[Any], Any]) -> None:
    """`fill(f)` writes a temporary text file beside `path`, then it is renamed over `path`: a reader sees the
    old file or the new one whole, never half of one."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            fill(f)
    except OSError as err:  # a full disk: the file before stays whole, and no half-written copy takes room
        tmp.unlink(missing_ok=True)
        err.filename = err.filename or str(path)
        raise
    os.replace(tmp, path)
