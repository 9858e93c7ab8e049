"""The knowledge-store stage: every claim's evidence retrieved from its own store file with HerO's strategy
(debate.methods.hero_retrieval), saved in HerO's format, resumable.

    OUTPUT_DIR/retrieved.jsonl            one line per claim: {"claim_id", "claim", "evidence": [{question, answer,
                                          url, bm25_score, rerank_score}], "hypo_fc_docs": [the HyDE articles, as
                                          HerO names them], "retrieval": {what it took}}, readable by --retrieved-file
    OUTPUT_DIR/retrieved.settings.json    the settings the file was retrieved with

A claim is done once its line is on disk (flushed and synced), so a killed retrieval resumes with the claims not
yet written; a torn last line is cut off. A file retrieved under other settings is never mixed with new lines: the
run stops and says which settings changed. The file is kept under --overwrite too: a debate started over does not
pay for the retrieval again (delete the file to retrieve again).

Memory is bounded by one claim's work: every store the run will read is checked before any model loads (each
line parsed, its fields typed; a store bigger than the memory this process may take is warned about), then each
batch's HyDE-FC articles are written, and each claim's store is streamed, searched and let go before the next
(debate.engine.store_search): no store is ever held, and no page text is kept beyond the answers.
"""
import json
import logging
import os
import time
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from debate.data import datasets, knowledge_store
from debate.data.inputs import DataError
from debate.engine import kv_pool, models, ram, retrieval
from debate.methods import hero_retrieval
from debate.pipeline import records

log = logging.getLogger(__name__)

RETRIEVED = "retrieved.jsonl"
SETTINGS = "retrieved.settings.json"
FEW_SHOT_SPLIT = "train"
# Peak memory of a store's search above the model, per byte of the store file (measured: docs/retrieval.md)
MEMORY_PER_STORE_BYTE = 1.5  # measured 0.8-0.95 at 100 MB-1 GB (docs/retrieval.md): the warning keeps a margin


def retrieved_path(config):
    return Path(config.output.output_dir) / RETRIEVED


def check(config, claims):
    """Every check of the stage that needs no model: the store directory, each store file a claim still to be
    retrieved will read (check_stores), and the few-shot split. Raises DataError naming the file, line or flag;
    returns the claim ids without a store file (--missing-store skip)."""
    r = config.retrieval
    missing = knowledge_store.check_directory(r.knowledge_store, [c["claim_id"] for c in claims], r.missing_store)
    done = _done_ids(config)
    absent = {str(m) for m in missing}
    todo = [c for c in claims if str(c["claim_id"]) not in done and str(c["claim_id"]) not in absent]
    check_stores(config, todo)
    if r.few_shot and any(str(c["claim_id"]) not in done for c in claims):
        few_shot_claims(config)
    return missing


def check_stores(config, claims, available=None):
    """Parse every line of the store files of `claims` (a bad one is one StoreError naming the file, the line and
    the field or byte), refuse an empty store (under --missing-store skip it is counted, and retrieves nothing), and
    warn in one line when the largest store may need more memory to search than this process may take
    (`available`: bytes, default debate.engine.ram's figure)."""
    r = config.retrieval
    largest = None
    for claim in tqdm(claims, unit="store", desc="checking stores", dynamic_ncols=True, disable=len(claims) < 50):
        path = knowledge_store.store_file(r.knowledge_store, claim["claim_id"])
        info = knowledge_store.check_store(path)
        if not info.sentences and r.missing_store != "skip":
            what = "an empty file" if not info.lines else (f"no sentence in any of its {info.lines} lines (field "
                                                            "'url2text' empty everywhere)")
            raise knowledge_store.StoreError(f"{path}: {what}; --missing-store skip retrieves nothing for the claim "
                                             "and counts it")
        if largest is None or info.bytes > largest.bytes:
            largest = info
    if largest is None:
        return
    room = ram.available() if available is None else available
    need = MEMORY_PER_STORE_BYTE * largest.bytes
    if room is not None and need > room:
        log.warning(f"warning: {largest.path} ({largest.bytes / 2**20:.0f} MB, the largest store) may need about "
                    f"{need / 2**20:.0f} MB to search ({MEMORY_PER_STORE_BYTE}x its size) beyond the model, more than "
                    f"the {room / 2**20:.0f} MB this process may take now; the run may be killed for memory on that "
                    "claim")


def _done_ids(config):
    path = retrieved_path(config)
    try:
        return {str(row.get("claim_id")) for row in records.read_jsonl(path, repair=False)} if path.is_file() else set()
    except Exception:  # a file the stage itself refuses later, with its own words
        return set()


def few_shot_claims(config):
    """The labelled claims whose golden question-answer pairs are the question generation's examples."""
    split = config.retrieval.few_shot_split or FEW_SHOT_SPLIT
    dataset = datasets.get(config.data.dataset)
    try:
        return dataset.read(split, config.data.data_dir)
    except DataError as err:
        raise DataError(f"--few-shot-split {split}: {err} (HerO takes its examples from AVeriTeC's train split; "
                        "name another labelled split, e.g. --few-shot-split dev, whose claims never see their own "
                        "pairs, or --few-shot 0)") from None


