"""Retrieval from a knowledge store in AVeriTeC's layout (HerO's strategy), end to end with the tiny model.

The store is built here from the real AVeriTeC dev split (../shared/data or $DEBATECV_SHARED_DATA): each claim's
pages are its golden answers (a page per answer, split into sentences) and its gold justification; three other
claims' pages are mixed in as distractors. The tiny random model's HyDE articles and questions are noise, so the
share of evidence from the claim's own pages measures BM25 with the claim and the shipped encoder's re-ranking.
"""
import json
import random
from pathlib import Path

import pytest
import torch

import run_debate
from debate.data import knowledge_store
from debate.data.knowledge_store import StoreError
from debate.methods import hero_retrieval
from debate.pipeline import store_retrieval
from eval import evidence_score as evidence_scores
from tests.tiny_models import averitec_dir, build_tiny_llama, claim_pages, missing, needs_wordnet

CLAIMS = 5  # claims of the test split; the last has no store file
RERANK_K = 3


pytestmark = pytest.mark.usefixtures("own_cache")  # tests/conftest.py: the embeddings' cache of our own


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    path = averitec_dir() / "dev.json"
    if not path.is_file():
        missing(f"real AVeriTeC data not found at {path} (set DEBATECV_SHARED_DATA)", shared_data=True)
    needs_wordnet()  # a run over a store scores the evidence it retrieved with METEOR (pipeline/scoring.py)
    dev = json.loads(path.read_text(encoding="utf-8"))
    chosen = [i for i, c in enumerate(dev) if len(claim_pages(c)) >= 4][:CLAIMS]
    root = tmp_path_factory.mktemp("ks")
    data, store = root / "data", root / "store"
    data.mkdir()
    store.mkdir()
    claims = [dict(dev[i], claim_id=i) for i in chosen]
    (data / "dev.json").write_text(json.dumps(claims), encoding="utf-8")
    rng = random.Random(0)
    own = {}
    for c in claims[:-1]:  # the last claim has no store file
        pages = claim_pages(c)
        own[c["claim_id"]] = {" ".join(s.split()) for p in pages for s in p["url2text"]}
        for other in rng.sample([k for k in range(len(dev)) if k != c["claim_id"]], 3):
            pages += claim_pages(dev[other])
        rng.shuffle(pages)
        (store / f"{c['claim_id']}.json").write_text("".join(json.dumps(p) + "\n" for p in pages), encoding="utf-8")
    model = str(build_tiny_llama(root / "tiny", seed=0))
    return {"data": data, "store": store, "claims": claims, "own": own, "model": model, "root": root}


def argv(world, out, *extra, store=None):
    return ["--split", "dev", "--data-dir", str(world["data"]), "--knowledge-store", str(store or world["store"]),
            "--model", world["model"], "--few-shot-split", "dev", "--few-shot", "2", "--hyde-docs", "2",
            "--hyde-max-tokens", "8", "--hyde-temperature", "0", "--question-max-tokens", "6", "--rerank-k",
            str(RERANK_K), "--batch-size", "2", "--output-dir", str(out), *extra]


def debate_flags():
    return ["--method", "rag-cot", "--max-new-tokens", "6", "--temperature", "0", "--no-structured"]


def lines(path):
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def retrieved(world):
    out = world["root"] / "retrieve-only"
    scores = run_debate.main(argv(world, out, "--retrieve-only", "--missing-store", "skip"))
    return out, scores


def test_saved_file_is_herOs_format_and_mostly_from_the_claims_own_pages(world, retrieved):
    out, scores = retrieved
    rows = lines(out / store_retrieval.RETRIEVED)
    assert [r["claim_id"] for r in rows] == [c["claim_id"] for c in world["claims"]]
    for row in rows[:-1]:
        assert len(row["evidence"]) == RERANK_K
        for item in row["evidence"]:
            assert set(item) == {"question", "answer", "url", "bm25_score", "rerank_score"}
            assert item["question"].endswith("?") and item["bm25_score"] > 0
        # The file can be audited: the HyDE articles under HerO's name, the re-rank scores best first.
        assert len(row["hypo_fc_docs"]) == 2 and all(isinstance(a, str) for a in row["hypo_fc_docs"])
        ranks = [item["rerank_score"] for item in row["evidence"]]
        assert ranks == sorted(ranks, reverse=True) and all(-1 <= r <= 1 for r in ranks)
    assert rows[-1]["evidence"] == [] and rows[-1]["retrieval"]["missing_store"]
    from_own = [item["answer"] in world["own"][row["claim_id"]] for row in rows[:-1] for item in row["evidence"]]
    # Measured: 10 of 12 items (83%) with the tiny model's noise articles (2 per claim) and all-MiniLM-L6-v2.
    print(f"share of items from the claim's own pages: {sum(from_own)} of {len(from_own)}")
    assert sum(from_own) / len(from_own) >= 0.75
    # --retrieve-only scores the file on its own (eval/evidence_score.py) against the claims' golden pairs
    # (the claim without a store is in the file with no evidence, and scores 0 as AVeriTeC's scorer has it)
    assert scores["n"] == CLAIMS and scores["n_missing"] == 0 and 0 < scores["question_answer"] <= 1
    assert json.loads((out / "retrieved.scores.json").read_text())["n"] == CLAIMS


