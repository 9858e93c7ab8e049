"""JSONL through jsonlines (debate/data/jsonl.py) and the run files on top of it (debate/pipeline/records.py)."""
import json
import os

import pytest

from debate.data import jsonl
from debate.pipeline import records

# Characters str.splitlines() takes for line ends; json.dumps(ensure_ascii=False) writes them as they are.
ODD = "a\u2028b\u0085c\x1cd\x0ce\rf"


def _record(claim_id, text="ok"):
    return {"transcript": {"claim_id": claim_id, "turns": [text]},
            "prediction": {"claim_id": claim_id, "label": "Refuted", "justification": text}}


def test_a_claim_is_durable_before_the_next_one_and_line_separators_inside_strings_survive(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(jsonl.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    writer = records.Writer(tmp_path)
    writer.write(_record(1, ODD))
    assert len(synced) == 2  # the transcript, then the prediction, each flushed to disk
    writer.write(_record(2))
    writer.close()
    assert len(synced) == 4
    predictions = records.read_predictions(tmp_path)
    assert [p["claim_id"] for p in predictions] == [1, 2] and predictions[0]["justification"] == ODD
    # A resume rewrites both files (orphans dropped) and reads them back the same.
    with records.RunDir(tmp_path, {"method": "debatecv"}) as run:
        assert run.done[1]["justification"] == ODD
    assert records.read_jsonl(tmp_path / records.TRANSCRIPTS)[0]["turns"] == [ODD]


def test_a_torn_last_line_is_cut_off_only_when_repairing(tmp_path):
    path = tmp_path / records.PREDICTIONS
    whole = "".join(json.dumps({"claim_id": i}) + "\n" for i in range(2))
    path.write_text(whole + '{"claim_id": 2, "lab')
    assert records.read_jsonl(path, repair=False) == [{"claim_id": 0}, {"claim_id": 1}]
    assert path.read_text().endswith('"lab')  # looking changed nothing
    assert records.read_jsonl(path) == [{"claim_id": 0}, {"claim_id": 1}]
    assert path.read_text() == whole


def test_a_bad_line_inside_a_run_file_names_the_file_and_line(tmp_path):
    path = tmp_path / records.PREDICTIONS
    path.write_text('{"claim_id": 0}\n\n{"claim_id": 1,}\n{"claim_id": 2}\n')
    with pytest.raises(records.RunConflict, match=r"predictions\.jsonl:3: not JSON \(Expecting property name"):
        records.read_jsonl(path)


def test_numbered_counts_blank_lines_and_keeps_null_for_the_caller(tmp_path):
    assert list(jsonl.numbered('{"a": 1}\n\n  \nnull\n[2]\n')) == [(1, {"a": 1}), (4, None), (5, [2])]
    path = tmp_path / "rows.jsonl"
    jsonl.write(path, [{"text": ODD}, [1, 2]])
    assert jsonl.read(path) == [{"text": ODD}, [1, 2]]
    assert path.read_text(encoding="utf-8").count("\n") == 2 and not list(tmp_path.glob("*.tmp"))
    with pytest.raises(jsonl.BadLine) as bad:
        list(jsonl.numbered('{"a": 1}\n{"a": \n'))
    assert bad.value.lineno == 2 and isinstance(bad.value.error, json.JSONDecodeError)
