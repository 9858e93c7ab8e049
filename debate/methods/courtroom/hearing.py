"""The hearing, round by round until a stopping rule holds (rules.stop_reason, from round 2) or the round
cap: discovery (P-RAG, every round; Appendix I's criteria are recorded, rules.prag_criterion), the two
counsels' arguments, expert witnesses, then reflection and review (reflection.py). `round_log` is what a
saved record keeps of each round.

As in the paper, every counsel turn is one stateless prompt (H.3, H.4, H.7, H.8, I): it carries the claim,
the current evidence pool and the recent proceedings, and nothing of the counsel's earlier turns; its
self-reflection reaches later rounds only through P-RAG's discovery request (and the scores the stopping
rule, the confidence and the judges read).

Ablations (Table 6): `opts.prag` off (A3) skips discovery and every stopping rule but the round cap;
`opts.reflection` off (A4) skips self-reflection, so discovery asks with the gap alone and the plateau rule
never fires."""
import torch

from debate.data.prompts import load_prompt, render
from debate.engine import engine, retrieval
from debate.methods.courtroom import rules
from debate.methods.courtroom.case import (
    SIDE_NAMES,
    SIDES,
    Hearing,
    ask,
    counsel_conversation,
    court_conversation,
    field_text,
    format_pool,
    named_word,
    recent_messages,
    reply_fields,
    tuned,
)
from debate.methods.courtroom.reflection import reflect_and_review

# Messages of the proceedings an argument or testimony prompt quotes (the authors' code; the paper gives none).
HISTORY = 5


def open_hearing(case, agents, speakers, rerun=False):
    """A hearing from the originally admitted exhibits only: the rerun after the role switch starts again
    from them (Appendix K), and disputed, dropped or unscored candidates never enter (section 2.3).

    P-RAG's novelty pool (`Hearing.vectors`) starts as the authors' engine starts it: empty in the primary
    hearing (its first call finds everything novel), the admitted exhibits in the rerun (their reset_state)."""
    convs = {"critic": engine.Conversation(system=render("critic_meta", claim=case.claim["claim"],
                                                         premises="; ".join(case.premises))),
             "court": court_conversation(case)}
    pool = [e for e in case.pool if e["status"] == "admitted"]
    seeded = pool if rerun else []
    vectors = case.index.vectors[[e["position"] for e in seeded]] if seeded else case.index.vectors[:0]
    hearing = Hearing(counsels={side: agents[role] for side, role in speakers.items()}, speakers=dict(speakers),
                      convs=convs, pool=pool, vectors=vectors)
    case.hearings.append(hearing)
    return hearing


def _counsel(active, side, settings, opts):
    """The model arguing `side` in these hearings (all of one batch hold the same) and its settings: a
    counsel keeps its own temperature when the role switch moves it to the other side."""
    hearing = active[0][1]
    return hearing.counsels[side], tuned(settings, opts, hearing.speakers[side])


