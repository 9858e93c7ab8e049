"""DebateCV's retrieval during the debate (--debate-retrieval; the toolkit's own, docs/debate_retrieval.md).

Each round, before arguing, each Debater names the evidence it lacks as one search query (prompts/debate_query).
The query runs against the claim's own source: its knowledge-store file (BM25, then dense re-ranking, the search of
the --knowledge-store stage: debate.engine.store_search), else a corpus index (--corpus, or the dataset's own corpus;
dense search as the courtroom's P-RAG does: debate.engine.retrieval). A passage joins the claim's evidence when it is
novel against everything shown so far (the courtroom's novelty test, 1 - the largest cosine to the pool) and the
caps allow it; what joins is shown, as one block, to both Debaters and the Moderator in the turns that follow.

Every retrieved passage is recorded with the decision on it: admitted, or refused with the reason ("novelty" under
the threshold, the "round cap" or the "claim cap" reached, or "context": the longest conversation of the claim
would no longer fit the model's context with room for the turns still to come).
"""
from dataclasses import dataclass, field

import torch

from debate.data import knowledge_store
from debate.data.claims import evidence_text
from debate.data.prompts import render
from debate.engine import retrieval, store_search

SIDE_NAMES = {"affirmative": "Affirmative", "negative": "Negative"}
TURN_ROOM = 256  # prompt tokens reserved per turn still to come, beside its --max-new-tokens (ours)


@dataclass(frozen=True)
class Limits:
    """The bounds of the growth (config group "debate"; docs/debate_retrieval.md gives each default's reason)."""
    top_k: int = 3  # passages each query returns (the courtroom's --top-k)
    novelty_threshold: float = 0.20  # the courtroom's: a passage under it repeats what is shown
    per_round: int = 2  # passages admitted per claim and round, both sides together
    per_claim: int = 6  # passages admitted per claim over the whole debate
    query_words: int = 32  # a query is cut to its first words


@dataclass
class Source:
    """What every claim searches with: the encoder, and the store directory or the corpus index."""
    embedder: object
    store: str = None  # a --knowledge-store directory: each claim searches its own file
    corpus: object = None  # retrieval.Index of --corpus or the dataset's corpus
    name: str = ""  # what it is, in words, for the record
    bm25_k: int = 10000  # a store: the sentences BM25 passes to re-ranking (HerO's)
    missing_store: str = "error"  # a store: a claim without a file searches nothing (skip) or stops the run


@dataclass
class Growth:
    """One claim's grown evidence: its search, the vectors of everything shown, and the record of each round."""
    search: object  # query -> [(passage {"id", "text", "url"}, cosine, vector)], best first
    pool: torch.Tensor  # embeddings of every evidence item shown so far
    shape: str  # "qa" or "passages": how the claim's evidence items are written
    first_number: int  # the number the next admitted item takes in the prompts
    limits: Limits
    source_name: str
    added: list = field(default_factory=list)  # admitted items, in the claim's evidence shape, in order
    rounds: list = field(default_factory=list)  # per round {"round", "queries": [...], "admitted": [ids]}


def start(claim, source, limits):
    """The Growth of one claim: its search over the source and its starting evidence as the novelty pool."""
    items = claim["evidence"]
    texts = [t for t in (evidence_text(e) for e in items) if t]
    pool = retrieval.embed(source.embedder, texts) if texts else torch.zeros((0, _dim(source.embedder)))
    shape = "passages" if items and all("text" in e and "question" not in e for e in items) else "qa"
    return Growth(search=_search_of(claim, source, limits.top_k), pool=pool, shape=shape,
                  first_number=len(items) + 1, limits=limits, source_name=source.name)


def _dim(embedder):
    return embedder.model.config.hidden_size


def _search_of(claim, source, k):
    """The search of one claim: its store file (BM25 then re-ranking, restatements of the claim left out), else the
    corpus index (dense top-k)."""
    if source.store:
        path = knowledge_store.store_file(source.store, claim["claim_id"])
        if not path.is_file():
            if source.missing_store == "skip":
                return lambda query: []
            raise knowledge_store.StoreError(f"{path}: no such store file for --debate-retrieval; --missing-store "
                                             "skip lets the claim debate without searching")
        def search_store(query):  # the store streamed per query, never held (debate.engine.store_search)
            found = store_search.bm25_candidates(path, query, source.bm25_k)
            if not found.candidates:
                return []
            cache = store_search.VectorCache(found.digest, source.embedder)
            vector = store_search.query_vector(source.embedder, [query])
            hits = store_search.rerank(cache, vector, found.candidates, k, claim["claim"])
            vectors = cache.vectors([c for c, _ in hits])
            return [({"id": str(c.position), "text": c.text, "url": c.url}, score, v)
                    for (c, score), v in zip(hits, vectors)]
        return search_store

    def search_corpus(query):
        vector = retrieval.embed(source.embedder, [query])
        hits = retrieval.search(source.corpus, vector, k)[0]
        return [(source.corpus.passages[p], score, source.corpus.vectors[p]) for p, score in hits]
    return search_corpus


