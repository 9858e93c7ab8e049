"""PROClaim's Table 4 baselines, on the courtroom's corpus and encoder, batched over claims.

- Standard MAD ("standard-mad"): the paper's "two-agent, single-judge RAG-based debate without our
  enhancements" (section 4.3; its authors' ablation 1): the seed retrieval with the claim itself
  (--seed-k passages, admitted as they come: no negotiation, no admissibility), then a fixed number of
  rounds (--max-rounds, 3) in which the plaintiff and then the defense counsel argue from that pool and
  the recent proceedings with the courtroom's own stateless per-turn prompt; no P-RAG, expert witness,
  self-reflection, critic, adaptive stopping or role switch. One judge (the first --judge-models seat)
  reads the claim, both counsels' arguments and the evidence, scores it like the panel's judges and
  votes Supported / Not Supported / Inconclusive; the courtroom's label rule and confidence formula
  apply to that one vote (confidence 0.8 + 0.3 x quality / 10).
- Single call ("single-call"): the argument miner's premises, then one evidence pool from the same
  corpus, the claim's top --seed-k passages and each premise's top --top-k (at most POOL_CAP distinct
  passages), and one RAG-CoT call of the verifier (--moderator-model) on it, over the dataset's labels.
"""

from debate.data.labels import AVERITEC
from debate.data.prompts import render
from debate.engine import retrieval
from debate.methods import baselines, turns
from debate.methods.courtroom.case import SIDES, Case, Hearing, format_pool, generator_of, index_for, token_report
from debate.methods.courtroom.hearing import argue, open_round
from debate.methods.courtroom.negotiation import mine_premises
from debate.methods.courtroom.panel import ballots_of, decide, panel_evidence, panel_note

STANDARD_MAD_MODELS = {"plaintiff": "debater", "defense": "defense", "judge_1": "judge_1"}
SINGLE_CALL_MODELS = {"critic": "critic", "verifier": "moderator"}
SCHEMAS = {"standard-mad": ("judge_mad",), "single-call": ("critic_premises", "ragcot")}
POOL_CAP = 20  # the single-call pool's size at most (the authors' baseline caps its evidence at 20 documents)


def _seed_pool(case, library, k):
    """The top-k passages for the claim itself, as admitted pool entries."""
    hits = retrieval.search(case.index, retrieval.embed(library.embedder, [case.claim["claim"]]), k)[0] if k else []
    case.retrieval_calls += 1 if k else 0
    case.retrieved += len(hits)
    return [{"passage": case.index.passages[p], "position": p, "status": "admitted", "weight": None, "round": 0}
            for p, _ in hits]


def standard_mad(agents, claims, settings, streams=None, on_finish=None, options=None, library=None, max_rounds=3,
                 labels=AVERITEC):
    """Standard MAD over `claims` (see the module doc); `options` is the run's Courtroom group."""
    opts = options
    generator = generator_of({s: agents[s] for s in SIDES}, streams, settings.seed, settings, opts)
    cases = [Case(claim=c, index=index_for(library, c)) for c in claims]
    counsels = {s: agents[s] for s in SIDES}
    active = []
    for case in cases:
        hearing = Hearing(counsels=counsels, speakers={s: s for s in SIDES}, convs={},
                          pool=_seed_pool(case, library, opts.seed_k), vectors=None)
        case.hearings.append(hearing)
        active.append((case, hearing))
    for round_no in range(1, max_rounds + 1):
        open_round(active, round_no)
        argue(active, round_no, opts, settings, generator, "debate")
    prompts = []
    for case, hearing in active:
        said = {side: "\n\n".join(r[side].strip() for r in hearing.rounds) or "(none)" for side in SIDES}
        prompts.append(render("judge_mad", claim=case.claim["claim"], plaintiff=said["plaintiff"],
                              defense=said["defense"], evidence=format_pool(hearing.pool)))
    judges = {r: a for r, a in agents.items() if r.startswith("judge_")}
    seats, ballots = ballots_of(judges, cases, prompts, opts, settings, streams, "judge_mad")
    records = []
    for case, hearing in active:
        outcome, reply, decision = decide(case, seats, ballots, opts, labels)
        records.append(turns.record(
            case.claim, outcome, case.said, case.convs, reply=reply, rounds=len(hearing.rounds),
            stop_reason="max_rounds", rounds_switched=0, total_rounds=len(hearing.rounds), **decision,
            panel=panel_note(agents, seats), retrieval_calls=case.retrieval_calls, retrieved=case.retrieved,
            evidence_pool=len(hearing.pool), tokens=token_report(case), corpus=library.source,
            evidence=panel_evidence(hearing.pool)))
        if on_finish:
            on_finish(records[-1])
    return records


def _pool(case, library, opts):
    """The single call's evidence: the claim's top seed_k passages, then each premise's top top_k, distinct,
    at most POOL_CAP."""
    queries = [(case.claim["claim"], opts.seed_k)] * bool(opts.seed_k) + [(p, opts.top_k) for p in case.premises]
    vectors = retrieval.embed(library.embedder, [q for q, _ in queries])
    positions = []
    for (_, k), vector in zip(queries, vectors):
        hits = retrieval.search(case.index, vector[None], k)[0]
        case.retrieval_calls += 1
        case.retrieved += len(hits)
        positions += [p for p, _ in hits if p not in positions]
    return [case.index.passages[p] for p in positions[:POOL_CAP]]


def _as_evidence(passage):
    """A passage as a question-answer evidence item (a passage's text answers an empty question)."""
    return {"question": passage.get("question", ""), "answer": passage.get("answer", passage["text"]),
            "url": passage.get("url", "")}


def single_call(agents, claims, settings, streams=None, on_finish=None, options=None, library=None, labels=AVERITEC):
    """The single-call verifier over `claims` (see the module doc); `options` is the run's Courtroom group."""
    opts = options
    generator = generator_of({"critic": agents["critic"]}, streams, settings.seed, settings, opts)
    cases = [Case(claim=c, index=index_for(library, c)) for c in claims]
    mine_premises(agents, cases, opts, settings, generator)
    pooled, by_id = [], {}
    for case in cases:
        evidence = [_as_evidence(p) for p in _pool(case, library, opts)]
        pooled.append(dict(case.claim, evidence=evidence))
        by_id[case.claim["claim_id"]] = (case, evidence)

    def finish(record):
        # The verifier's record, with the premises and the retrieval before it.
        case, evidence = by_id[record["prediction"]["claim_id"]]
        pred = record["prediction"]
        case.tokens[("verifier", "verdict")] = [pred["prompt_tokens"], pred["completion_tokens"]]
        for key, value in turns.token_counts(case.convs).items():
            pred[key] += value
        record["transcript"]["turns"] = case.said + record["transcript"]["turns"]
        pred.update(premises=case.premises, retrieval_calls=case.retrieval_calls, retrieved=case.retrieved,
                    evidence_pool=len(evidence), tokens=token_report(case), corpus=library.source, evidence=evidence)
        if on_finish:
            on_finish(record)

    return baselines.rag_cot({"verifier": agents["verifier"]}, pooled, settings, streams=streams, on_finish=finish,
                             labels=labels)