def _discover(agents, active, round_no, opts, library, settings, generator, tag):
    """P-RAG, every round: each counsel's gap (plus its last discovery need) becomes a query, the court
    refines it, and its novel top-k passages enter the pool; Appendix I's stopping criteria are checked
    and recorded (rules.prag_criterion), and the next round retrieves again.

    Novelty is measured against P-RAG's novelty pool (see open_hearing; what it accepted joins it), and a
    call's candidates are scored together against the pool as it stood before the call, as the authors'
    engine scores them: two near-identical candidates of one call can both enter. A candidate dropped at
    admissibility can be rediscovered. In the primary hearing an admitted exhibit retrieved again is novel
    (the novelty pool does not hold the exhibits there) and counts as accepted, as in the authors' engine;
    unlike their evidence pool, ours does not list a passage it already holds a second time."""
    stage = f"{tag}-{round_no}"
    requests = {}
    for side in SIDES:
        items = [(c, stage, side, counsel_conversation(side),
                  render("counsel_gap", round=round_no, side=SIDE_NAMES[side], context=recent_messages(h)))
                 for c, h in active]
        counsel, temperature = _counsel(active, side, settings, opts)
        for (case, hearing), reply in zip(active, ask(counsel, items, temperature, generator,
                                                       schema_name="counsel_gap")):
            gap = field_text(reply_fields(reply, ("Gap",)).get("Gap")) or reply.strip()
            need = field_text(hearing.reflections.get(side, {}).get("Discovery Need"))
            # Appendix I joins them as "{gap}. Focus also on: {need}"; a gap ending in a full stop keeps one.
            requests[(id(case), side)] = (render("courtroom_request", gap=gap.rstrip().rstrip("."), need=need)
                                          if need else gap)
    court = tuned(settings, opts, "court")
    pairs = [(case, hearing, side) for case, hearing in active for side in SIDES]
    # Step 2 (the P-RAG engine's query formulation) and step 3 (the court's refinement), Appendix I.
    items = [(c, stage, "court", engine.Conversation(system=""),
              render("courtroom_query", context=recent_messages(h), request=requests[(id(c), side)]))
             for c, h, side in pairs]
    drafts = [field_text(reply_fields(r, ("Query",)).get("Query")) or requests[(id(c), side)]
              for (c, h, side), r in zip(pairs, ask(agents["court"], items, court, generator,
                                                     schema_name="courtroom_query"))]
    items = [(c, stage, "court", court_conversation(c),
              render("court_query", side=SIDE_NAMES[side], query=draft, context=recent_messages(h)))
             for (c, h, side), draft in zip(pairs, drafts)]
    queries = [field_text(reply_fields(r, ("Query",)).get("Query")) or draft
               for draft, r in zip(drafts, ask(agents["court"], items, court, generator, schema_name="court_query"))]
    vectors = iter(retrieval.embed(library.embedder, queries))  # one encoder call for the whole round
    queries = iter(queries)
    for case, hearing in active:
        novelties, admitted_novelty, relevance, calls = [], [], [], []
        for side in SIDES:
            query = next(queries)
            hits = retrieval.search(case.index, next(vectors)[None], opts.top_k)[0]
            case.retrieval_calls += 1
            case.retrieved += len(hits)
            positions = [p for p, _ in hits]
            scores = [float(n) for n in retrieval.novelty(case.index.vectors[positions], hearing.vectors)]
            admitted = [k for k, n in enumerate(scores) if n >= opts.novelty_threshold]
            held = {e["passage"]["id"] for e in hearing.pool}
            for k in admitted:
                passage = case.index.passages[positions[k]]
                if passage["id"] not in held:  # accepted again (novel to the novelty pool) adds no second copy
                    held.add(passage["id"])
                    hearing.pool.append({"passage": passage, "position": positions[k], "status": "discovered",
                                         "weight": None, "round": round_no})
                relevance.append(hits[k][1])
                admitted_novelty.append(scores[k])
            if admitted:
                hearing.vectors = torch.cat([hearing.vectors, case.index.vectors[[positions[k] for k in admitted]]])
            ids = [case.index.passages[p]["id"] for p in positions]
            call = {"round": round_no, "side": side, "query": query, "admitted": len(admitted),
                    "retrieved": len(positions), "novelty": [round(n, 4) for n in scores],
                    "ids": ids, "relevance": [round(float(r), 4) for _, r in hits],
                    "admitted_ids": [ids[k] for k in admitted]}
            hearing.queries.append(call)
            calls.append(call)
            novelties += scores
        # Novelty exhaustion reads the mean novelty of what was admitted, 0 when nothing was (the authors'
        # orchestrator); Figure 3's per-round novelty is the mean over everything retrieved.
        hearing.novelty_means.append(sum(admitted_novelty) / len(admitted_novelty) if admitted_novelty else 0.0)
        mean_relevance = sum(relevance) / len(relevance) if relevance else 0.0
        previous = hearing.relevance[-1] if hearing.relevance else None
        hearing.relevance.append(mean_relevance)
        criterion = rules.prag_criterion(novelties, mean_relevance, previous, round_no,
                                         redundancy_limit=opts.redundancy_limit, gain_floor=opts.relevance_gain)
        if criterion:
            calls[-1]["prag_criterion"] = criterion
        hearing.rounds[-1]["discovery"] = {
            "queries": calls, "admitted": [i for c in calls for i in c["admitted_ids"]],
            "pool_size": len(hearing.pool),
            "novelty": round(sum(novelties) / len(novelties), 4) if novelties else None,
            "novelty_admitted": round(hearing.novelty_means[-1], 4), "relevance": round(mean_relevance, 4),
            "relevance_gain": None if previous is None else round(mean_relevance - previous, 4),
            "prag_criterion": criterion}


