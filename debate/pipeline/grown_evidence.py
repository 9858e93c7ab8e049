"""The run side of --debate-retrieval (debate/methods/debate_retrieval.py): its checks before any model loads, the
source the claims search, and the evidence each debate ended with, saved in HerO's retrieved-file format:

    OUTPUT_DIR/debate_retrieved.jsonl          one line per claim: {"claim_id", "claim", "evidence": [{question,
                                               answer, url}]}: the claim's own evidence, then what the debate
                                               admitted (its query as the question), readable by --retrieved-file
                                               and by `python -m eval.evidence_score`
    OUTPUT_DIR/debate_retrieved.scores.json    its evidence-only scores, where the split has golden pairs

The file is written anew from predictions.jsonl when the run is scored, so a resumed run's file holds every claim.
"""
import json
import logging
from pathlib import Path

from debate.data import claims as data, datasets, knowledge_store
from debate.engine import retrieval
from debate.methods import debate_retrieval
from debate.pipeline import records, run_claims, store_retrieval
from eval import averitec, evidence_score as evidence_scores, wordnet

log = logging.getLogger(__name__)

FILE = "debate_retrieved.jsonl"


def check(config, claims):
    """A store searched only during the debate (--evidence golden) is checked as the retrieval stage checks its own."""
    r = config.retrieval
    if config.debate.debate_retrieval and r.knowledge_store and config.data.evidence != "retrieved":
        missing = {str(m) for m in knowledge_store.check_directory(r.knowledge_store, [c["claim_id"] for c in claims],
                                                                   r.missing_store)}
        # every line of every store it will search, before any model loads (the stage's own check)
        store_retrieval.check_stores(config, [c for c in claims if str(c["claim_id"]) not in missing])


def limits_of(config):
    d = config.debate
    return debate_retrieval.Limits(top_k=d.debate_top_k, novelty_threshold=d.debate_novelty_threshold,
                                   per_round=d.admit_per_round, per_claim=d.admit_per_claim,
                                   query_words=d.query_max_words)


def source_of(config):
    """The Source every claim searches: its --knowledge-store file, else --corpus, else the dataset's corpus
    (config.build refused a run with none); loads the encoder."""
    embedder = retrieval.load_embedder(config.courtroom.embedder)
    r = config.retrieval
    if r.knowledge_store:
        return debate_retrieval.Source(embedder, store=str(r.knowledge_store), bm25_k=r.bm25_k,
                                       missing_store=r.missing_store,
                                       name=f"knowledge store {r.knowledge_store} (BM25, then re-ranking)")
    if config.courtroom.corpus:
        index = retrieval.corpus_index(config.courtroom.corpus, embedder)
        return debate_retrieval.Source(embedder, corpus=index, name=f"corpus {config.courtroom.corpus}")
    dataset = datasets.get(config.data.dataset)
    passages = run_claims.own_corpus(dataset, config.data.data_dir)
    index = retrieval.passage_index(passages, embedder, source=f"{dataset.name}'s corpus")
    return debate_retrieval.Source(embedder, corpus=index, name=f"{dataset.name}'s corpus")


def method_options(config):
    """DebateCV's keyword options under --debate-retrieval: the source and its limits."""
    return {"source": source_of(config), "limits": limits_of(config)}


def hero_items(items):
    """Evidence items as HerO's file holds them: {question, answer, url}; a passage's query (or nothing) stands as
    its question, its text as the answer."""
    return [{"question": e.get("question") or e.get("query") or "",
             "answer": e["answer"] if "answer" in e else e.get("text", ""), "url": e.get("url") or ""}
            for e in items]


def save(out, predictions, claims):
    """Write OUTPUT_DIR/debate_retrieved.jsonl from the predictions' evidence, and score it where the claims have
    golden question-answer pairs (OUTPUT_DIR/debate_retrieved.scores.json); returns the scores or None."""
    out = Path(out)
    by_id = {c["claim_id"]: c for c in claims}
    rows = [{"claim_id": p["claim_id"], "claim": by_id[p["claim_id"]]["claim"],
             "evidence": hero_items(p.get("evidence") or [])} for p in predictions if p["claim_id"] in by_id]
    path = out / FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)
    grown = sum(p.get("debate_retrieval", {}).get("admitted", 0) for p in predictions if p["claim_id"] in by_id)
    log.info(f"debate retrieval: {grown} passages admitted over {len(rows)} claims; the evidence each ended with "
             f"is in {path}")
    references = data.as_references([c for c in claims if c.get("questions")])
    if not references or not rows:
        return None
    if not averitec.meteor_available():
        log.info("debate retrieval's evidence: not scored here, METEOR needs WordNet (docs/wordnet.md)")
        return None
    wordnet.load_wordnet()
    scores = evidence_scores.score([(f"line {n}", r) for n, r in enumerate(rows, start=1)],
                                   [(f"claim {r['claim_id']}", r) for r in references], (str(path), "the split"))
    records.write_json(out / "debate_retrieved.scores.json", {k: v for k, v in scores.items() if k != "per_claim"})
    log.info("debate retrieval's evidence: " + evidence_scores.summary_line(scores))
    return scores