def test_store_run_debates_on_the_retrieved_evidence_and_the_file_reads_back(world, retrieved, tmp_path, capsys):
    out, _ = retrieved
    run = tmp_path / "store-run"
    # the same store and settings: the saved file is copied in, so the stage has nothing left to retrieve
    run.mkdir()
    for name in (store_retrieval.RETRIEVED, store_retrieval.SETTINGS):
        (run / name).write_bytes((out / name).read_bytes())
    metrics = run_debate.main(argv(world, run, "--missing-store", "skip", *debate_flags()))
    said = capsys.readouterr().out
    assert "evidence: retrieved from the knowledge store" in said and f"{CLAIMS} of {CLAIMS} claims already" in said
    assert "1 without a store file" in said
    assert f"evidence (Hungarian METEOR over {CLAIMS} claims): question-only" in said  # after the verdicts' scores
    assert metrics["n"] == CLAIMS
    back = tmp_path / "file-run"
    run_debate.main(["--split", "dev", "--data-dir", str(world["data"]), "--model", world["model"],
                     "--retrieved-file", str(run / store_retrieval.RETRIEVED), "--output-dir", str(back),
                     *debate_flags()])
    assert "evidence: retrieved, from the file" in capsys.readouterr().out
    assert lines(back / "predictions.jsonl") == lines(run / "predictions.jsonl")


def test_a_retrieval_stopped_half_way_resumes_to_the_same_file(world, retrieved, tmp_path, capsys, monkeypatch):
    from debate.engine import store_search

    out, _ = retrieved
    third = knowledge_store.store_file(world["store"], world["claims"][2]["claim_id"])
    real = store_search.bm25_candidates

    def torn_after_the_check(path, query, k):  # the file changed on disk after the run checked it
        if str(path) == str(third):
            raise StoreError(f"{third}: line 9: not valid JSON (Expecting value at column 1)")
        return real(path, query, k)

    monkeypatch.setattr(store_search, "bm25_candidates", torn_after_the_check)
    run = tmp_path / "run"
    flags = argv(world, run, "--retrieve-only", "--missing-store", "skip")
    with pytest.raises(SystemExit) as stop:
        run_debate.main(flags)
    assert stop.value.code == 2
    assert f"{third}: line 9: not valid JSON" in capsys.readouterr().err
    # the first batch (two claims) was retrieved before the bad line and is kept
    written = [r["claim_id"] for r in lines(run / store_retrieval.RETRIEVED)]
    assert written == [c["claim_id"] for c in world["claims"][:2]]
    monkeypatch.undo()
    searched = []
    monkeypatch.setattr(store_search, "bm25_candidates", lambda path, q, k: searched.append(path) or real(path, q, k))
    run_debate.main(flags)
    assert "2 of 5 claims already retrieved" in capsys.readouterr().out
    assert [Path(p).name for p in searched] == [f"{c['claim_id']}.json" for c in world["claims"][2:4]]

    def evidence(path):
        return [(r["claim_id"], r["evidence"]) for r in lines(path)]

    assert evidence(run / store_retrieval.RETRIEVED) == evidence(out / store_retrieval.RETRIEVED)


def test_other_settings_do_not_resume_the_file(world, retrieved, tmp_path, capsys):
    out, _ = retrieved
    run = tmp_path / "run"
    run.mkdir()
    for name in (store_retrieval.RETRIEVED, store_retrieval.SETTINGS):
        (run / name).write_bytes((out / name).read_bytes())
    with pytest.raises(SystemExit):
        run_debate.main(argv(world, run, "--retrieve-only", "--missing-store", "skip", "--rerank-k", "2"))
    assert "retrieved with other settings (rerank_k: 3 -> 2)" in capsys.readouterr().err


# ---------------------------------------------------------------- bad stores: one line naming file, line, field