def _counsel_prompt(case, hearing, side, round_no):
    """The per-turn argument prompt: everything the counsel reads this turn (H.3, H.4)."""
    return render("counsel_argument", round=round_no, claim=case.claim["claim"], side=SIDE_NAMES[side],
                  instruction=load_prompt(f"counsel_instruction_{side}"), evidence=format_pool(hearing.pool),
                  history=recent_messages(hearing, HISTORY))


def open_round(active, round_no):
    for case, hearing in active:
        hearing.rounds.append({"round": round_no, "testimony": []})


def argue(active, round_no, opts, settings, generator, tag):
    """Both counsels' arguments of round `round_no` (its record opened by open_round)."""
    for side in SIDES:  # the defense reads the plaintiff's argument of this round in its history
        items = [(case, f"{tag}-{round_no}", side, counsel_conversation(side),
                  _counsel_prompt(case, hearing, side, round_no)) for case, hearing in active]
        counsel, temperature = _counsel(active, side, settings, opts)
        for (case, hearing), reply in zip(active, ask(counsel, items, temperature, generator)):
            hearing.rounds[-1][side] = reply
            hearing.messages.append((SIDE_NAMES[side], reply))


def _call_witnesses(agents, active, round_no, opts, settings, generator, tag):
    """Each counsel may request an expert; the court grants or denies it; a granted expert testifies."""
    stage = f"{tag}-{round_no}"
    requests = []  # (case, hearing, side, expert type, reasoning)
    for side in SIDES:
        items = [(c, stage, side, counsel_conversation(side), render("counsel_expert", history=recent_messages(h)))
                 for c, h in active]
        counsel, temperature = _counsel(active, side, settings, opts)
        for (case, hearing), reply in zip(active, ask(counsel, items, temperature, generator,
                                                       schema_name="counsel_expert")):
            fields = reply_fields(reply, ("Expert Type", "Reasoning"))
            expert = field_text(fields.get("Expert Type"))
            if expert and expert.lower().strip(".") != "none":
                requests.append((case, hearing, side, expert, field_text(fields.get("Reasoning"))))
    items = [(c, stage, "court", court_conversation(c),
              render("court_witness", side=SIDE_NAMES[side], expert_type=expert,
                     reasoning=reasoning or "(none given)"))
             for c, h, side, expert, reasoning in requests]
    granted = []
    for request, reply in zip(requests, ask(agents["court"], items, tuned(settings, opts, "court"), generator,
                                             schema_name="court_witness")):
        ruling = named_word(reply_fields(reply, ("Ruling", "Reason")).get("Ruling") or reply, ("granted", "denied"))
        request[1].rounds[-1].setdefault("witness_requests", []).append(
            {"side": request[2], "expert": request[3], "ruling": ruling or "unreadable"})
        if ruling == "granted":
            granted.append(request)
    items = [(c, stage, "witness", engine.Conversation(system=load_prompt("witness_meta")),
              render("witness_testimony", claim=c.claim["claim"], expert_type=expert, expertise=expert,
                     evidence=format_pool(h.pool), history=recent_messages(h, HISTORY)))
             for c, h, side, expert, _ in granted]
    for (case, hearing, side, expert, _), reply in zip(granted, ask(agents["witness"], items,
                                                                     tuned(settings, opts, "witness"), generator)):
        hearing.rounds[-1]["testimony"].append({"side": side, "expert": expert, "answer": reply.strip()})
        hearing.messages.append((f"Expert witness ({expert})", reply.strip()))


