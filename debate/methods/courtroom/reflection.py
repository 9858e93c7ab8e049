"""The end of a hearing round: each counsel's self-reflection (logic, novelty, rebuttal, discovery need),
the critic's evaluation of both sides and whether the case is resolved, and the court's wait-or-close.

The round's reflection total S is the SUM of both counsels' totals, as the authors' orchestrator computes
it (Appendix J reports a change of 1.183, beyond any mean in [0, 1]); rules.plateaued compares it round
to round. Ablation A4 (`opts.reflection` off) skips the self-reflection; A3 (`opts.prag` off) has no
adaptive stopping, so the court is not asked whether to close; nor is it in round 1, when no rule may end
the hearing (rules.FIRST_STOP_ROUND)."""
from debate.data.parsing import number_in, yes_no
from debate.data.prompts import render
from debate.methods.courtroom import rules
from debate.methods.courtroom.case import (
    SIDE_NAMES,
    SIDES,
    ask,
    counsel_conversation,
    field_text,
    named_word,
    own_arguments,
    reply_fields,
    round_record,
    tuned,
)


def _side_scores(fields, side):
    """The critic's sub-scores of one side: {"Logic", "Evidence", "Rebuttal"} as 0-1 (None unreadable),
    and its reasoning."""
    scores = {k: number_in(fields.get(f"{side} {k}"), 1) for k in ("Logic", "Evidence", "Rebuttal")}
    scores["Reasoning"] = field_text(fields.get(f"{side} Reasoning"))
    return scores


def _items(value):
    """A list field as a list of strings (a lone text as one item)."""
    if isinstance(value, list):
        return [str(v).strip() for v in value if str(v).strip()]
    return [value.strip()] if isinstance(value, str) and value.strip() else []


def _reflect(active, round_no, opts, settings, generator, stage):
    """Each counsel audits its own last two arguments against the opponent's last two (H.7), in a fresh
    conversation; the round's total is the sum of both sides' totals (None if either is unreadable)."""
    for side in SIDES:
        other = SIDES[1 - SIDES.index(side)]
        items = [(c, stage, side, counsel_conversation(side),
                  render("counsel_reflection", round=round_no, side=SIDE_NAMES[side], claim=c.claim["claim"],
                         own=own_arguments(h, side), opponent=SIDE_NAMES[other], challenges=own_arguments(h, other)))
                 for c, h in active]
        hearing = active[0][1]  # a counsel keeps its own temperature across the role switch
        counsel, temperature = hearing.counsels[side], tuned(settings, opts, hearing.speakers[side])
        for (case, hearing), reply in zip(active, ask(counsel, items, temperature, generator,
                                                       schema_name="counsel_reflection")):
            fields = reply_fields(reply, ("Logic", "Novelty", "Rebuttal", "Flaws Identified", "Discovery Need",
                                     "Refined Stance"))
            parts = [number_in(fields.get(k), 1) for k in ("Logic", "Novelty", "Rebuttal")]
            hearing.reflections[side] = {"Logic": parts[0], "Novelty": parts[1], "Rebuttal": parts[2],
                                         "Discovery Need": field_text(fields.get("Discovery Need")),
                                         "total": rules.reflection_score(*parts, weights=opts.reflection_weights)}
            hearing.reflection_log.append(dict(hearing.reflections[side], round=round_no, side=side))
            hearing.rounds[-1].setdefault("reflection", {})[side] = {
                "logic": parts[0], "novelty": parts[1], "rebuttal": parts[2],
                "total": hearing.reflections[side]["total"]}
    for case, hearing in active:
        totals = [hearing.reflections[s]["total"] for s in SIDES]
        hearing.totals.append(None if None in totals else sum(totals))
        hearing.rounds[-1]["reflection_total"] = hearing.totals[-1]


def reflect_and_review(active, round_no, opts, agents, settings, generator, tag):
    """Self-reflection of both counsels, the critic's review and the court's wait-or-close; returns the
    per-hearing (critic resolved, court ready) decisions."""
    stage = f"{tag}-{round_no}"
    if opts.reflection:
        _reflect(active, round_no, opts, settings, generator, stage)
    decisions = {}
    items = [(c, stage, "critic", h.convs["critic"], render("critic_round", round=round_no, record=round_record(h)))
             for c, h in active]
    keys = tuple(f"{side} {part}" for side in ("Plaintiff", "Defense") for part in ("Logic", "Evidence", "Rebuttal",
                                                                                    "Reasoning"))
    keys += ("Unresolved Premises", "Plaintiff Recommendations", "Defense Recommendations", "Suggested Queries",
             "Resolved")
    for (case, hearing), reply in zip(active, ask(agents["critic"], items, tuned(settings, opts, "critic"),
                                                   generator, one_shot=False, schema_name="critic_round")):
        fields = reply_fields(reply, keys)
        hearing.rounds[-1]["critic"] = {
            "plaintiff": _side_scores(fields, "Plaintiff"), "defense": _side_scores(fields, "Defense"),
            "unresolved": _items(fields.get("Unresolved Premises")),
            "recommendations": {k: _items(fields.get(f"{k} Recommendations")) for k in ("Plaintiff", "Defense")},
            "queries": _items(fields.get("Suggested Queries")),
            "resolved": yes_no(fields.get("Resolved"))}
        decisions[id(hearing)] = {"critic": yes_no(fields.get("Resolved")) is True}
    # No adaptive convergence (A3): nothing would act on the court's answer; and, as in the authors'
    # orchestrator, the court is first asked whether to close after round 2 (no rule ends round 1).
    if not opts.prag or round_no < rules.FIRST_STOP_ROUND:
        for case, hearing in active:
            decisions[id(hearing)]["court"] = False
            hearing.rounds[-1]["court"] = None
        return decisions
    items = [(c, stage, "court", h.convs["court"], render("court_ready", round=round_no, record=round_record(h)))
             for c, h in active]
    for (case, hearing), reply in zip(active, ask(agents["court"], items, tuned(settings, opts, "court"),
                                                   generator, one_shot=False, schema_name="court_ready")):
        decision = named_word(reply_fields(reply, ("Decision",)).get("Decision") or reply, ("wait", "close"))
        hearing.rounds[-1]["court"] = decision or "unreadable"
        decisions[id(hearing)]["court"] = decision == "close"
    return decisions
