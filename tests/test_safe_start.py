"""A run checks everything before it touches its output directory or loads a weight, and never loses a finished run.

`--overwrite` with a bad path must leave the earlier run byte-identical; a start that fails must leave
nothing that blocks the corrected rerun; checks that need no weights must refuse before any is loaded.
"""
import json
import shutil
from pathlib import Path

import pytest

import run_debate
from debate.data import prompts
from debate.engine import errors, models
from debate.pipeline import progress, records
from tests.conftest import run_argv

ROOT = Path(__file__).resolve().parents[1]


def argv(model, out, *extra):
    return run_argv(model, out, *extra, batch_size=2, limit=2)


def snapshot(directory):
    """Every file under `directory`, hidden ones included, with its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(Path(directory).rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("finished") / "run"
    run_debate.main(argv(tiny, out))
    return out


@pytest.fixture
def copy(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


@pytest.fixture
def no_weights(monkeypatch):
    """A model loader that fails the test if anything tries to load weights."""
    def refuse(*args, **kwargs):
        pytest.fail("model weights were loaded before the run's checks had refused it")

    monkeypatch.setattr(models, "load_model", refuse)
    monkeypatch.setattr(models, "load_roles", refuse)


def refused(args, capsys, main=None):
    with pytest.raises(SystemExit) as stop:
        (main or run_debate.main)(args)
    assert stop.value.code == 2
    return capsys.readouterr().err


def test_overwrite_with_a_bad_model_path_leaves_the_finished_run_byte_identical(tiny, copy, tmp_path, capsys,
                                                                                 no_weights):
    before = snapshot(copy)
    missing = tmp_path / "nonexistent" / "path"
    err = refused(argv(str(missing), copy, "--overwrite"), capsys)
    assert str(missing) in err and "no such file" in err
    assert snapshot(copy) == before
    # Without --overwrite the same typo names the path too, not a settings conflict.
    err = refused(argv(str(missing), copy), capsys)
    assert "no such file" in err and "other settings" not in err
    assert snapshot(copy) == before


def test_overwrite_with_an_empty_adapter_dir_is_refused_before_weights_load(tiny, copy, tmp_path, capsys,
                                                                            no_weights):
    before = snapshot(copy)
    empty = tmp_path / "adapter"
    empty.mkdir()
    err = refused(argv(tiny, copy, "--overwrite", "--moderator-adapter", str(empty)), capsys)
    assert str(empty) in err and "adapter_config.json" in err
    assert snapshot(copy) == before


def test_overwrite_with_a_broken_prompt_or_bad_data_leaves_the_run(tiny, copy, tmp_path, capsys, monkeypatch,
                                                                   no_weights):
    before = snapshot(copy)
    broken = tmp_path / "prompts"
    shutil.copytree(prompts.PROMPT_DIR, broken)
    (broken / "moderator_round.txt").unlink()
    monkeypatch.setattr(prompts, "PROMPT_DIR", broken)
    err = refused(argv(tiny, copy, "--overwrite"), capsys)
    assert "moderator_round" in err
    assert snapshot(copy) == before
    monkeypatch.undo()
    monkeypatch.setattr(models, "load_roles", lambda *a, **k: pytest.fail("weights loaded"))
    err = refused(argv(tiny, copy, "--overwrite", "--split", "dev", "--data-dir", str(tmp_path / "nodata")), capsys)
    assert "nodata" in err
    assert snapshot(copy) == before


def test_overwrite_that_fails_before_its_first_claim_puts_the_old_run_back(tiny, copy, capsys, monkeypatch):
    before = snapshot(copy)

    def dies(self, record):
        raise KeyboardInterrupt("killed during the first claim")

    monkeypatch.setattr(records.Writer, "write", dies)
    with pytest.raises(KeyboardInterrupt):
        run_debate.main(argv(tiny, copy, "--overwrite", "--max-new-tokens", "3"))
    assert snapshot(copy) == before
    monkeypatch.undo()
    # Once the new run has written a claim the old one is gone, aside copy included.
    run_debate.main(argv(tiny, copy, "--overwrite", "--max-new-tokens", "3", "--limit", "1"))
    assert len(records.read_predictions(copy)) == 1 and not (copy / records.ASIDE).exists()
    assert json.loads((copy / records.CONFIG).read_text())["max_new_tokens"] == 3


def test_a_failed_start_leaves_nothing_that_blocks_the_corrected_rerun(tiny, tmp_path, monkeypatch):
    out = tmp_path / "run"

    def fails(*args, **kwargs):
        raise errors.ModelLoadError("out of memory while loading")

    monkeypatch.setattr(models, "load_roles", fails)
    with pytest.raises(SystemExit):
        run_debate.main(argv(tiny, out, "--max-new-tokens", "3"))
    assert not out.exists()
    monkeypatch.undo()
    run_debate.main(argv(tiny, out))
    assert len(records.read_predictions(out)) == 2

    # What an older version left after a failed start: a config and empty outputs. No claim was done, so
    # it is no run with other settings.
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / records.CONFIG).write_text(json.dumps({"method": "debatecv", "max_new_tokens": 99}))
    (stale / records.PREDICTIONS).write_text("")
    (stale / records.TRANSCRIPTS).write_text("")
    run_debate.main(argv(tiny, stale))
    assert len(records.read_predictions(stale)) == 2


def test_a_resume_with_nothing_to_do_keeps_config_json(finished, tiny, capsys, no_weights):
    config = (finished / records.CONFIG).read_bytes()
    assert json.loads(config)["models"]
    run_debate.main(argv(tiny, finished))
    assert (finished / records.CONFIG).read_bytes() == config


def test_config_names_only_the_roles_used_and_the_precision_in_effect(finished):
    config = json.loads((finished / records.CONFIG).read_text())
    assert config["debater_model"] and config["moderator_model"]
    for unused in ("judge_models", "defense_model", "refine_model", "top_k", "corpus", "voters", "madr_iterations"):
        assert unused not in config
    assert set(config["models"]) == {"affirmative", "negative", "moderator"}
    assert config["use_4bit"] is False and config["precision"] == config["dtype"] == "float32"  # a CPU run


def test_an_older_config_that_asked_for_4bit_on_cpu_still_resumes(finished, tiny, tmp_path):
    out = tmp_path / "old"
    shutil.copytree(finished, out)
    config = json.loads((out / records.CONFIG).read_text())
    config["use_4bit"] = True  # what configs said before they recorded the precision really used
    config["judge_models"] = [tiny] * 3
    (out / records.CONFIG).write_text(json.dumps(config))
    run_debate.main(argv(tiny, out, "--limit", "3"))
    assert len(records.read_predictions(out)) == 3


def test_a_run_resumed_in_another_dtype_is_told_apart_and_one_in_its_own_goes_on(finished, tiny, tmp_path, capsys):
    """A run directory's claims were decoded in one dtype: resumed under another (a default that changed, or --dtype)
    it stops in one line naming both; --dtype set to the saved one resumes. An older config (no dtype of its own)
    says its dtype as its precision."""
    saved = json.loads((finished / records.CONFIG).read_text())["dtype"]
    other = "float16" if saved != "float16" else "float32"
    out = tmp_path / "resumed"
    shutil.copytree(finished, out)
    with pytest.raises(SystemExit):
        run_debate.main(argv(tiny, out, "--limit", "3", "--dtype", other))
    err = capsys.readouterr().err
    assert f"dtype: '{saved}' -> '{other}'" in err and "--overwrite" in err
    old = json.loads((out / records.CONFIG).read_text())
    del old["dtype"]  # as configs said before --dtype: the precision alone
    (out / records.CONFIG).write_text(json.dumps(old))
    with pytest.raises(SystemExit):
        run_debate.main(argv(tiny, out, "--limit", "3", "--dtype", other))
    assert f"dtype: '{saved}' -> '{other}'" in capsys.readouterr().err
    run_debate.main(argv(tiny, out, "--limit", "3", "--dtype", saved))
    assert len(records.read_predictions(out)) == 3


def test_a_cpu_run_stays_float32_and_says_when_bf16_would_be_faster(tmp_path, monkeypatch):
    flags = tmp_path / "cpuinfo"
    flags.write_text("processor : 0\nflags : fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n")
    assert models.native_bf16(str(flags))
    flags.write_text("processor : 0\nflags : fpu sse2 avx2 avx512f avx512_vnni\n")
    assert not models.native_bf16(str(flags))
    assert not models.native_bf16(str(tmp_path / "none"))  # an OS that does not say
    info = {"moderator": {"device": "cpu", "precision": "float32"}}
    for native in (True, False):
        monkeypatch.setattr(models, "native_bf16", lambda: native)
        assert models.run_dtype(device="cpu") == "float32"  # the seed's records hold at any batch size
        assert models.run_dtype("bfloat16", device="cpu") == "bfloat16"  # --dtype wins
        hint = models.bf16_hint(info)
        assert (hint is not None) == native and (not native or "--dtype bfloat16" in hint)
    assert models.bf16_hint({"moderator": {"device": "cpu", "precision": "bfloat16"}}) is None


def test_progress_estimates_time_left_from_turns():
    now = [0.0]
    with progress.ClaimBar(total=4, desc="t", turns_hint=4, clock=lambda: now[0]) as bar:
        assert bar.eta() is None
        now[0] = 10.0
        bar.turn(2)  # two claims in progress spoke once: 2 claim-turns in 10 s
        # At most 4 turns a claim: 16 for the four claims, 2 spoken, at 0.2 turn/s.
        assert bar.eta() == pytest.approx(70.0)
        now[0] = 30.0
        bar.turn(3)
        bar.claim_done(2)
        bar.claim_done(2)
        # Measured: 2 turns a claim; the two claims left take 4, one of them spoken, at 5 turns / 30 s.
        assert bar.turns_per_claim() == 2 and bar.eta() == pytest.approx(18.0)


# --- train_moderator.py: the same rules for its stages --------------------------------------------

@pytest.fixture
def finished_training(tiny, tmp_path):
    """An OUT whose synth, correct and sft stages are done: SynDeC files and a D-SFT adapter."""
    from tests import syndec_task
    from tests.tiny_models import build_random_lora
    from train import stages, syndec

    out = tmp_path / "syndec"
    p = stages.paths(out)
    out.mkdir()
    rows = syndec_task.records(4) + syndec_task.records(2, start=4, wrong=True)
    syndec.write(p["syndec"], rows)
    syndec.write(p["corrected"], rows)
    p["corrections"].write_text("")
    build_random_lora(tiny, str(p["sft"] / "adapter"))
    return out


def train_argv(tiny, out, *extra):
    return ["--model", tiny, "--out", str(out), "--max-new-tokens", "4", "--lora-r", "4", "--lora-alpha", "8",
            "--epochs", "1", "--no-structured", *extra]


def test_train_overwrite_with_a_bad_path_leaves_finished_stages_byte_identical(tiny, finished_training, tmp_path,
                                                                               capsys, no_weights):
    import train_moderator

    before = snapshot(finished_training)
    empty = tmp_path / "empty-adapter"
    empty.mkdir()
    for extra in (["--stage", "sft", "--init-adapter", str(empty)],
                  ["--stage", "dpo", "--sft-adapter", str(empty)],
                  ["--stage", "all", "--debater-model", str(tmp_path / "typo")],
                  ["--stage", "correct", "--corrector-model", str(tmp_path / "typo")]):
        err = refused(train_argv(tiny, finished_training, "--overwrite", *extra), capsys, train_moderator.main)
        assert str(tmp_path) in err, extra
        assert snapshot(finished_training) == before, extra
    # Nothing is created for a run that cannot start.
    refused(train_argv(str(tmp_path / "typo"), tmp_path / "new", "--stage", "sft"), capsys, train_moderator.main)
    assert not (tmp_path / "new").exists()


def test_train_overwrite_that_fails_puts_the_finished_stage_back(tiny, finished_training, capsys, monkeypatch):
    import train_moderator
    from train import lora

    before = snapshot(finished_training)

    def dies(*args, **kwargs):
        raise errors.ModelLoadError("out of memory")

    monkeypatch.setattr(lora, "load_trainable", dies)
    refused(train_argv(tiny, finished_training, "--overwrite", "--stage", "sft"), capsys, train_moderator.main)
    assert snapshot(finished_training) == before


def test_train_config_records_the_precision_and_keeps_its_models(tiny, tmp_path):
    import train_moderator
    from tests import syndec_task
    from train import stages, syndec

    out = tmp_path / "syndec"
    out.mkdir()
    syndec.write(stages.paths(out)["syndec"], syndec_task.records(3))  # all right: no Corrector turn to load
    train_moderator.main(train_argv(tiny, out, "--stage", "correct"))
    path = out / "train_config.json"
    config = json.loads(path.read_text())
    assert config["use_4bit"] is False and config["precision"] == "float32"
    assert config["models"]["correct"]["corrector"]["path"] == str(Path(tiny).resolve())
    assert config["stages_run"] == ["correct"]
    kept = path.read_bytes()
    train_moderator.main(train_argv(tiny, out, "--stage", "correct"))  # done already: skipped
    assert path.read_bytes() == kept


# --- help and errors ------------------------------------------------------------------------------

def parsers():
    import train_moderator
    from debate.pipeline import cli, geval_run
    from eval import averitec, compare

    return {"run_debate.py": cli.run_parser(), "train_moderator.py": train_moderator.build_parser(),
            "eval.compare": compare.build_parser(), "eval.averitec": averitec.build_parser(),
            "debatecv-geval": geval_run.build_parser()}


@pytest.mark.parametrize("name", ["run_debate.py", "train_moderator.py", "eval.compare", "eval.averitec",
                                  "debatecv-geval"])
def test_help_shows_every_default(name):
    from debate.pipeline.cli import HelpFormatter

    parser = parsers()[name]
    formatter = HelpFormatter(parser.prog)
    for action in parser._actions:
        if action.nargs == 0 or action.required or not action.option_strings:
            continue  # switches, required flags and positionals have no default to show
        text = formatter._get_help_string(action) or ""
        assert "default" in text, f"{name} {action.option_strings[0]}: {text!r}"
        if action.default is not None and "default:" in text and "%(default)" not in text:
            assert str(action.default).split(".")[0] in text or isinstance(action.default, (list, tuple))
    shown = parser.format_help()
    if name == "run_debate.py":
        assert "(default: 8, ours)" in shown and "(default: 3, PROClaim's)" in shown
    if name == "train_moderator.py":
        assert "(default: 128, the paper's)" in shown and "(default: 2e-05, the paper's)" in shown


def test_a_bad_flag_prints_one_line_and_a_pointer_to_help(capsys):
    with pytest.raises(SystemExit) as stop:
        run_debate.parse_args(["--split", "demo", "--batch-size", "0"])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.splitlines() == ["error: --batch-size must be at least 1",
                                "(see `run_debate.py --help` for every flag and its default)"]


def test_every_prompt_the_code_names_is_checked_up_front():
    import re

    named = set()
    for path in [*ROOT.glob("debate/*.py"), *ROOT.glob("train/*.py")]:
        named |= set(re.findall(r'(?:render|load_prompt|raw_prompt)\("([a-z_]+)"', path.read_text()))
    # Names the code builds from a side: counsel_stance_<side>, counsel_instruction_<side>.
    named |= {f"counsel_{kind}_{side}" for kind in ("stance", "instruction") for side in ("plaintiff", "defense")}
    assert named <= set(prompts.NAMES)
    assert {p.stem for p in prompts.PROMPT_DIR.glob("*.txt")} == set(prompts.NAMES)


def test_json_errors_read_as_english():
    from debate.data import claims as data

    with pytest.raises(json.JSONDecodeError) as bad:
        json.loads('{"a": "x')
    assert data.json_problem(bad.value) == "Unterminated string starting at column 7"
    with pytest.raises(json.JSONDecodeError) as bad:
        json.loads('{"a": ')
    assert data.json_problem(bad.value) == "Expecting value at column 7"


def test_an_overwrite_killed_before_its_first_claim_leaves_the_run_to_a_plain_rerun(tiny, copy, no_weights):
    """SIGKILL leaves no chance to clean up: the earlier run is aside and the new start's empty files on top."""
    before = snapshot(copy)
    aside = copy / records.ASIDE
    aside.mkdir()
    for name in records.RUN_FILES:
        if (copy / name).exists():
            (copy / name).rename(aside / name)
    (copy / records.CONFIG).write_text(json.dumps({"method": "debatecv", "max_new_tokens": 3}))
    (copy / records.PREDICTIONS).write_text("")
    run_debate.main(argv(tiny, copy))  # every claim is done in the run aside: nothing to load
    after = snapshot(copy)
    assert records.ASIDE not in "".join(after) and after[records.PREDICTIONS] == before[records.PREDICTIONS]
    assert after[records.CONFIG] == before[records.CONFIG]


