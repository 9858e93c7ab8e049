"""Dense retrieval: the packaged all-MiniLM-L6-v2 offline, corpus files and their errors, the embedding cache,
search and the novelty filter."""
import json

import pytest
import torch

from debate.engine import retrieval


@pytest.fixture(scope="module")
def embedder():
    return retrieval.load_embedder()


def write_corpus(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_embeddings_match_sentence_transformers_and_are_normalised(embedder):
    from sentence_transformers import SentenceTransformer

    texts = ["The minister said taxes will rise.", "A cat sat on the mat.", "short"]
    ours = retrieval.embed(embedder, texts)
    reference = SentenceTransformer(embedder.path, device="cpu").encode(texts, normalize_embeddings=True)
    assert ours.shape == (3, 384)
    assert torch.allclose(ours, torch.tensor(reference), atol=1e-5)
    assert torch.allclose(ours.norm(dim=1), torch.ones(3), atol=1e-5)


def test_search_ranks_by_cosine(embedder):
    passages = [{"id": str(i), "text": t} for i, t in enumerate(
        ["Bananas are rich in potassium.", "The Eiffel Tower is in Paris.", "Paris is the capital of France."])]
    index = retrieval.index_of(passages, embedder)
    hits = retrieval.search(index, retrieval.embed(embedder, ["How tall is the tower in Paris?"]), 2)[0]
    assert [p for p, _ in hits] == [1, 2] and hits[0][1] > hits[1][1]
    assert retrieval.search(index, retrieval.embed(embedder, ["x"]), 10)[0].__len__() == 3  # k above the corpus size
    empty = retrieval.index_of([], embedder)
    assert retrieval.search(empty, retrieval.embed(embedder, ["x"]), 3) == [[]]


def test_novelty_filter_refuses_a_near_duplicate_and_admits_a_new_passage(embedder):
    pool = retrieval.embed(embedder, ["The Eiffel Tower in Paris is 330 metres tall."])
    candidates = retrieval.embed(embedder, ["The Eiffel Tower in Paris stands 330 metres tall.",
                                            "Bananas are a good source of potassium.",
                                            "Bananas are a great source of potassium."])
    admitted, scores = retrieval.admit_novel(pool, candidates, 0.20)
    assert admitted == [1]  # the paraphrase of the pool and the paraphrase of the admitted banana are refused
    assert scores[0] < 0.20 <= scores[1] and scores[2] < 0.20
    assert retrieval.admit_novel(pool[:0], candidates[:1], 0.20) == ([0], [1.0])  # an empty pool admits anything


def test_corpus_errors_name_file_line_and_field(tmp_path):
    cases = [
        ('{"id": 1, "text": "ok"}\nnot json\n', "line 2: not valid JSON"),
        ('{"text": "no id"}\n', "line 1: missing field 'id'"),
        ('{"id": 1, "text": ""}\n', "line 1: field 'text'"),
        ('{"id": true, "text": "x"}\n', "line 1: field 'id'"),
        ('{"id": 1, "text": "x", "url": 5}\n', "line 1: field 'url'"),
        ('{"id": 1, "text": "x"}\n\n{"id": "1", "text": "y"}\n', "line 3: field 'id': '1' repeats line 1"),
        ("\n", "has no passages"),
    ]
    for text, message in cases:
        path = tmp_path / "corpus.jsonl"
        path.write_text(text)
        with pytest.raises(retrieval.RetrievalError, match=message) as err:
            retrieval.load_corpus(path)
        assert str(path) in str(err.value)
    with pytest.raises(retrieval.RetrievalError, match="no such corpus file"):
        retrieval.load_corpus(tmp_path / "missing.jsonl")


def test_corpus_embeddings_are_cached_by_content_in_the_cache_directory(tmp_path, embedder, monkeypatch):
    monkeypatch.setenv("DEBATECV_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "data"
    data.mkdir()
    corpus = write_corpus(data / "c.jsonl", [{"id": "a", "text": "Bananas are yellow.", "url": "u", "date": "2020"},
                                             {"id": "b", "text": "The sky is blue."}])
    data.chmod(0o555)  # a read-only data directory is never written to
    embedded = []
    real = retrieval.embed
    monkeypatch.setattr(retrieval, "embed", lambda e, texts, **kw: embedded.append(list(texts)) or real(e, texts))
    try:
        first = retrieval.corpus_index(corpus, embedder)
        assert sorted(p.name for p in data.iterdir()) == ["c.jsonl"] and len(embedded) == 1
        assert list((tmp_path / "cache" / "retrieval").glob("*.pt"))
        again = retrieval.corpus_index(corpus, embedder)
        assert len(embedded) == 1 and torch.equal(first.vectors, again.vectors)  # read from the cache
        assert again.passages[0] == {"id": "a", "text": "Bananas are yellow.", "url": "u", "date": "2020"}
        # The same passages handed over as a list (a dataset's corpus) share the cache: the key is their texts.
        listed = retrieval.passage_index([{"id": 1, "text": "Bananas are yellow."},
                                          {"id": 2, "text": "The sky is blue."}], embedder)
        assert len(embedded) == 1 and torch.equal(listed.vectors, first.vectors) and listed.passages[0]["id"] == "1"
    finally:
        data.chmod(0o755)
    write_corpus(corpus, [{"id": "a", "text": "Bananas are yellow."}, {"id": "c", "text": "Grass is green."}])
    changed = retrieval.corpus_index(corpus, embedder)
    assert len(embedded) == 2 and not torch.equal(changed.vectors[1], first.vectors[1])
    # Another encoder (here: the same one read with a shorter window) is another cache entry.
    retrieval.corpus_index(corpus, retrieval.Embedder(embedder.model, embedder.tokenizer, embedder.path, 128))
    assert len(embedded) == 3


def test_a_bad_passage_list_is_named_by_passage_and_field(embedder):
    for passages, message in [([], "has no passages"), ([{"id": 1}], "passage 0: field 'text'"),
                              ([{"id": 1, "text": "x"}, {"id": "1", "text": "y"}],
                               "passage 1: field 'id': '1' repeats"),
                              ([{"id": None, "text": "x"}], "passage 0: field 'id'")]:
        with pytest.raises(retrieval.RetrievalError, match=message):
            retrieval.passage_index(passages, embedder, source="check-covid corpus")


def test_evidence_of_both_shapes_becomes_passages():
    claim = {"claim_id": 3, "evidence": [{"question": "Who?", "answer": "Me.", "url": "u"},
                                         {"text": "An abstract sentence.", "url": "v"}, {"question": "", "answer": ""}]}
    passages = retrieval.evidence_passages(claim)
    assert [(p["id"], p["text"], p["url"]) for p in passages] == [("3-0", "Who? Me.", "u"),
                                                                  ("3-1", "An abstract sentence.", "v")]
    assert passages[0]["question"] == "Who?"  # a QA item keeps its fields


def test_a_missing_encoder_directory_is_named(tmp_path):
    with pytest.raises(retrieval.RetrievalError, match=str(tmp_path)):
        retrieval.load_embedder(str(tmp_path))
