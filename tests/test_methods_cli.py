"""Every method through run_debate.py with a tiny random model: outputs, MADR refinement, resuming, errors."""
import json
from pathlib import Path

import pytest

import run_debate
from debate.data.labels import LABELS
from debate.pipeline import records
from tests import page_ledger


def argv(model, out, method, *extra):
    return ["--split", "demo", "--method", method, "--model", model, "--max-new-tokens", "5", "--max-rounds", "2",
            "--batch-size", "3", "--limit", "3", "--output-dir", str(out), "--no-structured", *extra]


def read(out, name):
    return [json.loads(line) for line in (Path(out) / name).read_text().splitlines()]


@pytest.mark.parametrize("method, fields", [
    ("rag-cot", {"rounds", "stop_reason"}),
    ("majority", {"votes", "vote_counts", "tie", "voter_seeds"}),
    ("cooperation", {"rounds", "stop_reason"}),
    ("courtroom", {"votes", "panel", "confidence", "confidence_parts", "premises", "negotiation", "hearings",
                   "role_switch", "evidence", "tokens", "total_rounds", "retrieved", "components"}),
    ("standard-mad", {"votes", "confidence", "evidence", "tokens", "retrieved"}),
    ("single-call", {"premises", "evidence", "tokens", "retrieved"}),
])
def test_each_method_runs_end_to_end(tiny, tmp_path, method, fields):
    out = tmp_path / method
    # The courtroom's roles sample by default (the paper's temperatures); greedy here, so seats share votes.
    greedy = ("--temperature", "0") if method in ("courtroom", "standard-mad") else ()
    # Every cache given back by the run's end, every page accounted for; the courtroom drops each of its caches
    # itself (the other methods leave some to their conversations' end).
    with page_ledger.at_run_end(by_the_method=method in ("courtroom", "standard-mad")) as ends:
        metrics = run_debate.main(argv(tiny, out, method, *greedy))
    page_ledger.no_page_held(ends)
    preds = read(out, records.PREDICTIONS)
    assert sorted(p["claim_id"] for p in preds) == [0, 1, 2] and metrics["n"] == 3
    for p in preds:
        assert fields <= set(p) and p["prompt_tokens"] > 0 and p["completion_tokens"] > 0
    assert all(t["turns"] for t in read(out, records.TRANSCRIPTS))
    config = json.loads((out / records.CONFIG).read_text())
    assert config["method"] == method
    if method in ("courtroom", "standard-mad", "single-call"):
        # PROClaim's evaluation and Appendix P's cost, summed over the run.
        assert metrics["proclaim"]["efficiency"]["tokens"]["total"] == sum(p["tokens"]["total"] for p in preds) > 0
    else:
        # The DebateCV paper sampled every LLM at 0.7, top-p 1.0 (Appendix C): the baselines' default too.
        assert (config["temperature"], config["top_p"]) == (0.7, 1.0)
    if method == "courtroom":
        assert config["max_rounds"] == 2 and config["judge_models"] == [config["moderator_model"]] * 3
        assert "repeat one vote" in preds[0]["panel"]["note"]
        # The submission carries the evidence the courtroom read, for the AVeriTeC score.
        submission = json.loads((out / records.SUBMISSION).read_text())
        assert [q["question"] for q in submission[0]["questions"]] == [e["question"] for e in preds[0]["evidence"]]


def test_refine_madr_keeps_both_justifications_and_scores_both(tiny, tmp_path):
    out = tmp_path / "madr"
    metrics = run_debate.main(argv(tiny, out, "rag-cot", "--refine", "madr", "--madr-iterations", "2"))
    preds = read(out, records.PREDICTIONS)
    for p in preds:
        assert p["justification_unrefined"] and p["madr"]["stop_reason"] in ("agreement", "max_iterations")
        # Algorithm 1: N revisions at most, the judge asked before each.
        assert 0 <= p["madr"]["revisions"] <= 2
        assert p["madr"]["judge_calls"] == p["madr"]["revisions"] + (p["madr"]["stop_reason"] == "agreement")
    roles = {t["role"] for t in read(out, records.TRANSCRIPTS)[0]["turns"]}
    assert {"verifier", "madr_typology", "madr_free", "madr_judge", "madr_refiner"} <= roles
    assert "justification_meteor" in metrics and "justification_meteor_unrefined" in metrics
    submission = json.loads((out / records.SUBMISSION).read_text())
    assert all("justification_unrefined" in s for s in submission)


