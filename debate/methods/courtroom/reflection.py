"""The end of a hearing round: each counsel's self-reflection (logic, novelty, rebuttal, discovery need),
the critic's evaluation of both sides and whether the case is resolved, and the court's wait-or-close."""
from debate.data.parsing import number_in, yes_no
from debate.data.prompts import render
from debate.methods.courtroom import rules
from debate.methods.courtroom.case import (SIDES, SIDE_NAMES, ask, field_text, named_word, reply_fields, round_record,
                                           tuned)


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


def reflect_and_review(active, round_no, opts, agents, settings, generator, tag):
    """Self-reflection of both counsels, the critic's review and the court's wait-or-close; returns the
    per-hearing (critic resolved, court ready) decisions."""
    stage = f"{tag}-{round_no}"
    for side in SIDES:
        items = [(c, stage, side, h.convs[side], render("counsel_reflection", round=round_no, side=SIDE_NAMES[side]))
                 for c, h in active]
        counsel = active[0][1].counsels[side]
        for (case, hearing), reply in zip(active, ask(counsel, items, tuned(settings, opts, side), generator,
                                                       one_shot=False, schema_name="counsel_reflection")):
            fields = reply_fields(reply, ("Logic", "Novelty", "Rebuttal", "Flaws Identified", "Discovery Need",
                                     "Refined Stance"))
            parts = [number_in(fields.get(k), 1) for k in ("Logic", "Novelty", "Rebuttal")]
            hearing.reflections[side] = {"Logic": parts[0], "Novelty": parts[1], "Rebuttal": parts[2],
                                         "Discovery Need": field_text(fields.get("Discovery Need")),
                                         "total": rules.reflection_score(*parts, weights=opts.reflection_weights)}
            hearing.reflection_log.append(dict(hearing.reflections[side], round=round_no, side=side))
    for case, hearing in active:
        totals = [hearing.reflections[s]["total"] for s in SIDES if hearing.reflections[s]["total"] is not None]
        hearing.totals.append(sum(totals) / len(totals) if totals else None)
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
    items = [(c, stage, "court", h.convs["court"], render("court_ready", round=round_no, record=round_record(h)))
             for c, h in active]
    for (case, hearing), reply in zip(active, ask(agents["court"], items, tuned(settings, opts, "court"),
                                                   generator, one_shot=False, schema_name="court_ready")):
        decision = named_word(reply_fields(reply, ("Decision",)).get("Decision") or reply, ("wait", "close"))
        hearing.rounds[-1]["court"] = decision or "unreadable"
        decisions[id(hearing)]["court"] = decision == "close"
    return decisions
