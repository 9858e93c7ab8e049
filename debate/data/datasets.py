"""The datasets a run can read (`--dataset`): each a reader, a label set, an evidence shape, its evidence
conditions, its retrieval corpus where it has one, and the metrics its papers report.

    dataset = datasets.get("check-covid")
    claims = dataset.read("test", "data/check-covid")        # claim records (debate.data.claims)
    labels = dataset.labels("test", "data/check-covid")      # its LabelSet

No dataset ships in the package (the demo claims apart); `source` says where each comes from, and
`--data-dir` names its folder laid out as its publisher ships it.
"""
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from debate.data import averitec, checkcovid, healthver, politihop, proclaim, userdata
from debate.data.inputs import DataError, check_unique_ids
from debate.data.labels import AVERITEC, LabelSet


@dataclass(frozen=True)
class Dataset:
    name: str
    title: str  # what it is, who made it
    evidence: str  # its evidence, in words
    conditions: Tuple[str, ...]  # the evidence conditions it can offer (retrieved: from its retrieved file or corpus)
    default_condition: str  # --evidence when none is given
    splits: Optional[Tuple[str, ...]]  # its split names (None: any name, a file DATA_DIR/<split>.json[l])
    default_dir: str  # --data-dir when none is given
    source: str  # where to get it
    reader: Callable[[str, Path], List[Dict[str, Any]]]  # (split, data_dir) -> claim records
    # (split, data_dir) -> LabelSet; --list-datasets passes data_dir None to the sets that do not read it
    label_set: Callable[[str, Any], LabelSet]
    # (split, data_dir) -> its retrieved-evidence file, or None
    retrieved_file: Optional[Callable[[str, Path], Optional[Path]]] = None
    retrieved_source: str = ""  # where to get that file (it is no part of the dataset's own release)
    # (data_dir) -> passages {id, text, url} of its retrieval corpus
    corpus: Optional[Callable[[Path], List[Dict[str, Any]]]] = None
    scorer: str = "labels"  # "averitec": also the AVeriTeC evidence score and submission.json
    papers: str = ""  # which paper evaluates on it, and what it reports
    # --evidence of an explanation run (--task explain: MADR's experiment and its baselines) when none is
    # given: the evidence MADR's models read; None: default_condition
    explain_condition: Optional[str] = None

    def data_dir(self, given: Optional[Union[str, os.PathLike]] = None) -> Path:
        """The dataset's folder: `given`, else its default ($DEBATECV_DATA for AVeriTeC)."""
        if self.name == "averitec":
            return averitec.resolve_data_dir(given)
        return Path(given or self.default_dir)

    def read(self, split: str, data_dir: Optional[Union[str, os.PathLike]] = None) -> List[Dict[str, Any]]:
        """The claim records of `split`; refuses a split the dataset does not have, with one line."""
        if self.splits is not None and split not in self.splits:
            raise DataError(f"--split {split!r}: {self.name} has the splits {', '.join(self.splits)}")
        folder = self.data_dir(data_dir)
        claims = self.reader(split, folder)
        where = f"--split {split} of {self.name}" + ("" if split == "demo" else f" (in {folder})")
        if not claims:  # nothing to verify is one line now, not a traceback once the run ends
            raise DataError(f"{where}: the split holds no claims; nothing to verify")
        # Resume, the scorer and retrieved evidence key on the id: two claims under one would become one.
        check_unique_ids(where, [(f"claim {i} (claim_id {c['claim_id']})", c["claim_id"]) for i,
                                 c in enumerate(claims)])
        return claims

    def labels(self, split: str, data_dir: Optional[Union[str, os.PathLike]] = None) -> LabelSet:
        """The LabelSet of `split` (Check-COVID's test-binary and the PROClaim samples have two labels)."""
        return self.label_set(split, self.data_dir(data_dir))


