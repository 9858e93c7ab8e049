"""HerO's retrieval (Yoon et al. 2024, AVeriTeC's best open system) as a method over the engine: the steps that
need a language model, and the search between them.

    articles = hyde_articles(agent, claims, n, settings)                    # HyDE-FC, batched over claims
    hits, found = search(claim, path, articles, embedder, bm25_k, rerank_k, instruction)  # BM25, re-ranking
    asks = questions(agent, items, settings)                               # one question per answer, batched

- HyDE-FC: the model writes `n` hypothetical fact-checking articles per claim (prompts/hyde_fc.txt: what HerO's
  prompt asks, a passage that supports, refutes, finds too little evidence or presents conflicting evidence), sampled.
- The search: BM25 over the store's sentences with the claim and the articles as one query; its `bm25_k` best are
  re-ranked by cosine to the mean embedding of the claim and the articles, each embedded under the encoder's query
  instruction where it needs one (`query_instruction`: SFR-Embedding-2_R's as HerO writes it, prompts/sfr_query.txt);
  sentences that only restate the claim are dropped; the `rerank_k` best are the answers, each with its BM25 and
  re-rank score (debate.engine.store_search).
- Question generation: for each answer, the model writes the question it answers about the claim
  (prompts/hero_question.txt), after `few_shot` examples from golden question-answer pairs whose answers BM25
  finds nearest to it (never the claim's own pairs: the same split and id; AVeriTeC's ids restart in every
  split). The question is the reply up to its first "?", as HerO keeps it.

docs/FIDELITY.md ("Retrieval (HerO)") sets each step against HerO's code.
"""
import json
import os
from dataclasses import replace

from debate.data.prompts import render
from debate.engine import store_search
from debate.engine.engine import Conversation
from debate.methods import turns


def hyde_articles(agent, claims, n, settings, streams=None):
    """(`n` hypothetical fact-checking articles for each claim, the tokens each claim's took): one batched call over
    len(claims) * n conversations."""
    if n == 0 or not claims:
        return [[] for _ in claims], [0 for _ in claims]
    convs = [Conversation(system="") for _ in claims for _ in range(n)]
    prompts = [render("hyde_fc", claim=c["claim"]) for c in claims for _ in range(n)]
    generator = turns.stream({"agent": agent}, streams, settings.seed, settings)
    replies = turns.speak(agent, convs, prompts, settings, generator)
    for conv in convs:
        conv.drop_cache()
    articles = [_article(r) for r in replies]
    tokens = [c.prompt_tokens + c.completion_tokens for c in convs]
    return [articles[i * n:(i + 1) * n] for i in range(len(claims))], [sum(tokens[i * n:(i + 1) * n])
                                                                        for i in range(len(claims))]


def _article(reply):
    """The article of a reply: HerO stops at the first three newlines in a row; a 'Passage:' label goes."""
    text = reply.split("\n\n\n")[0].strip()
    return text[len("Passage:"):].strip() if text.lower().startswith("passage:") else text


def search(claim, path, articles, embedder, bm25_k, rerank_k, instruction=""):
    """(the `rerank_k` sentences of the store file at `path` HerO would answer with: [(store_search.Candidate,
    cosine)], best first, each candidate with its BM25 score; BM25's store_search.Found): the store streamed, never
    held. `instruction` prefixes every query text (the claim and each article) before it is embedded."""
    found = store_search.bm25_candidates(path, " ".join([claim["claim"], *articles]), bm25_k)
    texts = [claim["claim"], *articles]
    query = store_search.query_vector(embedder, [instruction + q if q.strip() else q for q in texts])
    cache = store_search.VectorCache(found.digest, embedder)
    return store_search.rerank(cache, query, found.candidates, rerank_k, claim["claim"]), found


def query_instruction(embedder_path, given=None):
    """The text put before each query the encoder embeds: `given` (--query-instruction; "\\n" stands for a line
    break, "" for none), else the query prompt the encoder's folder names (sentence-transformers'
    config_sentence_transformers.json: "prompts"["query"], else its default prompt), else, for an SFR-Embedding
    encoder, the instruction HerO gives SFR-Embedding-2_R (prompts/sfr_query.txt), else none."""
    if given is not None:
        return given.replace("\\n", "\n")
    path = os.path.join(embedder_path, "config_sentence_transformers.json")
    if os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: unreadable ({e})") from None
        prompts = config.get("prompts") or {}
        name = "query" if prompts.get("query") else config.get("default_prompt_name")
        if prompts.get(name):
            return prompts[name]
    if "sfr-embedding" in os.path.basename(os.path.normpath(embedder_path)).lower():
        return render("sfr_query", query="")
    return ""


def estimated_seconds(embedder, texts, candidates):
    """Seconds the re-ranking would take to embed `candidates` sentences, from the time this encoder takes on a
    sample of `texts` here (a CPU user who keeps --bm25-k 10000 sees the cost before paying it)."""
    import time

    from debate.engine import retrieval

    sample = list(texts[:32]) or ["a sentence"]
    start = time.time()
    retrieval.embed(embedder, sample)
    return (time.time() - start) / len(sample) * candidates


def few_shot_index(pool):
    """The BM25 index of a few-shot pool (debate.data.knowledge_store.qa_examples) over its answers."""
    return store_search.bm25_index([e["lookup"] for e in pool]) if pool else None


def examples_for(pool, index, answer, claim_id, n, split=None):
    """The `n` examples of `pool` whose answers BM25 finds nearest to `answer`, none of them the claim's own: an
    example is the claim's when its split and its id are the claim's (a dev claim keeps the train claim of its id)."""
    if not n or index is None:
        return []

    def own(e):
        return str(e["claim_id"]) == str(claim_id) and e.get("split") == split

    found = [pool[p] for p in store_search.bm25_top(index, answer, n + sum(map(own, pool)))]
    return [e for e in found if not own(e)][:n]


def questions(agent, items, settings):
    """One question per item {"claim", "evidence", "examples"}: (questions, tokens per item), one batched call."""
    if not items:
        return [], []
    convs = [Conversation(system="") for _ in items]
    prompts = [render("hero_question", claim=it["claim"], evidence=it["evidence"],
                      examples="\n\n".join(render("hero_example", index=k, example=e)
                                           for k, e in enumerate(it["examples"], start=1)))
               for it in items]
    # HerO samples with top_k 1: the most likely token every step, which is greedy decoding.
    replies = turns.speak(agent, convs, prompts, replace(settings, temperature=0.0))
    for conv in convs:
        conv.drop_cache()
    return [_question(r) for r in replies], [c.prompt_tokens + c.completion_tokens for c in convs]


def _question(reply):
    """The question of a reply: its text up to the first '?', on one line, a 'Question:' label dropped."""
    text = " ".join(reply.split())
    if text.lower().startswith("question:"):
        text = text[len("question:"):].strip()
    return text.split("?")[0].strip() + "?"
