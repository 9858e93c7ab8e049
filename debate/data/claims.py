"""Claims and evidence: load an AVeriTeC-shaped split and pick the evidence condition.

A claim record is a plain dict:

    {"claim_id": int | str,
     "claim": str,
     "label": str | None,            # one of labels.LABELS; None only for an unlabelled test split
     "justification": str | None,
     "evidence": [{"question": str, "answer": str, "url": str}, ...],       # what the agents see
     "gold_evidence": [{"question": str, "answer": str, "url": str}, ...],  # the annotators' QA pairs
     "questions": [...]}  # the split's own question-answer entries, kept for the scorer

`load_split` fills `evidence` with the golden evidence; `attach_evidence` swaps it for the chosen
condition (golden, retrieved, none). Every problem in an input file raises `DataError`, whose message
names the file, the entry (index, line or claim_id) and the field.
"""
import json
import os
from pathlib import Path

from debate.data import jsonl
from debate.data.inputs import DataError, check_unique_ids, read_text
from debate.data.labels import LABELS, canonical_label

DEMO_SPLIT = "demo"
DEMO_FILE = Path(__file__).resolve().parent / "demo" / "claims.json"
DEFAULT_DATA_DIR = "data/averitec"
CONDITIONS = ("golden", "retrieved", "none")
NO_ANSWER = "No answer could be found."


def json_problem(error):
    """A json.JSONDecodeError as words: "Expecting value at column 3", "Unterminated string starting at column 7"."""
    return f"{error.msg}{'' if error.msg.endswith(' at') else ' at'} column {error.colno}"


def resolve_data_dir(arg=None):
    """The data folder: `arg` if given, else $DEBATECV_DATA, else data/averitec."""
    return Path(arg or os.environ.get("DEBATECV_DATA") or DEFAULT_DATA_DIR)


def retrieved_path(split, data_dir=None):
    """Where the retrieved evidence of `split` lives by default; None for the demo set, which has none."""
    if split == DEMO_SPLIT:
        return None
    return resolve_data_dir(data_dir) / f"{split}.retrieved.hero.jsonl"


def load_split(split, data_dir=None):
    """Read `<data_dir>/<split>.json` (AVeriTeC format) into claim records.

    split "demo" reads the small invented set shipped inside the package, whatever data_dir says.
    Splits whose name starts with "test" may lack labels and questions (label None, no gold evidence).
    """
    if split == DEMO_SPLIT:
        path = DEMO_FILE
    else:
        path = resolve_data_dir(data_dir) / f"{split}.json"
        if not path.is_file():
            raise DataError(
                f"{path}: no such split file (looked in {path.parent.resolve()}). AVeriTeC is not "
                f"shipped with debatecv: download it yourself and point --data-dir (or $DEBATECV_DATA) "
                f"at the folder holding {split}.json, or try --split demo.")
    entries = _read_json(path)
    if not isinstance(entries, list):
        raise DataError(f"{path}: top level: expected a JSON list of claims, got {_kind(entries)}")
    labelled = not split.startswith("test")
    claims = [_claim_record(path, i, entry, labelled) for i, entry in enumerate(entries)]
    check_unique_ids(path, [(f"entry {i} (claim_id {c['claim_id']})", c["claim_id"]) for i, c in enumerate(claims)])
    return claims


def attach_evidence(claims, condition, retrieved_file=None):
    """Return copies of `claims` whose `evidence` follows `condition` (golden | retrieved | none).

    golden: the annotators' QA pairs; none: an empty set; retrieved: the items of `retrieved_file`
    (JSON list or JSONL, one object per claim: {"claim_id", "evidence": [{question, answer, url}]},
    as HerO writes it). With retrieved and no file (the demo set, for which no retrieval exists) the
    golden evidence stands in; use `retrieved_path` to get the file for a real split.
    """
    if condition not in CONDITIONS:
        raise DataError(f"unknown evidence condition {condition!r}; expected one of {', '.join(CONDITIONS)}")
    if condition == "golden" or (condition == "retrieved" and retrieved_file is None):
        return [dict(c, evidence=list(c["gold_evidence"])) for c in claims]
    if condition == "none":
        return [dict(c, evidence=[]) for c in claims]

    by_id = load_retrieved(retrieved_file)
    missing = [c["claim_id"] for c in claims if str(c["claim_id"]) not in by_id]
    if missing:
        shown = ", ".join(str(i) for i in missing[:5])
        raise DataError(f"{retrieved_file}: field 'claim_id': {len(missing)} of {len(claims)} claims have "
                        f"no retrieved evidence (first: {shown})")
    return [dict(c, evidence=by_id[str(c["claim_id"])]) for c in claims]


