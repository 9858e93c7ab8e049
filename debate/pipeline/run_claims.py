"""The run's claims: its dataset's split read, cut to --limit, and given the evidence of its condition; and the
corpus the courtroom's retrieval searches.

golden and none (and a dataset's own conditions, PolitiHop's ruling) come with the claims. retrieved comes,
in this order, from --knowledge-store (each claim's evidence retrieved from its own store file with HerO's strategy:
debate/pipeline/store_retrieval.py), --retrieved-file, the dataset's own retrieved file (AVeriTeC: HerO's), --corpus,
or the
dataset's own corpus (Check-COVID: its abstracts); from a corpus, each claim's --evidence-k passages nearest
to it under the project's sentence encoder (debate.engine.retrieval). That step loads the encoder, so it runs
(`retrieve`) only after every check of the run has passed.

The courtroom (and PROClaim's baselines) search a corpus, in place of a claim's own evidence: --corpus, else the
dataset's own (Check-COVID's abstracts), else the evidence of every claim of the split under the run's
condition, pooled (AVeriTeC: the annotators' pairs of the whole split under golden, HerO's under retrieved,
nothing under none), so P-RAG has more than the claim's own items to discover and never sees a condition's
hidden evidence.
"""
import logging
import random
from dataclasses import dataclass, replace
from pathlib import Path

from debate.data import averitec, claims as records, datasets
from debate.data.inputs import DataError
from debate.engine import retrieval
from debate.pipeline.config import COURTROOM_METHODS
from debate.pipeline.preflight import missing_retrieved

log = logging.getLogger(__name__)


@dataclass
class Inputs:
    claims: list  # claim records, --limit applied, evidence attached (unless it waits for `retrieve`)
    labels: object  # the split's LabelSet
    dataset: object  # debate.data.datasets.Dataset
    corpus: object = None  # passages the retrieved evidence is still to come from (see `retrieve`), or None
    notes: tuple = ()  # what the reader left out and why (one line each)
    passages: list = None  # the courtroom's corpus when it is not --corpus (see the module doc), or None
    source: str = None  # where the retrieved evidence comes from, in words (None: another condition)


def read(config):
    """The run's Inputs in one pass over its dataset, looked up once: the split read, cut to --limit, its labels,
    then the evidence of the run's condition from the one source it comes from (see the module doc). Every problem
    of the data raises DataError before any model loads."""
    d = config.data
    dataset = datasets.get(d.dataset)
    split = dataset.read(d.split, d.data_dir)
    labels = dataset.labels(d.split, d.data_dir)
    claims = _limited(split, d)
    notes = tuple(note for c in claims for note in c.get("notes", ()))
    where = f"{dataset.name} {d.split}"
    if d.evidence == "golden" and claims and not any(c["gold_evidence"] for c in claims):
        raise DataError(f"--evidence golden: {where} has no annotated evidence; run it with --evidence "
                        f"{' or '.join(c for c in dataset.conditions if c != 'golden')}")
    if d.evidence == "retrieved" and config.retrieval.knowledge_store:
        # A store given on the command line wins: the evidence is retrieved from it (`retrieve`, store_retrieval).
        return Inputs([dict(c, evidence=[]) for c in claims], labels, dataset, notes=notes,
                      source=f"the knowledge store {config.retrieval.knowledge_store}")
    path, corpus = None, None
    if d.evidence == "retrieved":
        path = d.retrieved_file or (dataset.retrieved_file(d.split, d.data_dir) if dataset.retrieved_file else None)
        if path is not None and not Path(path).is_file():
            raise DataError(missing_retrieved(Path(path), dataset, where, given=bool(d.retrieved_file)))
        if path is None and config.courtroom.corpus:
            corpus = retrieval.load_corpus(config.courtroom.corpus)
        elif path is None and dataset.corpus is not None:
            corpus = own_corpus(dataset, d.data_dir)
        elif path is None and d.split != averitec.DEMO_SPLIT:  # the demo set's retrieved is its golden (config)
            raise DataError(f"--evidence retrieved: {where} has no retrieved evidence of its own; give "
                            "--retrieved-file (evidence keyed by claim_id) or --corpus (JSONL passages to retrieve "
                            "from)")
    if corpus is not None:
        inputs = Inputs([dict(c, evidence=[]) for c in claims], labels, dataset, corpus=corpus, notes=notes,
                        source=f"the passages of {config.courtroom.corpus or dataset.name + chr(39) + 's corpus'}")
    else:
        inputs = Inputs(records.attach_evidence(claims, d.evidence, path), labels, dataset, notes=notes,
                        source=f"the file {path}" if path else None)
    if config.method.method in COURTROOM_METHODS and not config.courtroom.corpus:
        own = corpus if corpus is not None else own_corpus(dataset, d.data_dir)  # read once where retrieval used it
        inputs.passages = own if own is not None else pooled(records.attach_evidence(split, d.evidence, path))
    return inputs


def own_corpus(dataset, data_dir=None):
    """The dataset's own retrieval corpus as passages (Check-COVID's abstracts), or None where it has none."""
    return dataset.corpus(dataset.data_dir(data_dir)) if dataset.corpus is not None else None


def _limited(claims, d):
    """--limit's claims: the first N, or with --sample-seed N drawn at random, kept in file order."""
    if d.limit and d.sample_seed is not None and d.limit < len(claims):
        # A seeded draw: the same claims for every method run with this seed.
        chosen = sorted(random.Random(d.sample_seed).sample(range(len(claims)), d.limit))
        return [claims[i] for i in chosen]
    return claims[: d.limit] if d.limit else claims


def pooled(claims):
    """Every claim's evidence as one corpus of passages, each text once (the first claim's copy kept)."""
    passages, seen = [], set()
    for c in claims:
        for passage in retrieval.evidence_passages(c):
            if passage["text"] not in seen:
                seen.add(passage["text"])
                passages.append(passage)
    return passages


def retrieve(inputs, config):
    """`inputs` with each claim's --evidence-k passages of the corpus nearest to the claim as its evidence, or with
    the evidence retrieved from each claim's --knowledge-store file (debate/pipeline/store_retrieval.py)."""
    if config.retrieval.knowledge_store and config.data.evidence == "retrieved":
        from debate.pipeline import store_retrieval  # loads the models only when a store is given

        claims, _ = store_retrieval.run(config, inputs.claims)
        return replace(inputs, claims=claims)
    if inputs.corpus is None:
        return inputs
    embedder = retrieval.load_embedder(config.courtroom.embedder)
    log.info(f"retrieving {config.data.evidence_k} passages per claim from {len(inputs.corpus)} with "
             f"{embedder.path}")
    index = retrieval.passage_index(inputs.corpus, embedder, source=f"{inputs.dataset.name}'s corpus")
    hits = retrieval.search(index, retrieval.embed(embedder, [c["claim"] for c in inputs.claims]),
                            config.data.evidence_k)
    claims = [dict(c, evidence=[_item(inputs.corpus[position]) for position, _ in found])
              for c, found in zip(inputs.claims, hits)]
    return replace(inputs, claims=claims, corpus=None)


def _item(passage):
    """A corpus passage as evidence: a question-answer pair where the corpus holds them, else its text."""
    if passage.get("question") and passage.get("answer"):
        return {"question": passage["question"], "answer": passage["answer"], "url": passage.get("url") or ""}
    return {"text": passage["text"], "url": passage.get("url") or ""}
