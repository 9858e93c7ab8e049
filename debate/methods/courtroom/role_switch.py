"""The role switch (PROClaim Appendix K): whether the rerun with the counsels' models swapped is held, and
the consistency analyzer's comparison of the two hearings."""
from debate.data.parsing import number_in
from debate.data.prompts import render
from debate.engine import engine
from debate.methods.courtroom.case import ask, hearing_text, reply_fields, tuned


def switch_needed(agents, opts):
    if not opts.role_switch:
        return False, "off"
    a, b = agents["plaintiff"], agents["defense"]
    greedy = opts.temperature_of("plaintiff") <= 0 and opts.temperature_of("defense") <= 0
    if a.path == b.path and a.adapter == b.adapter and greedy:
        return False, ("skipped: both counsels run on one model under greedy decoding, "
                       "so the rerun would repeat the first hearing")
    return True, "rerun"


def score_consistency(agents, cases, opts, settings, generator):
    """The consistency analyzer (the paper runs it on the critic's model) compares the two hearings."""
    items = [(c, "role-switch", "critic", engine.Conversation(system=""),
              render("critic_consistency", first=hearing_text(c.hearings[0], "First hearing"),
                     second=hearing_text(c.hearings[1], "Second hearing"))) for c in cases]
    for case, reply in zip(cases, ask(agents["critic"], items, tuned(settings, opts, "critic"), generator,
                                       schema_name="critic_consistency")):
        fields = reply_fields(reply, ("Model A", "Model B", "Contradictions", "Consistency"))
        score = number_in(fields.get("Consistency"), 10)
        case.consistency = None if score is None else 10 * score
        case.consistency_fields = {k: v for k, v in fields.items() if isinstance(v, (str, int, float))}
