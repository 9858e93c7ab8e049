"""train_moderator.py end to end on the demo claims, the Corrector, and clear errors on bad input."""
import contextlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import run_debate
import train_moderator
from debate.data.labels import REFUTED, SUPPORTED
from debate.engine import engine
from debate.pipeline import progress, records
from tests import syndec_task
from tests.test_run import responses
from tests.tiny_models import build_tiny_llama
from train import corrector, loop, stages, syndec

TINY_TRAIN = ["--max-new-tokens", "8", "--max-rounds", "2", "--lora-r", "8", "--lora-alpha", "16", "--lr", "5e-3",
              "--epochs", "1", "--grad-accum", "2", "--save-every", "2", "--temperature", "0", "--no-structured"]


@pytest.fixture(scope="module")
def trained(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("syndec")
    args = train_moderator.parse_args(["--stage", "all", "--split", "demo", "--model", tiny, "--out", str(out),
                                       "--sft-include-corrected", *TINY_TRAIN])
    with said() as log:
        stages.run(args)
    return out, log


@contextlib.contextmanager
def said():
    """The lines the stages log (the `train` loggers) and their synth stage's run logs (the `debate` loggers), at
    INFO, as train_moderator.py prints them."""
    lines = []
    with progress.lines(lines.append, lines.append, logger="train"), progress.lines(lines.append, lines.append):
        yield lines


def test_all_stages_write_records_corrections_and_two_adapters(trained):
    out, log = trained
    rows = syndec.load(out / "syndec.jsonl")
    assert sorted(r["claim_id"] for r in rows) == list(range(8))
    for r in rows:
        assert r["debate"] and r["gold_label"] and r["claim"] and r["evidence"]
        assert r["correct"] == (r["predicted_label"] == r["gold_label"])
    corrected = syndec.load(out / "syndec.corrected.jsonl")
    wrong = [r for r in corrected if not r["correct"]]
    assert wrong and all(r["corrected_justification"] for r in wrong)  # a random model still writes text
    assert len(corrector.read_done(out / "corrections.jsonl")) == len(wrong)
    for stage in ("sft", "dpo"):
        assert (out / stage / "adapter/adapter_model.safetensors").exists()
        summary = json.loads((out / stage / loop.SUMMARY).read_text())
        assert summary["finished"] and summary["truncation"]
        metrics = [json.loads(line) for line in (out / stage / loop.METRICS).read_text().splitlines()]
        assert [m["step"] for m in metrics] == list(range(1, summary["total_steps"] + 1))
    dpo_log = json.loads((out / "dpo" / loop.METRICS).read_text().splitlines()[0])
    assert {"loss", "reward_accuracy", "reward_margin", "lr", "tokens", "tokens_per_s"} <= set(dpo_log)
    assert any("synth: 8 SynDeC records" in line for line in log)


def test_rerunning_skips_the_stages_that_are_done(trained, tiny):
    out, _ = trained
    with said() as log:
        stages.run(train_moderator.parse_args(["--stage", "all", "--split", "demo", "--model", tiny, "--out",
                                               str(out), *TINY_TRAIN]))
    assert sum("already done" in line for line in log) == 4


def test_the_adapter_changes_what_run_debate_says(trained, tiny, tmp_path):
    out, _ = trained
    common = ["--split", "demo", "--evidence", "golden", "--debater-model", tiny, "--moderator-model", tiny,
              "--max-new-tokens", "8", "--max-rounds", "1", "--limit", "3", "--temperature", "0", "--no-structured"]
    run_debate.main(common + ["--output-dir", str(tmp_path / "plain")])
    run_debate.main(common + ["--output-dir", str(tmp_path / "tuned"), "--moderator-adapter", str(out / "dpo/adapter")])
    plain, tuned = responses(tmp_path / "plain"), responses(tmp_path / "tuned")
    for claim_id in plain:
        # Debaters run without the adapter, so only the Moderator's turns (every third) may change.
        assert plain[claim_id][:2] == tuned[claim_id][:2]
    assert any(plain[c][2:] != tuned[c][2:] for c in plain)


def test_dsft_without_correct_records_says_how_to_go_on(trained, tiny, tmp_path, capsys):
    out, _ = trained
    (tmp_path / "run").mkdir()
    rows = syndec.load(out / "syndec.corrected.jsonl")
    syndec.write(tmp_path / "wrong.jsonl", [r for r in rows if not r["correct"]])
    with pytest.raises(SystemExit) as exit:
        train_moderator.main(["--stage", "sft", "--model", tiny, "--out", str(tmp_path / "run"),
                              "--syndec", str(tmp_path / "wrong.jsonl")])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "wrong.jsonl: no record to train D-SFT on" in err and "--sft-include-corrected" in err


# --- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize("stage", ["sft", "dpo"])
def test_a_training_stage_without_its_syndec_file_names_the_stages_that_write_it(tiny, tmp_path, capsys, stage):
    with pytest.raises(SystemExit) as exit:
        train_moderator.main(["--stage", stage, "--model", tiny, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    # D-DPO also lacks the D-SFT adapter it starts from: both said in one message (issue 54), one line each.
    assert exit.value.code == 2 and len(err.strip().splitlines()) == (1 if stage == "sft" else 3)
    assert "syndec.jsonl: no such SynDeC file" in err and "--stage synth" in err and "--stage all" in err
    assert ("no D-SFT adapter at" in err) == (stage == "dpo")


def test_the_parser_takes_every_default_from_the_training_settings():
    from dataclasses import asdict

    from train.settings import DEFAULTS, TrainSettings

    parsed = train_moderator.parse_args(["--split", "train", "--model", "m"])  # a real split names its model
    assert isinstance(parsed, TrainSettings)
    # The one field filled from the split and the one given; every other default is the dataclass's own.
    assert {k for k, v in asdict(parsed).items() if v != getattr(DEFAULTS, k)} == {"max_new_tokens", "model"}
    with pytest.raises(Exception):  # frozen: the stages cannot change what was parsed
        parsed.model = "other"


@pytest.mark.parametrize("flags, message", [(["--lr", "0"], "--lr and --beta must be positive"),
                                            (["--epochs", "0"], "--epochs must be at least 1"),
                                            (["--top-p", "0"], "--top-p in (0, 1]")])
def test_a_bad_training_setting_is_one_error_line(flags, message, capsys):
    with pytest.raises(SystemExit) as exit:
        train_moderator.parse_args(flags)
    err = capsys.readouterr().err
    assert exit.value.code == 2 and message in err and err.startswith("error: ")


def write_lines(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("rows, message", [
    ([], r"empty.jsonl: no SynDeC records \(the file is empty\)"),
    (["{not json"], r"empty.jsonl:1: not valid JSON"),
    ([dict(syndec_task.record(1, SUPPORTED), debate=[])],
     r"empty.jsonl:1 \(claim_id 1\): field 'debate': no debate record"),
    ([{k: v for k, v in syndec_task.record(1, SUPPORTED).items() if k != "debate"}], r"field 'debate': no debate"),
    ([dict(syndec_task.record(1, SUPPORTED), debate=syndec_task.record(1, SUPPORTED)["debate"][:2])],
     r"no Moderator turn"),
    ([syndec_task.record(1, SUPPORTED), dict(syndec_task.record(2, SUPPORTED), gold_label="Maybe")],
     r"empty.jsonl:2 \(claim_id 2\): field 'gold_label': 'Maybe'"),
    ([{k: v for k, v in syndec_task.record(1, SUPPORTED).items() if k != "claim"}], r"missing field 'claim'"),
])
def test_bad_syndec_files_stop_naming_file_line_and_field(tiny, tmp_path, capsys, rows, message):
    path = write_lines(tmp_path / "empty.jsonl", rows)
    with pytest.raises(SystemExit) as exit:
        train_moderator.main(["--stage", "sft", "--model", tiny, "--out", str(tmp_path / "run"), "--syndec", str(path)])
    assert exit.value.code == 2
    import re
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "run/sft").exists()  # nothing was started


def test_an_adapter_for_another_base_model_is_refused(trained, tmp_path, capsys):
    out, _ = trained
    other = str(build_tiny_llama(tmp_path / "other", seed=1, hidden_size=32, intermediate_size=64))
    adapter = str(out / "sft/adapter")
    with pytest.raises(SystemExit) as exit:
        run_debate.main(["--split", "demo", "--debater-model", other, "--moderator-model", other,
                         "--moderator-adapter", adapter, "--output-dir", str(tmp_path / "run")])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert f"adapter {adapter} was trained on another base model" in err and "hidden_size 64" in err
    assert "hidden_size 32" in err
    with pytest.raises(SystemExit) as exit:
        train_moderator.main(["--stage", "dpo", "--model", other, "--out", str(tmp_path / "train"),
                              "--syndec", str(out / "syndec.corrected.jsonl"), "--sft-adapter", adapter])
    assert exit.value.code == 2 and "trained on another base model" in capsys.readouterr().err


def test_leftover_checkpoints_need_resume_or_overwrite(trained, tiny, tmp_path, capsys):
    out, _ = trained
    run = tmp_path / "run"
    argv = ["--stage", "sft", "--model", tiny, "--out", str(run), "--syndec", str(out / "syndec.corrected.jsonl"),
            "--sft-include-corrected", *TINY_TRAIN]
    args = train_moderator.parse_args(argv)
    stages.sft(args, stop_after=2)  # a run that died after its step-2 checkpoint
    with pytest.raises(SystemExit) as exit:
        train_moderator.main(argv)
    assert exit.value.code == 2 and "--resume" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_moderator.main(argv + ["--resume", "--lr", "1e-3"])
    assert "saved with other training settings (lr)" in capsys.readouterr().err
    train_moderator.main(argv + ["--resume"])
    assert (run / "sft/adapter/adapter_config.json").exists()


# --- the Corrector --------------------------------------------------------------------------------

def test_corrector_prompt_carries_the_debate_the_insights_and_the_gold_verdict_and_nothing_else():
    record = syndec_task.record(4, REFUTED, predicted=SUPPORTED)
    text = corrector.prompt_for(record)
    assert "Round 1, Affirmative Debater:\nThe claim is refuted" in text
    assert "Round 1, Negative Debater:\nThe claim is refuted." in text
    assert "Round 1: both sides repeat" in text  # the Moderator's Primary Insight
    assert "this claim is Refuted" in text
    # Only the paper's inputs (Appendix B.3): not the wrong verdict, the claim or the evidence.
    assert SUPPORTED not in text and record["claim"] not in text and "The minister." not in text


@pytest.mark.parametrize("reply, expected", [
    ('{"Justification for Verdict": "Because X."}', ("Because X.", "field")),
    ('Here: {"Justification for Verdict": "Because X.",}', ("Because X.", "field")),
    ("Because the minister never said it.", ("Because the minister never said it.", "text")),
    ("   ", ("", "empty")),
])
def test_corrector_reply_is_read_from_json_else_kept_as_text(reply, expected):
    assert corrector.read_justification(reply) == expected


def test_correction_resumes_after_a_crash_without_asking_twice(monkeypatch, tmp_path):
    rows = syndec_task.records(5, wrong=True) + syndec_task.records(2, start=10)
    asked = []

    def fake_generate(model, tokenizer, convs, prompts, settings, generator=None, schemas=None):
        asked.extend(prompts)
        return ['{"Justification for Verdict": "fixed %d"}' % len(asked) for _ in prompts]

    monkeypatch.setattr(engine, "generate", fake_generate)
    agent = SimpleNamespace(model=None, tokenizer=None, adapter=None)
    path = tmp_path / "corrections.jsonl"
    corrector.correct(agent, rows[:2], path, engine.Settings(structured=False), batch_size=2)
    with open(path, "a") as f:
        f.write('{"claim_id": 3, "correc')  # the process died mid-line
    asked.clear()
    done = corrector.correct(agent, rows, path, engine.Settings(structured=False), batch_size=2)
    assert len(asked) == 3  # claims 2, 3, 4: the two done are not asked again, the correct ones never
    assert sorted(done) == [0, 1, 2, 3, 4]
    merged = corrector.merge(rows, done)
    assert [r["corrected_justification"] is not None for r in merged] == [True] * 5 + [False] * 2
    assert len(records.read_jsonl(Path(path))) == 5


@pytest.mark.slow
def test_embedded_gemma_all_stages_then_the_adapter_changes_the_moderator(tmp_path):
    """`--stage all` with the real embedded model on demo claims (short settings), then run_debate with its adapter."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "syndec"
    proc = subprocess.run(
        [sys.executable, str(root / "train_moderator.py"), "--stage", "all", "--split", "demo", "--limit", "4",
         "--max-rounds", "1", "--max-new-tokens", "80", "--out", str(out), "--sft-include-corrected",
         "--lora-r", "8", "--lora-alpha", "16", "--lr", "1e-3", "--epochs", "1", "--grad-accum", "2",
         "--max-length", "768", "--no-gradient-checkpointing"],
        capture_output=True, text=True, timeout=1500, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "dpo/adapter/adapter_model.safetensors").exists()
    assert "dpo: " in proc.stdout and "adapter:" in proc.stdout

    def run(name, *extra):
        p = subprocess.run([sys.executable, str(root / "run_debate.py"), "--split", "demo", "--limit", "2",
                            "--max-rounds", "1", "--max-new-tokens", "80", "--output-dir", str(tmp_path / name),
                            *extra], capture_output=True, text=True, timeout=900, cwd=root)
        assert p.returncode == 0, p.stderr[-3000:]
        return responses(tmp_path / name)

    plain = run("plain")
    tuned = run("tuned", "--moderator-adapter", str(out / "dpo/adapter"))
    assert plain.keys() == tuned.keys()
    # Structured decoding makes both runs' verdicts readable; what must change is what the Moderator
    # says, and only the Moderator (every third turn).
    assert all(plain[c][:2] == tuned[c][:2] for c in plain)
    assert any(plain[c][2:] != tuned[c][2:] for c in plain)


def test_synthesis_debates_on_a_retrieved_file_when_given_one(tiny, tmp_path):
    """SynDeC from retrieved evidence (issue 33): --retrieved-file's items, not the golden pairs, are what the
    debaters read and what the records keep."""
    from tests.tiny_models import averitec_dir, missing

    if not (averitec_dir() / "dev.json").is_file():
        missing(f"no AVeriTeC dev split at {averitec_dir()}", shared_data=True)
    dev = json.loads((averitec_dir() / "dev.json").read_text(encoding="utf-8"))
    retrieved = tmp_path / "retrieved.jsonl"
    mine = {i: [{"question": f"Marker question {i}?", "answer": f"Marker answer {i}.", "url": f"https://x/{i}"}]
            for i in range(2)}
    retrieved.write_text("".join(json.dumps({"claim_id": i, "claim": dev[i]["claim"], "evidence": mine[i]}) + "\n"
                                 for i in range(2)), encoding="utf-8")
    out = tmp_path / "syndec"
    args = train_moderator.parse_args(["--stage", "synth", "--split", "dev", "--data-dir", str(averitec_dir()),
                                       "--limit", "2", "--retrieved-file", str(retrieved), "--model", tiny,
                                       "--out", str(out), *TINY_TRAIN])
    stages.run(args)
    rows = {r["claim_id"]: r for r in syndec.load(out / "syndec.jsonl")}
    assert sorted(rows) == [0, 1]
    for i, r in rows.items():
        assert [(e["question"], e["answer"]) for e in r["evidence"]] == [(e["question"], e["answer"]) for e in mine[i]]
    config = json.loads((out / "debates" / records.CONFIG).read_text())
    assert config["evidence"] == "retrieved" and config["retrieved_file"] == str(retrieved)