def write(path, *rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def test_bad_lines_name_the_file_line_and_field(tmp_path):
    page = {"url": "u", "url2text": ["One sentence.", "Two."]}
    check = knowledge_store.check_store
    with pytest.raises(StoreError, match=r"1\.json: line 2: not valid JSON"):
        check(write(tmp_path / "1.json", page, "{not json"))
    with pytest.raises(StoreError, match=r"2\.json: line 2: missing field 'url2text'"):
        check(write(tmp_path / "2.json", page, {"url": "v", "type": "pdf"}))
    with pytest.raises(StoreError, match=r"3\.json: line 1: field 'url2text': expected a list of strings, got a str"):
        check(write(tmp_path / "3.json", {"url": "v", "url2text": "text"}))
    with pytest.raises(StoreError, match=r"4\.json: line 1: field 'url': expected a string"):
        check(write(tmp_path / "4.json", {"url": 3, "url2text": []}))
    # a null among the sentences is named by its index
    null = r"5\.json: line 3: field 'url2text': url2text\[3\] is null, expected a string$"
    with pytest.raises(StoreError, match=null):
        check(write(tmp_path / "5.json", page, page, {"url": "w", "url2text": ["a", "b", "c", None]}))
    # a torn line: the column is counted on the line itself (29 characters: the break is at column 30)
    torn = '{"url": "x", "url2text": ["a"]'
    with pytest.raises(StoreError, match=r"6\.json: line 2: not valid JSON \(Expecting ',' delimiter at column 31 "
                                         r"\(the end of the line"):
        check(write(tmp_path / "6.json", page, torn))
    with pytest.raises(StoreError, match=r"7\.json: line 1: not valid JSON \(Expecting ',' delimiter at column 13\)$"):
        check(write(tmp_path / "7.json", '{"url": "x" "url2text": []}'))


def test_bytes_that_are_not_utf8_are_named_on_their_own_line(tmp_path):
    path = tmp_path / "8.json"
    good = (json.dumps({"url": "u", "url2text": ["caf\u00e9 " * 200]}, ensure_ascii=False) + "\n").encode()
    bad = b'{"url": "v", "url2text": ["ab\xffcd"]}\n'
    # 120 long good lines first: a decoder reading ahead of the lines would name an earlier one
    path.write_bytes(b"\xef\xbb\xbf" + good * 120 + bad + good)
    with pytest.raises(StoreError) as e:
        knowledge_store.check_store(path)
    at = bad.index(b"\xff")
    offset = 3 + len(good) * 120 + at
    assert str(e.value) == (f"{path}: line 121: not UTF-8 text (byte 0xff at byte {at + 1} of the line, offset "
                            f"{offset} of the file: invalid start byte)")
    assert path.read_bytes()[offset] == 0xff


def test_an_empty_store_is_named_empty_or_counted_as_empty(tmp_path, caplog):
    from types import SimpleNamespace

    (tmp_path / "1.json").write_bytes(b"")
    write(tmp_path / "2.json", {"url": "a", "url2text": []}, {"url": "b", "url2text": ["  "]})
    write(tmp_path / "3.json", {"url": "a", "url2text": ["A sentence."]})
    claims = [{"claim_id": k} for k in (1, 2, 3)]

    def config(missing):
        return SimpleNamespace(retrieval=SimpleNamespace(knowledge_store=str(tmp_path), missing_store=missing))

    caplog.set_level("INFO", logger="debate")
    with pytest.raises(StoreError, match=r"1\.json: an empty file; --missing-store skip retrieves nothing"):
        store_retrieval.check_stores(config("error"), claims, available=1 << 40)
    with pytest.raises(StoreError, match=r"2\.json: no sentence in any of its 2 lines"):
        store_retrieval.check_stores(config("error"), claims[1:], available=1 << 40)
    # the status is read from the file, not from what an earlier check in this process left behind
    assert [store_retrieval._status(config("skip"), c) for c in claims] == ["empty_store", "empty_store", "present"]
    store_retrieval.check_stores(config("skip"), claims, available=1 << 40)
    assert caplog.messages == []  # no line, not even a warning


def test_a_stores_first_sentences_are_read_without_reading_the_rest(tmp_path):
    path = write(tmp_path / "1.json", {"url": "a", "url2text": ["", "One.", "  Two  words. "]},
                 {"url": "b", "url2text": ["Three."]})
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"url": "c", "url2text": ["cut short\n')  # a broken line after them: never reached
    assert knowledge_store.first_sentences(path, 2) == ["One.", "Two words."]
    assert knowledge_store.first_sentences(path, 3) == ["One.", "Two words.", "Three."]
    with pytest.raises(StoreError, match=r"1\.json: line 3: not valid JSON"):
        knowledge_store.first_sentences(path, 4)


def test_a_store_bigger_than_the_memory_allows_is_warned_about_in_one_line(tmp_path, caplog):
    from types import SimpleNamespace

    big = write(tmp_path / "1.json", *[{"url": "a", "url2text": [f"Sentence {i} of the store."] * 20}
                                       for i in range(50)])
    write(tmp_path / "2.json", {"url": "a", "url2text": ["Small."]})
    config = SimpleNamespace(retrieval=SimpleNamespace(knowledge_store=str(tmp_path), missing_store="error"))
    claims = [{"claim_id": 1}, {"claim_id": 2}]
    caplog.set_level("INFO", logger="debate")
    room = int(big.stat().st_size * store_retrieval.MEMORY_PER_STORE_BYTE) - 1
    store_retrieval.check_stores(config, claims, available=room)
    said = caplog.messages
    assert len(said) == 1 and said[0].startswith(f"warning: {big} (") and "the largest store" in said[0]
    assert caplog.records[0].levelname == "WARNING"
    caplog.clear()
    store_retrieval.check_stores(config, claims, available=room + 2)
    assert caplog.messages == []


def test_the_memory_warning_comes_before_any_model_loads(world, tmp_path, capsys, monkeypatch):
    from debate.engine import models, ram

    class Loaded(Exception):
        pass

    def load_roles(*a, **k):
        raise Loaded(capsys.readouterr().err)  # what was warned (on stderr) before the first model loads

    monkeypatch.setattr(ram, "available", lambda *a, **k: 1000)
    monkeypatch.setattr(models, "load_roles", load_roles)
    with pytest.raises(Loaded) as said:
        run_debate.main(argv(world, tmp_path / "run", "--retrieve-only", "--missing-store", "skip"))
    warned = [line for line in str(said.value).splitlines() if line.startswith("warning: ")]
    assert len(warned) == 1 and "the largest store" in warned[0] and "more than the 0 MB this process" in warned[0]


def test_a_bad_store_is_named_before_any_model_loads(world, tmp_path, capsys, monkeypatch):
    from debate.engine import models

    broken = tmp_path / "store"
    broken.mkdir()
    for f in world["store"].iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    last = broken / f"{world['claims'][3]['claim_id']}.json"
    last.write_text(last.read_text(encoding="utf-8") + '{"url": "x", "url2text": [null]}\n', encoding="utf-8")
    monkeypatch.setattr(models, "load_roles", lambda *a, **k: pytest.fail("a model loaded"))
    with pytest.raises(SystemExit) as stop:
        run_debate.main(argv(world, tmp_path / "run", "--retrieve-only", "--missing-store", "skip", store=broken))
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    n = last.read_text(encoding="utf-8").count("\n")
    assert err[-1].endswith(f"{last}: line {n}: field 'url2text': url2text[0] is null, expected a string")


def test_empty_pages_are_skipped_and_counted_and_duplicates_kept_once(tmp_path):
    store = knowledge_store.read_store(write(
        tmp_path / "1.json", {"url": "a", "url2text": ["First.", "Second.", "Third."]}, {"url": "b", "url2text": []},
        {"url": "c", "url2text": ["  second. ", "Fourth."]}))
    assert store.texts == ["First.", "Second.", "Third.", "Fourth."]
    assert store.urls == ["a", "a", "a", "c"] and store.empty_pages == [2] and store.lines == 3
    assert store.with_context(1, 1) == "First. Second. Third." and store.with_context(3, 1) == "second. Fourth."


def test_missing_files_and_a_store_of_other_claims(tmp_path):
    write(tmp_path / "1.json", {"url": "a", "url2text": ["x."]})
    with pytest.raises(StoreError,
                       match=r"2\.json: no such store file \(1 of 2 claims have none\); --missing-store skip"):
        knowledge_store.check_directory(tmp_path, [1, 2])
    assert knowledge_store.check_directory(tmp_path, [1, 2], missing="skip") == [2]
    with pytest.raises(StoreError,
                       match=r"no store file for any of the 2 claims .* it holds 1\.json: a store for other"):
        knowledge_store.check_directory(tmp_path, [7, 8], missing="skip")
    with pytest.raises(StoreError, match="not a directory"):
        knowledge_store.check_directory(tmp_path / "nowhere", [1])


def test_bad_store_directory_stops_the_run_before_any_model_loads(world, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        run_debate.main(argv(world, tmp_path / "run", store=tmp_path))  # an empty folder: a store for no claim
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no store file for any of the 5 claims" in err[0]
    with pytest.raises(SystemExit):
        run_debate.main(argv(world, tmp_path / "run"))  # the last claim has no file, and no --missing-store skip
    assert "no such store file (1 of 5 claims have none); --missing-store skip" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- the pieces


def test_few_shot_examples_never_come_from_the_claims_own_pairs():
    claims = [{"claim_id": k, "claim": f"claim {k}", "gold_evidence": [
        {"question": "Who won the vote", "answer": f"The mayor won the vote {k}", "url": ""},
        {"question": "Was it answered?", "answer": "No answer could be found.", "url": ""}]} for k in range(3)]
    pool = knowledge_store.qa_examples(claims, "dev")
    assert len(pool) == 3 and pool[0]["split"] == "dev"
    assert pool[0]["text"] == "Claim: claim 0\nEvidence: The mayor won the vote 0.\nQuestion: Who won the vote?"
    index = hero_retrieval.few_shot_index(pool)
    chosen = hero_retrieval.examples_for(pool, index, "the mayor won the vote 1", 1, 5, "dev")
    assert [e["claim_id"] for e in chosen] and all(e["claim_id"] != 1 for e in chosen)


def test_a_dev_claim_keeps_the_train_claim_of_its_id_in_its_few_shot_pool():
    # AVeriTeC's ids are positions within each split: train claim 1 is another claim than dev claim 1.
    claims = [{"claim_id": k, "claim": f"claim {k}", "gold_evidence": [
        {"question": "Who won the vote", "answer": f"The mayor won the vote in {town}", "url": ""}]}
        for k, town in enumerate(("Leeds", "Hull", "York"))]
    pool = knowledge_store.qa_examples(claims, "train")
    index = hero_retrieval.few_shot_index(pool)
    chosen = hero_retrieval.examples_for(pool, index, "the mayor won the vote in Hull", 1, 3, "dev")
    assert [e["claim_id"] for e in chosen][0] == 1 and len(chosen) == 3
    assert 1 not in [e["claim_id"] for e in hero_retrieval.examples_for(pool, index, "the mayor won the vote in Hull",
                                                                        1, 3, "train")]


def test_boolean_answers_read_as_hero_writes_them():
    from debate.data import averitec

    item = {"claim": "c", "questions": [{"question": "Did it happen", "answers": [
        {"answer": "No", "answer_type": "Boolean", "boolean_explanation": "The Record shows otherwise."}]}]}
    gold = averitec._gold_evidence("dev.json", "entry 0", item["questions"])
    assert gold[0]["answer"] == "No. The Record shows otherwise."  # what the debates and the scorer read
    pool = knowledge_store.qa_examples([{"claim_id": 0, "claim": "c", "gold_evidence": gold}], "train")
    assert pool[0]["lookup"] == "No, because the record shows otherwise."
    assert "Evidence: No, because the record shows otherwise.\nQuestion: Did it happen?" in pool[0]["text"]


def test_the_hyde_prompt_asks_what_heros_asks_and_nothing_more():
    from debate.data.prompts import render

    prompt = render("hyde_fc", claim="The moon is made of cheese.")
    # HerO: a fact-checking article passage that supports, refutes, indicates not enough evidence, or presents
    # conflicting evidence regarding the claim; then the claim, and the reply opens with "Passage:".
    for asked in ("fact-checking article", "supports", "refutes", "not enough evidence", "conflicting evidence"):
        assert asked in prompt
    assert prompt.endswith("Claim: The moon is made of cheese.\nPassage:")
    # Nothing HerO does not ask: no call for concrete specifics, no reply-format instruction.
    for added in ("concrete", "names", "dates", "figures", "only"):
        assert added not in prompt.lower()


def test_the_query_instruction_comes_from_the_flag_the_encoders_folder_or_heros_sfr_line(tmp_path):
    sfr = tmp_path / "SFR-Embedding-2_R"
    sfr.mkdir()
    hero = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery: "
    assert hero_retrieval.query_instruction(str(sfr)) == hero
    assert hero_retrieval.query_instruction(str(sfr), "") == ""  # the flag wins, even when empty
    assert hero_retrieval.query_instruction(str(sfr), "query:\\n") == "query:\n"
    e5 = tmp_path / "e5"
    e5.mkdir()
    assert hero_retrieval.query_instruction(str(e5)) == ""
    (e5 / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {"query": "query: ", "passage": ""}}))
    assert hero_retrieval.query_instruction(str(e5)) == "query: "
    (sfr / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {"web": "Instruct: x\nQuery: "},
                                                                        "default_prompt_name": "web"}))
    assert hero_retrieval.query_instruction(str(sfr)) == "Instruct: x\nQuery: "


