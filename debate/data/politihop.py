"""PolitiHop (Ostrowski et al. 2021), MADR's benchmark: PolitiFact statements whose verdict takes reasoning over
several sentences of the PolitiFact ruling, labels true / false / half-true.

As its repository ships it (github copenlu/politihop), DATA_DIR holds `politihop_<split>.tsv` (train, valid,
test), tab-separated with the columns article_id, statement, author, ruling (a JSON list of the ruling's
sentences), url_sentences, relevant_text_url_sentences, politifact_label, annotated_evidence (JSON: evidence
chain -> ids of ruling sentences, "13,14" naming two), annotated_label, urls, annotated_urls.

Evidence conditions: golden = the ruling sentences of every annotated evidence chain, in ruling order (the
evidence the annotators found the verdict on); ruling = the whole ruling, every sentence (what MADR's
explanations are written from); none. An evidence sentence id past the end of its ruling (one in the
published test file) is left out, and the claim's `notes` say so. Unit: one record per statement (200 test claims;
MADR's paper counts
"445 test set instances").
"""
import csv
import io
import json
import os
from pathlib import Path
from typing import Any, Dict, List, Set, Union

from debate.data.claims import check_label, read_text, record, split_file
from debate.data.inputs import DataError
from debate.data.labels import LabelSet

LABELS = LabelSet(
    name="politihop",
    labels=("true", "false", "half-true"),
    definitions=("the statement is accurate, as the ruling's evidence shows.",
                 "the statement is inaccurate, as the ruling's evidence shows.",
                 "the statement is partly accurate: it leaves out important details or takes things out of "
                 "context."),
    supported="true", refuted="false", mixed="half-true",
    aliases=(("supported", "true"), ("refuted", "false"), ("halftrue", "half-true"), ("partlytrue", "half-true")),
)
SPLITS = ("train", "valid", "test")
COLUMNS = ("article_id", "statement", "ruling", "annotated_evidence", "annotated_label")


def load_split(split: str, data_dir: Union[str, os.PathLike]) -> List[Dict[str, Any]]:
    if split not in SPLITS:
        raise DataError(f"--split {split!r}: PolitiHop has the splits {', '.join(SPLITS)}")
    path = split_file(Path(data_dir) / f"politihop_{split}.tsv", "PolitiHop", "github copenlu/politihop")
    csv.field_size_limit(1 << 30)  # a ruling is one long cell
    reader = csv.DictReader(io.StringIO(read_text(path), newline=""), delimiter="\t")
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise DataError(f"{path}: line 1: missing column(s) {', '.join(missing)}")
    return [_claim(path, f"line {reader.line_num} (article_id {row['article_id']})", row) for row in reader]


def _json(path: Path, where: str, row: Dict[str, Any], column: str, kind: type) -> Any:
    try:
        value = json.loads(row[column])
    except (TypeError, ValueError):
        raise DataError(f"{path}: {where}: column '{column}': not JSON") from None
    if not isinstance(value, kind):
        raise DataError(f"{path}: {where}: column '{column}': expected a JSON {kind.__name__}")
    return value


def _claim(path: Path, where: str, row: Dict[str, Any]) -> Dict[str, Any]:
    statement = (row.get("statement") or "").strip()
    if not statement:
        raise DataError(f"{path}: {where}: column 'statement': empty")
    label = check_label(path, where, row.get("annotated_label") or "", LABELS, field="annotated_label")
    ruling = _json(path, where, row, "ruling", list)
    if not all(isinstance(s, str) for s in ruling):
        raise DataError(f"{path}: {where}: column 'ruling': expected a JSON list of sentences")
    chains = _json(path, where, row, "annotated_evidence", dict)
    ids: Set[int]  # the chains' sentences
    notes: List[str]
    ids, notes = set(), []
    for chain, sentences in chains.items():
        for value in sentences if isinstance(sentences, list) else [sentences]:
            for part in str(value).split(","):
                if not part.strip().isdigit():
                    raise DataError(f"{path}: {where}: column 'annotated_evidence': chain {chain}: sentence "
                                    f"{part.strip()!r} is not a sentence number")
                if int(part) < len(ruling):
                    ids.add(int(part))
                else:  # the published test file has one such id; the rest of the chain still stands
                    notes.append(f"{path.name}: {where}: annotated evidence chain {chain} names sentence "
                                 f"{int(part)} of a {len(ruling)}-sentence ruling; left out")
    url = f"PolitiFact ruling {row['article_id']}"

    def sentence(i: int) -> Dict[str, str]:
        return {"text": ruling[i].strip(), "url": f"{url}, sentence {i + 1}"}

    return record(row["article_id"], statement, label, [sentence(i) for i in sorted(ids)], "passages",
                  evidence_sets={"ruling": [sentence(i) for i in range(len(ruling)) if ruling[i].strip()]},
                  author=row.get("author") or "", notes=notes)
