"""The DebateCV protocol (He et al. 2025): two Debaters argue, a Moderator judges each round.

Round 1: the Affirmative opens, the Negative rebuts it. Later rounds: each Debater answers the other's
last argument. After every round the Moderator answers in JSON and says whether to go on; a clear "No"
ends the debate with its verdict. After `max_rounds` without one, the Moderator gets the final prompt.
A Moderator reply whose "Proceeding Necessity" cannot be read counts as "go on": the debate cannot end
on a decision nobody made, and the final prompt still asks for a verdict. A "No" that names none of
the dataset's labels ends the debate and goes straight to the final prompt for its verdict. The labels are the
run's dataset's (`labels`, a LabelSet): the Moderator's meta prompt defines them and its verdicts choose among them.

Claims are debated in batches: each role's turn for every active claim is one batched generate call.

With a search `source` (--debate-retrieval, the toolkit's own: debate/methods/debate_retrieval.py), each round
opens with both Debaters naming the evidence they lack as a query; what is admitted from the claim's source is
shown, above their prompts, to the Affirmative, the Negative and the Moderator of that round, and stays in their
conversations from then on. Without a source the debate is the paper's, prompt for prompt.
"""
from dataclasses import asdict, dataclass, field, replace

from debate.data.labels import AVERITEC
from debate.data.parsing import parse_moderator, read_fields
from debate.data.prompts import format_evidence, render, verdict_criteria
from debate.engine import engine
from debate.methods import debate_retrieval as grow, turns as shared

ROLES = ("affirmative", "negative", "moderator")
MODEL_OF = {"affirmative": "debater", "negative": "debater", "moderator": "moderator"}  # role -> its model flag
SCHEMAS = ("moderator_round", "moderator_final")  # the JSON answers it asks for (debate.data.answer_schemas)


@dataclass
class ClaimDebate:
    claim: dict
    convs: dict  # role -> engine.Conversation
    labels: object  # the dataset's LabelSet
    turns: list = field(default_factory=list)
    arguments: dict = field(default_factory=dict)  # role -> its latest argument
    outcome: dict = None  # the parsed verdict once the debate has ended
    rounds: int = 0
    stop_reason: str = ""
    growth: object = None  # debate_retrieval.Growth under --debate-retrieval, else None


def moderator_system(claim_text, evidence_items, labels=AVERITEC):
    """The Moderator's meta prompt (training renders the same one, so contexts match token for token)."""
    return render("moderator_meta", claim=claim_text, evidence=format_evidence(evidence_items),
                  labels=verdict_criteria(labels))


def start_debate(claim, labels=AVERITEC):
    evidence = format_evidence(claim["evidence"])
    # Both Debaters share the paper's meta prompt; each learns its side from its first prompt of round 1.
    convs = {role: engine.Conversation(system=render("debater_meta", claim=claim["claim"], evidence=evidence))
             for role in ("affirmative", "negative")}
    convs["moderator"] = engine.Conversation(system=moderator_system(claim["claim"], claim["evidence"], labels))
    return ClaimDebate(claim=claim, convs=convs, labels=labels)


def _speak(agents, role, debates, prompts, round_no, settings, generator, schema_name=None):
    """One batched turn of `role` in each of `debates`; returns the replies."""
    replies = shared.speak(agents[role], [d.convs[role] for d in debates], prompts, settings, generator,
                           schema_name, debates[0].labels if debates else AVERITEC)
    for d, prompt, reply in zip(debates, prompts, replies):
        d.arguments[role] = reply
        d.turns.append({"round": round_no, "role": role, "prompt": prompt, "response": reply})
    return replies


def _finish(debate, parsed, reason):
    debate.outcome, debate.stop_reason = parsed, reason
    for conv in debate.convs.values():
        conv.drop_cache()  # the memory goes to the claims still debating


def _debaters_done(debates):
    """The Debaters have spoken their last (the final prompt is the Moderator's alone): their caches go now, not
    when the claim ends, so that a tight budget drops the caches still needed last, never the Moderator's."""
    for debate in debates:
        debate.convs["affirmative"].drop_cache()
        debate.convs["negative"].drop_cache()