def test_the_search_embeds_its_queries_under_the_instruction_and_scores_what_it_keeps(monkeypatch, tmp_path):
    from debate.engine import store_search

    path = write(tmp_path / "0.json", {"url": "a", "url2text": ["The mayor won the vote.", "Rain fell in May."]},
                 {"url": "b", "url2text": ["The vote was close."]})
    seen = []
    monkeypatch.setattr(store_search, "query_vector", lambda embedder, queries: seen.extend(queries) or "q")
    monkeypatch.setattr(store_search, "VectorCache", lambda digest, embedder: None)
    monkeypatch.setattr(store_search, "rerank", lambda cache, query, candidates, k, claim: [(c, 0.5) for c in
                                                                                            candidates[:k]])
    hits, found = hero_retrieval.search({"claim": "Who won the vote?"}, path, ["The mayor won."], None, 10, 2, "Q: ")
    assert seen == ["Q: Who won the vote?", "Q: The mayor won."]
    # Each kept sentence carries its BM25 score for the retrieved file; "Rain fell in May." shares no word.
    assert [c.text for c, _ in hits] == ["The mayor won the vote.", "The vote was close."]
    assert all(c.score > 0 and cosine == 0.5 for c, cosine in hits) and hits[0][0].score >= hits[1][0].score


