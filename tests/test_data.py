"""Data loading and evidence conditions: hand-made AVeriTeC-shaped files, bad files, and the real dev split."""
import collections
import hashlib
import json
from pathlib import Path

import pytest

from debate.data.averitec import NO_ANSWER, load_split, resolve_data_dir, retrieved_path
from debate.data.claims import attach_evidence, load_retrieved
from debate.data.inputs import DataError
from debate.data.labels import CEC, LABELS, NEE, REFUTED, SUPPORTED
from tests.tiny_models import averitec_dir, missing

SHARED = averitec_dir()


def answer(text, url="https://example.org/a", kind="Abstractive", **extra):
    return {"answer": text, "answer_type": kind, "source_url": url, **extra}


def entry(claim="The sky is green.", label="Refuted", questions=None, **extra):
    if questions is None:
        questions = [{"question": "What colour is the sky?", "answers": [answer("Blue.")]}]
    return {"claim": claim, "label": label, "justification": "Because.", "questions": questions, **extra}


def write_split(tmp_path, entries, split="dev"):
    (tmp_path / f"{split}.json").write_text(json.dumps(entries))
    return tmp_path


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --- golden evidence extraction ----------------------------------------------------------------

def test_golden_evidence_one_item_per_answer_with_boolean_and_unanswered(tmp_path):
    questions = [
        {"question": "Q1?", "answers": [answer("First.", "https://example.org/1"),
                                        answer("Second.", "https://example.org/2")]},
        {"question": "Q2?", "answers": [answer("No", "https://example.org/3", kind="Boolean",
                                               boolean_explanation="The record shows otherwise.")]},
        {"question": "Q3?", "answers": []},
        {"question": "Q4?"},
        {"question": "Q5?", "answers": [{"answer": NO_ANSWER, "answer_type": "Unanswerable",
                                         "source_url": "", "source_medium": ""}]},
    ]
    [claim] = load_split("dev", write_split(tmp_path, [entry(questions=questions)]))
    assert claim["claim_id"] == 0 and claim["label"] == REFUTED and claim["justification"] == "Because."
    assert claim["gold_evidence"] == [
        {"question": "Q1?", "answer": "First.", "url": "https://example.org/1"},
        {"question": "Q1?", "answer": "Second.", "url": "https://example.org/2"},
        {"question": "Q2?", "answer": "No. The record shows otherwise.", "url": "https://example.org/3",
         "boolean": {"answer": "No", "explanation": "The record shows otherwise."}},
        {"question": "Q3?", "answer": NO_ANSWER, "url": ""},
        {"question": "Q4?", "answer": NO_ANSWER, "url": ""},
        {"question": "Q5?", "answer": NO_ANSWER, "url": ""},
    ]
    assert claim["evidence"] == claim["gold_evidence"]


def test_claim_id_is_position_unless_given(tmp_path):
    claims = load_split("dev", write_split(tmp_path, [entry(), entry(claim_id="abc-7"), entry()]))
    assert [c["claim_id"] for c in claims] == [0, "abc-7", 2]


@pytest.mark.parametrize("raw,label", [
    ("Supported", SUPPORTED), ("refuted", REFUTED), ("NOT ENOUGH EVIDENCE", NEE),
    ("Not  enough evidence", NEE), ("Conflicting Evidence/Cherrypicking", CEC),
    ("Conflicting Evidence/Cherry-picking", CEC), ("Cherry-picking", CEC), ("conflicting evidence", CEC),
])
def test_label_variants_are_canonicalised(tmp_path, raw, label):
    [claim] = load_split("dev", write_split(tmp_path, [entry(label=raw)]))
    assert claim["label"] == label


def test_test_split_may_lack_labels_and_questions(tmp_path):
    write_split(tmp_path, [{"claim": "Unlabelled claim."}, entry(label=None)], split="test")
    claims = load_split("test", tmp_path)
    assert [c["label"] for c in claims] == [None, None]
    assert claims[0]["gold_evidence"] == [] and claims[0]["justification"] is None


# --- errors name the file, the entry and the field -----------------------------------------------

