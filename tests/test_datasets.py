"""Datasets: each reader on the real published files (counts as the data's README gives them), label sets in
prompts and parsing, bad files refused with one line before anything loads, a user's own JSONL with a card."""
import collections
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from debate.data import checkcovid, datasets, politihop, userdata
from debate.data.inputs import DataError
from debate.data.labels import AVERITEC, LABELS, LabelSet
from debate.data.parsing import parse_moderator
from debate.data.prompts import render, verdict_criteria
from tests.tiny_models import missing, shared_dir

ROOT = Path(__file__).resolve().parents[1]


def real(dataset, folder):
    path = shared_dir(folder)
    if not path.is_dir():
        missing(f"no shared {folder} data at {path}", shared_data=True)
    return datasets.get(dataset), path


def counts(claims):
    return dict(collections.Counter(c["label"] for c in claims))


# --- the real files, counted as ../shared/data/README.md counts them ---------------------------------------------

def test_check_covid_splits_and_golden_sentences():
    dataset, path = real("check-covid", "check-covid")
    train = dataset.read("train", path)
    assert len(train) == 1068 and counts(train) == {"SUPPORT": 359, "REFUTE": 358, "NOTENOUGHINFO": 351}
    assert len(dataset.read("dev", path)) == 207
    test = dataset.read("test", path)
    assert len(test) == 49 + 180 and set(counts(test)) == {"SUPPORT", "REFUTE", "NOTENOUGHINFO"}
    # Golden evidence: the abstract's sentences the evidence_set names, in the abstract's order.
    corpus = checkcovid.load_corpus(path)
    first = test[0]
    rows = [json.loads(line) for line in (path / "test" / "covidCheck_test_composed.json").open()]
    indices = sorted({e["sent_index"] for e in rows[0]["evidence_set"]})
    assert [e["text"] for e in first["gold_evidence"]] == [corpus[rows[0]["cord_id"]]["abstract"][i] for i in indices]
    assert first["gold_evidence"][0]["url"].startswith(f"CORD-19 {rows[0]['cord_id']}")
    assert dataset.labels("test", path).labels == ("SUPPORT", "REFUTE", "NOTENOUGHINFO")


def test_check_covid_binary_is_proclaims_121_claims_with_two_labels():
    dataset, path = real("check-covid", "check-covid")
    binary = dataset.read("test-binary", path)  # PROClaim's file, found in the proclaim/ folder beside it
    assert len(binary) == 121 and counts(binary) == {"REFUTE": 64, "SUPPORT": 57}
    assert dataset.labels("test-binary", path).labels == ("SUPPORT", "REFUTE")
    test_ids = {c["claim_id"] for c in dataset.read("test", path)}
    assert {c["claim_id"] for c in binary} <= test_ids and all(c["gold_evidence"] for c in binary)


def test_check_covid_corpus_holds_its_abstracts_and_the_retrieved_ones_once():
    dataset, path = real("check-covid", "check-covid")
    passages = dataset.corpus(path)
    ids = [p["id"] for p in passages]
    assert len(ids) == len(set(ids)) > 347  # corpus.json's 347 abstracts and more from the retrieval files
    assert set(checkcovid.load_corpus(path)) <= set(ids)
    assert all(p["text"].strip() and p["url"].startswith("CORD-19") for p in passages)


def test_healthver_rows_grouped_by_claim_and_label():
    dataset, path = real("healthver", "healthver")
    for split, rows, labels in (("dev", 1917, {"Neutral": 993, "Supports": 533, "Refutes": 391}),
                                ("test", 1823, {"Neutral": 727, "Supports": 671, "Refutes": 425})):
        claims = dataset.read(split, path)
        per_row = collections.Counter()
        for c in claims:
            per_row[c["label"]] += len(c["rows"])
            assert len(c["gold_evidence"]) == len(c["rows"])
        assert sum(per_row.values()) == rows and dict(per_row) == labels  # every row, in exactly one record
        keys = [(c["claim"], c["label"]) for c in claims]
        assert len(keys) == len(set(keys))  # one record per claim and label
    sample = dataset.read("sample", path)  # PROClaim's sample: claims and labels only
    assert len(sample) == 100 and counts(sample) == {"SUPPORT": 50, "REFUTE": 50}
    assert not any(c["gold_evidence"] for c in sample)