def test_restatements_of_the_claim_are_dropped():
    from debate.engine.store_search import restates, tfidf_cosine

    # two texts with no word in common are orthogonal; the same words give cosine 1
    assert tfidf_cosine("red apples", "blue sky") == 0 and tfidf_cosine("a red apple", "apple red") == pytest.approx(1)
    assert restates("Joe Biden won the 2020 election.", "joe biden won the 2020 election")
    assert not restates("Joe Biden won",
                        "Official results show that Joe Biden won the 2020 election by 7 million votes")


def test_question_is_the_reply_up_to_its_first_question_mark():
    assert hero_retrieval._question("Question: Did he\nsay it? And more? ") == "Did he say it?"
    assert hero_retrieval._article("Passage: The text.\n\n\nNoise") == "The text."


# ---------------------------------------------------------------- the evidence-only scorer


def test_evidence_scores_against_a_hand_worked_example():
    from eval.wordnet import WordNetMissingError

    try:
        from eval.meteor import pairwise_meteor

        pairwise_meteor("a b", "a b")
    except WordNetMissingError as err:
        missing(str(err))
    reference = {"claim_id": 0, "questions": [
        {"question": "Where was the mayor born", "answers": [{"answer": "Paris", "answer_type": "Extractive"}]},
        {"question": "Which party funds zebras", "answers": [{"answer": "Nobody", "answer_type": "Extractive"}]}]}
    retrieved = {"claim_id": 0, "evidence": [
        {"question": "Where was the mayor born", "answer": "Paris", "url": ""},
        {"question": "Quantum chromodynamics lattice", "answer": "gluons", "url": ""}]}
    # By hand: the first question matches its golden twin word for word: METEOR's F-mean is 1 and its penalty
    # 0.5 * (1 chunk / 5 matches)^3 = 0.004, so 0.996; the second shares no word with anything: 0. The Hungarian
    # sum 0.996 over 2 golden questions is 0.498. Question+answer: "Where was the mayor born Paris" (6 words, one
    # chunk): 1 - 0.5 / 216 = 0.99769, over 2 golden strings 0.49884.
    result = evidence_scores.score([("line 1", retrieved)],
                                   [("entry 0", reference), ("entry 1", dict(reference, claim_id=1))])
    assert result["n"] == 1 and result["n_missing"] == 1
    assert result["question_only"] == pytest.approx(0.498, abs=1e-4)
    assert result["question_answer"] == pytest.approx(0.5 * (1 - 0.5 / 216), abs=1e-4)


