"""Retrieval from a knowledge store in AVeriTeC's layout (HerO's strategy), end to end with the tiny model.

The store is built here from the real AVeriTeC dev split (../shared/data or $DEBATECV_SHARED_DATA): each claim's
pages are its golden answers (a page per answer, split into sentences) and its gold justification; three other
claims' pages are mixed in as distractors. The tiny random model's HyDE articles and questions are noise, so the
share of evidence from the claim's own pages measures BM25 with the claim and the shipped encoder's re-ranking.
"""
import json
import random
import re
from pathlib import Path

import pytest
import torch

import run_debate
from debate.data import knowledge_store
from debate.data.knowledge_store import StoreError
from debate.methods import hero_retrieval
from debate.pipeline import store_retrieval
from eval import evidence as evidence_scores
from tests.tiny_models import averitec_dir, build_tiny_llama, missing

CLAIMS = 5  # claims of the test split; the last has no store file
RERANK_K = 3


def _sentences(text):
    return [s for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if s]


def _pages(claim):
    """A claim's own pages: one per substantive golden answer, and one of its gold justification."""
    pages = []
    for q in claim["questions"]:
        for a in q.get("answers") or []:
            if a.get("answer_type") != "Unanswerable" and len(a["answer"].split()) > 3:
                pages.append({"url": a.get("source_url") or "https://example.org/answer", "type": "web",
                              "query": q["question"], "url2text": _sentences(a["answer"])})
    if claim.get("justification"):
        pages.append({"url": "https://example.org/justification", "url2text": _sentences(claim["justification"])})
    return pages


