"""HealthVer (Sarrouti et al., Findings of EMNLP 2021): health claims about COVID-19 checked against sentences
of scientific articles, labels Supports / Refutes / Neutral.

As its repository ships it (github sarrouti/HealthVer), DATA_DIR holds `healthver_<split>.csv` with the
columns id, evidence, claim, label, topic_ip, question: one row per claim-evidence pair. A claim repeats over
many rows, and its rows often disagree (the same claim is supported by one sentence and refuted by another:
half of the dev claims), so a claim has no single label. We group the rows of one claim that share a label:
a record is the claim with every evidence sentence its annotators gave that label, in file order, its id the
first such row's id. A claim thus counts once per label its evidence carries.

Split `sample` is PROClaim's 99-claim sample (`healthver_sample_100.jsonl`, its section 4.6: {id, claim,
label} with SUPPORT / REFUTE, no evidence), found in DATA_DIR or in a `proclaim/` folder beside it; it runs
with the evidence conditions none or retrieved (a --retrieved-file or --corpus of your own).
"""
import csv
import io
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, Dict, List, Tuple, Union

from debate.data import proclaim
from debate.data.claims import check_label, read_text, record, split_file
from debate.data.inputs import DataError
from debate.data.labels import LabelSet

LABELS = LabelSet(
    name="healthver",
    labels=("Supports", "Refutes", "Neutral"),
    definitions=("the evidence backs the claim.",
                 "the evidence contradicts the claim.",
                 "the evidence neither backs the claim nor contradicts it."),
    supported="Supports", refuted="Refutes", nei="Neutral",
    aliases=(("support", "Supports"), ("supported", "Supports"), ("refute", "Refutes"), ("refuted", "Refutes"),
             ("notenoughinfo", "Neutral"), ("notenoughinformation", "Neutral"), ("notenoughevidence", "Neutral")),
)
SPLITS = ("dev", "test", "sample")
SAMPLE_FILE = "healthver_sample_100.jsonl"
COLUMNS = ("id", "evidence", "claim", "label")


def labels_of(split: str) -> LabelSet:
    return proclaim.BINARY if split == "sample" else LABELS


def load_split(split: str, data_dir: Union[str, os.PathLike]) -> List[Dict[str, Any]]:
    if split == "sample":
        return proclaim.load_sample(proclaim.find(data_dir, SAMPLE_FILE, "HealthVer"), proclaim.BINARY)
    if split not in SPLITS:
        raise DataError(f"--split {split!r}: HealthVer has the splits {', '.join(SPLITS)}")
    path = split_file(Path(data_dir) / f"healthver_{split}.csv", "HealthVer", "github sarrouti/HealthVer")
    reader = csv.DictReader(io.StringIO(read_text(path), newline=""))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise DataError(f"{path}: line 1: missing column(s) {', '.join(missing)} (HealthVer's header is "
                        "id, evidence, claim, label, topic_ip, question)")
    groups: Dict[Tuple[str, str], List[Dict[str, str]]] = OrderedDict()  # (claim, label) -> [rows]
    for row in reader:
        where = f"line {reader.line_num} (id {row['id']})"
        for column in COLUMNS:
            if not (row.get(column) or "").strip():
                raise DataError(f"{path}: {where}: column '{column}': empty")
        label = check_label(path, where, row["label"], LABELS)
        groups.setdefault((row["claim"].strip(), label), []).append(row)
    return [record(rows[0]["id"], claim, label, [{"text": r["evidence"].strip(), "url": f"HealthVer {r['id']}"}
                                                   for r in rows], "passages", rows=[r["id"] for r in rows])
            for (claim, label), rows in groups.items()]
