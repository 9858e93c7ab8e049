"""PROClaim (Chowdhury et al. 2026): a courtroom debate with progressive retrieval, batched over claims.

`run_batch` is the trial from start to end; each stage lives in its own module of this package:
1. Premises (negotiation.py): the argument miner (on the critic's model) breaks the claim into premises.
2. Evidence negotiation (negotiation.py): seed retrieval with the claim itself, shared retrieval per
   premise, a supporting and a challenging query for each counsel's pool, the counsels' disclosures and
   challenges, and the court's admissibility ratings: weight = relevance x credibility, admitted /
   disputed / dropped by the two thresholds (rules.admissibility). Only the admitted items go on.
3. The hearing (hearing.py), round by round until a stopping rule holds (rules.stop_reason, from round
   2) or the round cap: discovery (P-RAG) every round, Appendix I's criteria recorded
   (rules.prag_criterion), the plaintiff's and then the defense's argument, expert witnesses the court
   grants (unless --no-witness), then (reflection.py) each counsel's self-reflection, the critic's
   evaluation and the court's wait-or-close.
4. Role switch (role_switch.py): the counsels' models swap sides and the whole hearing is held again from
   the originally admitted exhibits, under the primary's round cap and stopping rules (--switch-rounds caps
   it lower, an ablation), its P-RAG state reset (open_hearing); the consistency analyzer (critic's
   model) scores the two hearings. With one model for both counsels and greedy decoding the rerun would
   repeat the first hearing token for token, so it is skipped and the output says so.
5. The panel (panel.py): one judge per --judge-models path reads the whole case record and votes
   Supported / Not Supported / Inconclusive; rules.vote maps the votes onto the dataset's labels (a split
   goes to the Chief Justice) and rules.confidence gives the confidence, its reflection adjustment read from
   the last hearing held (the rerun's, as the authors compute it). Under greedy decoding, seats held
   by the same model vote alike, so each distinct model is asked once.

What every stage shares (the case, one batched turn, the texts the roles read) is in case.py; the
paper's arithmetic, apart from any model, in rules.py. Each role runs on its own model and samples at
its own temperature (Courtroom.temperature_of, the paper's by default). The ablations of the paper's
Table 6 are the options role_switch (A1), single_judge (A2: a one-seat panel), prag (A3) and reflection (A4).
"""
from debate.data.labels import AVERITEC
from debate.methods import turns
from debate.methods.courtroom.case import SIDES, Case, generator_of, index_for, token_report
from debate.methods.courtroom.hearing import hold_hearings, round_log
from debate.methods.courtroom.negotiation import mine_premises, negotiate
from debate.methods.courtroom.panel import decide, judge_cases, panel_evidence, panel_note
from debate.methods.courtroom.role_switch import score_consistency, switch_needed

# the JSON answers it asks for (debate.data.answer_schemas)
SCHEMAS = ("critic_premises", "counsel_search", "counsel_disclosure", "court_admissibility", "counsel_gap",
           "courtroom_query", "court_query", "counsel_expert", "court_witness", "counsel_reflection", "critic_round",
           "court_ready", "critic_consistency", "judge_case")


def model_of(n_judges):
    """Role -> model flag; judge seat i runs on the i-th --judge-models path. Every role has a flag of its
    own (--court-model, --critic-model, --witness-model default to the moderator's and debater's models)."""
    roles = {"plaintiff": "debater", "defense": "defense", "court": "court", "critic": "critic",
             "witness": "witness"}
    roles.update({f"judge_{i + 1}": f"judge_{i + 1}" for i in range(n_judges)})
    return roles


def components(opts):
    """The rows of the paper's Table 6 (the ablation matrix) and whether this run has each on."""
    adaptive = "on" if opts.prag and opts.reflection else "partial" if opts.prag else "off"
    return {"evidence_negotiation": True, "prag": opts.prag, "expert_witness": opts.witness,
            "self_reflection": opts.reflection, "reflection_to_prag": opts.prag and opts.reflection,
            "critic": True, "adaptive_convergence": adaptive, "role_switch": opts.role_switch,
            "three_judge_panel": not opts.single_judge, "reflection_confidence": opts.reflection}


