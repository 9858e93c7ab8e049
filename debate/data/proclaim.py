"""The claim samples PROClaim evaluated besides Check-COVID (its section 4.6), as its repository ships them
(github mnc13/PROClaim, `data/`): JSON Lines of {id, claim, label} with the labels SUPPORT and REFUTE.

Their evidence ids point to sources not available offline (FEVEROUS's Wikipedia tables, SciFact's and
HealthVer's articles), so they run with evidence `none`, or `retrieved` from a --retrieved-file or --corpus
of your own. FEVEROUS and SciFact are read from DATA_DIR (the folder holding `feverous_sample_100.jsonl`,
`scifact_sample_100.jsonl`), split `sample`; HealthVer's sample is a split of the healthver dataset.
"""
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Union

from debate.data.claims import claim_fields, read_jsonl, record
from debate.data.inputs import DataError
from debate.data.labels import LabelSet

BINARY = LabelSet(
    name="binary",
    labels=("SUPPORT", "REFUTE"),
    definitions=("the evidence backs the claim.", "the evidence contradicts the claim."),
    supported="SUPPORT", refuted="REFUTE",
    aliases=(("supported", "SUPPORT"), ("supports", "SUPPORT"), ("refuted", "REFUTE"), ("refutes", "REFUTE")),
)
FILES = {"feverous": "feverous_sample_100.jsonl", "scifact": "scifact_sample_100.jsonl"}


def find(data_dir: Union[str, os.PathLike], name: str, dataset: str) -> Path:
    """PROClaim's file `name`: in DATA_DIR, or in a proclaim/ folder beside it."""
    root = Path(data_dir)
    for place in (root / name, root.parent / "proclaim" / name):
        if place.is_file():
            return place
    raise DataError(f"{root / name}: no such file (nor in {root.parent / 'proclaim'}): {dataset}'s sample is "
                    f"PROClaim's data/{name} (github mnc13/PROClaim); put it in --data-dir or in a proclaim/ "
                    "folder beside it")


def load_sample(path: Path, labels: LabelSet) -> List[Dict[str, Any]]:
    """Claims and labels of a PROClaim sample file, without evidence."""
    claims: List[Dict[str, Any]] = []
    for where, row in read_jsonl(path):
        claim_id, where, claim, label = claim_fields(path, where, row, labels)
        claims.append(record(claim_id, claim, label, [], "passages"))
    return claims


def loader(dataset: str) -> Callable[[str, Union[str, os.PathLike]], List[Dict[str, Any]]]:
    """The split reader of FEVEROUS's or SciFact's sample."""
    def load_split(split: str, data_dir: Union[str, os.PathLike]) -> List[Dict[str, Any]]:
        if split != "sample":
            raise DataError(f"--split {split!r}: the {dataset} data here is PROClaim's sample: --split sample")
        return load_sample(find(data_dir, FILES[dataset], dataset), BINARY)
    return load_split
