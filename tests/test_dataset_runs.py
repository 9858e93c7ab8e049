"""Every method on every dataset with a tiny random model: the prompts and the schemas carry only that dataset's
labels, predictions and metrics are over them; a user's JSONL with a three-label card runs end to end; the
Verifier loads its models once for batch after batch."""
import json
from pathlib import Path

import pytest

import run_debate
from debate.data.labels import LABELS
from debate.pipeline import records
from tests.tiny_models import missing, shared_dir

METHODS = ("debatecv", "rag-cot", "majority", "cooperation")
CARD = {"name": "mine", "labels": [{"label": "Accurate", "definition": "the evidence backs the claim."},
                                   {"label": "Inaccurate", "definition": "the evidence contradicts the claim."},
                                   {"label": "Unclear", "definition": "the evidence cannot settle the claim."}],
        "nei": "Unclear"}
USER_CLAIMS = [
    {"claim_id": "u1", "claim": "Drinking tea cures the common cold.", "label": "Inaccurate",
     "evidence": [{"text": "Two trials found no effect of tea on colds.", "url": "trial-report"}]},
    {"claim_id": "u2", "claim": "The bridge opened in 1932.", "label": "Accurate",
     "evidence": [{"text": "The bridge was opened to traffic in March 1932.", "url": "city-archive"}]},
]


@pytest.fixture(scope="module")
def user_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mine")
    (folder / "card.json").write_text(json.dumps(CARD))
    (folder / "dev.jsonl").write_text("".join(json.dumps(c) + "\n" for c in USER_CLAIMS))
    return folder


def run(tiny, out, method, dataset, split, data_dir, *extra):
    argv = ["--dataset", dataset, "--split", split, "--data-dir", str(data_dir), "--method", method, "--model", tiny,
            "--limit", "1", "--max-rounds", "1", "--max-new-tokens", "120", "--voters", "2", "--output-dir", str(out),
            *extra]
    return run_debate.main(argv)


def read(out, name):
    return [json.loads(line) for line in (Path(out) / name).read_text().splitlines()]


# PROClaim's judges vote in the paper's own words, mapped onto the dataset's labels by rule (its "Supported" is
# also an AVeriTeC label's spelling).
PANEL = ("Supported", "Not Supported", "Inconclusive")


def check_labels(out, labels, panel=False):
    """Predictions, every prompt, every structured choice and the metrics speak only of `labels` (and, for the
    courtroom's judges, PROClaim's panel vocabulary)."""
    [prediction] = read(out, records.PREDICTIONS)
    assert prediction["label"] in labels and set(prediction["label_probs"]) == set(labels)
    [transcript] = read(out, records.TRANSCRIPTS)
    foreign = [label for label in LABELS if label not in labels and not (panel and label in PANEL)]
    verdicts, replies = 0, []
    for turn in transcript["turns"]:
        # What the prompt files and the code wrote, without the earlier replies it quotes: a random model's
        # words (its vocabulary comes from AVeriTeC text) are not the prompt's.
        prompt = turn["prompt"]
        for reply in replies:
            prompt = prompt.replace(reply.strip(), "")
        replies.append(turn["response"])
        assert not [label for label in foreign if label in prompt], prompt
        verdict = (turn.get("probs") or {}).get("Verdict")
        if verdict:
            verdicts += 1
            assert list(verdict) == list(PANEL if panel and turn["role"].startswith("judge") else labels)
    assert verdicts >= 1
    metrics = json.loads((Path(out) / records.METRICS).read_text())
    assert metrics["labels"] == list(labels) and set(metrics["per_class_f1"]) == set(labels)
    assert metrics["n"] == 1 and "intervals" in metrics
    config = json.loads((Path(out) / records.CONFIG).read_text())
    assert config["labels"] == list(labels)
    assert not (Path(out) / records.SUBMISSION).exists()  # AVeriTeC's submission shape only for AVeriTeC


DATASETS = [  # (dataset, split, shared folder, evidence, labels)
    ("check-covid", "test", "check-covid", "golden", ("SUPPORT", "REFUTE", "NOTENOUGHINFO")),
    ("check-covid", "test-binary", "check-covid", "golden", ("SUPPORT", "REFUTE")),
    ("healthver", "dev", "healthver", "golden", ("Supports", "Refutes", "Neutral")),
    ("politihop", "test", "politihop", "ruling", ("true", "false", "half-true")),
    ("feverous", "sample", "proclaim", "none", ("SUPPORT", "REFUTE")),
    ("scifact", "sample", "proclaim", "none", ("SUPPORT", "REFUTE")),
]