@pytest.mark.parametrize("bad,where,field", [
    ({"label": "Refuted", "questions": []}, "entry 1", "'claim'"),
    (entry(label=None), "entry 1", "'label'"),
    (entry(label="Mostly True"), "entry 1", "'label'"),
    ({"claim": "x", "label": "Refuted"}, "entry 1", "'questions'"),
    (entry(claim=42), "entry 1", "'claim'"),
    (entry(questions={"question": "Q?"}), "entry 1", "'questions'"),
    (entry(questions=[{"answers": []}]), "entry 1", "'questions[0].question'"),
    (entry(questions=[{"question": "Q?", "answers": [{"answer_type": "Abstractive"}]}]), "entry 1",
     "'questions[0].answers[0].answer'"),
    (entry(questions=[{"question": "Q?", "answers": [answer(3)]}]), "entry 1", "'questions[0].answers[0].answer'"),
    (entry(questions=[{"question": "Q?", "answers": [answer("A", url=["u"])]}]), "entry 1",
     "'questions[0].answers[0].source_url'"),
    (entry(claim_id=True), "entry 1", "'claim_id'"),
    (entry(justification=5), "entry 1", "'justification'"),
])
def test_bad_entries_name_file_entry_and_field(tmp_path, bad, where, field):
    write_split(tmp_path, [entry(), bad])
    with pytest.raises(DataError) as err:
        load_split("dev", tmp_path)
    message = str(err.value)
    assert str(tmp_path / "dev.json") in message and where in message and field in message


def test_entry_with_claim_id_is_named_by_it(tmp_path):
    write_split(tmp_path, [entry(claim_id=77, label="Probably")])
    with pytest.raises(DataError, match=r"entry 0 \(claim_id 77\): field 'label': unknown label 'Probably' \(expected"):
        load_split("dev", tmp_path)


def test_not_json_names_file_and_line(tmp_path):
    (tmp_path / "dev.json").write_text('[\n{"claim": "x",\n  "label": }\n]')
    with pytest.raises(DataError, match=r"dev\.json: line 3: not valid JSON"):
        load_split("dev", tmp_path)


def test_split_that_is_not_a_list(tmp_path):
    write_split(tmp_path, {"claim": "x"})
    with pytest.raises(DataError, match=r"dev\.json: top level: expected a JSON list"):
        load_split("dev", tmp_path)


def test_missing_split_file_says_where_and_that_averitec_is_not_shipped(tmp_path):
    with pytest.raises(DataError) as err:
        load_split("dev", tmp_path / "nowhere")
    message = str(err.value)
    assert str(tmp_path / "nowhere" / "dev.json") in message
    assert "not shipped" in message and "--data-dir" in message


def test_resolve_data_dir_order(monkeypatch, tmp_path):
    monkeypatch.delenv("DEBATECV_DATA", raising=False)
    assert resolve_data_dir(None) == Path("data/averitec")
    monkeypatch.setenv("DEBATECV_DATA", str(tmp_path))
    assert resolve_data_dir(None) == tmp_path
    assert resolve_data_dir("elsewhere") == Path("elsewhere")


# --- what every reader of a user's file must take: ids, byte-order marks, an empty split ---------------

def test_a_claim_id_given_twice_is_refused_naming_both_entries(tmp_path):
    write_split(tmp_path, [entry(claim_id=5), entry(claim_id=6), entry(claim_id="5")])
    with pytest.raises(DataError) as err:
        load_split("dev", tmp_path)
    assert str(err.value) == (f"{tmp_path / 'dev.json'}: entry 2 (claim_id 5): field 'claim_id': '5' is already the "
                              "id of entry 0 (claim_id 5); every claim needs its own id (resume and the scorer key "
                              "on it)")
    # An entry without an id is named by its position: an explicit id equal to another's position is taken too.
    write_split(tmp_path, [entry(), entry(claim_id=0)])
    with pytest.raises(DataError, match=r"entry 1 \(claim_id 0\): .* already the id of entry 0 \(claim_id 0\)"):
        load_split("dev", tmp_path)


def with_bom(path, text):
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))  # what spreadsheet and Windows tools write
    return path


def test_every_reader_of_a_users_file_takes_a_utf8_byte_order_mark(tmp_path):
    from debate.data import prompts
    from debate.engine import retrieval
    from eval import averitec
    from tests import syndec_task
    from train import syndec

    with_bom(tmp_path / "dev.json", json.dumps([entry(claim="Ça alors."), entry()]))
    claims = load_split("dev", tmp_path)
    assert [c["claim"] for c in claims] == ["Ça alors.", "The sky is green."]
    rows = [{"claim_id": i, "evidence": [{"question": "q", "answer": "a", "url": ""}]} for i in range(2)]
    for name, text in (("r.jsonl", "".join(json.dumps(r) + "\n" for r in rows)), ("r.json", json.dumps(rows))):
        assert attach_evidence(claims, "retrieved", with_bom(tmp_path / name, text))[1]["evidence"][0]["answer"] == "a"
    corpus = with_bom(tmp_path / "corpus.jsonl", json.dumps({"id": "p1", "text": "A passage."}) + "\n")
    assert retrieval.load_corpus(corpus)[0]["id"] == "p1"
    mine = tmp_path / "prompts"
    mine.mkdir()
    shipped = (prompts.PROMPT_DIR / "moderator_round.txt").read_text(encoding="utf-8")
    with_bom(mine / "moderator_round.txt", shipped)
    with prompts.using(prompts.checked_set(mine)) as mine_set:
        # The same text as the shipped file: the same hash (the run's identity), and no U+FEFF reaches the model.
        digest = mine_set.info()["files"]["moderator_round"]
        assert digest == hashlib.sha256(shipped.rstrip("\n").encode()).hexdigest()
        assert prompts.raw_prompt("moderator_round") == shipped.rstrip("\n")
    records = syndec_task.records(2)
    assert syndec.load(with_bom(tmp_path / "s.jsonl", "".join(json.dumps(r) + "\n" for r in records))) == records
    predictions = with_bom(tmp_path / "p.json", json.dumps([{"claim_id": 0, "pred_label": "Refuted"}]))
    assert averitec.read_records(predictions)[0][1]["pred_label"] == "Refuted"