def test_politihop_splits_labels_and_evidence_chains():
    dataset, path = real("politihop", "politihop")
    assert counts(dataset.read("train", path)) == {"false": 386, "half-true": 127, "true": 79}
    assert len(dataset.read("valid", path)) == 141
    test = dataset.read("test", path)
    assert len(test) == 200 and counts(test) == {"false": 150, "half-true": 29, "true": 21}
    csv.field_size_limit(1 << 30)
    with open(path / "politihop_test.tsv", encoding="utf-8", newline="") as f:
        chains = sum(len(json.loads(row["annotated_evidence"])) for row in csv.DictReader(f, delimiter="\t"))
    assert chains == 815
    # The one published evidence id past its ruling is left out and said so; the rest of the claim stands.
    notes = [n for c in test for n in c.get("notes", [])]
    assert len(notes) == 1 and "18058" in notes[0]
    for c in test:
        assert all(e in c["evidence_sets"]["ruling"] for e in c["gold_evidence"])


@pytest.mark.parametrize("name", ["feverous", "scifact"])
def test_proclaim_samples_have_claims_and_labels_only(name):
    dataset, path = real(name, "proclaim")
    claims = dataset.read("sample", path)
    assert len(claims) == 100 and counts(claims) == {"SUPPORT": 50, "REFUTE": 50}
    assert dataset.conditions == ("none", "retrieved")


