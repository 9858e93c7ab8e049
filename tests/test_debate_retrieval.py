"""DebateCV with retrieval during the debate (--debate-retrieval), with scripted agents and the real sentence encoder:
what a Debater asks for is searched, admitted when novel and within the caps, and shown from then on."""
import json

import pytest

from debate.data.labels import SUPPORTED
from debate.data.prompts import render
from debate.engine import engine, retrieval
from debate.methods import debate_retrieval as grow, debatecv
from debate.pipeline import config, grown_evidence
from eval import evidence_score as evidence_scores
from tests import scripted as engine_script

CLAIM = {"claim_id": "c1", "claim": "The Eiffel Tower is in Rome.", "label": SUPPORTED,
         "evidence": [{"question": "Where is the Colosseum?", "answer": "The Colosseum stands in Rome.",
                       "url": "https://example.org/colosseum"}]}
TOWER = "The Eiffel Tower was built in Paris for the 1889 World's Fair."
STORE_PAGES = [
    {"url": "https://example.org/tower", "url2text": [TOWER, "Gustave Eiffel's company designed and built it."]},
    {"url": "https://example.org/food", "url2text": ["Pasta is boiled in salted water.",
                                                     "Bread rises because of yeast."]},
]
PROCEED = json.dumps({"Primary Insight": "p", "Evidence Gaps": "g", "Justification for Proceeding": "more",
                      "Proceeding Necessity": "Yes", "Justification for Verdict": "", "Verdict": ""})
FINAL = json.dumps({"Justification for Verdict": "because", "Verdict": SUPPORTED})


pytestmark = pytest.mark.usefixtures("own_cache")  # tests/conftest.py: the embeddings' cache of our own


@pytest.fixture(scope="module")
def embedder():
    return retrieval.load_embedder()


@pytest.fixture
def store_source(tmp_path, embedder):
    (tmp_path / "c1.json").write_text("".join(json.dumps(p) + "\n" for p in STORE_PAGES), encoding="utf-8")
    return grow.Source(embedder, store=str(tmp_path), name="test store")


def corpus_source(embedder, texts):
    passages = [{"id": f"p{i}", "text": t, "url": f"https://example.org/{i}"} for i, t in enumerate(texts)]
    return grow.Source(embedder, corpus=retrieval.index_of(passages, embedder), name="test corpus")


def debate(monkeypatch, query, source=None, limits=None, rounds=2, seen=None):
    """One claim debated by scripted agents; `query(role, round)` is a Debater's search query; `seen` collects
    (role, every message and prompt the model had) per call."""
    def reply(model, conv, prompt):
        if seen is not None:
            seen.append((model, conv.system + "".join(m["content"] for m in conv.messages)))
        if "search query" in prompt:
            return json.dumps({"Query": query(model, prompt.split()[1])})
        if model == "moderator":
            return FINAL if "Verdict\": \"" in prompt and "Proceeding" not in prompt else PROCEED
        return f"{model} argues"
    engine_script.install(monkeypatch, reply)
    agents = engine_script.agents(debatecv.ROLES)
    return debatecv.run_batch(agents, [CLAIM], engine.Settings(max_new_tokens=64), max_rounds=rounds,
                              source=source, limits=limits)[0]


def test_a_passage_asked_for_is_admitted_and_shown_to_both_debaters_and_the_moderator_from_then_on(
        monkeypatch, store_source):
    seen = []
    record = debate(monkeypatch, lambda role, round_no: "Eiffel Tower built Paris World's Fair",
                    store_source, grow.Limits(top_k=1), seen=seen)
    turns = record["transcript"]["turns"]
    assert [(t["round"], t["role"], t.get("kind")) for t in turns[:5]] == [
        (1, "affirmative", "query"), (1, "negative", "query"), (1, "affirmative", None), (1, "negative", None),
        (1, "moderator", None)]
    log = record["transcript"]["debate_retrieval"]["rounds"]
    first = log[0]["queries"]
    assert first[0]["returned"][0]["text"] == TOWER and first[0]["returned"][0]["decision"] == "admitted"
    # The Negative asked for the same page: the duplicate is refused by novelty, with its score recorded.
    assert first[1]["returned"][0]["decision"] == "novelty" and first[1]["returned"][0]["novelty"] < 0.2
    assert log[0]["admitted"] == [first[0]["returned"][0]["id"]] and log[0]["evidence_size"] == 2
    # Shown, as evidence item [2], in every prompt of the round after the queries ...
    for t in turns[2:5]:
        assert TOWER in t["prompt"] and "[2]" in t["prompt"]
    # ... and held by every conversation from then on: round 2's turns and the Moderator's final verdict.
    later = [text for role, text in seen[5:]]
    assert later and all(TOWER in text for text in later)
    assert {role for role, _ in seen[5:]} == {"affirmative", "negative", "moderator"}
    assert turns[-1]["round"] == "final"
    pred = record["prediction"]
    assert pred["evidence"][0] == CLAIM["evidence"][0]
    assert pred["evidence"][1]["answer"] == TOWER and pred["evidence"][1]["question"].startswith("Eiffel Tower")
    assert pred["debate_retrieval"]["admitted"] == 1