def load_retrieved(path):
    """Read a retrieved-evidence file into {str(claim_id): [evidence items]}.

    Ids are compared as strings so that 7 in one file matches "7" in another.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such retrieved-evidence file")
    text = read_text(path)
    if text.lstrip().startswith("["):
        rows = _read_json(path, text)
        if not isinstance(rows, list):
            raise DataError(f"{path}: top level: expected a JSON list, got {_kind(rows)}")
        rows = [(f"entry {i}", row) for i, row in enumerate(rows)]
    else:
        try:
            rows = [(f"line {n}", row) for n, row in jsonl.numbered(text)]
        except jsonl.BadLine as e:
            raise DataError(f"{path}: line {e.lineno}: not valid JSON ({json_problem(e.error)})") from None

    by_id, seen_at = {}, {}
    for where, row in rows:
        if not isinstance(row, dict):
            raise DataError(f"{path}: {where}: expected a JSON object, got {_kind(row)}")
        if "claim_id" not in row:
            raise DataError(f"{path}: {where}: missing field 'claim_id'")
        key = str(row["claim_id"])
        where = f"{where} (claim_id {key})"
        if key in by_id:
            raise DataError(f"{path}: {where}: field 'claim_id': duplicate, first seen at {seen_at[key]}")
        by_id[key], seen_at[key] = _evidence_items(path, where, row), where
    return by_id


def _evidence_items(path, where, row):
    items = _required(path, where, row, "evidence", list)
    out = []
    for j, item in enumerate(items):
        field = f"evidence[{j}]"
        _expect(path, where, field, item, dict)
        for key in ("question", "answer", "url"):
            _required(path, where, item, key, str, prefix=f"{field}.")
        out.append({"question": item["question"], "answer": item["answer"], "url": item["url"]})
    return out


def _claim_record(path, index, entry, labelled):
    where = f"entry {index}"
    if not isinstance(entry, dict):
        raise DataError(f"{path}: {where}: expected a JSON object for the claim, got {_kind(entry)}")
    claim_id = entry.get("claim_id", index)
    if "claim_id" in entry:
        where = f"entry {index} (claim_id {claim_id})"
        _expect(path, where, "claim_id", claim_id, (int, str))

    claim = _required(path, where, entry, "claim", str)
    if not claim.strip():
        raise DataError(f"{path}: {where}: field 'claim': empty")

    label = entry.get("label")
    if label is None:
        if labelled:
            raise DataError(f"{path}: {where}: missing field 'label' (only test splits may be unlabelled)")
    else:
        _expect(path, where, "label", label, str)
        if canonical_label(label) is None:
            raise DataError(f"{path}: {where}: field 'label': unknown label {label!r} "
                            f"(expected one of: {', '.join(LABELS)})")
        label = canonical_label(label)

    justification = entry.get("justification")
    if justification is not None:
        _expect(path, where, "justification", justification, str)

    if "questions" in entry:
        gold = _gold_evidence(path, where, entry["questions"])
    elif labelled:
        raise DataError(f"{path}: {where}: missing field 'questions'")
    else:
        gold = []
    return {"claim_id": claim_id, "claim": claim, "label": label, "justification": justification,
            "evidence": list(gold), "gold_evidence": gold, "questions": entry.get("questions") or []}


def _gold_evidence(path, where, questions):
    """One evidence item per answer; a question nobody could answer still counts, as AVeriTeC scores it."""
    _expect(path, where, "questions", questions, list)
    items = []
    for q, qa in enumerate(questions):
        field = f"questions[{q}]"
        _expect(path, where, field, qa, dict)
        question = _required(path, where, qa, "question", str, prefix=f"{field}.")
        answers = _expect(path, where, f"{field}.answers", qa.get("answers") or [], list)
        if not answers:
            items.append({"question": question, "answer": NO_ANSWER, "url": ""})
        for a, ans in enumerate(answers):
            afield = f"{field}.answers[{a}]"
            _expect(path, where, afield, ans, dict)
            text = _required(path, where, ans, "answer", str, prefix=f"{afield}.")
            explanation = ans.get("boolean_explanation")
            if ans.get("answer_type") == "Boolean" and explanation:
                text = f"{text}. {_expect(path, where, f'{afield}.boolean_explanation', explanation, str)}"
            url = _expect(path, where, f"{afield}.source_url", ans.get("source_url") or "", str)
            items.append({"question": question, "answer": text, "url": url})
    return items


def _read_json(path, text=None):
    try:
        return json.loads(read_text(path) if text is None else text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: line {e.lineno}: not valid JSON ({json_problem(e)})") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _expect(path, where, field, value, types):
    # bool is an int subclass; an id or count of True is never what the file meant
    if isinstance(value, bool) or not isinstance(value, types):
        names = " or ".join(_type_name(t) for t in (types if isinstance(types, tuple) else (types,)))
        raise DataError(f"{path}: {where}: field '{field}': expected {names}, got {_kind(value)}")
    return value


def _required(path, where, obj, key, types, prefix=""):
    """obj[key], which must be there and of `types`; errors name the field as prefix + key."""
    if key not in obj:
        raise DataError(f"{path}: {where}: missing field '{prefix}{key}'")
    return _expect(path, where, prefix + key, obj[key], types)


def _type_name(t):
    return {dict: "a JSON object", list: "a JSON list", str: "a string", int: "an integer"}.get(t, t.__name__)


def _kind(value):
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def as_references(claims):
    """Claims as the scorer's references: the annotators' own `questions`, exactly as the split has them,
    and their gold `justification` (None where the split has none)."""
    return [{"claim_id": c["claim_id"], "claim": c["claim"], "label": c["label"], "questions": c["questions"],
             "justification": c.get("justification")} for c in claims]