@pytest.fixture(scope="module", autouse=True)
def own_cache(tmp_path_factory):
    """The store embeddings' cache in a folder of the tests' own, not the user's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DEBATECV_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    path = averitec_dir() / "dev.json"
    if not path.is_file():
        missing(f"real AVeriTeC data not found at {path} (set DEBATECV_SHARED_DATA)")
    dev = json.loads(path.read_text(encoding="utf-8"))
    chosen = [i for i, c in enumerate(dev) if len(_pages(c)) >= 4][:CLAIMS]
    root = tmp_path_factory.mktemp("ks")
    data, store = root / "data", root / "store"
    data.mkdir()
    store.mkdir()
    claims = [dict(dev[i], claim_id=i) for i in chosen]
    (data / "dev.json").write_text(json.dumps(claims), encoding="utf-8")
    rng = random.Random(0)
    own = {}
    for c in claims[:-1]:  # the last claim has no store file
        pages = _pages(c)
        own[c["claim_id"]] = {" ".join(s.split()) for p in pages for s in p["url2text"]}
        for other in rng.sample([k for k in range(len(dev)) if k != c["claim_id"]], 3):
            pages += _pages(dev[other])
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
    # --retrieve-only scores the file on its own (eval/evidence.py) against the claims' golden pairs
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
                     "--retrieved-file", str(run / store_retrieval.RETRIEVED), "--output-dir", str(back), *debate_flags()])
    assert "evidence: retrieved, from the file" in capsys.readouterr().out
    assert lines(back / "predictions.jsonl") == lines(run / "predictions.jsonl")


def test_a_retrieval_stopped_half_way_resumes_to_the_same_file(world, retrieved, tmp_path, capsys):
    out, _ = retrieved
    broken = tmp_path / "store"
    broken.mkdir()
    for f in world["store"].iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    third = broken / f"{world['claims'][2]['claim_id']}.json"
    good = third.read_text(encoding="utf-8")
    third.write_text(good + '{"url": "x", "url2text": ["a"]\n', encoding="utf-8")  # the last line is torn
    run = tmp_path / "run"
    flags = argv(world, run, "--retrieve-only", "--missing-store", "skip", store=broken)
    with pytest.raises(SystemExit) as stop:
        run_debate.main(flags)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"{third}: line {good.count(chr(10)) + 1}: not valid JSON" in err
    # the first batch (two claims) was retrieved before the bad line and is kept
    assert [r["claim_id"] for r in lines(run / store_retrieval.RETRIEVED)] == [c["claim_id"] for c in world["claims"][:2]]
    third.write_text(good, encoding="utf-8")
    run_debate.main(flags)
    assert "2 of 5 claims already retrieved" in capsys.readouterr().out

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
    with pytest.raises(StoreError, match=r"1\.json: line 2: not valid JSON"):
        knowledge_store.read_store(write(tmp_path / "1.json", page, "{not json"))
    with pytest.raises(StoreError, match=r"2\.json: line 2: missing field 'url2text'"):
        knowledge_store.read_store(write(tmp_path / "2.json", page, {"url": "v", "type": "pdf"}))
    with pytest.raises(StoreError, match=r"3\.json: line 1: field 'url2text': expected a list of strings"):
        knowledge_store.read_store(write(tmp_path / "3.json", {"url": "v", "url2text": "text"}))
    with pytest.raises(StoreError, match=r"4\.json: line 1: field 'url': expected a string"):
        knowledge_store.read_store(write(tmp_path / "4.json", {"url": 3, "url2text": []}))


def test_empty_pages_are_skipped_and_counted_and_duplicates_kept_once(tmp_path):
    store = knowledge_store.read_store(write(
        tmp_path / "1.json", {"url": "a", "url2text": ["First.", "Second.", "Third."]}, {"url": "b", "url2text": []},
        {"url": "c", "url2text": ["  second. ", "Fourth."]}))
    assert store.texts == ["First.", "Second.", "Third.", "Fourth."]
    assert store.urls == ["a", "a", "a", "c"] and store.empty_pages == [2] and store.lines == 3
    assert store.with_context(1, 1) == "First. Second. Third." and store.with_context(3, 1) == "second. Fourth."


def test_missing_files_and_a_store_of_other_claims(tmp_path):
    write(tmp_path / "1.json", {"url": "a", "url2text": ["x."]})
    with pytest.raises(StoreError, match=r"2\.json: no such store file \(1 of 2 claims have none\); --missing-store skip"):
        knowledge_store.check_directory(tmp_path, [1, 2])
    assert knowledge_store.check_directory(tmp_path, [1, 2], missing="skip") == [2]
    with pytest.raises(StoreError, match=r"no store file for any of the 2 claims .* it holds 1\.json: a store for other"):
        knowledge_store.check_directory(tmp_path, [7, 8], missing="skip")
    with pytest.raises(StoreError, match="not a directory"):
        knowledge_store.check_directory(tmp_path / "nowhere", [1])


def test_bad_store_stops_the_run_before_any_model_loads(world, tmp_path, capsys):
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


def test_the_search_embeds_its_queries_under_the_instruction_and_scores_what_it_keeps(monkeypatch):
    from types import SimpleNamespace

    from debate.engine import store_search

    texts = ["The mayor won the vote.", "Rain fell in May.", "The vote was close."]
    seen = []
    monkeypatch.setattr(store_search, "query_vector", lambda embedder, queries: seen.extend(queries) or "q")
    monkeypatch.setattr(store_search, "rerank", lambda cache, query, candidates, k, claim: [(c, 0.5) for c in
                                                                                            candidates[:k]])
    hits = hero_retrieval.search({"claim": "Who won the vote?"}, SimpleNamespace(texts=texts), ["The mayor won."],
                                 None, 10, 2, None, "Q: ")
    assert seen == ["Q: Who won the vote?", "Q: The mayor won."]
    assert len(hits) == 2 and all(len(h) == 3 and h[2] > 0 and h[1] == 0.5 for h in hits)
    assert hits[0][2] >= hits[1][2]  # BM25's order, which the stub re-ranking kept


def test_restatements_of_the_claim_are_dropped():
    from debate.engine.store_search import restates, tfidf_cosine

    # two texts with no word in common are orthogonal; the same words give cosine 1
    assert tfidf_cosine("red apples", "blue sky") == 0 and tfidf_cosine("a red apple", "apple red") == pytest.approx(1)
    assert restates("Joe Biden won the 2020 election.", "joe biden won the 2020 election")
    assert not restates("Joe Biden won", "Official results show that Joe Biden won the 2020 election by 7 million votes")


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
    result = evidence_scores.score([("line 1", retrieved)], [("entry 0", reference), ("entry 1", dict(reference, claim_id=1))])
    assert result["n"] == 1 and result["n_missing"] == 1
    assert result["question_only"] == pytest.approx(0.498, abs=1e-4)
    assert result["question_answer"] == pytest.approx(0.5 * (1 - 0.5 / 216), abs=1e-4)


def test_the_courtroom_searches_the_claims_own_store(tmp_path, monkeypatch):
    from debate.engine import retrieval
    from debate.methods.courtroom.case import Library, index_for

    write(tmp_path / "7.json", {"url": "https://a", "url2text": ["The bridge opened in 1932.", "It cost 10 million."]},
          {"url": "https://b", "url2text": ["Tigers are striped cats."]})
    library = Library(retrieval.load_embedder(), store=str(tmp_path), log=lambda *a: None)
    claim = {"claim_id": 7, "claim": "The bridge opened in 1932", "evidence": [{"text": "own evidence", "url": ""}]}
    index = index_for(library, claim)
    assert [p["text"] for p in index.passages] == ["The bridge opened in 1932.", "It cost 10 million.",
                                                   "Tigers are striped cats."]
    hits = retrieval.search(index, retrieval.embed(library.embedder, ["When did the bridge open?"]), 1)[0]
    assert index.passages[hits[0][0]]["url"] == "https://a"
    # embedded once: the second index of the same store takes every vector from the cache
    monkeypatch.setattr(retrieval, "embed", lambda *a, **k: pytest.fail("embedded again"))
    assert index_for(library, claim).vectors.shape == index.vectors.shape
    # a claim without a store file (--missing-store skip) searches its own evidence
    monkeypatch.undo()
    assert [p["text"] for p in index_for(library, dict(claim, claim_id=8)).passages] == ["own evidence"]


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
