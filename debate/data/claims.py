"""Claim records, whatever the dataset: their shape, the evidence conditions, and the checks every reader uses.

A claim record is a plain dict, made by a dataset's reader (debate.data.datasets):

    {"claim_id": int | str,
     "claim": str,
     "label": str | None,           # one of the dataset's labels; None only for an unlabelled split
     "justification": str | None,   # the gold justification, where the dataset has one (AVeriTeC)
     "evidence": [item, ...],       # what the agents see, under the run's evidence condition
     "gold_evidence": [item, ...],  # the annotated evidence
     "evidence_shape": "qa" | "passages",
     "evidence_sets": {condition: [item, ...]},  # a dataset's own further conditions (PolitiHop's ruling)
     "questions": [...]}            # AVeriTeC only: the split's question-answer entries, for its scorer

An evidence item is a question-answer pair {"question", "answer", "url"} (AVeriTeC) or a passage {"text", "url"}
(an abstract's or a ruling's sentence). `attach_evidence` sets `evidence` for the chosen condition. Every
problem in an input file raises `DataError`, whose message names the file, the entry (index, line or
claim_id) and the field.
"""
import difflib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Tuple, Union

from debate.data import inputs, jsonl
from debate.data.inputs import DataError

if TYPE_CHECKING:
    from debate.data.labels import LabelSet

CONDITIONS = ("golden", "retrieved", "none")
PathArg = Union[str, os.PathLike]  # a file, as a message names it
Types = Union[type, Tuple[type, ...]]  # what isinstance takes


def json_problem(error: json.JSONDecodeError) -> str:
    """A json.JSONDecodeError as words: "Expecting value at column 3", "Unterminated string starting at column 7"."""
    return f"{error.msg}{'' if error.msg.endswith(' at') else ' at'} column {error.colno}"


def line_problem(error: json.JSONDecodeError) -> str:
    """json_problem of one line's error (the line without its break), saying so when the fault is at its end: a
    bracket or string never closed, a line cut short."""
    end = not error.doc[error.pos:].strip()
    return json_problem(error) + (" (the end of the line: is it cut short?)" if end else "")


