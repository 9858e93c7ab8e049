"""SynDeC records: one zero-shot debate per training claim, with what the Moderator got right or wrong.

A record is one JSON line:
    claim_id, claim, evidence [{question, answer, url} or {text, url}], debate [the run's turns: round, role,
    prompt, response], gold_label, predicted_label (null when unreadable), predicted_justification, correct,
    corrected_justification (null until the Corrector has written one for a wrong prediction), labels (the
    dataset's LabelSet as a dict, so D-SFT and D-DPO render the Moderator's prompt as the run did; a record
    without it is AVeriTeC's)

The paper's split: correct records train D-SFT, corrected ones train D-DPO.
"""
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Tuple, Union

from debate.data import jsonl
from debate.data.claims import ITEM_SHAPES, item_problem, item_shape, kind_of, line_problem
from debate.data.inputs import read_text
from debate.data.labels import AVERITEC, LabelSet
from debate.pipeline import records as run_records


class SynDeCError(ValueError):
    pass


def build(run_dir: Union[str, os.PathLike], claims: Iterable[Dict[str, Any]],
          labels: LabelSet = AVERITEC) -> List[Dict[str, Any]]:
    """SynDeC records from a finished run directory of `run_debate`-style outputs, in claim order; `labels`: the
    run's dataset's LabelSet."""
    predictions = {p["claim_id"]: p for p in run_records.read_predictions(run_dir)}
    transcripts = {t["claim_id"]: t for t in run_records.read_jsonl(Path(run_dir) / run_records.TRANSCRIPTS)}
    out: List[Dict[str, Any]] = []
    for claim in claims:
        p = predictions.get(claim["claim_id"])
        if p is None:
            continue
        out.append({
            "claim_id": claim["claim_id"],
            "claim": claim["claim"],
            "evidence": claim["evidence"],
            "debate": transcripts[claim["claim_id"]]["turns"],
            "gold_label": claim["label"],
            "predicted_label": p["label"],
            "predicted_justification": p["justification"],
            "correct": p["label"] == claim["label"],
            "corrected_justification": None,
            "labels": labels.as_dict(),
        })
    return out


def write(path: Union[str, os.PathLike], rows: Iterable[Dict[str, Any]]) -> None:
    """Write records atomically: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    jsonl.write(path, rows)


def load(path: Union[str, os.PathLike]) -> List[Dict[str, Any]]:
    """Read and check a SynDeC file; every problem names the file, line and field."""
    path = Path(path)
    if not path.is_file():
        raise SynDeCError(f"{path}: no such SynDeC file")
    try:
        rows = [_check(row, f"{path}:{n}") for n, row in jsonl.numbered(read_text(path))]
    except jsonl.BadLine as e:
        raise SynDeCError(f"{path}:{e.lineno}: not valid JSON ({line_problem(e.error)})") from None
    if not rows:
        raise SynDeCError(f"{path}: no SynDeC records (the file is empty); run --stage synth first")
    return rows


def _check(row: Any, where: str) -> Dict[str, Any]:
    if not isinstance(row, dict):
        raise SynDeCError(f"{where}: expected a JSON object")
    for key, types in (("claim_id", (int, str)), ("claim", str), ("evidence", list), ("gold_label", str)):
        if key not in row:
            raise SynDeCError(f"{where}: missing field '{key}'")
        if not isinstance(row[key], types):
            raise SynDeCError(f"{where}: field '{key}': wrong type ({type(row[key]).__name__})")
    where = f"{where} (claim_id {row['claim_id']})"
    try:
        labels = labels_of(row)
    except (TypeError, ValueError) as err:
        raise SynDeCError(f"{where}: field 'labels': not a label set ({err})") from None
    if labels.canonical(row["gold_label"]) is None:
        raise SynDeCError(f"{where}: field 'gold_label': {row['gold_label']!r} is none of {', '.join(labels.labels)}")
    debate = row.get("debate")
    if not isinstance(debate, list) or not debate:
        raise SynDeCError(f"{where}: field 'debate': no debate record (expected the list of turns)")
    for i, turn in enumerate(debate):
        if not isinstance(turn, dict) or not all(isinstance(turn.get(k), str) for k in ("role", "prompt", "response")):
            raise SynDeCError(f"{where}: field 'debate[{i}]': expected an object with role, prompt and response")
    if not any(t["role"] == "moderator" for t in debate):
        raise SynDeCError(f"{where}: field 'debate': no Moderator turn, so nothing to train on")
    for i, item in enumerate(row["evidence"]):
        if not isinstance(item, dict):
            raise SynDeCError(f"{where}: field 'evidence[{i}]': expected {ITEM_SHAPES}, got {kind_of(item)}")
        if item_shape(item) is None:
            raise SynDeCError(f"{where}: {item_problem(item, f'evidence[{i}]', needed=('question', 'answer'))}")
    predicted = row.get("predicted_label")
    correct = predicted is not None and labels.canonical(predicted) == labels.canonical(row["gold_label"])
    corrected = row.get("corrected_justification")
    if corrected is not None and not isinstance(corrected, str):
        raise SynDeCError(f"{where}: field 'corrected_justification': expected a string or null")
    return dict(row, gold_label=labels.canonical(row["gold_label"]), correct=correct)


def labels_of(row: Dict[str, Any]) -> LabelSet:
    """The LabelSet a SynDeC record was debated under (AVeriTeC's for records written before they said)."""
    return LabelSet.from_dict(row["labels"]) if row.get("labels") else AVERITEC


def split(rows: Iterable[Dict[str, Any]]) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """The paper's split: (correct records for D-SFT, wrong records with a correction for D-DPO)."""
    sft = [r for r in rows if r["correct"]]
    dpo = [r for r in rows if not r["correct"] and (r.get("corrected_justification") or "").strip()]
    return sft, dpo