def test_the_courtroom_searches_bm25s_best_of_the_claims_own_store(tmp_path, monkeypatch):
    from debate.engine import retrieval
    from debate.methods.courtroom.case import Library, index_for

    monkeypatch.setenv("DEBATECV_CACHE", str(tmp_path / "cache"))
    pages = [{"url": "https://a", "url2text": ["The bridge opened in 1932.", "It cost 10 million."]},
             {"url": "https://b", "url2text": ["Tigers are striped cats."]}]
    pages += [{"url": f"https://n{i}", "url2text": [f"Noise sentence {i} about the river bridge {j}."
                                                    for j in range(9)]} for i in range(30)]
    write(tmp_path / "7.json", *pages)
    embedded = []
    real = retrieval.embed
    monkeypatch.setattr(retrieval, "embed", lambda e, texts, **kw: embedded.extend(texts) or real(e, texts, **kw))
    library = Library(retrieval.load_embedder(), store=str(tmp_path), bm25_k=12)
    claim = {"claim_id": 7, "claim": "The bridge opened in 1932", "evidence": [{"text": "own evidence", "url": ""}]}
    index = index_for(library, claim)
    # BM25's 12 best for the claim of the store's 273 sentences, and only they, are embedded: never the store
    assert len(index.passages) == 12 and len(embedded) == 12 and index.vectors.shape[0] == 12
    assert index.passages[0] == {"id": "0", "text": "The bridge opened in 1932.", "url": "https://a"}
    assert "Tigers are striped cats." not in embedded and "It cost 10 million." not in embedded
    hits = retrieval.search(index, real(library.embedder, ["When did the bridge open?"]), 1)[0]
    assert index.passages[hits[0][0]]["url"] == "https://a"
    # embedded once: the second index of the same store takes every vector from the cache
    assert index_for(library, claim).vectors.shape == index.vectors.shape and len(embedded) == 12
    # a claim without a store file (--missing-store skip) searches its own evidence
    assert [p["text"] for p in index_for(library, dict(claim, claim_id=8)).passages] == ["own evidence"]