def run_batch(agents, claims, settings, max_rounds=3, streams=None, on_finish=None, labels=AVERITEC, source=None,
              limits=None):
    """Debate `claims` together; call `on_finish(record)` as each claim ends; return the records. `labels`: the
    dataset's LabelSet. `source` (a debate_retrieval.Source): search it during the debate within `limits`."""
    debates = [start_debate(c, labels) for c in claims]
    limits = limits or grow.Limits()
    if source is not None:
        for d in debates:
            d.growth = grow.start(d.claim, source, limits)
    answer = {"label_choices": labels.choices(), "label_answer": labels.answer_format()}
    active, final, records = list(debates), [], []
    # One stream for the whole run: a fresh seed per call would repeat the same draws every turn.
    generator = shared.stream(agents, streams, settings.seed, settings)

    def finished(debate):
        record = to_record(debate)
        records.append(record)
        if on_finish:
            on_finish(record)

    for round_no in range(1, max_rounds + 1):
        if not active:
            break
        shared.round_begins([d.claim for d in active], round_no, max_rounds)
        # The evidence admitted this round, shown above each of the round's prompts ("" without a source).
        shown = _search(agents, active, round_no, max_rounds, settings, generator, limits) if source else {}
        if round_no == 1:
            aff_prompts = [render("affirmative_opening", claim=d.claim["claim"]) for d in active]
        else:
            aff_prompts = [render("debater_rebuttal", opponent_argument=d.arguments["negative"]) for d in active]
        aff_prompts = [shown.get(id(d), "") + p for d, p in zip(active, aff_prompts)]
        _speak(agents, "affirmative", active, aff_prompts, round_no, settings, generator)
        opening = "negative_opening" if round_no == 1 else "debater_rebuttal"
        neg_prompts = [shown.get(id(d), "") + render(opening, opponent_argument=d.arguments["affirmative"])
                       for d in active]
        _speak(agents, "negative", active, neg_prompts, round_no, settings, generator)
        if round_no == max_rounds:
            _debaters_done(active)
        mod_prompts = [shown.get(id(d), "") + render("moderator_round", round=round_no,
                                                     affirmative_argument=d.arguments["affirmative"],
                                                     negative_argument=d.arguments["negative"], **answer)
                       for d in active]
        replies = _speak(agents, "moderator", active, mod_prompts, round_no, settings, generator, "moderator_round")

        still = []
        for debate, reply in zip(active, replies):
            debate.rounds = round_no
            parsed = _read(debate, reply)
            if parsed["proceed"] is False and parsed["verdict"] is not None:
                _finish(debate, parsed, "moderator")
                finished(debate)
            elif parsed["proceed"] is False:
                # It stopped the debate but named no label: the final prompt asks for the verdict.
                debate.stop_reason = "moderator"
                _debaters_done([debate])
                final.append(debate)
            else:
                still.append(debate)
        active = still

    final += active
    if final:
        shared.round_begins([d.claim for d in final], "final", max_rounds)
        prompts = [render("moderator_final", affirmative_argument=d.arguments["affirmative"],
                          negative_argument=d.arguments["negative"], claim=d.claim["claim"], **answer) for d in final]
        replies = _speak(agents, "moderator", final, prompts, "final", settings, generator, "moderator_final")
        for debate, reply in zip(final, replies):
            parsed = _read(debate, reply)
            _finish(debate, parsed, debate.stop_reason or "max_rounds")
            finished(debate)
    return records


def _search(agents, active, round_no, max_rounds, settings, generator, limits):
    """The round's retrieval: each Debater's query turn (in its own conversation), then each claim's search and
    admission; returns {id(debate): the prompt block of what was admitted}."""
    asked = {id(d): [] for d in active}
    # A query is a line, not an argument: its turn gets the tokens its words need, at most the run's.
    short = replace(settings, max_new_tokens=min(settings.max_new_tokens, 2 * limits.query_words + 32))
    for role in ("affirmative", "negative"):
        prompts = [render("debate_query", round=round_no, side=grow.SIDE_NAMES[role]) for _ in active]
        replies = shared.speak(agents[role], [d.convs[role] for d in active], prompts, short, generator,
                               "debate_query", active[0].labels)
        for d, prompt, reply in zip(active, prompts, replies):
            conv = d.convs[role]
            fields = conv.structured["fields"] if conv.structured else read_fields(reply, ("Query",))[0]
            query = fields.get("Query")
            query = query.strip() if isinstance(query, str) and query.strip() else reply.strip()
            d.turns.append({"round": round_no, "role": role, "prompt": prompt, "response": reply, "kind": "query",
                            **shared.structured_note(conv)})
            asked[id(d)].append((role, query))
    context = grow.context_of([agents[r] for r in ROLES])
    shown = {}
    for d in active:
        fits = _fits(d, agents, context, round_no, max_rounds, settings)
        admitted = grow.admit(d.growth, round_no, asked[id(d)], limits, fits)
        shown[id(d)] = grow.block(d.growth, admitted)
    return shown


def _fits(debate, agents, context, round_no, max_rounds, settings):
    """Whether admitted items still leave every conversation of `debate` room, in `context` tokens, for its turns
    to come (each its --max-new-tokens and TURN_ROOM of prompt): the items go into all three conversations."""
    if context is None:
        return lambda items: True
    rounds_left = max_rounds - round_no + 1
    turns_left = {"affirmative": 2 * rounds_left - 1, "negative": 2 * rounds_left - 1, "moderator": rounds_left + 1}
    counts = {role: grow.counter(agents[role]) for role in ROLES}
    used = {role: grow.conversation_tokens(debate.convs[role], counts[role]) for role in ROLES}

    def fits(items):
        text = "\n".join(grow.evidence_line(e) for e in items)
        return all(used[role] + counts[role](text) + turns_left[role] * (settings.max_new_tokens + grow.TURN_ROOM)
                   <= context for role in ROLES)
    return fits


def _read(debate, reply):
    """The Moderator's reply parsed (from its schema result when structured); noted on its turn."""
    structured = debate.convs["moderator"].structured
    parsed = parse_moderator(reply, structured, debate.labels)
    debate.turns[-1]["parse_status"] = parsed["status"]
    debate.turns[-1].update(shared.structured_note(debate.convs["moderator"]))
    return parsed


def to_record(debate):
    """The prediction and transcript of one finished debate, as written to the output files."""
    if debate.growth is None:
        return shared.record(debate.claim, debate.outcome, debate.turns, debate.convs.values(),
                             reply=debate.turns[-1]["response"], rounds=debate.rounds, stop_reason=debate.stop_reason)
    g = debate.growth
    # The evidence the verdict was given on: the claim's own, then what the debate admitted, in order.
    record = shared.record(debate.claim, debate.outcome, debate.turns, debate.convs.values(),
                           reply=debate.turns[-1]["response"], rounds=debate.rounds, stop_reason=debate.stop_reason,
                           evidence=list(debate.claim["evidence"]) + g.added,
                           debate_retrieval={"source": g.source_name, "queries": sum(len(r["queries"])
                                                                                     for r in g.rounds),
                                             "admitted": len(g.added)})
    record["transcript"]["debate_retrieval"] = {"source": g.source_name, "limits": asdict(g.limits),
                                                "rounds": g.rounds}
    return record