def test_the_caps_hold_and_a_long_query_is_cut(monkeypatch, embedder):
    facts = [f"Fact {name}: the tower was painted {colour} in {year}." for name, colour, year in (
        ("one", "red", 1890), ("two", "yellow", 1899), ("three", "brown", 1907), ("four", "bronze", 1968),
        ("five", "grey", 1980), ("six", "green", 2001))]
    source = corpus_source(embedder, facts)
    long = " ".join(["tower paint colour"] * 20)
    limits = grow.Limits(top_k=3, per_round=1, per_claim=2, query_words=5, novelty_threshold=0.0)
    record = debate(monkeypatch, lambda role, round_no: long, source, limits, rounds=3)
    rounds = record["transcript"]["debate_retrieval"]["rounds"]
    assert [len(r["admitted"]) for r in rounds] == [1, 1, 0]
    decisions = [p["decision"] for r in rounds for q in r["queries"] for p in q["returned"]]
    assert "round cap" in decisions and "claim cap" in decisions
    assert all(len(q["query"].split()) == 5 and q["cut"] for r in rounds for q in r["queries"])
    assert len(record["prediction"]["evidence"]) == 1 + 2


def test_a_passage_that_would_overflow_the_context_is_refused_and_logged(monkeypatch, embedder):
    monkeypatch.setattr(grow, "context_of", lambda agents: 300)
    record = debate(monkeypatch, lambda role, round_no: "tower", corpus_source(embedder, [TOWER]), grow.Limits())
    returned = record["transcript"]["debate_retrieval"]["rounds"][0]["queries"][0]["returned"]
    assert [p["decision"] for p in returned] == ["context"]
    assert len(record["prediction"]["evidence"]) == 1


def test_flag_off_prompts_are_the_papers_byte_for_byte(monkeypatch, embedder):
    seen = []
    record = debate(monkeypatch, None, None, rounds=2, seen=seen)
    turns = record["transcript"]["turns"]
    labels = {"label_choices": debatecv.AVERITEC.choices(), "label_answer": debatecv.AVERITEC.answer_format()}
    expected = [render("affirmative_opening", claim=CLAIM["claim"]),
                render("negative_opening", opponent_argument="affirmative argues"),
                render("moderator_round", round=1, affirmative_argument="affirmative argues",
                       negative_argument="negative argues", **labels),
                render("debater_rebuttal", opponent_argument="negative argues"),
                render("debater_rebuttal", opponent_argument="affirmative argues"),
                render("moderator_round", round=2, affirmative_argument="affirmative argues",
                       negative_argument="negative argues", **labels),
                render("moderator_final", affirmative_argument="affirmative argues",
                       negative_argument="negative argues", claim=CLAIM["claim"], **labels)]
    assert [t["prompt"] for t in turns] == expected
    assert "debate_retrieval" not in record["transcript"] and "evidence" not in record["prediction"]
    # With a source that admits nothing, the arguments' prompts are those same prompts: only the queries are added.
    record = debate(monkeypatch, lambda role, round_no: "pasta", corpus_source(embedder, [CLAIM["evidence"][0][
        "answer"]]), grow.Limits(top_k=1))
    assert [t["prompt"] for t in record["transcript"]["turns"] if t.get("kind") != "query"] == expected


def test_the_grown_evidence_file_is_herOs_format_and_eval_evidence_reads_it(tmp_path, monkeypatch):
    monkeypatch.setattr(grown_evidence.averitec, "meteor_available", lambda: False)  # METEOR is eval's to test
    predictions = [{"claim_id": "c1", "debate_retrieval": {"admitted": 1},
                    "evidence": [CLAIM["evidence"][0], {"question": "tower", "answer": TOWER, "url": "u", "round": 1}]}]
    claims = [dict(CLAIM, questions=[{"question": "Where was the Eiffel Tower built?", "answers": [
        {"answer": TOWER, "answer_type": "Extractive"}]}])]
    grown_evidence.save(tmp_path, predictions, claims)
    rows = [json.loads(line) for line in (tmp_path / grown_evidence.FILE).read_text().splitlines()]
    assert rows == [{"claim_id": "c1", "claim": CLAIM["claim"], "evidence": [
        {"question": "Where is the Colosseum?", "answer": "The Colosseum stands in Rome.",
         "url": "https://example.org/colosseum"}, {"question": "tower", "answer": TOWER, "url": "u"}]}]
    # eval.evidence_score's own reader takes the file as it takes HerO's
    # (what `python -m eval.evidence_score` reads first).
    assert [r for _, r in evidence_scores.read_records(tmp_path / grown_evidence.FILE)] == rows


