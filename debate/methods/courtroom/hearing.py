"""The hearing, round by round until a stopping rule holds (rules.stop_reason) or the round cap: discovery
(P-RAG) until an early exit stops it (rules.prag_exit), the two counsels' arguments, expert witnesses, then
reflection and review (reflection.py)."""
from debate.data.prompts import load_prompt, render
from debate.engine import engine, retrieval
from debate.methods.courtroom import rules
from debate.methods.courtroom.case import (Hearing, SIDES, SIDE_NAMES, ask, counsel_system, court_conversation,
                                           field_text, format_pool, named_word, recent_messages, reply_fields, tuned)
from debate.methods.courtroom.reflection import reflect_and_review


def open_hearing(case, counsels):
    convs = {side: engine.Conversation(system=counsel_system(case, side)) for side in SIDES}
    convs["critic"] = engine.Conversation(system=render("critic_meta", claim=case.claim["claim"],
                                                        premises="; ".join(case.premises)))
    convs["court"] = court_conversation(case)
    # The negotiated pool is in the counsels' system prompts: they have seen all of it.
    hearing = Hearing(counsels=counsels, convs=convs, pool=list(case.pool), vectors=case.vectors,
                      seen={side: len(case.pool) for side in SIDES})
    case.hearings.append(hearing)
    return hearing


def _discover(agents, active, round_no, opts, library, settings, generator, tag):
    """P-RAG: each counsel's gap (plus its last discovery need) becomes a query, the court refines it,
    and its novel top-k passages enter the pool; then the early exits are checked."""
    active = [(c, h) for c, h in active if h.prag_stop is None]
    if not active:
        return
    stage = f"{tag}-{round_no}"
    requests = {}
    for side in SIDES:
        items = [(c, stage, side, h.convs[side], render("counsel_gap", round=round_no, side=SIDE_NAMES[side],
                                                        context=recent_messages(h))) for c, h in active]
        counsel = active[0][1].counsels[side]
        for (case, hearing), reply in zip(active, ask(counsel, items, tuned(settings, opts, side), generator,
                                                       one_shot=False, schema_name="counsel_gap")):
            gap = field_text(reply_fields(reply, ("Gap",)).get("Gap")) or reply.strip()
            need = field_text(hearing.reflections.get(side, {}).get("Discovery Need"))
            requests[(id(case), side)] = render("courtroom_request", gap=gap, need=need) if need else gap
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
        novelties, retrieved, relevance = [], [], []
        for side in SIDES:
            query = next(queries)
            hits = retrieval.search(case.index, next(vectors)[None], opts.top_k)[0]
            positions = [p for p, _ in hits]
            admitted, scores = retrieval.admit_novel(hearing.vectors, case.index.vectors[positions],
                                                     opts.novelty_threshold)
            for k in admitted:
                hearing.pool.append({"passage": case.index.passages[positions[k]], "position": positions[k],
                                     "status": "discovered", "weight": None, "round": round_no})
                relevance.append(hits[k][1])
            if admitted:
                hearing.vectors = case.index.vectors[[e["position"] for e in hearing.pool]]
            hearing.queries.append({"round": round_no, "side": side, "query": query, "admitted": len(admitted),
                                    "retrieved": len(positions), "novelty": [round(s, 4) for s in scores]})
            novelties += scores
            retrieved += scores
        hearing.novelty_means.append(sum(novelties) / len(novelties) if novelties else None)
        mean_relevance = sum(relevance) / len(relevance) if relevance else 0.0
        previous = hearing.relevance[-1] if hearing.relevance else None
        hearing.relevance.append(mean_relevance)
        hearing.prag_stop = rules.prag_exit(retrieved, mean_relevance, previous, round_no, opts.redundancy_limit,
                                            opts.relevance_gain)
        if hearing.prag_stop:
            hearing.queries[-1]["prag_stop"] = hearing.prag_stop


def _argue(active, round_no, opts, settings, generator, tag):
    for case, hearing in active:
        hearing.rounds.append({"round": round_no, "testimony": []})
    for side in SIDES:
        items = []
        for case, hearing in active:
            prompt = render("counsel_argument", round=round_no,
                            new_evidence=format_pool(hearing.pool, hearing.seen[side]),
                            history=recent_messages(hearing))
            hearing.seen[side] = len(hearing.pool)
            items.append((case, f"{tag}-{round_no}", side, hearing.convs[side], prompt))
        counsel = active[0][1].counsels[side]
        for (case, hearing), reply in zip(active, ask(counsel, items, tuned(settings, opts, side), generator,
                                                       one_shot=False)):
            hearing.rounds[-1][side] = reply
            hearing.messages.append((SIDE_NAMES[side], reply))


def _call_witnesses(agents, active, round_no, opts, settings, generator, tag):
    """Each counsel may request an expert; the court grants or denies it; a granted expert testifies."""
    stage = f"{tag}-{round_no}"
    requests = []  # (case, hearing, side, expert type, reasoning)
    for side in SIDES:
        items = [(c, stage, side, h.convs[side], render("counsel_expert", history=recent_messages(h)))
                 for c, h in active]
        counsel = active[0][1].counsels[side]
        for (case, hearing), reply in zip(active, ask(counsel, items, tuned(settings, opts, side), generator,
                                                       one_shot=False, schema_name="counsel_expert")):
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
                     evidence=format_pool(h.pool), history=recent_messages(h)))
             for c, h, side, expert, _ in granted]
    for (case, hearing, side, expert, _), reply in zip(granted, ask(agents["witness"], items,
                                                                     tuned(settings, opts, "witness"), generator)):
        hearing.rounds[-1]["testimony"].append({"side": side, "expert": expert, "answer": reply.strip()})
        hearing.messages.append((f"Expert witness ({expert})", reply.strip()))


def hold_hearings(agents, cases, counsels, opts, max_rounds, library, settings, generator, tag):
    active = [(case, open_hearing(case, counsels)) for case in cases]
    for round_no in range(1, max_rounds + 1):
        if not active:
            break
        _discover(agents, active, round_no, opts, library, settings, generator, tag)
        _argue(active, round_no, opts, settings, generator, tag)
        if opts.witness:
            _call_witnesses(agents, active, round_no, opts, settings, generator, tag)
        decisions = reflect_and_review(active, round_no, opts, agents, settings, generator, tag)
        still = []
        for case, hearing in active:
            said = decisions[id(hearing)]
            hearing.stop_reason = rules.stop_reason(
                round_no, max_rounds, said["critic"], said["court"], hearing.totals, hearing.novelty_means,
                opts.plateau_delta, opts.novelty_stop)
            if hearing.stop_reason is None:
                still.append((case, hearing))
            else:
                for conv in hearing.convs.values():
                    conv.drop_cache()  # the memory goes to the hearings still running, then to the panel
        active = still