DATASETS = {d.name: d for d in (
    Dataset(
        name="averitec", title="AVeriTeC (Schlichtkrull et al. 2023): real-world claims, four labels",
        evidence="question-answer pairs", conditions=("golden", "retrieved", "none"), default_condition="retrieved",
        splits=None, default_dir=averitec.DEFAULT_DATA_DIR,
        source="github MichSchli/AVeriTeC data/ (dev.json); HerO's retrieved evidence dev.retrieved.hero.jsonl from "
               "github ssu-humane/HerO (CC BY-NC 4.0); --split demo: the invented demo claims in the package",
        reader=averitec.load_split, label_set=lambda split, data_dir: AVERITEC,
        retrieved_file=averitec.retrieved_path, retrieved_source="HerO's release, github ssu-humane/HerO",
        scorer="averitec",
        papers="DebateCV: accuracy and AVeriTeC score on dev, golden / retrieved / no evidence"),
    Dataset(
        name="check-covid", title="Check-COVID (Wang et al. 2023): news claims vs scientific abstracts",
        evidence="abstract sentences", conditions=("golden", "retrieved", "none"), default_condition="golden",
        splits=checkcovid.SPLITS, default_dir="data/check-covid",
        source="github posuer/Check-COVID (MIT); test-binary: data/checkcovid_test_binary.jsonl of github "
               "mnc13/PROClaim in a proclaim/ folder beside it",
        reader=checkcovid.load_split, label_set=lambda split, data_dir: checkcovid.labels_of(split),
        corpus=checkcovid.corpus_passages,
        papers="PROClaim: accuracy and macro-F1 on test-binary (121 claims), majority vote over three runs"),
    Dataset(
        name="healthver", title="HealthVer (Sarrouti et al. 2021): health claims vs article sentences",
        evidence="article sentences", conditions=("golden", "retrieved", "none"), default_condition="golden",
        splits=healthver.SPLITS, default_dir="data/healthver",
        source="github sarrouti/HealthVer (healthver_dev.csv, healthver_test.csv); sample: PROClaim's "
               "data/healthver_sample_100.jsonl in a proclaim/ folder beside it",
        reader=healthver.load_split, label_set=lambda split, data_dir: healthver.labels_of(split),
        papers="PROClaim: accuracy on its 100-claim sample (retrieved evidence)"),
    Dataset(
        name="politihop", title="PolitiHop (Ostrowski et al. 2021): PolitiFact statements vs ruling sentences",
        evidence="ruling sentences", conditions=("golden", "ruling", "none"), default_condition="golden",
        splits=politihop.SPLITS, default_dir="data/politihop",
        source="github copenlu/politihop (politihop_train.tsv, politihop_valid.tsv, politihop_test.tsv)",
        reader=politihop.load_split, label_set=lambda split, data_dir: politihop.LABELS,
        papers="MADR: faithfulness of explanations (G-Eval) on test",
        explain_condition="ruling"),  # MADR's models read the whole ruling article, not the annotated chains
    Dataset(
        name="feverous", title="FEVEROUS, PROClaim's 100-claim sample (claims and labels only)",
        evidence="none offline (Wikipedia)", conditions=("none", "retrieved"), default_condition="none",
        splits=("sample",), default_dir="data/proclaim",
        source="PROClaim's data/feverous_sample_100.jsonl (github mnc13/PROClaim)",
        reader=proclaim.loader("feverous"), label_set=lambda split, data_dir: proclaim.BINARY,
        papers="PROClaim: accuracy on 60 claims with a Wikipedia retriever"),
    Dataset(
        name="scifact", title="SciFact, PROClaim's 100-claim sample (claims and labels only)",
        evidence="none offline (abstracts)", conditions=("none", "retrieved"), default_condition="none",
        splits=("sample",), default_dir="data/proclaim",
        source="PROClaim's data/scifact_sample_100.jsonl (github mnc13/PROClaim)",
        reader=proclaim.loader("scifact"), label_set=lambda split, data_dir: proclaim.BINARY,
        papers="PROClaim's repository carries it; no number in the paper"),
    Dataset(
        name="jsonl", title="your own claims: DATA_DIR/<split>.jsonl and DATA_DIR/card.json",
        evidence="passages or question-answer pairs", conditions=("golden", "retrieved", "none"),
        default_condition="golden", splits=None, default_dir="data/jsonl",
        source="your own (format in docs/datasets.md)",
        reader=userdata.load_split, label_set=lambda split, data_dir: userdata.load_card(data_dir)),
)}
NAMES = tuple(DATASETS)
CONDITIONS = ("golden", "retrieved", "ruling", "none")  # every dataset's, for --evidence


def get(name: str) -> Dataset:
    if name not in DATASETS:
        raise DataError(f"--dataset must be one of {', '.join(NAMES)}, not {name!r}")
    return DATASETS[name]


def listing() -> str:
    """The text of --list-datasets: each dataset with its labels, evidence, splits and source."""
    blocks = []
    for d in DATASETS.values():
        if d.name == "jsonl":
            labels = "declared by DATA_DIR/card.json"
        else:
            sets: Dict[Tuple[str, ...], List[str]] = {}  # labels -> the splits with them
            for split in d.splits or ("dev",):
                sets.setdefault(d.label_set(split, None).labels, []).append(split)
            labels = "; ".join(", ".join(ls) + (f" ({', '.join(splits)})" if len(sets) > 1 else "")
                               for ls, splits in sets.items())
        where = d.data_dir() if d.name == "averitec" else d.default_dir
        blocks.append(f"{d.name}: {d.title}\n"
                      f"  labels: {labels}\n"
                      f"  evidence: {d.evidence}; conditions: {', '.join(d.conditions)} (default {d.default_condition}"
                      + (f"; {d.explain_condition} under --task explain" if d.explain_condition else "") + ")\n"
                      f"  splits: {', '.join(d.splits) if d.splits else 'any file DATA_DIR/<split>'}; --data-dir "
                      f"default {where}\n"
                      f"  source: {d.source}")
    return "\n".join(blocks)