def round_log(hearing):
    """What a saved record keeps of each round of `hearing` (its arguments and testimony are in the
    transcript), one dict per round with these fields:
      round; queries: per P-RAG call {side, query, ids (retrieved, best first), novelty and relevance (of
      each retrieved passage), admitted_ids (accepted as novel), retrieved and admitted (counts)}; admitted:
      the ids P-RAG accepted this round (one the pool held already is accepted but not listed twice);
      pool_size: the evidence pool after the round's discovery; novelty: the mean novelty of
      everything retrieved this round (Figure 3), None without retrieval; novelty_admitted: the mean novelty
      of what was admitted, 0.0 when nothing was (the novelty rule's input); relevance, relevance_gain:
      the mean query cosine of the admitted passages and its change from the previous round;
      prag_criterion: the Appendix I criterion that held (max_iterations, redundancy, relevance_gain) or
      None; reflection: per side {logic, novelty, rebuttal, total} (0-1, total 0.4 l + 0.3 n + 0.3 b),
      reflection_total: their sum S (None when one is unreadable); critic: per side {logic, evidence,
      rebuttal} and resolved (True, False or None: unreadable); court: "wait", "close", "unreadable", or
      None when not asked (round 1, or without P-RAG); witnesses: the expert requests and rulings;
      stop: the stopping rule that ended the hearing after this round, else None.
    Without P-RAG (A3) the discovery fields are empty or None; without self-reflection (A4) reflection is
    {} and reflection_total None."""
    log = []
    for r in hearing.rounds:
        found = r.get("discovery") or {}
        critic = r.get("critic") or {}
        log.append({
            "round": r["round"], "queries": found.get("queries", []), "admitted": found.get("admitted", []),
            "pool_size": sum(e.get("round", 0) <= r["round"] for e in hearing.pool),
            "novelty": found.get("novelty"), "novelty_admitted": found.get("novelty_admitted"),
            "relevance": found.get("relevance"), "relevance_gain": found.get("relevance_gain"),
            "prag_criterion": found.get("prag_criterion"),
            "reflection": r.get("reflection", {}), "reflection_total": r.get("reflection_total"),
            "critic": {**{side: {k.lower(): critic[side].get(k) for k in ("Logic", "Evidence", "Rebuttal")}
                          for side in SIDES if side in critic}, "resolved": critic.get("resolved")},
            "court": r.get("court"), "witnesses": r.get("witness_requests", []), "stop": r.get("stop")})
    return log


def _stop_reason(opts, round_no, max_rounds, said, hearing):
    """Why the hearing ends after this round, or None. Without P-RAG (A3) only the round cap ends it (no
    adaptive convergence); without self-reflection (A4) there is no reflection plateau."""
    if not opts.prag:
        return "max_rounds" if round_no >= max_rounds else None
    return rules.stop_reason(round_no, max_rounds, said["critic"], said["court"],
                             hearing.totals if opts.reflection else [], hearing.novelty_means,
                             opts.plateau_delta, opts.novelty_stop)


def hold_hearings(agents, cases, speakers, opts, max_rounds, library, settings, generator, tag):
    """Hold one hearing per case, `speakers` {side: the role whose model argues it}, batched round by round."""
    active = [(case, open_hearing(case, agents, speakers, rerun=tag == "switched")) for case in cases]
    for round_no in range(1, max_rounds + 1):
        if not active:
            break
        open_round(active, round_no)
        if opts.prag:
            _discover(agents, active, round_no, opts, library, settings, generator, tag)
        argue(active, round_no, opts, settings, generator, tag)
        if opts.witness:
            _call_witnesses(agents, active, round_no, opts, settings, generator, tag)
        decisions = reflect_and_review(active, round_no, opts, agents, settings, generator, tag)
        still = []
        for case, hearing in active:
            hearing.stop_reason = _stop_reason(opts, round_no, max_rounds, decisions[id(hearing)], hearing)
            hearing.rounds[-1]["stop"] = hearing.stop_reason
            if hearing.stop_reason is None:
                still.append((case, hearing))
            else:
                for conv in hearing.convs.values():
                    conv.drop_cache()  # the memory goes to the hearings still running, then to the panel
        active = still
