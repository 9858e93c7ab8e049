"""The smaller things a new user met in the first hour (issue 54): the demo's `next:` line names every file written,
submission.json's predicted label cannot pass for the gold one, a misspelled key is named, an output folder that
refuses writes says --output-dir, and a skip names its test and DEBATECV_SHARED_DATA."""
import errno
import json

import pytest

from debate.data import claims as data
from debate.data.inputs import DataError
from debate.pipeline import preflight, records, scoring
from eval import averitec as scorer
from tests import tiny_models


def test_the_next_line_names_every_file_the_run_wrote(tmp_path):
    for name in records.RUN_FILES:
        (tmp_path / name).write_text("{}")
    line = scoring.next_step(tmp_path)
    assert all(name in line for name in ("config.json", "submission.json", "predictions.jsonl", "metrics.json"))
    (tmp_path / "submission.json").unlink()  # a dataset other than AVeriTeC writes none: the line does not claim it
    assert "submission.json" not in scoring.next_step(tmp_path)


def test_the_submission_holds_the_prediction_under_pred_label_only():
    claims = [{"claim_id": 0, "claim": "c", "label": "Refuted", "evidence": []}]
    rows = records.submission([{"claim_id": 0, "label": "Supported", "justification": "j"}], claims)
    assert rows[0]["pred_label"] == "Supported" and "label" not in rows[0]
    # An older submission.json with "label" only still scores as before.
    assert scorer._label_of({"label": "Refuted"}, "row 1") == "Refuted"


def test_a_misspelled_key_is_named_with_the_field_it_misses(tmp_path):
    with pytest.raises(DataError, match=r"missing field 'claim'; it has 'cliam': did you mean 'claim'\?"):
        data.required("f.jsonl", "line 3", {"claim_id": 1, "cliam": "x", "label": "Supported"}, "claim", str)
    with pytest.raises(DataError) as err:
        data.required("f.jsonl", "line 3", {"claim_id": 1, "text": "x"}, "claim", str)
    assert str(err.value) == "f.jsonl: line 3: missing field 'claim'"  # nothing near it: no guess


def test_a_write_refused_in_the_output_folder_suggests_output_dir(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=r"cannot write .*run/predictions.jsonl \(Read-only file system\); give "
                                         r"--output-dir DIR on a writable disk"):
        with preflight.writing_to(str(out)):
            raise OSError(errno.EROFS, "Read-only file system", str(out / "predictions.jsonl"))
    with pytest.raises(PermissionError):  # elsewhere (an input file), the OS's own error stands
        with preflight.writing_to(str(out)):
            raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "dev.json"))


def test_a_skip_for_missing_shared_data_names_the_test_and_the_variable(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/test_data.py::test_real_dev (call)")
    with pytest.raises(pytest.skip.Exception) as skipped:
        tiny_models.missing("no AVeriTeC dev split at /x", shared_data=True)
    reason = str(skipped.value)
    assert reason.startswith("tests/test_data.py::test_real_dev: no AVeriTeC dev split at /x")
    assert "set DEBATECV_SHARED_DATA" in reason
    assert "\n" not in reason  # one line in pytest's summary of skips


def test_a_stop_says_what_is_kept_and_what_restarts(tmp_path):
    from debate.pipeline import config, runner

    cfg = config.build(split="demo", model="m", output_dir=str(tmp_path))
    claims = [{"claim_id": k} for k in range(3)]
    assert runner.kept_and_resume(cfg, claims) == (f"0 claims written to {tmp_path}: nothing to resume",
                                                   "the 3 claims restart with the same command")
    (tmp_path / records.PREDICTIONS).write_text(json.dumps({"claim_id": 1, "label": "Supported"}) + "\n")
    assert runner.kept_and_resume(cfg, claims) == (
        f"1 of 3 claims written to {tmp_path}",
        "the same command resumes: the 2 claims not written restart from their first turn")
    over = config.build(split="demo", model="m", output_dir=str(tmp_path / "new"), overwrite=True)
    assert runner.kept_and_resume(over, claims) == (
        f"0 claims written to {tmp_path / 'new'}: nothing to resume (an earlier run there is put back as it was)",
        "the 3 claims restart with the same command")
    over = config.build(split="demo", model="m", output_dir=str(tmp_path), overwrite=True)
    assert runner.kept_and_resume(over, claims)[1] == ("the same command without --overwrite resumes; the 2 claims "
                                                       "not written restart from their first turn")