def cut_query(text, words):
    """A Debater's query as searched: its first `words` words, on one line."""
    return " ".join(str(text).split()[:words])


def admit(growth, round_no, queries, limits, fits):
    """Search each side's query and admit what is novel, within the caps and the context (`fits(items)`: whether
    these admitted items still leave the claim's conversations room); returns the items admitted this round."""
    record = {"round": round_no, "queries": [], "admitted": []}
    admitted = []
    for side, asked in queries:
        query = cut_query(asked, limits.query_words)
        call = {"side": side, "query": query, "cut": query != " ".join(str(asked).split()), "returned": []}
        for passage, score, vector in (growth.search(query) if query else []):
            novelty = float(retrieval.novelty(vector[None], growth.pool)[0])
            item = _item(passage, query, side, round_no, novelty, growth.shape)
            if novelty < limits.novelty_threshold:
                decision = "novelty"
            elif len(growth.added) + len(admitted) >= limits.per_claim:
                decision = "claim cap"
            elif len(admitted) >= limits.per_round:
                decision = "round cap"
            elif not fits(admitted + [item]):
                decision = "context"
            else:
                decision = "admitted"
                admitted.append(item)
                growth.pool = torch.cat([growth.pool, vector[None]])
                record["admitted"].append(passage["id"])
            call["returned"].append({"id": passage["id"], "text": passage["text"], "url": passage.get("url") or "",
                                     "score": round(float(score), 4), "novelty": round(novelty, 4),
                                     "decision": decision})
        record["queries"].append(call)
    record["evidence_size"] = growth.first_number - 1 + len(admitted)
    growth.first_number += len(admitted)
    growth.added += admitted
    growth.rounds.append(record)
    return admitted


def _item(passage, query, side, round_no, novelty, shape):
    """An admitted passage as an evidence item of the claim's shape; its query stands as the question of a QA item
    (so the saved file is HerO's format: the question asked, the passage found)."""
    where = {"url": passage.get("url") or "", "id": passage["id"], "round": round_no, "side": side,
             "novelty": round(novelty, 4)}
    if shape == "passages":
        return {"text": passage["text"], "query": query, **where}
    return {"question": query, "answer": passage["text"], **where}


def block(growth, items):
    """The prompt block that shows `items` (admitted this round), numbered after the evidence shown before them;
    "" when nothing was admitted, so the turn's prompt is as without retrieval."""
    if not items:
        return ""
    first_number = growth.first_number - len(items)
    lines = [evidence_line(e, n) for n, e in enumerate(items, start=first_number)]
    return render("debate_evidence_added", evidence="\n".join(lines))


def evidence_line(item, number=0):
    """One admitted item as the prompts show it (the evidence set's own item formats)."""
    url = item["url"] or "(no source given)"
    if "text" in item:
        return render("evidence_passage", index=number, text=item["text"], url=url)
    return render("evidence_item", index=number, question=item["question"], answer=item["answer"], url=url)


def context_of(agents):
    """The shortest context length among the agents' models, or None when none says (no bound then)."""
    lengths = []
    for agent in agents:
        config = getattr(getattr(agent, "model", None), "config", None)
        if config is not None and hasattr(config, "get_text_config"):
            config = config.get_text_config(decoder=True)
        n = getattr(config, "max_position_embeddings", None)
        if isinstance(n, int):
            lengths.append(n)
    return min(lengths) if lengths else None


def counter(agent):
    """Tokens of a text under the agent's tokenizer; words where it has none (scripted tests)."""
    tokenizer = getattr(agent, "tokenizer", None)
    if tokenizer is None:
        return lambda text: len(text.split())
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def conversation_tokens(conv, count):
    return count(conv.system) + sum(count(m["content"]) for m in conv.messages)
