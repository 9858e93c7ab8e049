"""The Python API: docs/api.md's example runs as written, run(config) writes what the CLI writes, verify works in
memory."""
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

import run_debate
from debate.data.inputs import DataError
from debate.data.labels import LABELS
from debate.engine import gguf
from debate.pipeline import config, records

ROOT = Path(__file__).resolve().parents[1]


def api_page_example():
    section = (ROOT / "docs" / "api.md").read_text()
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def read(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_the_api_page_example_runs_as_written(tiny, tmp_path, monkeypatch, capsys):
    # The example uses the embedded model; a tiny random one stands in for it, nothing else changes.
    monkeypatch.setattr(gguf, "default_model_path", lambda: tiny)
    monkeypatch.chdir(tmp_path)
    code = api_page_example()
    assert len(code.strip().splitlines()) <= 12
    scope = {}
    exec(compile(code, "docs/api.md", "exec"), scope)
    out = tmp_path / "runs/api-demo"
    assert sorted(p["claim_id"] for p in read(out / records.PREDICTIONS)) == [0, 1]
    assert scope["metrics"] == json.loads((out / records.METRICS).read_text())
    # The run directory's config.json reads back into the config that made it, 4-bit and the dtype as really used
    # (on a CPU: no 4-bit, float32).
    made = scope["config"]
    assert made.models.dtype is None
    assert config.load(out / records.CONFIG) == replace(made, models=replace(made.models, use_4bit=False,
                                                                               dtype="float32"))
    # verify: one prediction of the one claim, with one of the four labels (structured decoding).
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert any(last.startswith(label) for label in LABELS)


def test_run_writes_what_the_cli_writes_and_verify_gives_one_record_per_claim(tiny, tmp_path, capsys):
    # --max-new-tokens 64: room for RAG-CoT's JSON answer under structured decoding (checked before a run).
    flags = ["--split", "demo", "--method", "rag-cot", "--model", tiny, "--limit", "1", "--max-new-tokens", "64",
             "--temperature", "0"]
    cli_metrics = run_debate.main(flags + ["--output-dir", str(tmp_path / "cli")])
    from debate import build, run, verify

    cfg = build(split="demo", method="rag-cot", model=tiny, limit=1, max_new_tokens=64, temperature=0,
                output_dir=tmp_path / "api")
    assert run(cfg, log=lambda *a: None) == cli_metrics
    strip = lambda rows: [dict(r, encoded_tokens=None) for r in rows]  # noqa: E731
    assert strip(read(tmp_path / "api" / records.PREDICTIONS)) == strip(read(tmp_path / "cli" / records.PREDICTIONS))
    saved = [json.loads((tmp_path / d / records.CONFIG).read_text()) for d in ("cli", "api")]
    assert {k for k in saved[0] if saved[0][k] != saved[1][k]} == {"output_dir"}

    claims = [{"claim": "The river flooded the town.", "claim_id": "a",
               "evidence": [{"question": "Did it flood?", "answer": "Yes, in May."}]},
              "Oak trees can live for centuries."]
    predictions = verify(claims, cfg)
    assert [p["claim_id"] for p in predictions] == ["a", 1]
    assert all(p["label"] in LABELS and p["parse_status"] == "structured" for p in predictions)
    assert sum(predictions[0]["label_probs"].values()) == pytest.approx(1, abs=1e-4)


def test_run_hands_log_the_lines_the_cli_prints_and_leaves_no_handler_behind(tiny, tmp_path, capsys):
    import logging

    from debate import build, run

    flags = ["--split", "demo", "--method", "rag-cot", "--model", tiny, "--limit", "1", "--max-new-tokens", "64",
             "--temperature", "0"]
    run_debate.main(flags + ["--output-dir", str(tmp_path / "cli")])
    logger = logging.getLogger("debate")
    handlers, level = list(logger.handlers), logger.level
    assert handlers == [] and level == logging.NOTSET  # the CLI's printing went with its run

    def same(lines, out):  # the two runs differ in their directory, their seconds and the RAM they found free only
        lines = [re.sub(r"\d+\.\d+s\b", "Ts", line.replace(str(tmp_path / out), "OUT")) for line in lines]
        return [re.sub(r"\d+(\.\d+)? (GiB|MiB|ms)\b", r"N \2", line) for line in lines]

    printed = capsys.readouterr().out.splitlines()
    # Nobody asked for retrieved evidence, so nothing says the demo has none (issue 49); the models line names it.
    assert not any("retrieved evidence" in line for line in printed)
    assert any(line.startswith("1 claims, 0 already done in ") for line in printed)
    assert f"models: {Path(tiny).name} float32 on cpu: verifier" in printed
    cfg = build(split="demo", method="rag-cot", model=tiny, limit=1, max_new_tokens=64, temperature=0,
                output_dir=tmp_path / "api")
    said = []
    run(cfg, log=said.append)
    assert "\n".join(same(said, "api")) == "\n".join(same(printed, "cli"))  # a line may hold a table: joined
    assert capsys.readouterr().out == ""  # to `log` only, not printed as well
    assert logger.handlers == handlers and logger.level == level
    again = []
    run(cfg, log=again.append)  # resumed, nothing to do: each of its lines once, no handler left over to repeat it
    assert again.count(f"1 claims, 1 already done in {tmp_path / 'api'}, 0 to go") == 1
    assert len(again) == len(set(again)) and logger.handlers == handlers and logger.level == level


def test_verify_names_a_bad_claim():
    from debate import verify

    with pytest.raises(DataError, match=r"claim 1: missing field 'evidence\[0\]\.question' \(an evidence item is"):
        verify(["fine", {"claim": "x", "evidence": [{"answer": "no question"}]}], config.build(model="m"))
    with pytest.raises(DataError, match=r"claim 0: field 'evidence\[1\]': unknown field 'txt'; an evidence item is"):
        verify([{"claim": "x", "evidence": [{"text": "t"}, {"txt": "t"}]}], config.build(model="m"))


def test_two_verifiers_in_one_process_each_keep_their_own_prompts(tiny, tmp_path, monkeypatch):
    from debate import Verifier
    from debate.data import prompts
    from debate.pipeline import runner

    shipped = (prompts.PROMPT_DIR / "ragcot.txt").read_text(encoding="utf-8")
    folders = {}
    for name in ("alpha", "beta"):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        (folders[name] / "ragcot.txt").write_text(f"{name.upper()} PROMPT. " + shipped, encoding="utf-8")
    seen = []  # the RAG-CoT prompt each claim's turn was given, through the scheduler's claim threads
    original = runner.verify_claims

    def keeping_turns(config, agents, claims, settings, streams, options, write):
        def write_all(record):
            seen.append(record["transcript"]["turns"][0]["prompt"].split(".")[0])
            write(record)
        original(config, agents, claims, settings, streams, options, write_all)

    monkeypatch.setattr(runner, "verify_claims", keeping_turns)
    base = dict(split="demo", method="rag-cot", model=tiny, max_new_tokens=8, structured=False)
    with Verifier(config.build(prompts=folders["alpha"], **base)) as first:
        with Verifier(config.build(prompts=folders["beta"], **base)) as second:  # built after the first
            first.verify(["Oak trees can live for centuries.", "The river flooded."])
            second.verify(["Oak trees can live for centuries."])
            first.verify(["The moon is made of cheese."])
        with Verifier(config.build(**base)) as plain:
            plain.verify(["Oak trees can live for centuries."])
    assert seen[:4] == ["ALPHA PROMPT", "ALPHA PROMPT", "BETA PROMPT", "ALPHA PROMPT"]
    assert seen[4].startswith("Your task is to predict")  # the shipped prompt again
    assert prompts.in_use().directory is None  # nothing of a Verifier's prompts outlives its calls