def read_text(path: Union[str, Path]) -> str:
    """A text file's contents without a leading byte-order mark (debate.data.inputs); a file that is not UTF-8
    is one DataError naming it."""
    try:
        return inputs.read_text(path)
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_json(path: Union[str, Path], text: Optional[str] = None) -> Any:
    """A JSON file's value; a syntax error names the file and its line."""
    try:
        return json.loads(read_text(path) if text is None else text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: line {e.lineno}: not valid JSON ({json_problem(e)})") from None


def read_jsonl(path: Union[str, Path]) -> List[Tuple[str, dict]]:
    """("line n", object) for every line of a JSON Lines file; a bad line names the file and its number."""
    try:
        rows = [(f"line {n}", row) for n, row in jsonl.numbered(read_text(path))]
    except jsonl.BadLine as e:
        raise DataError(f"{path}: line {e.lineno}: not valid JSON ({line_problem(e.error)})") from None
    for where, row in rows:
        if not isinstance(row, dict):
            raise DataError(f"{path}: {where}: expected a JSON object, got {kind_of(row)}")
    return rows


def read_records(path: Union[str, Path]) -> List[Tuple[str, dict]]:
    """("entry i" | "line n", object) of a file holding a JSON list or JSON Lines of objects."""
    text = read_text(path)
    if not text.lstrip().startswith("["):
        return read_jsonl(path)
    rows = read_json(path, text)
    located = [(f"entry {i}", row) for i, row in enumerate(rows)]
    for where, row in located:
        if not isinstance(row, dict):
            raise DataError(f"{path}: {where}: expected a JSON object, got {kind_of(row)}")
    return located


def expect(path: PathArg, where: str, field: str, value: Any, types: Types) -> Any:
    """`value` if it is of `types`, else a DataError naming the file, the entry and the field."""
    # bool is an int subclass; an id or count of True is never what the file meant
    if isinstance(value, bool) or not isinstance(value, types):
        names = " or ".join(_type_name(t) for t in (types if isinstance(types, tuple) else (types,)))
        raise DataError(f"{path}: {where}: field '{field}': expected {names}, got {kind_of(value)}")
    return value


def required(path: PathArg, where: str, obj: Dict[str, Any], key: str, types: Types, prefix: str = "") -> Any:
    """obj[key], which must be there and of `types`; errors name the field as prefix + key."""
    if key not in obj:
        raise DataError(f"{path}: {where}: missing field '{prefix}{key}'{misspelled(obj, key, prefix)}")
    return expect(path, where, prefix + key, obj[key], types)


def misspelled(obj: Dict[str, Any], key: str, prefix: str = "") -> str:
    """"; it has 'cliam': did you mean 'claim'?" where a key of `obj` is close to the missing `key` (a typo in the
    file); else "". The file's other keys are not known to be wrong, so only the nearest one is named."""
    # A typo keeps about the key's length; a longer name that contains it ('claim_id' for 'claim') is another field.
    typos = [k for k in obj if isinstance(k, str) and abs(len(k) - len(key)) <= 2 and key not in k]
    near = difflib.get_close_matches(key, typos, n=1, cutoff=0.7)
    return f"; it has '{prefix}{near[0]}': did you mean '{prefix}{key}'?" if near else ""


def split_file(path: PathArg, dataset: str, source: str, holding: Optional[str] = None) -> Path:
    """`path` when it is there; else a DataError saying the dataset is not shipped and where to get it."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such split file. {dataset} is not shipped with debatecv: get it from {source} "
                        f"and point --data-dir at the folder holding {holding or path.name}")
    return path


def claim_fields(path: PathArg, where: str, row: Dict[str, Any], labels: "LabelSet",
                 id_field: str = "id") -> Tuple[Union[str, int], str, str, str]:
    """(claim_id, where, claim, label) of a row with an id, a non-empty claim and one of `labels`; `where` then
    names the id, as every later error of the row does."""
    claim_id = required(path, where, row, id_field, (str, int))
    where = f"{where} ({id_field} {claim_id})"
    claim = required(path, where, row, "claim", str).strip()
    if not claim:
        raise DataError(f"{path}: {where}: field 'claim': empty")
    return claim_id, where, claim, check_label(path, where, required(path, where, row, "label", str), labels)


def _type_name(t: type) -> str:
    return {dict: "a JSON object", list: "a JSON list", str: "a string", int: "an integer"}.get(t, t.__name__)


def kind_of(value: Any) -> str:
    """What a JSON value is, in words ("a list", "null")."""
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def check_label(path: PathArg, where: str, value: Any, labels: "LabelSet", field: str = "label") -> str:
    """The dataset's spelling of a gold label (`labels`: its LabelSet); one not in the set is refused."""
    expect(path, where, field, value, str)
    label = labels.canonical(value)
    if label is None:
        raise DataError(f"{path}: {where}: field '{field}': unknown label {value!r} "
                        f"(expected one of: {', '.join(labels.labels)})")
    return label


def evidence_text(item: Dict[str, Any]) -> str:
    """An evidence item as one text: a passage's text, a question-answer pair's "question answer"."""
    return item["text"] if "text" in item and "question" not in item else f"{item['question']} {item['answer']}".strip()


def record(claim_id: Any, claim: str, label: Optional[str], gold_evidence: List[Dict[str, Any]], shape: str,
           justification: Optional[str] = None, **extra: Any) -> Dict[str, Any]:
    """A claim record (see the module doc), its evidence the golden one until a condition is attached."""
    return {"claim_id": claim_id, "claim": claim, "label": label, "justification": justification,
            "evidence": list(gold_evidence), "gold_evidence": gold_evidence, "evidence_shape": shape, **extra}


def attach_evidence(claims: List[dict], condition: str, retrieved_file: Union[str, Path, None] = None) -> List[dict]:
    """Copies of `claims` whose `evidence` follows `condition`.

    golden: the annotated evidence; none: an empty set; retrieved: the items of `retrieved_file` (see
    `load_retrieved`), which must cover every claim; with no file (the demo set, for which no retrieval exists)
    the golden evidence stands in. Any other condition is one of the dataset's own: the claim's
    `evidence_sets[condition]` (PolitiHop's whole ruling).
    """
    if condition == "golden" or (condition == "retrieved" and retrieved_file is None):
        return [dict(c, evidence=list(c["gold_evidence"])) for c in claims]
    if condition == "none":
        return [dict(c, evidence=[]) for c in claims]
    if condition == "retrieved" and retrieved_file is not None:
        by_id = load_retrieved(retrieved_file)
        missing = [c["claim_id"] for c in claims if str(c["claim_id"]) not in by_id]
        if missing:
            shown = ", ".join(str(i) for i in missing[:5])
            raise DataError(f"{retrieved_file}: field 'claim_id': {len(missing)} of {len(claims)} claims have "
                            f"no retrieved evidence (first: {shown})")
        return [dict(c, evidence=by_id[str(c["claim_id"])]) for c in claims]
    if not claims or condition in claims[0].get("evidence_sets", {}):
        return [dict(c, evidence=list(c["evidence_sets"][condition])) for c in claims]
    raise DataError(f"unknown evidence condition {condition!r}; expected one of {', '.join(CONDITIONS)}"
                    + "".join(f" or {name}" for name in (claims[0].get("evidence_sets") or {})))


def load_retrieved(path: Union[str, Path]) -> Dict[str, List[dict]]:
    """Read a retrieved-evidence file into {str(claim_id): [evidence items]}.

    JSON list or JSONL, one object per claim: {"claim_id", "evidence": [items]}, as HerO writes it; items are
    question-answer pairs {question, answer, url} or passages {text, url (optional)}. Ids are compared as strings so
    that
    7 in one file matches "7" in another.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such retrieved-evidence file")
    by_id: Dict[str, List[dict]] = {}
    seen_at: Dict[str, str] = {}
    for where, row in read_records(path):
        if "claim_id" not in row:
            raise DataError(f"{path}: {where}: missing field 'claim_id'")
        key = str(row["claim_id"])
        where = f"{where} (claim_id {key})"
        if key in by_id:
            raise DataError(f"{path}: {where}: field 'claim_id': duplicate, first seen at {seen_at[key]}")
        by_id[key], seen_at[key] = evidence_items(path, where, required(path, where, row, "evidence", list)), where
    return by_id


def evidence_items(path: PathArg, where: str, items: Iterable[Any], field: str = "evidence") -> List[Dict[str, str]]:
    """Checked evidence items of a file: question-answer pairs or passages (see the module doc)."""
    out: List[Dict[str, str]] = []
    for j, item in enumerate(items):
        name = f"{field}[{j}]"
        expect(path, where, name, item, dict)
        if "question" in item or "text" not in item:
            for key in ("question", "answer", "url"):
                if key not in item:
                    raise DataError(f"{path}: {where}: {item_problem(item, name)}")
                required(path, where, item, key, str, prefix=f"{name}.")
            out.append({"question": item["question"], "answer": item["answer"], "url": item["url"]})
        else:
            out.append({"text": required(path, where, item, "text", str, prefix=f"{name}."),
                        "url": expect(path, where, f"{name}.url", item.get("url") or "", str)})
    return out


ITEM_FIELDS = ("question", "answer", "url", "text")  # a pair's three, a passage's text and optional url
ITEM_SHAPES = "a question-answer pair {question, answer, url} or a passage {text, url}"


def item_problem(item: Dict[str, Any], name: str, needed: Tuple[str, ...] = ("question", "answer", "url")) -> str:
    """What is wrong with evidence item `name`, a dict of neither shape, in words: its unknown fields (a misspelled
    `text` is named as written) with the fields each shape takes, else the field a pair lacks (`needed`: a pair's
    fields that must be there), else the field whose value is not a string."""
    unknown = [key for key in item if key not in ITEM_FIELDS]
    if unknown:
        return (f"field '{name}': unknown field{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(repr(k) for k in unknown)}; an evidence item is {ITEM_SHAPES}")
    shape = needed if "question" in item or "text" not in item else ("text",)
    absent = next((key for key in shape if key not in item), None)
    if absent:
        return f"missing field '{name}.{absent}' (an evidence item is {ITEM_SHAPES})"
    wrong = next(key for key in shape if not isinstance(item[key], str))
    return f"field '{name}.{wrong}': expected a string, got {kind_of(item[wrong])}"


def item_shape(item: Any) -> Optional[str]:
    """"qa" for a question-answer pair ({"question", "answer"} strings), "passage" for a passage ({"text"}
    string), None for anything else: the one test of an evidence item given in memory or a SynDeC file."""
    if not isinstance(item, dict):
        return None
    if all(isinstance(item.get(key), str) for key in ("question", "answer")):
        return "qa"
    return "passage" if isinstance(item.get("text"), str) else None


def as_references(claims: Iterable[dict]) -> List[dict]:
    """Claims as the scorer's references: id, claim, gold label and justification, and AVeriTeC's own
    `questions` exactly as the split has them (the evidence score's gold side), where there are any."""
    return [{"claim_id": c["claim_id"], "claim": c["claim"], "label": c["label"], "questions": c.get("questions") or [],
             "justification": c.get("justification")} for c in claims]