# Greedy: seats on one model share a vote; no witness; turns long enough for the critic's JSON keys.
COURTROOM = ("--temperature", "0", "--no-witness", "--max-new-tokens", "200")


@pytest.mark.parametrize("method", ["courtroom", "standard-mad", "single-call"])
def test_proclaims_methods_on_its_binary_check_covid_claims_speak_its_labels(tiny, tmp_path, method):
    data_dir = shared_dir("check-covid")
    if not data_dir.is_dir():
        missing(f"no shared check-covid data at {data_dir}", shared_data=True)
    out = tmp_path / "run"
    run(tiny, out, method, "check-covid", "test-binary", data_dir, "--evidence", "golden", *COURTROOM)
    check_labels(out, ("SUPPORT", "REFUTE"), panel=True)
    [prediction] = read(out, records.PREDICTIONS)
    assert prediction["corpus"] == "dataset corpus"  # P-RAG and negotiation search the abstracts, not the claim alone


@pytest.mark.parametrize("dataset, split, folder, evidence, labels", DATASETS, ids=[f"{d[0]}-{d[1]}" for d in DATASETS])
@pytest.mark.parametrize("method", METHODS)
def test_every_method_on_every_dataset_speaks_its_labels(tiny, tmp_path, method, dataset, split, folder, evidence,
                                                         labels):
    data_dir = shared_dir(folder)
    if not data_dir.is_dir():
        missing(f"no shared {folder} data at {data_dir}", shared_data=True)
    out = tmp_path / "run"
    metrics = run(tiny, out, method, dataset, split, data_dir, "--evidence", evidence)
    assert metrics["dataset"] == dataset and metrics["evidence_condition"] == evidence
    check_labels(out, labels)


@pytest.mark.parametrize("method", ["debatecv", "rag-cot", "courtroom"])
def test_a_users_jsonl_with_a_three_label_card_runs_end_to_end(tiny, tmp_path, user_data, method):
    out = tmp_path / "run"
    run(tiny, out, method, "jsonl", "dev", user_data, *COURTROOM if method == "courtroom" else ())
    check_labels(out, ("Accurate", "Inaccurate", "Unclear"), panel=method == "courtroom")
    if method == "rag-cot":  # RAG-CoT's one prompt holds the evidence (DebateCV's is in the system prompts)
        [transcript] = read(out, records.TRANSCRIPTS)
        prompt = transcript["turns"][0]["prompt"]
        assert "[1] Two trials found no effect of tea on colds.\nSource: trial-report" in prompt
        assert "from the evidence passages given as evidence" in transcript["turns"][0]["prompt"]
    # Resuming with an edited card (other labels) is refused: the labels are part of the run's identity.
    card = dict(CARD, labels=CARD["labels"][:2])
    (user_data / "card.json").write_text(json.dumps(card))
    try:
        with pytest.raises(SystemExit) as stop:
            run(tiny, out, method, "jsonl", "dev", user_data)
        assert stop.value.code == 2
    finally:
        (user_data / "card.json").write_text(json.dumps(CARD))


def test_the_verifier_loads_once_and_verifies_batch_after_batch(tiny, user_data, monkeypatch):
    from debate import Verifier, build
    from debate.data.inputs import DataError
    from debate.engine import models

    loads = []
    real = models.load_roles
    monkeypatch.setattr(models, "load_roles", lambda *a, **k: loads.append(1) or real(*a, **k))
    config = build(dataset="jsonl", split="dev", data_dir=str(user_data), method="rag-cot", model=tiny,
                   max_new_tokens=120, temperature=0)
    with Verifier(config) as verifier:
        first = verifier.verify(USER_CLAIMS)
        second = verifier.verify(["The bridge opened in 1932."])
        assert loads == [1]  # the models loaded once for both batches
        assert [p["claim_id"] for p in first] == ["u1", "u2"] and second[0]["claim_id"] == 0
        assert all(p["label"] in verifier.labels.labels for p in first + second)
        assert first[0]["gold_label"] == "Inaccurate"
        with pytest.raises(DataError, match="label 'True' is not one of Accurate, Inaccurate, Unclear"):
            verifier.verify([{"claim": "x", "label": "True"}])
    with pytest.raises(RuntimeError, match="closed"):
        verifier.verify(["again"])


