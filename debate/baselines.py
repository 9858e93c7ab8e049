"""The DebateCV paper's baselines, batched over claims like the debate itself.

- RAG-CoT: one agent reads the claim and the evidence, reasons step by step, gives a verdict.
- Majority: `voters` independent RAG-CoT agents, voter v sampling from its own stream (seed + v); the
  label most voters give wins. Tie rule: among the labels tied for most votes, the one given by the
  earliest voter wins (voter 1 acts as chair). Unreadable votes do not count; with none readable the
  claim has no verdict.
- Cooperation (CAMEL-style role play): a user agent leads the fact-check with one instruction per turn,
  an assistant agent carries each one out; when the user says TASK_DONE, or after `max_rounds`
  instruction/solution exchanges, the assistant gives the verdict.
"""
import re
from collections import Counter

from debate import engine, turns
from debate.parsing import parse_moderator
from debate.prompts import format_evidence, load_prompt, render

RAG_COT_MODELS = {"verifier": "moderator"}  # role -> its model flag
COOPERATION_MODELS = {"user": "debater", "assistant": "moderator"}
SCHEMAS = {"rag-cot": ("ragcot",), "majority": ("ragcot",), "cooperation": ("cooperation_final",)}
DONE = re.compile(r"\bTASK[_ ]DONE\b", re.IGNORECASE)


def _meta(name, claim):
    return render(name, claim=claim["claim"], evidence=format_evidence(claim["evidence"]),
                  labels=load_prompt("verdict_labels"))


def _verify(agent, claims, settings, generator):
    """One RAG-CoT pass over `claims`: (conversations, prompt, replies)."""
    convs = [engine.Conversation(system=_meta("ragcot_meta", c)) for c in claims]
    prompt = render("ragcot", answer=render("verdict_answer"))
    replies = turns.speak(agent, convs, [prompt] * len(claims), settings, generator, "ragcot")
    return convs, prompt, replies


def rag_cot(agents, claims, settings, streams=None, on_finish=None):
    generator = turns.stream(agents, streams, settings.seed, settings)
    convs, prompt, replies = _verify(agents["verifier"], claims, settings, generator)
    records = []
    for claim, conv, reply in zip(claims, convs, replies):
        outcome = parse_moderator(reply, conv.structured)
        said = [{"round": 1, "role": "verifier", "prompt": prompt, "response": reply,
                 "parse_status": outcome["status"], **turns.structured_note(conv)}]
        records.append(turns.record(claim, outcome, said, [conv], reply=reply, rounds=1, stop_reason="answered"))
        if on_finish:
            on_finish(records[-1])
    return records


def majority_vote(votes):
    """(label, counts, tie) for a list of labels or None (unreadable), by the tie rule in the module doc."""
    readable = [v for v in votes if v is not None]
    if not readable:
        return None, {}, False
    counts = Counter(readable)
    top = max(counts.values())
    tied = [label for label in counts if counts[label] == top]
    winner = next(v for v in readable if v in tied)  # the earliest voter's label among the tied ones
    return winner, dict(counts), len(tied) > 1


def majority(agents, claims, settings, voters=3, streams=None, on_finish=None):
    ballots = []  # per voter: (convs, prompt, replies)
    for v in range(voters):
        ballots.append(_verify(agents["verifier"], claims, settings,
                               turns.stream(agents, streams, settings.seed + v, settings)))
    records = []
    for i, claim in enumerate(claims):
        outcomes = [parse_moderator(replies[i], convs[i].structured) for convs, _, replies in ballots]
        label, counts, tie = majority_vote([o["verdict"] for o in outcomes])
        # The justification and parse status are the first winning voter's; with no readable vote,
        # the first voter's reply, so its status says why.
        chosen = next((v for v, o in enumerate(outcomes) if o["verdict"] == label), 0)
        # The label distribution of the vote itself: each voter independent, the same tie rule.
        outcome = dict(outcomes[chosen], label_probs=turns.outcome_probs(
            [o.get("label_probs") for o in outcomes], lambda votes: majority_vote(votes)[0]))
        said = [{"round": 1, "role": f"voter_{v + 1}", "prompt": prompt, "response": replies[i],
                 "parse_status": o["status"], **turns.structured_note(convs[i])}
                for v, ((convs, prompt, replies), o) in enumerate(zip(ballots, outcomes))]
        records.append(turns.record(
            claim, outcome, said, [convs[i] for convs, _, _ in ballots], reply=ballots[chosen][2][i],
            rounds=1, stop_reason="vote",
            votes=[o["verdict"] for o in outcomes], vote_counts=counts, tie=tie,
            voter_seeds=[settings.seed + v for v in range(voters)]))
        if on_finish:
            on_finish(records[-1])
    return records


def cooperation(agents, claims, settings, max_rounds=3, streams=None, on_finish=None):
    generator = turns.stream(agents, streams, settings.seed, settings)
    users = [engine.Conversation(system=_meta("cooperation_user_meta", c)) for c in claims]
    assistants = [engine.Conversation(system=_meta("cooperation_assistant_meta", c)) for c in claims]
    said = [[] for _ in claims]
    rounds = [0] * len(claims)
    stop = ["max_rounds"] * len(claims)
    to_user = [load_prompt("cooperation_start")] * len(claims)  # what each user agent reads next
    active = list(range(len(claims)))
    for round_no in range(1, max_rounds + 1):
        if not active:
            break
        instructions = turns.speak(agents["user"], [users[i] for i in active], [to_user[i] for i in active],
                                   settings, generator)
        going = []
        for i, text in zip(active, instructions):
            said[i].append({"round": round_no, "role": "user", "prompt": to_user[i], "response": text})
            rounds[i] = round_no
            if DONE.search(text):
                stop[i] = "user_done"
            else:
                going.append(i)
        solutions = turns.speak(agents["assistant"], [assistants[i] for i in going],
                                [said[i][-1]["response"] for i in going], settings, generator)
        for i, text in zip(going, solutions):
            said[i].append({"round": round_no, "role": "assistant", "prompt": said[i][-1]["response"],
                            "response": text})
            to_user[i] = text
        active = going

    final = render("cooperation_final", answer=render("verdict_answer"))
    replies = turns.speak(agents["assistant"], assistants, [final] * len(claims), settings, generator,
                          "cooperation_final")
    records = []
    for i, (claim, reply) in enumerate(zip(claims, replies)):
        outcome = parse_moderator(reply, assistants[i].structured)
        said[i].append({"round": "final", "role": "assistant", "prompt": final, "response": reply,
                        "parse_status": outcome["status"], **turns.structured_note(assistants[i])})
        records.append(turns.record(claim, outcome, said[i], [users[i], assistants[i]], reply=reply,
                                    rounds=rounds[i], stop_reason=stop[i]))
        if on_finish:
            on_finish(records[-1])
    return records