# ---------------------------------------------------------------- streamed BM25 against bm25s


def test_streamed_bm25_finds_what_bm25s_finds(tmp_path, monkeypatch):
    import bm25s

    from debate.engine import store_search

    rng = random.Random(3)
    # non-ASCII words too: one regex call over many sentences must cut and lower-case them as bm25s does (a final
    # sigma lower-cases by its place in the word, and a sentence's end is a word's end)
    vocab = [f"w{i}" for i in range(80)] + ["the", "of", "a", "I", "x9", "naïve", "Straße", "ΣΟΦΟΣ", "日本語", "é"]
    rows = []
    for p in range(150):
        sentences = [" ".join(rng.choice(vocab) for _ in range(rng.randint(0, 14))) for _ in range(rng.randint(0, 9))]
        sentences += ["The W1  w2 of"] * (rng.random() < 0.3)  # repeated, in another case: kept once
        rows.append({"url": f"https://p{p}", "url2text": sentences})
    path = write(tmp_path / "1.json", *rows)
    store = knowledge_store.read_store(path)
    index = store_search.bm25_index(store.texts)
    monkeypatch.setattr(store_search, "CHUNK", 97)  # many chunks: the running best must merge them right
    for query in ("w1 w2 w3 the the of w50 zz w7 w7 W7", "x9", "nothing known here", "w5 " * 30 + "w6",
                  "σοφος straße NAÏVE 日本語"):
        words = [w for w in bm25s.tokenize([query], stopwords=None, show_progress=False, return_ids=False)[0]
                 if w in index.vocab_dict]
        oracle = index.get_scores(words) if words else None
        for k in (1, 10, 60, 5000):
            found = store_search.bm25_candidates(path, query, k)
            assert found.sentences == len(store.texts) and found.pages == 150
            old = store_search.bm25_top(index, query, k)
            got = [c.position for c in found.candidates]
            assert len(got) == len(old)
            if not old:
                continue
            assert all(c.text == store.texts[c.position] and c.url == store.urls[c.position] for c in found.candidates)
            # the same scores, rank by rank (float32, as bm25s keeps them); ties keep store order
            assert [c.score for c in found.candidates] == pytest.approx([float(oracle[i]) for i in old], rel=1e-6)
            pairs = zip(found.candidates, found.candidates[1:])
            assert all(a.score > b.score or a.score == b.score and a.position < b.position for a, b in pairs)
            # the same sentences, but for those tied with the last one kept (bm25s orders ties as it likes)
            last = found.candidates[-1].score
            assert {p for p in got if oracle[p] > last + 1e-5} == {p for p in old if oracle[p] > last + 1e-5}
            assert got == sorted(range(len(oracle)), key=lambda i: (-oracle[i], i))[:len(got)]