def settings_of(config, device):
    """What the retrieved file depends on, resolved (the encoder's path; --bm25-k is HerO's on every device)."""
    r = config.retrieval
    bm25_k = r.bm25_k
    return {"knowledge_store": str(Path(r.knowledge_store).resolve()), "dataset": config.data.dataset,
            "split": config.data.split, "model": config.models.moderator_model, "use_4bit": config.models.use_4bit,
            "embedder": config.courtroom.embedder or retrieval.default_embedder_path(), "seed": config.generation.seed,
            "missing_store": r.missing_store, "hyde_docs": r.hyde_docs, "hyde_max_tokens": r.hyde_max_tokens,
            "hyde_temperature": r.hyde_temperature, "bm25_k": bm25_k,
            "query_instruction": r.query_instruction, "rerank_k": r.rerank_k, "context": r.context,
            "few_shot": r.few_shot, "few_shot_split": (r.few_shot_split or FEW_SHOT_SPLIT) if r.few_shot else None,
            "question_max_tokens": r.question_max_tokens, "prompts": config.method.prompts}


def _resume(path, settings):
    """{claim_id as str: line} already retrieved in `path` under the same settings; refuses other settings."""
    saved_path = path.with_name(SETTINGS)
    done = {str(row["claim_id"]): row for row in records.read_jsonl(path)} if path.is_file() else {}
    if done and saved_path.is_file():
        before = json.loads(saved_path.read_text(encoding="utf-8"))
        changed = [k for k in settings if k in before and before[k] != settings[k]]
        if changed:
            raise records.RunConflict(
                f"{path} holds {len(done)} claims retrieved with other settings ("
                + "; ".join(f"{k}: {before[k]!r} -> {settings[k]!r}" for k in changed)
                + "); delete it to retrieve again, or give another --output-dir")
    path.parent.mkdir(parents=True, exist_ok=True)
    records.write_json(saved_path, settings)
    return done


def run(config, claims):
    """`claims` with the evidence retrieved from their stores (retrieving those not yet in the run's file), and a
    summary {claims, retrieved, missing_store, empty_pages, seconds}."""
    path = retrieved_path(config)
    r = config.retrieval
    device = models.precision(config.models.use_4bit)["device"]
    settings = settings_of(config, device)
    done = _resume(path, settings)
    todo = [c for c in claims if str(c["claim_id"]) not in done]
    log.info(f"evidence: retrieved from the knowledge store {r.knowledge_store} (HerO's strategy), saved in {path}; "
             f"{len(claims) - len(todo)} of {len(claims)} claims already retrieved")
    summary = {"claims": len(claims), "missing_store": 0, "empty_store": 0, "empty_pages": 0, "seconds": 0.0}
    if todo:
        summary.update(_retrieve(config, settings, todo, path, done))
    by_id = {**done, **_read(path)}
    # counted over the whole file: the claims of an earlier, resumed start count too
    summary["missing_store"] = sum(1 for c in claims if by_id[str(c["claim_id"])].get("retrieval", {})
                                   .get("missing_store"))
    out = [dict(c, evidence=list(by_id[str(c["claim_id"])]["evidence"])) for c in claims]
    summary["empty_store"] = sum(1 for c in claims if by_id[str(c["claim_id"])].get("retrieval", {})
                                 .get("empty_store"))
    summary["retrieved"] = sum(1 for c in out if c["evidence"])
    log.info(f"retrieval: {summary['retrieved']} of {len(claims)} claims have evidence; {summary['missing_store']} "
             f"without a store file and {summary['empty_store']} with an empty one (--missing-store skip), "
             f"{summary['empty_pages']} empty pages skipped")
    log.info(retrieval.cache_summary())
    return out, summary


def _read(path):
    return {str(row["claim_id"]): row for row in records.read_jsonl(path)}


