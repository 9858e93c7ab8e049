"""Your own claims (`--dataset jsonl`): DATA_DIR/<split>.jsonl with DATA_DIR/card.json beside it.

Each line of <split>.jsonl is one claim:

    {"claim_id": "c1", "claim": "...", "label": "True",
     "evidence": [{"text": "...", "url": "..."}, ...]}      # or question-answer items {question, answer, url}

`claim_id` must be unique; `label` one of the card's (it may be left out or null only in a split named
test*); `evidence` is the golden evidence (may be empty or left out: then run with --evidence none or
retrieved). card.json declares the labels and what each means:

    {"name": "my-claims",
     "labels": [{"label": "True", "definition": "the evidence backs the claim."},
                {"label": "False", "definition": "the evidence contradicts the claim."},
                {"label": "Unverifiable", "definition": "the evidence cannot settle the claim."}],
     "supported": "True", "refuted": "False",      # optional: default the first and the second label
     "nei": "Unverifiable",                        # optional: the label meaning "not enough information"
     "mixed": null}                                 # optional: a label for claims the evidence supports in part
"""
import os
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple, Union

from debate.data.claims import check_label, evidence_items, expect, read_json, read_jsonl, record, required
from debate.data.inputs import DataError, check_unique_ids
from debate.data.labels import LabelSet

CARD = "card.json"


def load_card(data_dir: Union[str, os.PathLike]) -> LabelSet:
    """The LabelSet a card.json declares; every problem names the card and the field."""
    path = Path(data_dir) / CARD
    if not path.is_file():
        raise DataError(f"{path}: no such file: --dataset jsonl needs a card.json beside the split files "
                        "declaring the labels (see docs/datasets.md)")
    card = read_json(path)
    expect(path, "top level", "card", card, dict)
    entries = required(path, "top level", card, "labels", list)
    if len(entries) < 2:
        raise DataError(f"{path}: field 'labels': a card declares at least two labels")
    labels: List[str]
    definitions: List[str]
    labels, definitions = [], []
    for i, entry in enumerate(entries):
        where = f"labels[{i}]"
        expect(path, "top level", where, entry, dict)
        label = required(path, where, entry, "label", str).strip()
        if not label or '"' in label or label in labels:
            raise DataError(f"{path}: {where}: field 'label': {label!r} is empty, has a double quote or repeats")
        labels.append(label)
        definitions.append(required(path, where, entry, "definition", str).strip())
    roles: Dict[str, Any] = {}  # role -> its label (None: the card gives the role no label)
    for role, default in (("supported", labels[0]), ("refuted", labels[1]), ("nei", None), ("mixed", None)):
        value = card.get(role, default)
        if value is not None and value not in labels:
            raise DataError(f"{path}: field '{role}': {value!r} is not one of the card's labels ({', '.join(labels)})")
        roles[role] = value
    name = expect(path, "top level", "name", card.get("name") or Path(data_dir).name, str)
    return LabelSet(name=name, labels=tuple(labels), definitions=tuple(definitions), **roles)


def load_split(split: str, data_dir: Union[str, os.PathLike]) -> List[Dict[str, Any]]:
    labels = load_card(data_dir)
    path = Path(data_dir) / f"{split}.jsonl"
    if not path.is_file():
        raise DataError(f"{path}: no such split file (--dataset jsonl reads DATA_DIR/<split>.jsonl)")
    labelled = not split.startswith("test")
    claims: List[Dict[str, Any]]
    shapes: Set[str]
    located: List[Tuple[str, Any]]
    claims, shapes, located = [], set(), []
    for where, row in read_jsonl(path):
        claim_id = required(path, where, row, "claim_id", (str, int))
        where = f"{where} (claim_id {claim_id})"
        located.append((where, claim_id))
        claim = required(path, where, row, "claim", str).strip()
        if not claim:
            raise DataError(f"{path}: {where}: field 'claim': empty")
        label = row.get("label")
        if label is None and labelled:
            raise DataError(f"{path}: {where}: missing field 'label' (only splits named test* may be unlabelled)")
        label = None if label is None else check_label(path, where, label, labels)
        gold = evidence_items(path, where, expect(path, where, "evidence", row.get("evidence") or [], list))
        shapes.update("qa" if "question" in item else "passages" for item in gold)
        claims.append(record(claim_id, claim, label, gold, "passages"))
    check_unique_ids(path, located)
    shape = "qa" if shapes == {"qa"} else "passages"  # prompts name the evidence by the file's one kind
    return [dict(c, evidence_shape=shape) for c in claims]


def labels_of(split: str, data_dir: Union[str, os.PathLike]) -> LabelSet:
    return load_card(data_dir)