def test_an_answer_comes_with_its_pages_neighbours_read_back_from_the_file(tmp_path):
    from debate.engine import store_search

    path = write(tmp_path / "1.json", {"url": "a", "url2text": ["First.", "Second stone.", "Third."]},
                 {"url": "b", "url2text": []}, {"url": "c", "url2text": ["  second stone. ", "Fourth stone."]})
    found = store_search.bm25_candidates(path, "stone", 5)
    assert [(c.position, c.text, c.url, c.line) for c in found.candidates] == [(1, "Second stone.", "a", 1),
                                                                             (3, "Fourth stone.", "c", 3)]
    assert found.empty_pages == [2] and found.sentences == 4
    assert [found.answer(c, 1) for c in found.candidates] == ["First. Second stone. Third.",
                                                              "second stone. Fourth stone."]
    assert [found.answer(c, 0) for c in found.candidates] == ["Second stone.", "Fourth stone."]


# ---------------------------------------------------------------- the embedding cache


def test_encoders_under_one_path_with_other_weights_never_share_embeddings(tmp_path, monkeypatch):
    import shutil

    from debate.engine import retrieval, store_search

    monkeypatch.setenv("DEBATECV_CACHE", str(tmp_path / "cache"))
    copy = tmp_path / "enc"
    shutil.copytree(retrieval.default_embedder_path(), copy)
    path = write(tmp_path / "1.json", {"url": "a", "url2text": ["The bridge opened in 1932.", "Bridges are old."]})
    found = store_search.bm25_candidates(path, "bridge 1932", 5)
    first = retrieval.load_embedder(str(copy))
    before = store_search.VectorCache(found.digest, first).vectors(found.candidates)
    assert store_search.VectorCache(found.digest, first).rows.keys() == {0}  # the second sees the first's rows
    with torch.no_grad():  # retrained in place: the same directory, other weights
        for p in first.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    first.model.save_pretrained(str(copy))
    second = retrieval.load_embedder(str(copy))
    assert second.path == first.path
    cache = store_search.VectorCache(found.digest, second)
    old = store_search.VectorCache(found.digest, first)  # the encoder loaded before: its own entries still
    assert cache.rows == {} and cache.path != old.path and old.rows.keys() == {0}
    after = cache.vectors(found.candidates)
    assert not torch.allclose(before, after, atol=1e-3)


def test_the_cache_stays_under_its_bound_the_oldest_going_first(tmp_path, monkeypatch):
    from debate.engine import retrieval, store_search

    monkeypatch.setenv("DEBATECV_CACHE", str(tmp_path / "cache"))
    embedder = retrieval.load_embedder()
    monkeypatch.setattr(retrieval, "_cache", dict(retrieval._cache, dropped=0, dropped_bytes=0, written=0))
    one = None
    made = []
    for claim in range(12):
        path = write(tmp_path / f"{claim}.json", {"url": "a", "url2text": [f"Claim {claim} sentence {j} here."
                                                                          for j in range(6)]})
        found = store_search.bm25_candidates(path, f"claim {claim} sentence", 6)
        cache = store_search.VectorCache(found.digest, embedder)
        cache.vectors(found.candidates)
        made.append(cache.path)
        if one is None:
            one = cache.path.stat().st_size
            retrieval.set_cache_limit(3.5 * one / 2**20)  # room for three stores' files
        root = cache.path.parent
        held = sorted(root.glob("*.pt"))
        assert sum(p.stat().st_size for p in held) <= 3.5 * one
    assert sorted(root.glob("*.pt")) == sorted(made[-3:])
    assert "3 files (3 stores, 0 corpora)" in retrieval.cache_summary() and "dropped 9" in retrieval.cache_summary()


def test_an_encoder_pools_as_its_directory_says(tmp_path):
    import shutil

    from debate.engine import retrieval

    shipped = retrieval.default_embedder_path()
    copy = tmp_path / "enc"
    shutil.copytree(shipped, copy)
    (copy / "1_Pooling").mkdir(exist_ok=True)
    (copy / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_lasttoken": True}))
    encoder = retrieval.load_embedder(str(copy))
    assert encoder.pooling == "lasttoken" and retrieval.load_embedder().pooling == "mean"
    # the last real token of a row is pooled whatever the padding: alone and beside a longer text, the same vector
    alone = retrieval.embed(encoder, ["short one"])
    padded = retrieval.embed(encoder, ["short one", "a much longer sentence that pads the other row of the batch"])
    assert torch.allclose(alone[0], padded[0], atol=1e-5)
    assert not torch.allclose(alone[0], retrieval.embed(retrieval.load_embedder(), ["short one"])[0], atol=1e-3)