def test_the_verifiers_courtroom_searches_the_datasets_corpus_as_the_cli_does(tiny, monkeypatch, tmp_path):
    from debate import Verifier, build
    from debate.data import checkcovid
    from debate.methods.courtroom import case
    from debate.pipeline.config import to_dict

    data_dir = shared_dir("check-covid")
    if not (data_dir / "corpus.json").is_file():
        missing(f"no shared check-covid data at {data_dir}", shared_data=True)
    searched = []
    monkeypatch.setattr(case, "library_from", lambda options, passages=None,
                        store=None, bm25_k=None: searched.append(passages))
    config = build(dataset="check-covid", split="test-binary", data_dir=str(data_dir), method="courtroom",
                   model=tiny, temperature=0, witness=False, max_new_tokens=200)
    Verifier(config).close()
    [passages] = searched  # Check-COVID's abstracts, not each claim's own evidence (P-RAG would find nothing new)
    assert len(passages) > 100 and passages == checkcovid.corpus_passages(data_dir)
    # --corpus, when given, is read by the library itself: no dataset corpus is passed along.
    corpus = tmp_path / "mine.jsonl"
    corpus.write_text(json.dumps({"id": "m1", "text": "Masks cut the spread of droplets."}) + "\n")
    Verifier(build(**{**to_dict(config), "corpus": str(corpus)})).close()
    assert searched[1] is None


def test_the_courtrooms_corpus_is_the_datasets_own_read_once_else_the_splits_evidence_pooled():
    from debate.data import checkcovid
    from debate.pipeline import config as run_config, run_claims

    data_dir = shared_dir("check-covid")
    if not (data_dir / "corpus.json").is_file():
        missing(f"no shared check-covid data at {data_dir}", shared_data=True)
    settings = dict(dataset="check-covid", split="test", data_dir=str(data_dir), method="courtroom", model="m")
    golden = run_claims.read(run_config.build(**settings, evidence="golden"))
    assert golden.passages == checkcovid.corpus_passages(data_dir) and golden.corpus is None
    retrieved = run_claims.read(run_config.build(**settings, evidence="retrieved"))
    assert retrieved.passages is retrieved.corpus  # the abstracts retrieval reads are the courtroom's corpus
    assert retrieved.passages == golden.passages
    plain = run_claims.read(run_config.build(**{**settings, "method": "rag-cot"}, evidence="golden"))
    assert plain.passages is None  # only the courtroom's methods search a corpus


def test_a_dataset_without_a_corpus_gives_the_courtroom_its_splits_evidence_pooled(user_data):
    from debate.pipeline import config as run_config, run_claims

    inputs = run_claims.read(run_config.build(dataset="jsonl", split="dev", data_dir=str(user_data), method="courtroom",
                                            model="m"))
    assert [p["text"] for p in inputs.passages] == [c["evidence"][0]["text"] for c in USER_CLAIMS]


def test_a_politihop_madr_run_reads_the_whole_ruling_by_default(tiny, tmp_path):
    """MADR's experiments gave the models the whole ruling article: --task explain on PolitiHop defaults to
    --evidence ruling, and the explanation prompt holds ruling sentences outside the annotated chains."""
    from debate.data import datasets

    data_dir = shared_dir("politihop")
    if not data_dir.is_dir():
        missing(f"no shared politihop data at {data_dir}", shared_data=True)
    claims = datasets.get("politihop").read("test", data_dir)
    # The first claim whose ruling holds sentences no evidence chain names, so the two conditions differ.
    first = next(k for k, c in enumerate(claims)
                 if len(c["evidence_sets"]["ruling"]) > len(c["gold_evidence"]))
    out = tmp_path / "madr"
    run_debate.main(["--dataset", "politihop", "--split", "test", "--data-dir", str(data_dir), "--task", "explain",
                     "--method", "madr", "--model", tiny, "--limit", str(first + 1), "--madr-iterations", "1",
                     "--max-new-tokens", "40", "--output-dir", str(out)])
    config = json.loads((out / records.CONFIG).read_text())
    assert config["evidence"] == "ruling"
    prompts = {row["claim_id"]: row["turns"][0]["prompt"] for row in read(out, records.TRANSCRIPTS)}
    claim = claims[first]
    unannotated = [e["text"] for e in claim["evidence_sets"]["ruling"] if e not in claim["gold_evidence"]]
    assert all(text in prompts[claim["claim_id"]] for text in unannotated)
