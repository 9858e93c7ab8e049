"""The run's claims: its dataset's split read, cut to --limit, and given the evidence of its condition.

golden and none (and a dataset's own conditions, PolitiHop's ruling) come with the claims. retrieved comes,
in this order, from --retrieved-file, the dataset's own retrieved file (AVeriTeC: HerO's), --corpus, or the
dataset's own corpus (Check-COVID: its abstracts); from a corpus, each claim's --evidence-k passages nearest
to it under the project's sentence encoder (debate.engine.retrieval). That step loads the encoder, so it runs
(`retrieve`) only after every check of the run has passed.
"""
import random
from dataclasses import dataclass

from debate.data import averitec, claims as records, datasets
from debate.data.claims import DataError
from debate.engine import retrieval


@dataclass
class Inputs:
    claims: list  # claim records, --limit applied, evidence attached (unless it waits for `retrieve`)
    labels: object  # the split's LabelSet
    dataset: object  # debate.data.datasets.Dataset
    corpus: object = None  # passages the retrieved evidence is still to come from (see `retrieve`), or None
    notes: tuple = ()  # what the reader left out and why (one line each)


def read(config):
    """The run's Inputs; every problem of the data raises DataError before any model loads."""
    d = config.data
    dataset = datasets.get(d.dataset)
    claims = dataset.read(d.split, d.data_dir)
    labels = dataset.labels(d.split, d.data_dir)
    if d.limit and d.sample_seed is not None and d.limit < len(claims):
        # A seeded draw, kept in file order: the same claims for every method run with this seed.
        chosen = sorted(random.Random(d.sample_seed).sample(range(len(claims)), d.limit))
        claims = [claims[i] for i in chosen]
    elif d.limit:
        claims = claims[: d.limit]
    notes = tuple(note for c in claims for note in c.get("notes", ()))
    where = f"{dataset.name} {d.split}"
    if d.evidence == "golden" and claims and not any(c["gold_evidence"] for c in claims):
        raise DataError(f"--evidence golden: {where} has no annotated evidence; run it with --evidence "
                        f"{' or '.join(c for c in dataset.conditions if c != 'golden')}")
    if d.evidence != "retrieved":
        return Inputs(records.attach_evidence(claims, d.evidence), labels, dataset, notes=notes)
    path = d.retrieved_file or (dataset.retrieved_file(d.split, d.data_dir) if dataset.retrieved_file else None)
    if path is not None:
        return Inputs(records.attach_evidence(claims, "retrieved", path), labels, dataset, notes=notes)
    if config.courtroom.corpus:
        corpus = retrieval.load_corpus(config.courtroom.corpus)
    elif dataset.corpus is not None:
        corpus = dataset.corpus(dataset.data_dir(d.data_dir))
    elif d.split == averitec.DEMO_SPLIT:
        return Inputs(records.attach_evidence(claims, "golden"), labels, dataset, notes=notes)  # config says so
    else:
        raise DataError(f"--evidence retrieved: {where} has no retrieved evidence of its own; give --retrieved-file "
                        "(evidence keyed by claim_id) or --corpus (JSONL passages to retrieve from)")
    return Inputs([dict(c, evidence=[]) for c in claims], labels, dataset, corpus=corpus, notes=notes)


def retrieve(inputs, config, log=print):
    """`inputs` with each claim's --evidence-k passages of the corpus nearest to the claim as its evidence."""
    if inputs.corpus is None:
        return inputs
    embedder = retrieval.load_embedder(config.courtroom.embedder)
    log(f"retrieving {config.data.evidence_k} passages per claim from {len(inputs.corpus)} with {embedder.path}")
    index = retrieval.index_of(inputs.corpus, embedder)
    hits = retrieval.search(index, retrieval.embed(embedder, [c["claim"] for c in inputs.claims]),
                            config.data.evidence_k)
    claims = [dict(c, evidence=[_item(inputs.corpus[position]) for position, _ in found])
              for c, found in zip(inputs.claims, hits)]
    return Inputs(claims, inputs.labels, inputs.dataset, notes=inputs.notes)


def _item(passage):
    """A corpus passage as evidence: a question-answer pair where the corpus holds them, else its text."""
    if passage.get("question") and passage.get("answer"):
        return {"question": passage["question"], "answer": passage["answer"], "url": passage.get("url") or ""}
    return {"text": passage["text"], "url": passage.get("url") or ""}