@pytest.mark.parametrize("settings, message", [
    ({"debate_retrieval": True}, "needs something to search"),
    ({"debate_retrieval": True, "corpus": "c.jsonl", "method": "rag-cot"}, "DebateCV's"),
    ({"admit_per_round": 0}, "--admit-per-round must be at least 1"),
    ({"debate_novelty_threshold": 1.5}, "--debate-novelty-threshold must be in"),
])
def test_settings_that_make_no_run_are_refused_naming_the_flag(settings, message):
    with pytest.raises(config.ConfigError, match=message):
        config.build(split="dev", evidence="golden", **settings)


def test_a_store_searched_only_during_the_debate_is_allowed_with_golden_evidence():
    built = config.build(split="dev", evidence="golden", knowledge_store="stores", debate_retrieval=True, model="m")
    assert built.retrieval.knowledge_store == "stores" and built.debate.debate_retrieval
    with pytest.raises(config.ConfigError, match="--evidence retrieved"):
        config.build(split="dev", evidence="golden", knowledge_store="stores", model="m")


def test_syndec_synthesis_passes_the_flag_and_its_source_on():
    import train_moderator
    from train import stages

    args = train_moderator.parse_args(["--stage", "synth", "--split", "dev", "--debate-retrieval",
                                       "--knowledge-store", "stores", "--out", "runs/x", "--model", "m"])
    built = stages.synth_config(args)
    assert built.debate.debate_retrieval and built.retrieval.knowledge_store == "stores"
    assert built.data.evidence == "golden"  # the store is searched during the debate only
    plain = stages.synth_config(train_moderator.parse_args(["--stage", "synth", "--split", "dev", "--out", "runs/x",
                                                            "--model", "m"]))
    assert not plain.debate.debate_retrieval and plain.retrieval.knowledge_store is None


def test_a_run_debates_with_growing_evidence_and_saves_it_in_herOs_format(monkeypatch, tmp_path):
    """run_debate.py --debate-retrieval end to end with a tiny model on the demo claims, its store searched during the
    debate only; a random model's query is garbage, so the search asks with fixed words instead."""
    import run_debate
    from tests.tiny_models import build_tiny_llama

    found = "Riverton's bus ridership on the downtown loop doubled in the first month after fares ended."
    store = tmp_path / "stores"
    store.mkdir()
    (store / "0.json").write_text(json.dumps({"url": "https://example.org/riverton/ridership", "url2text": [
        found, "The weather in Riverton was mild that winter."]}) + "\n", encoding="utf-8")
    monkeypatch.setattr(grow, "cut_query", lambda text, words: "Riverton bus ridership downtown loop fares")
    out = tmp_path / "run"
    run_debate.main(["--split", "demo", "--limit", "1", "--model", str(build_tiny_llama(tmp_path / "tiny")),
                     "--max-rounds", "2", "--max-new-tokens", "8", "--no-structured", "--temperature", "0",
                     "--knowledge-store", str(store), "--debate-retrieval", "--debate-top-k", "1",
                     "--output-dir", str(out)])
    transcript = json.loads((out / "transcripts.jsonl").read_text().splitlines()[0])
    rounds = transcript["debate_retrieval"]["rounds"]
    assert rounds[0]["queries"][0]["returned"][0]["text"] == found
    assert rounds[0]["queries"][0]["returned"][0]["decision"] == "admitted"
    assert rounds[0]["queries"][1]["returned"][0]["decision"] == "novelty"
    assert all(found in t["prompt"] for t in transcript["turns"] if t["round"] == 1 and t.get("kind") != "query")
    saved = json.loads((out / grown_evidence.FILE).read_text().splitlines()[0])
    assert saved["claim_id"] == 0 and saved["evidence"][-1]["answer"] == found
    config_saved = json.loads((out / "config.json").read_text())
    assert config_saved["debate_retrieval"] is True and config_saved["evidence"] == "golden"