def test_the_listing_names_every_dataset_with_its_labels():
    out = subprocess.run([sys.executable, "run_debate.py", "--list-datasets"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0
    for name in datasets.NAMES:
        assert f"\n{name}: " in "\n" + out.stdout
    assert "SUPPORT, REFUTE, NOTENOUGHINFO" in out.stdout and "true, false, half-true" in out.stdout


# --- labels in prompts and parsing -----------------------------------------------------------------------------

CARD3 = {"name": "mine", "labels": [{"label": "Accurate", "definition": "the evidence backs it."},
                                    {"label": "Inaccurate", "definition": "the evidence contradicts it."},
                                    {"label": "Unclear", "definition": "the evidence cannot settle it."}],
         "nei": "Unclear"}


def test_label_sets_render_their_own_labels_and_no_averitec_one():
    for labels in (checkcovid.LABELS, checkcovid.BINARY, politihop.LABELS, userdata_labels()):
        texts = [verdict_criteria(labels),
                 render("moderator_final", affirmative_argument="A", negative_argument="N", claim="C",
                        label_choices=labels.choices(), label_answer=labels.answer_format())]
        for label in labels.labels:
            assert all(label in t for t in texts)
        assert not [label for label in LABELS for t in texts if label in t]
    assert checkcovid.BINARY.choices() == '"SUPPORT" or "REFUTE"'
    assert checkcovid.LABELS.answer_format() == "SUPPORT, REFUTE, or NOTENOUGHINFO"


def userdata_labels(tmp_path=None):
    return LabelSet(name="mine", labels=("Accurate", "Inaccurate", "Unclear"),
                    definitions=("a.", "b.", "c."), supported="Accurate", refuted="Inaccurate", nei="Unclear")


@pytest.mark.parametrize("reply, labels, verdict", [
    ('{"Verdict": "REFUTE"}', checkcovid.LABELS, "REFUTE"),
    ('{"Verdict": "Not enough information"}', checkcovid.LABELS, "NOTENOUGHINFO"),
    ("The abstract leaves it open: not enough info.", checkcovid.LABELS, "NOTENOUGHINFO"),
    ("The claim is not refuted by the abstract.", checkcovid.LABELS, None),  # negated: never guessed
    ("Verdict: half true", politihop.LABELS, "half-true"),
    ('{"Verdict": "Refuted"}', politihop.LABELS, "false"),
    ('{"Verdict": "Supported"}', AVERITEC, "Supported"),
    ('{"Verdict": "SUPPORT"}', checkcovid.BINARY, "SUPPORT"),
    ('{"Verdict": "NOTENOUGHINFO"}', checkcovid.BINARY, None),  # not a label of the binary split
])
def test_parsing_maps_spellings_per_dataset(reply, labels, verdict):
    assert parse_moderator(reply, labels=labels)["verdict"] == verdict


# --- a user's own claims ------------------------------------------------------------------------------------

def write_user(tmp_path, rows, card=CARD3, split="dev"):
    (tmp_path / "card.json").write_text(json.dumps(card))
    (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_user_jsonl_with_a_card(tmp_path):
    rows = [{"claim_id": "a", "claim": "Tea cures colds.", "label": "inaccurate",
             "evidence": [{"text": "Trials found no effect.", "url": "u"}]},
            {"claim_id": "b", "claim": "Water is wet.", "label": "Accurate", "evidence": []}]
    claims = datasets.get("jsonl").read("dev", write_user(tmp_path, rows))
    assert [c["label"] for c in claims] == ["Inaccurate", "Accurate"]
    assert claims[0]["gold_evidence"] == [{"text": "Trials found no effect.", "url": "u"}]
    labels = userdata.load_card(tmp_path)
    assert (labels.labels, labels.supported, labels.refuted, labels.nei) == (
        ("Accurate", "Inaccurate", "Unclear"), "Accurate", "Inaccurate", "Unclear")


# --- bad input: one line, naming file, line and field -----------------------------------------------------------

def _covid(tmp_path, row, abstract=("One.", "Two.")):
    (tmp_path / "corpus.json").write_text(json.dumps({"cord_id": "c1", "title": "T",
                                                      "abstract": list(abstract)}) + "\n")
    (tmp_path / "dev").mkdir()
    base = {"id": "x1", "claim": "A claim.", "cord_id": "c1", "label": "SUPPORT",
            "evidence_set": [{"sent_index": 1, "type": "PRIMARY"}]}
    line = json.dumps(dict(base, **row)) if isinstance(row, dict) else row
    (tmp_path / "dev" / "covidCheck_dev_composed+extracted.json").write_text(line + "\n")
    return ("check-covid", "dev", tmp_path)


def _healthver(tmp_path, body):
    (tmp_path / "healthver_dev.csv").write_text(body)
    return ("healthver", "dev", tmp_path)


def _politihop(tmp_path, ruling, evidence, label="false"):
    header = "article_id\tstatement\tauthor\truling\turl_sentences\trelevant_text_url_sentences\tpolitifact_label\t" \
             "annotated_evidence\tannotated_label\turls\tannotated_urls\n"
    row = f"7\tA statement.\tX\t{ruling}\t[]\t[]\tfalse\t{evidence}\t{label}\t[]\t{{}}\n"
    (tmp_path / "politihop_valid.tsv").write_text(header + row)
    return ("politihop", "valid", tmp_path)


BAD = {
    "covid missing cord_id": (lambda t: _covid(t, '{"id": "x1", "claim": "A claim.", "label": "SUPPORT", '
                                                  '"evidence_set": []}'),
                              ["covidCheck_dev_composed+extracted.json", "line 1", "'cord_id'"]),
    "covid index past the abstract": (lambda t: _covid(t, {"evidence_set": [{"sent_index": 5}]}),
                                      ["line 1 (id x1)", "sent_index", "past the end of abstract c1"]),
    "covid unknown cord": (lambda t: _covid(t, {"cord_id": "zz"}), ["'cord_id'", "'zz' is not an abstract"]),
    "covid label outside the set": (lambda t: _covid(t, {"label": "MAYBE"}), ["'label'", "unknown label 'MAYBE'"]),
    "covid not JSON": (lambda t: _covid(t, '{"id": "x1",'), ["line 1", "not valid JSON"]),
    "healthver missing column": (lambda t: _healthver(t, "id,claim,label\n1,c,Supports\n"),
                                 ["healthver_dev.csv", "line 1", "missing column(s) evidence"]),
    "healthver bad label": (lambda t: _healthver(t, "id,evidence,claim,label\n1,e,c,Maybe\n"),
                            ["line 2 (id 1)", "'label'", "unknown label 'Maybe'"]),
    "politihop ruling not JSON": (lambda t: _politihop(t, "[oops", '{"0": ["0"]}'),
                                  ["politihop_valid.tsv", "line 2 (article_id 7)", "'ruling': not JSON"]),
    "politihop bad label": (lambda t: _politihop(t, '["S one."]', '{"0": ["0"]}', label="pants-fire"),
                            ["'annotated_label'", "unknown label 'pants-fire'"]),
    "jsonl label outside the card": (lambda t: ("jsonl", "dev", write_user(t, [{"claim_id": 1, "claim": "c",
                                                                               "label": "True"}])),
                                     ["dev.jsonl", "line 1 (claim_id 1)", "unknown label 'True'"]),
    "jsonl card without labels": (lambda t: ("jsonl", "dev", write_user(t, [], card={"name": "x"})),
                                  ["card.json", "missing field 'labels'"]),
    "jsonl card role outside its labels": (lambda t: ("jsonl", "dev", write_user(t, [], card=dict(CARD3, nei="Maybe"))),
                                           ["card.json", "'nei'", "'Maybe' is not one of the card's labels"]),
    # Resume, the scorer and retrieved evidence key on the claim id: a second claim under one id is refused.
    "jsonl id given twice": (lambda t: ("jsonl", "dev", write_user(t, [{"claim_id": 1, "claim": "c",
                                                                        "label": "Accurate"},
                                                                       {"claim_id": "1", "claim": "d",
                                                                        "label": "Accurate"}])),
                             ["dev.jsonl", "line 2 (claim_id 1)", "is already the id of line 1 (claim_id 1)"]),
    "covid id given twice": (lambda t: _covid(t, '{"id": "x1", "claim": "A.", "cord_id": "c1", "label": "SUPPORT", '
                                              '"evidence_set": []}\n{"id": "x1", "claim": "B.", "cord_id": "c1", '
                                              '"label": "REFUTE", "evidence_set": []}'),
                             ["--split dev of check-covid", "claim 1 (claim_id x1)", "already the id of claim 0"]),
    "jsonl empty split": (lambda t: ("jsonl", "dev", write_user(t, [])),
                          ["--split dev of jsonl", "the split holds no claims"]),
    "healthver empty split": (lambda t: _healthver(t, "id,evidence,claim,label\n"),
                              ["--split dev of healthver", "the split holds no claims"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_files_give_one_error_naming_the_place(tmp_path, case):
    make, words = BAD[case]
    name, split, folder = make(tmp_path)
    with pytest.raises(DataError) as err:
        datasets.get(name).read(split, folder)
    message = str(err.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_a_byte_order_mark_is_taken_by_every_dataset_reader(tmp_path):
    # Spreadsheet and Windows tools start UTF-8 files with U+FEFF; json, csv and the TSV header would take it
    # for part of the first key or column name.
    for part in ("covid", "hv", "ph"):
        (tmp_path / part).mkdir()
    made = [_covid(tmp_path / "covid", {}),
            _healthver(tmp_path / "hv", "id,evidence,claim,label\n1,Masks filter.,Masks work.,Supports\n"),
            _politihop(tmp_path / "ph", '["S one."]', '{"0": ["0"]}')]
    for name, split, folder in made:
        files = [f for f in folder.rglob("*") if f.is_file()]
        before = datasets.get(name).read(split, folder)
        for f in files:
            f.write_bytes(b"\xef\xbb\xbf" + f.read_bytes())
        assert datasets.get(name).read(split, folder) == before, name


def test_a_bad_file_stops_the_cli_before_any_model_loads_and_writes_nothing(tmp_path):
    (tmp_path / "data").mkdir()
    name, split, folder = _covid(tmp_path / "data", {"evidence_set": [{"sent_index": 9}]})
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "run_debate.py", "--dataset", name, "--split", split, "--data-dir",
                           str(folder), "--model", str(tmp_path / "no-such-model"), "--output-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and not out.exists()
    # Everything that stops the run in one message (issue 54): the model path and the file's line, each named.
    lines = done.stderr.strip().splitlines()
    assert lines[0] == "error: 2 things stop this run before it starts:", done.stderr
    assert any("no-such-model" in line for line in lines[1:])
    assert any("line 1" in line and "past the end of abstract c1" in line for line in lines[1:])


@pytest.mark.parametrize("settings, message", [
    ({"dataset": "politihop", "evidence": "retrieved"}, "--evidence must be one of golden, ruling, none on politihop"),
    ({"dataset": "feverous", "split": "sample", "evidence": "golden"}, "--evidence must be one of none, retrieved"),
    ({"dataset": "check-covid", "split": "demo"}, "--split demo is AVeriTeC's"),
    ({"dataset": "fever"}, "--dataset must be one of"),
])
def test_a_condition_or_split_a_dataset_cannot_offer_is_refused(settings, message):
    from debate.pipeline import config

    with pytest.raises(config.ConfigError, match=message):
        config.build(model="m", **settings)


def test_defaults_follow_the_dataset():
    from debate.pipeline import config

    built = config.build(model="m", dataset="check-covid", split="test")
    assert built.data.evidence == "golden" and built.output.output_dir == "runs/check-covid-test-golden-debatecv"
    assert config.build(model="m").data.evidence == "retrieved"  # AVeriTeC's default, as before
    assert config.build(model="m", dataset="scifact", split="sample").data.evidence == "none"