def test_a_bad_courtroom_corpus_is_refused_before_any_model_loads(tiny, tmp_path, capsys, monkeypatch, no_weights):
    from debate.engine import retrieval

    monkeypatch.setattr(retrieval, "load_embedder", lambda *a, **k: pytest.fail("the encoder was loaded"))
    corpus = tmp_path / "passages.jsonl"
    corpus.write_text(json.dumps({"id": "p1"}) + "\n")
    err = refused(argv(tiny, tmp_path / "run", "--method", "courtroom", "--corpus", str(corpus)), capsys)
    assert f"{corpus}: line 1: missing field 'text'" in err and not (tmp_path / "run").exists()


def test_a_missing_hero_file_says_where_to_get_it_and_what_runs_without_it(tmp_path, capsys, no_weights):
    entry = {"claim": "The sky is green.", "label": "Refuted", "justification": "No.",
             "questions": [{"question": "What colour is the sky?", "answers": [{"answer": "Blue.",
                                                                                 "answer_type": "Abstractive"}]}]}
    (tmp_path / "dev.json").write_text(json.dumps([entry]))
    model = tmp_path / "m"  # a model folder as far as the file system can tell (no weights load here)
    model.mkdir()
    (model / "config.json").write_text("{}")
    err = refused(["--split", "dev", "--data-dir", str(tmp_path), "--model", str(model)], capsys)  # retrieved: default
    assert err.startswith(f"error: {tmp_path / 'dev.retrieved.hero.jsonl'}: no such retrieved-evidence file")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for fix in ("get dev.retrieved.hero.jsonl", "ssu-humane/HerO", f"into {tmp_path}", "--evidence golden",
                "--knowledge-store DIR"):
        assert fix in err
    given = tmp_path / "mine.jsonl"
    err = refused(["--split", "dev", "--data-dir", str(tmp_path), "--model", str(model), "--retrieved-file",
                   str(given)], capsys)
    assert f"{given}: no such retrieved-evidence file (--retrieved-file)" in err and "--evidence golden" in err


def test_the_demo_says_it_has_no_retrieved_evidence_only_when_it_is_asked_for(capsys):
    from debate.pipeline import cli

    assert cli.parse_run_args(["--split", "demo", "--model", "m"]).data.evidence == "golden"
    assert capsys.readouterr().out == ""
    assert cli.parse_run_args(["--split", "demo", "--model", "m", "--evidence", "retrieved"]).data.evidence == "golden"
    assert capsys.readouterr().out.startswith("the demo set has no retrieved evidence")


def test_the_models_line_names_each_model_and_its_precision():
    info = {"affirmative": {"path": "/m/Llama-3.1-8B-Instruct/", "precision": "nf4", "device": "cuda:0"},
            "negative": {"path": "/m/Llama-3.1-8B-Instruct", "precision": "nf4", "device": "cuda:0"},
            "moderator": {"path": "/m/Qwen2.5-7B", "adapter": "runs/syndec/dpo/adapter", "precision": "bfloat16",
                          "device": "cuda:0"}}
    assert models.precision_line(info) == ("Llama-3.1-8B-Instruct nf4 on cuda:0: affirmative, negative; "
                                           "Qwen2.5-7B + adapter dpo/adapter bfloat16 on cuda:0: moderator")