def test_refine_changes_the_default_output_dir(tiny, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_debate.main(["--split", "demo", "--method", "rag-cot", "--model", tiny, "--max-new-tokens", "3", "--limit", "1",
                     "--refine", "madr", "--madr-iterations", "1", "--no-structured"])
    assert (tmp_path / "runs/demo-golden-rag-cot-madr" / records.PREDICTIONS).is_file()


def test_courtroom_resumes_after_a_crash_and_matches_an_uninterrupted_run(tiny, tmp_path, monkeypatch):
    full = tmp_path / "full"
    run_debate.main(argv(tiny, full, "courtroom", "--batch-size", "2", "--temperature", "0"))
    out = tmp_path / "crashy"
    real_write, written = records.Writer.write, []

    def dies_after_one(self, record):
        if written:
            raise KeyboardInterrupt("killed")
        real_write(self, record)
        written.append(record)

    monkeypatch.setattr(records.Writer, "write", dies_after_one)
    with pytest.raises(KeyboardInterrupt):
        run_debate.main(argv(tiny, out, "courtroom", "--batch-size", "2", "--temperature", "0"))
    monkeypatch.setattr(records.Writer, "write", real_write)
    run_debate.main(argv(tiny, out, "courtroom", "--batch-size", "2", "--temperature", "0"))
    # Everything matches but how many cached tokens a row re-encoded, which depends on its batch-mates.
    by_id = lambda rows: {r["claim_id"]: dict(r, encoded_tokens=None) for r in rows}  # noqa: E731
    assert by_id(read(out, records.PREDICTIONS)) == by_id(read(full, records.PREDICTIONS))
    # A courtroom setting is part of the run's identity.
    with pytest.raises(SystemExit):
        run_debate.main(argv(tiny, out, "courtroom", "--batch-size", "2", "--temperature", "0",
                             "--novelty-threshold", "0.3"))


def test_courtroom_reads_a_corpus_and_names_a_bad_line(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DEBATECV_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "passages.jsonl"
    corpus.write_text(json.dumps({"id": "p1", "text": "Tomatoes are the most grown vegetable.", "url": "u"}) + "\n"
                      + json.dumps({"id": "p2", "text": "Oak trees can live for centuries."}) + "\n")
    out = tmp_path / "with-corpus"
    run_debate.main(argv(tiny, out, "courtroom", "--corpus", str(corpus), "--limit", "1"))
    pred = read(out, records.PREDICTIONS)[0]
    assert {e["answer"] for e in pred["evidence"]} <= {"Tomatoes are the most grown vegetable.",
                                                      "Oak trees can live for centuries."}
    assert list((tmp_path / "cache" / "retrieval").glob("*.pt"))  # embeddings cached, not beside the corpus
    assert pred["corpus"] == str(corpus)
    kept = (out / records.PREDICTIONS).read_text()
    corpus.write_text(corpus.read_text() + '{"id": "p3"}\n')
    with pytest.raises(SystemExit) as stop:
        run_debate.main(argv(tiny, out, "courtroom", "--corpus", str(corpus)))
    assert stop.value.code == 2
    assert f"{corpus}: line 3: missing field 'text'" in capsys.readouterr().err
    assert (out / records.PREDICTIONS).read_text() == kept  # nothing already done is lost


@pytest.mark.parametrize("extra, message", [
    (["--method", "courtroom", "--judge-models", "a", "b", "c", "d"], "at most 3 paths"),
    (["--method", "majority", "--temperature", "0"], "needs sampling"),
    (["--method", "courtroom", "--novelty-threshold", "1.5"], "--novelty-threshold must be in [0, 1]"),
    (["--method", "courtroom", "--dispute-threshold", "0.6"], "must not be above --admit-threshold"),
    (["--method", "majority", "--voters", "0"], "--voters must be at least 1"),
])
def test_bad_method_settings_are_refused_before_anything_runs(extra, message, capsys):
    with pytest.raises(SystemExit) as stop:
        run_debate.parse_args(["--split", "demo", *extra])
    assert stop.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("method, extra", [
    ("rag-cot", ["--refine", "madr", "--madr-iterations", "1"]),
    ("majority", []),
    ("cooperation", []),
    ("courtroom", ["--top-k", "2", "--switch-rounds", "1", "--seed-k", "2", "--no-witness"]),
])
def test_embedded_gemma_smoke(tmp_path, method, extra):
    """Each method on the real Gemma 3 270M, one demo claim, short turns, as a user would run it."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / method
    # 96 tokens: the demo's turn, enough for the keys of every JSON answer with Gemma's tokenizer.
    proc = subprocess.run([sys.executable, str(root / "run_debate.py"), "--split", "demo", "--method", method,
                           "--limit", "1", "--max-rounds", "1", "--max-new-tokens", "96", "--output-dir", str(out),
                           *extra], capture_output=True, text=True, timeout=1500, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    pred = read(out, records.PREDICTIONS)[0]
    assert pred["completion_tokens"] > 0 and "accuracy" in proc.stdout
    # A readable verdict from the base model: one of the four labels, with its probabilities.
    assert pred["label"] in LABELS and pred["parse_status"] == "structured"
    assert sum(pred["label_probs"].values()) == pytest.approx(1, abs=1e-4)
    turns = read(out, records.TRANSCRIPTS)[0]["turns"]
    assert turns and all(t["response"].strip() for t in turns)
    assert all(t["parse_status"] == "structured" for t in turns if "schema" in t)
    if "--refine" in extra:
        assert "justification_unrefined" in pred and any(t["role"] == "madr_refiner" for t in turns)


def test_courtroom_trials_write_table_3(tiny, tmp_path):
    out = tmp_path / "trials"
    summary = run_debate.main(argv(tiny, out, "courtroom", "--limit", "2", "--max-rounds", "1", "--trials", "2",
                                   "--switch-rounds", "1", "--no-witness"))
    table = json.loads((out / records.METRICS).read_text())["table3"]
    assert table == summary["table3"] and table["n_runs"] == 2 and table["claims"] == 2
    assert {"runs", "majority_vote", "weighted_total", "oracle", "mean_over_runs", "efficiency"} <= set(table)
    assert table["weighted_total"]["n"] == 4 and len(table["runs"][0]["kappa_gt"]) == 3