def test_an_empty_split_is_one_line_before_anything_is_written(tmp_path, capsys):
    import run_debate

    write_split(tmp_path, [])
    model = tmp_path / "m"  # a model folder as far as the file system can tell: the split is the one problem
    model.mkdir()
    (model / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as stop:
        run_debate.main(["--split", "dev", "--data-dir", str(tmp_path), "--model", str(model), "--evidence", "golden",
                         "--output-dir", str(tmp_path / "run")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err == f"error: --split dev of averitec (in {tmp_path}): the split holds no claims; nothing to verify\n"
    assert not (tmp_path / "run").exists()


# --- evidence conditions ----------------------------------------------------------------------

def two_claims(tmp_path):
    return load_split("dev", write_split(tmp_path, [entry(), entry(claim="Water is dry.")]))


def test_golden_and_none_conditions(tmp_path):
    claims = two_claims(tmp_path)
    golden = attach_evidence(claims, "golden")
    assert [c["evidence"] for c in golden] == [c["gold_evidence"] for c in claims]
    none = attach_evidence(claims, "none")
    assert [c["evidence"] for c in none] == [[], []]
    assert claims[0]["evidence"] != []  # the input records are left alone
    with pytest.raises(DataError, match="unknown evidence condition 'silver'"):
        attach_evidence(claims, "silver")


@pytest.mark.parametrize("fmt", ["jsonl", "json"])
def test_retrieved_condition_joins_by_claim_id(tmp_path, fmt):
    claims = two_claims(tmp_path)
    rows = [{"claim_id": "1", "claim": "Water is dry.", "evidence": [{"question": "q", "answer": "a", "url": "u"}]},
            {"claim_id": 0, "evidence": []}, {"claim_id": 99, "evidence": []}]
    path = tmp_path / f"r.{fmt}"
    write_jsonl(path, rows) if fmt == "jsonl" else path.write_text(json.dumps(rows, indent=1))
    out = attach_evidence(claims, "retrieved", path)
    assert out[0]["evidence"] == [] and out[1]["evidence"] == [{"question": "q", "answer": "a", "url": "u"}]
    assert out[1]["gold_evidence"] == claims[1]["gold_evidence"]


def test_retrieved_missing_claims_are_counted_and_listed(tmp_path):
    claims = load_split("dev", write_split(tmp_path, [entry() for _ in range(8)]))
    path = write_jsonl(tmp_path / "r.jsonl", [{"claim_id": 2, "evidence": []}])
    with pytest.raises(DataError) as err:
        attach_evidence(claims, "retrieved", path)
    message = str(err.value)
    assert str(path) in message and "7 of 8 claims" in message and "first: 0, 1, 3, 4, 5" in message


@pytest.mark.parametrize("lines,where,field", [
    (['{"claim_id": 0, "evidence": []}', '{"claim_id": 1, "evidence": [}'], "line 2", "not valid JSON"),
    (['{"claim_id": 0, "evidence": []}', '', '{"evidence": []}'], "line 3", "'claim_id'"),
    (['{"claim_id": 4}'], "line 1 (claim_id 4)", "'evidence'"),
    (['{"claim_id": 4, "evidence": {"question": "q"}}'], "line 1 (claim_id 4)", "'evidence'"),
    (['{"claim_id": 4, "evidence": [{"question": "q", "answer": "a"}]}'], "line 1 (claim_id 4)", "'evidence[0].url'"),
    (['{"claim_id": 4, "evidence": [{"question": "q", "answer": 1, "url": "u"}]}'], "line 1 (claim_id 4)",
     "'evidence[0].answer'"),
    (['{"claim_id": 4, "evidence": []}', '{"claim_id": "4", "evidence": []}'], "line 2 (claim_id 4)",
     "duplicate, first seen at line 1"),
    (['[1, 2]'], "entry 0", "expected a JSON object"),
])
def test_bad_retrieved_file_names_file_line_and_field(tmp_path, lines, where, field):
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as err:
        load_retrieved(path)
    message = str(err.value)
    assert str(path) in message and where in message and field in message


def test_missing_retrieved_file(tmp_path):
    with pytest.raises(DataError, match="no such retrieved-evidence file"):
        attach_evidence(two_claims(tmp_path), "retrieved", tmp_path / "absent.jsonl")


def user_data(tmp_path, lines):
    """--dataset jsonl's folder: dev.jsonl of `lines` (text) with a two-label card.json."""
    (tmp_path / "dev.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    (tmp_path / "card.json").write_text(json.dumps({"labels": [{"label": "True", "definition": "d"},
                                                               {"label": "False", "definition": "e"}]}))
    return tmp_path