def hearing_record(hearing, phase):
    """One hearing in the saved record: phase ("primary", or "switched" after the role switch), rounds (how
    many were held), stop_reason, pool_size (its evidence pool at the end), discovered (what P-RAG added),
    reflection_totals and novelty_means (the plateau and novelty rules' inputs, per round), prag_criteria
    (per round, the Appendix I criterion that held or None), queries (every P-RAG call, in order) and
    round_log (hearing.round_log: everything per round)."""
    log = round_log(hearing)
    return {"phase": phase, "rounds": len(hearing.rounds), "stop_reason": hearing.stop_reason,
            "pool_size": len(hearing.pool), "discovered": sum(e["status"] == "discovered" for e in hearing.pool),
            "reflection_totals": hearing.totals, "novelty_means": hearing.novelty_means,
            "prag_criteria": [r["prag_criterion"] for r in log], "queries": hearing.queries, "round_log": log}


def run_batch(agents, claims, settings, options, library, max_rounds, streams=None, on_finish=None, labels=AVERITEC):
    """Try `claims` together, hearings of `max_rounds` rounds at most; call `on_finish(record)` as each one is
    decided; return the records. `options`: the run config's Courtroom group (the paper's numbers by default),
    `library`: case.library_from(options, passages), `labels`: the dataset's LabelSet the verdicts map onto."""
    opts = options
    generator = generator_of(agents, streams, settings.seed, settings, opts)
    cases = [Case(claim=c, index=index_for(library, c)) for c in claims]
    mine_premises(agents, cases, opts, settings, generator)
    negotiate(agents, cases, opts, library, settings, generator)
    hold_hearings(agents, cases, {s: s for s in SIDES}, opts, max_rounds, library, settings, generator, "first")
    rerun, switch_note = switch_needed(agents, opts)
    if rerun:
        swapped = {"plaintiff": "defense", "defense": "plaintiff"}  # each model argues the other side
        # The full debate again under the primary's cap and stopping rules (2.7); --switch-rounds caps it lower.
        hold_hearings(agents, cases, swapped, opts, opts.switch_rounds or max_rounds, library, settings, generator,
                      "switched")
        score_consistency(agents, cases, opts, settings, generator)
    seats, ballots = judge_cases(agents, cases, opts, settings, streams, switch_note)
    records = []
    for case in cases:
        outcome, reply, decision = decide(case, seats, ballots, opts, labels)
        first = case.hearings[0]
        counts = {s: sum(e["status"] == s for e in case.pool) for s in ("admitted", "disputed", "dropped", "unscored")}
        switched = sum(len(h.rounds) for h in case.hearings[1:])
        records.append(turns.record(
            case.claim, outcome, case.said, case.convs, reply=reply, rounds=len(first.rounds),
            stop_reason=first.stop_reason, rounds_switched=switched, total_rounds=len(first.rounds) + switched,
            **decision, premises=case.premises, negotiation=counts, disclosures=case.disclosures,
            role_switch=switch_note, consistency=case.consistency, panel=panel_note(agents, seats),
            stop_reason_switched=case.hearings[1].stop_reason if len(case.hearings) > 1 else None,
            hearings=[hearing_record(h, phase) for h, phase in zip(case.hearings, ("primary", "switched"))],
            # Table 5's evidence pool as the authors counted it: passages returned by all retrieval calls;
            # and the distinct passages the hearings' pools held.
            retrieval_calls=case.retrieval_calls, retrieved=case.retrieved,
            evidence_pool=len({e["passage"]["id"] for h in case.hearings for e in h.pool}),
            tokens=token_report(case), components=components(opts), corpus=library.source,
            evidence=panel_evidence(first.pool)))
        if on_finish:
            on_finish(records[-1])
    return records
