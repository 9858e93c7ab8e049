"""AVeriTeC (Schlichtkrull et al. 2023), DebateCV's benchmark: real-world claims with four labels and
question-answer evidence written by annotators.

DATA_DIR/<split>.json is the published split (a JSON list of claims with `label`, `justification` and
`questions`: each question with its answers), DATA_DIR/<split>.retrieved.hero.jsonl the evidence HerO
retrieved for it (the retrieved condition). Split "demo" is the small invented set shipped in the package.
"""
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from debate.data.claims import check_label, expect, kind_of, read_json, record, required
from debate.data.inputs import DataError, check_unique_ids
from debate.data.labels import AVERITEC

DEMO_SPLIT = "demo"
DEMO_FILE = Path(__file__).resolve().parent / "demo" / "claims.json"
DEFAULT_DATA_DIR = "data/averitec"
NO_ANSWER = "No answer could be found."


def resolve_data_dir(arg: Optional[Union[str, os.PathLike]] = None) -> Path:
    """The data folder: `arg` if given, else $DEBATECV_DATA, else data/averitec."""
    return Path(arg or os.environ.get("DEBATECV_DATA") or DEFAULT_DATA_DIR)


def retrieved_path(split: str, data_dir: Optional[Union[str, os.PathLike]] = None) -> Optional[Path]:
    """Where the retrieved evidence of `split` lives by default; None for the demo set, which has none."""
    if split == DEMO_SPLIT:
        return None
    return resolve_data_dir(data_dir) / f"{split}.retrieved.hero.jsonl"


def load_split(split: str, data_dir: Optional[Union[str, os.PathLike]] = None) -> List[Dict[str, Any]]:
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
    entries = read_json(path)
    if not isinstance(entries, list):
        raise DataError(f"{path}: top level: expected a JSON list of claims, got {kind_of(entries)}")
    labelled = not split.startswith("test")
    claims = [_claim_record(path, i, entry, labelled) for i, entry in enumerate(entries)]
    check_unique_ids(path, [(f"entry {i} (claim_id {c['claim_id']})", c["claim_id"]) for i, c in enumerate(claims)])
    return claims


def _claim_record(path: Path, index: int, entry: Any, labelled: bool) -> Dict[str, Any]:
    where = f"entry {index}"
    if not isinstance(entry, dict):
        raise DataError(f"{path}: {where}: expected a JSON object for the claim, got {kind_of(entry)}")
    claim_id = entry.get("claim_id", index)
    if "claim_id" in entry:
        where = f"entry {index} (claim_id {claim_id})"
        expect(path, where, "claim_id", claim_id, (int, str))

    claim = required(path, where, entry, "claim", str)
    if not claim.strip():
        raise DataError(f"{path}: {where}: field 'claim': empty")

    label = entry.get("label")
    if label is None:
        if labelled:
            raise DataError(f"{path}: {where}: missing field 'label' (only test splits may be unlabelled)")
    else:
        label = check_label(path, where, label, AVERITEC)

    justification = entry.get("justification")
    if justification is not None:
        expect(path, where, "justification", justification, str)

    if "questions" in entry:
        gold = _gold_evidence(path, where, entry["questions"])
    elif labelled:
        raise DataError(f"{path}: {where}: missing field 'questions'")
    else:
        gold = []
    return record(claim_id, claim, label, gold, "qa", justification, questions=entry.get("questions") or [])


def _gold_evidence(path: Path, where: str, questions: Any) -> List[Dict[str, Any]]:
    """One evidence item per answer; a question nobody could answer still counts, as AVeriTeC scores it."""
    expect(path, where, "questions", questions, list)
    items: List[Dict[str, Any]] = []
    for q, qa in enumerate(questions):
        field = f"questions[{q}]"
        expect(path, where, field, qa, dict)
        question = required(path, where, qa, "question", str, prefix=f"{field}.")
        answers = expect(path, where, f"{field}.answers", qa.get("answers") or [], list)
        if not answers:
            items.append({"question": question, "answer": NO_ANSWER, "url": ""})
        for a, ans in enumerate(answers):
            afield = f"{field}.answers[{a}]"
            expect(path, where, afield, ans, dict)
            text = required(path, where, ans, "answer", str, prefix=f"{afield}.")
            explanation = ans.get("boolean_explanation")
            boolean: Optional[Dict[str, Any]] = None
            if ans.get("answer_type") == "Boolean" and explanation:
                boolean = {"answer": text,
                           "explanation": expect(path, where, f'{afield}.boolean_explanation', explanation, str)}
                text = f"{text}. {boolean['explanation']}"
            url = expect(path, where, f"{afield}.source_url", ans.get("source_url") or "", str)
            # A Boolean answer keeps its parts apart too: HerO's few-shot examples join them their own way.
            item = {"question": question, "answer": text, "url": url}
            items.append(dict(item, boolean=boolean) if boolean else item)
    return items
