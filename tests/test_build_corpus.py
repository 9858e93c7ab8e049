"""bench/build_corpus.py on a hand-made two-claim split: ids, texts, left-out items, duplicates, readability."""
import importlib.util
import json
from pathlib import Path

from debate.data.averitec import NO_ANSWER
from debate.engine import retrieval

# bench/ is a folder of standalone scripts, not a package: load the script by its path.
_SPEC = importlib.util.spec_from_file_location(
    "build_corpus", Path(__file__).resolve().parents[1] / "bench" / "build_corpus.py")
build_corpus = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(build_corpus)


def qa(question, *answers):
    return {"question": question, "answers": [{"answer": a, "answer_type": "Abstractive",
                                                "source_url": f"https://example.org/{i}"}
                                               for i, a in enumerate(answers)]}


def write_data(tmp_path):
    split = [
        {"claim": "The sky is green.", "label": "Refuted", "justification": "No.",
         "questions": [qa("What colour is the sky?", "Blue."), qa("Who saw it green?", NO_ANSWER),
                       qa("Is grass green?", "Yes.")]},
        {"claim": "Grass is green.", "label": "Supported", "justification": "Yes.",
         "questions": [qa("Is grass green?", "Yes.")]},  # the same text as claim 0's third item
    ]
    retrieved = [
        {"claim_id": 0, "evidence": [{"question": "What colour is the sky?", "answer": "Blue.", "url": "u0"},
                                     {"question": "Sky colour?", "answer": "Mostly blue.", "url": "u1"}]},
        {"claim_id": 1, "evidence": [{"question": "Sky colour?", "answer": "Mostly blue.", "url": "u2"}]},
    ]
    (tmp_path / "dev.json").write_text(json.dumps(split))
    (tmp_path / "dev.retrieved.hero.jsonl").write_text("".join(json.dumps(r) + "\n" for r in retrieved))
    return tmp_path


def test_build_corpus_pools_gold_and_retrieved(tmp_path):
    passages, counts = build_corpus.build_corpus(write_data(tmp_path))
    by_id = {p["id"]: p for p in passages}
    # gold-0-1 ("No answer") is left out; its position still numbers the items after it
    assert list(by_id) == ["gold-0-0", "gold-0-2", "hero-0-1"]
    assert by_id["gold-0-0"]["text"] == "What colour is the sky? Blue."
    assert by_id["hero-0-1"]["text"] == "Sky colour? Mostly blue."
    assert by_id["gold-0-0"]["source"] == "gold" and by_id["hero-0-1"]["source"] == "retrieved"
    assert by_id["gold-0-2"]["claim_id"] == 0 and by_id["gold-0-0"]["url"] == "https://example.org/0"
    assert (by_id["gold-0-0"]["question"], by_id["gold-0-0"]["answer"]) == ("What colour is the sky?", "Blue.")
    # exact duplicates are kept once, gold first, with the copies' ids recorded
    assert by_id["gold-0-0"]["also"] == ["hero-0-0"]
    assert by_id["gold-0-2"]["also"] == ["gold-1-0"]
    assert by_id["hero-0-1"]["also"] == ["hero-1-0"]
    assert counts == {"claims": 2, "gold_items": 4, "gold_no_answer": 1, "retrieved_items": 3, "empty_text": 0,
                      "duplicates": 3, "passages": 3, "gold_passages": 2, "retrieved_passages": 1}
    assert not any(NO_ANSWER in p["text"] for p in passages)


def test_written_corpus_loads(tmp_path):
    passages, _ = build_corpus.build_corpus(write_data(tmp_path))
    out = tmp_path / "out" / "corpus.jsonl"
    build_corpus.write_corpus(passages, out)
    loaded = retrieval.load_corpus(out)
    assert [p["id"] for p in loaded] == [p["id"] for p in passages]
    assert [p["also"] for p in loaded] == [p["also"] for p in passages]