@pytest.mark.parametrize("item, says", [
    ({"txt": "A passage.", "url": "u"}, "field 'evidence[0]': unknown field 'txt'; an evidence item is a "
                                        "question-answer pair {question, answer, url} or a passage {text, url}"),
    ({"question": "q", "answr": "a", "url": "u"}, "field 'evidence[0]': unknown field 'answr'; an evidence item is"),
    ({"question": "q", "url": "u"}, "missing field 'evidence[0].answer' (an evidence item is"),
    ({"text": 3}, "field 'evidence[0].text': expected a string, got a number"),
])
def test_an_evidence_item_of_neither_shape_names_its_unknown_field_and_the_expected_ones(tmp_path, item, says):
    """A misspelled `text` is the item's fault, named as written, not a pair's missing 'question' (issue 49)."""
    from debate.data import userdata

    path = write_jsonl(tmp_path / "r.jsonl", [{"claim_id": 0, "evidence": [item]}])
    with pytest.raises(DataError) as err:
        load_retrieved(path)
    assert str(err.value).startswith(f"{path}: line 1 (claim_id 0): {says}")
    row = json.dumps({"claim_id": "c1", "claim": "c", "label": "True", "evidence": [item]})
    with pytest.raises(DataError) as err:
        userdata.load_split("dev", user_data(tmp_path, [row]))
    assert str(err.value).startswith(f"{tmp_path / 'dev.jsonl'}: line 1 (claim_id c1): {says}")


def test_a_line_cut_short_is_named_at_its_end_not_at_column_1_of_the_next(tmp_path):
    from debate.data import userdata

    good = json.dumps({"claim_id": 1, "claim": "c", "label": "True"})
    cut = '{"claim_id": 2, "claim": "c", "label": "True"'  # no closing brace: the fault is just past the last quote
    with pytest.raises(DataError) as err:
        userdata.load_split("dev", user_data(tmp_path, [good, cut, good]))
    assert f"line 2: not valid JSON (Expecting ',' delimiter at column {len(cut) + 1} (the end of the line: is it " \
        "cut short?))" in str(err.value)
    # A fault inside a line keeps its own column, with no word about the end.
    with pytest.raises(DataError, match=r"line 1: not valid JSON \(Expecting ',' delimiter at column 16\)$"):
        userdata.load_split("dev", user_data(tmp_path, ['{"claim_id": 1 "claim": "c"}']))


# --- the embedded demo set ----------------------------------------------------------------------

def test_demo_set_loads_from_the_package_and_covers_every_label(tmp_path):
    claims = load_split("demo", tmp_path / "ignored")
    counts = collections.Counter(c["label"] for c in claims)
    assert set(counts) == set(LABELS) and min(counts.values()) >= 2
    for c in claims:
        assert 2 <= len(c["gold_evidence"]) <= 4 and c["justification"]
        assert all(e["url"].startswith("https://example.org/") for e in c["gold_evidence"])


def test_demo_retrieved_condition_uses_golden_evidence():
    claims = load_split("demo")
    assert retrieved_path("demo") is None
    out = attach_evidence(claims, "retrieved", retrieved_path("demo"))
    assert [c["evidence"] for c in out] == [c["gold_evidence"] for c in claims]


# --- the real AVeriTeC dev split -------------------------------------------------------------------

def test_real_dev_split_labels_and_retrieved_join():
    if not (SHARED / "dev.json").is_file():
        missing(f"no AVeriTeC dev split at {SHARED}", shared_data=True)
    claims = load_split("dev", SHARED)
    assert len(claims) == 500
    assert collections.Counter(c["label"] for c in claims) == {REFUTED: 305, SUPPORTED: 122, CEC: 38, NEE: 35}
    assert all(c["gold_evidence"] for c in claims)
    out = attach_evidence(claims, "retrieved", retrieved_path("dev", SHARED))
    assert len(out) == 500 and all(1 <= len(c["evidence"]) <= 10 for c in out)
    assert out[0]["claim"] == claims[0]["claim"] and out[0]["evidence"] != claims[0]["gold_evidence"]