def _retrieve(config, settings, todo, path, done):
    r, g = config.retrieval, config.generation
    agent = models.load_roles({"retriever": config.models.moderator_model}, use_4bit=config.models.use_4bit,
                              device_map=config.models.device_map,
                              dtype=models.run_dtype(config.models.dtype))["retriever"]
    kv_pool.start_run([agent.model], config.generation.gpu_memory_fraction, config.generation.memory_gb,
                      rows=g.batch_size)
    embedder = retrieval.load_embedder(config.courtroom.embedder)
    instruction = hero_retrieval.query_instruction(embedder.path, r.query_instruction)
    pool = knowledge_store.qa_examples(few_shot_claims(config), settings["few_shot_split"]) if r.few_shot else []
    pool_index = hero_retrieval.few_shot_index(pool)
    base = replace(_engine_settings(config), top_p=1.0)
    hyde_settings = replace(base, max_new_tokens=r.hyde_max_tokens, temperature=r.hyde_temperature)
    question_settings = replace(base, max_new_tokens=r.question_max_tokens, temperature=0.0)
    counts = {"missing_store": 0, "empty_store": 0, "empty_pages": 0, "seconds": 0.0, "search_seconds": 0.0}
    if not str(embedder.model.device).startswith("cuda"):
        _say_cost(config, todo[0], embedder, settings["bm25_k"], len(todo))
    start = time.time()
    bar = tqdm(total=len(todo) + len(done), initial=len(done), unit="claim", desc="retrieval", dynamic_ncols=True)
    with bar, open(path, "a", encoding="utf-8") as out:
        for at in range(0, len(todo), g.batch_size):
            batch = todo[at:at + g.batch_size]
            status = {id(c): _status(config, c) for c in batch}
            present = [c for c in batch if status[id(c)] == "present"]
            # HyDE for the whole batch first; then each store is streamed, searched and let go, one at a time
            articles, hyde_tokens = hero_retrieval.hyde_articles(agent, present, r.hyde_docs, hyde_settings)
            articles, hyde_tokens = dict(zip(map(id, present), articles)), dict(zip(map(id, present), hyde_tokens))
            found, items = {}, []
            for claim in present:
                t = time.time()
                hits, store = hero_retrieval.search(claim, status_path(config, claim), articles[id(claim)], embedder,
                                                    settings["bm25_k"], r.rerank_k, instruction)
                answers = [store.answer(c, r.context) for c, _ in hits]
                found[id(claim)] = (store, hits, answers, time.time() - t)
                counts["search_seconds"] += time.time() - t
                counts["empty_pages"] += len(store.empty_pages)
                for (candidate, _), answer in zip(hits, answers):
                    items.append({"claim": claim["claim"], "evidence": answer, "claim_id": claim["claim_id"],
                                  "examples": [e["text"] for e in hero_retrieval.examples_for(
                                      pool, pool_index, candidate.text, claim["claim_id"], r.few_shot,
                                      config.data.split)]})
            asked = iter(zip(*hero_retrieval.questions(agent, items, question_settings)))  # (question, tokens)
            for claim in batch:
                line = {"claim_id": claim["claim_id"], "claim": claim["claim"], "evidence": []}
                if status[id(claim)] != "present":
                    counts[status[id(claim)]] += 1
                    line["retrieval"] = {status[id(claim)]: True}
                else:
                    store, hits, answers, seconds = found[id(claim)]
                    spent = 0
                    for (candidate, rerank_score), answer in zip(hits, answers):
                        question, tokens = next(asked)
                        spent += tokens
                        line["evidence"].append({"question": question, "answer": answer, "url": candidate.url,
                                                 "bm25_score": round(float(candidate.score), 4),
                                                 "rerank_score": round(float(rerank_score), 4)})
                    line["hypo_fc_docs"] = articles[id(claim)]
                    line["retrieval"] = {"sentences": store.sentences, "pages": store.pages,
                                         "search_seconds": round(seconds, 3), "hyde_tokens": hyde_tokens[id(claim)],
                                         "question_tokens": spent}
                out.write(json.dumps(line, ensure_ascii=False) + "\n")
                out.flush()
                os.fsync(out.fileno())
                bar.update(1)
    counts["seconds"] = time.time() - start
    log.info(f"retrieved {len(todo)} claims in {counts['seconds']:.1f}s "
             f"(BM25 and re-ranking {counts['search_seconds']:.1f}s)")
    return counts


def _say_cost(config, claim, embedder, bm25_k, claims):
    """On a CPU: the re-ranking's expected time at this --bm25-k, measured on the first claim's store."""
    if _status(config, claim) != "present":
        return
    path = status_path(config, claim)
    sample = knowledge_store.first_sentences(path, 32)  # the encoder's speed on texts of this store's length
    sentences = len(knowledge_store.first_sentences(path, bm25_k))  # a store smaller than --bm25-k embeds it all
    each = hero_retrieval.estimated_seconds(embedder, sample, sentences)
    log.info(f"--bm25-k {bm25_k} on {embedder.model.device}: re-ranking embeds up to {bm25_k} sentences a claim, "
             f"about {each:.0f}s a claim here ({each * claims / 60:.0f} min for {claims} claims, before any cached "
             "embeddings); a lower --bm25-k is faster but lets BM25 decide what HerO leaves to the re-ranker")


def _engine_settings(config):
    from debate.engine import engine

    g = config.generation
    return engine.Settings(seed=g.seed, reuse_cache=False, structured=False, max_context=g.max_context,
                           prefill_tokens=g.prefill_tokens)


def status_path(config, claim):
    return knowledge_store.store_file(config.retrieval.knowledge_store, claim["claim_id"])


def _status(config, claim):
    """"present", or where the claim retrieves nothing under --missing-store skip: "missing_store" (no file) or
    "empty_store" (no sentence at all). Without skip, both are errors (the stage's check, before any model loads,
    refused them); the store is read only up to its first sentence."""
    r = config.retrieval
    path = status_path(config, claim)
    if not path.is_file():
        if r.missing_store == "skip":
            return "missing_store"
        raise knowledge_store.StoreError(f"{path}: no such store file; --missing-store skip retrieves nothing for "
                                         "the claim and goes on")
    return "present" if knowledge_store.first_sentences(path, 1) else "empty_store"
