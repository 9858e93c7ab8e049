"""A new user's first commands answer at once (issue 54): --help, a bad flag and every missing prerequisite are said
before torch or transformers is imported, a typo gets "did you mean", and everything missing comes in one message."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from debate.data.flags import Parser
from debate.pipeline import cli, preflight

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers")


def command(script, *flags, cwd):
    """Run `python -X importtime SCRIPT FLAGS` in `cwd` (no data there, no $DEBATECV_DATA): (exit code, stderr less
    the import-time lines, the top-level modules imported)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    env.pop("DEBATECV_DATA", None)
    done = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / script), *flags], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    said = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("import time:"))
    return done.returncode, said, imported


@pytest.mark.parametrize("script", ["run_debate.py", "train_moderator.py"])
def test_help_and_a_misspelled_flag_import_neither_torch_nor_transformers(script, tmp_path):
    code, _, imported = command(script, "--help", cwd=tmp_path)
    assert code == 0 and not set(HEAVY) & imported and "debate.data.flags" in imported
    code, said, imported = command(script, "--limt", "3", cwd=tmp_path)
    assert code == 2 and not set(HEAVY) & imported
    assert "unrecognized arguments: --limt 3; --limt: did you mean --limit?" in said


def test_a_dev_run_in_an_empty_folder_names_the_model_and_both_data_files_at_once(tmp_path):
    code, said, imported = command("run_debate.py", "--split", "dev", "--evidence", "retrieved", cwd=tmp_path)
    assert code == 2 and not set(HEAVY) & imported, said
    assert said.startswith("error: 3 things stop this run before it starts:")
    assert "no --model given" in said and "dev.json: no such split file" in said
    assert "dev.retrieved.hero.jsonl: no such retrieved-evidence file" in said


def test_training_dpo_in_an_empty_folder_names_the_model_and_the_syndec_file_at_once(tmp_path):
    code, said, imported = command("train_moderator.py", "--stage", "dpo", cwd=tmp_path)
    assert code == 2 and not set(HEAVY) & imported, said
    assert "no --model given" in said and "runs/syndec/syndec.jsonl: no such SynDeC file" in said
    assert "no D-SFT adapter at runs/syndec/sft/adapter" in said


def test_a_misspelled_choice_gets_the_nearest_one(capsys):
    parser = Parser(prog="p")
    parser.add_argument("--method", choices=("debatecv", "rag-cot"))
    with pytest.raises(SystemExit):
        parser.parse_args(["--method", "debatcv"])
    assert "; did you mean debatecv?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["--method", "zzz"])  # nothing near it: no guess
    assert "did you mean" not in capsys.readouterr().err


def test_a_given_model_path_that_is_not_there_is_said_with_the_data(tmp_path, capsys):
    """With --model given, a wrong path, a missing split and an unwritable output folder come in one message."""
    wrong = tmp_path / "no-such-model"
    flat = tmp_path / "file"
    flat.write_text("")
    with pytest.raises(SystemExit) as stop:
        cli.parse_run_args(["--split", "dev", "--data-dir", str(tmp_path), "--evidence", "golden", "--model",
                            str(wrong), "--output-dir", str(flat / "run")], check=preflight.problems)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("error: 3 things")
    assert f"--model {wrong}: no such file or directory" in err and "dev.json: no such split file" in err
    assert "cannot write here" in err and "give --output-dir DIR" in err


def test_an_unwritable_output_folder_suggests_output_dir(tmp_path, monkeypatch):
    assert preflight.output_problem(str(tmp_path / "a" / "b")) is None  # folders still to make, under a writable one
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path)  # tmp_path read-only (root ignores
    problem = preflight.output_problem(str(tmp_path / "a" / "b"))  # chmod, so the check is faked here)
    assert problem.startswith(f"{tmp_path / 'a' / 'b'}: cannot write here (its nearest existing folder {tmp_path} is")
    assert problem.endswith("give --output-dir DIR on a writable disk")
    assert "--out DIR" in preflight.output_problem(str(tmp_path), "--out")


def test_a_model_path_is_judged_from_the_file_system_alone(tmp_path):
    (tmp_path / "dir").mkdir()
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    (tmp_path / "m.gguf").write_bytes(b"GGUF\x03")
    (tmp_path / "m.bin").write_bytes(b"\x00\x01")
    assert preflight.model_problem(str(tmp_path / "hf"), "--model") is None
    assert preflight.model_problem(str(tmp_path / "m.gguf"), "--model") is None
    assert "not a model directory (no config.json)" in preflight.model_problem(str(tmp_path / "dir"), "--model")
    assert "not a GGUF file" in preflight.model_problem(str(tmp_path / "m.bin"), "--model")


def test_a_turn_too_short_for_the_json_answer_is_refused_from_the_tokenizer_before_any_weight_loads(
        tiny, tmp_path, capsys, monkeypatch):
    import run_debate
    from debate.engine import models

    def refuse(*args, **kwargs):
        raise AssertionError("weights loaded before the token budget was checked")

    monkeypatch.setattr(models, "load_roles", refuse)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        run_debate.main(["--split", "demo", "--model", tiny, "--max-new-tokens", "2", "--limit", "1",
                         "--output-dir", str(out)])
    assert stop.value.code == 2 and "--max-new-tokens 2 is too small for the JSON answer" in capsys.readouterr().err
    assert not out.exists()  # refused before the output directory was touched
