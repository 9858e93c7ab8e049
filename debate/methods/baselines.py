"""The DebateCV paper's baselines, batched over claims like the debate itself.

- RAG-CoT: HerO's chain-of-thought veracity prompt (Yoon et al. 2024), as the DebateCV paper used it: one
  user message with the task, the claim and the question-answer evidence; the agent justifies step by
  step, then gives the verdict.
- Majority (Lin et al. 2025, FACT-AUDIT): `voters` independent RAG-CoT agents, voter v sampling from its
  own stream (seed + VOTER_SEED_STRIDE * v, so the voters of trial seeds seed, seed+1, ... never share a
  stream); then one more call of the same model reads all their answers with FACT-AUDIT's voting prompt
  (merge the two most alike, else pick the most fitting) and its verdict is the claim's. When the voting
  reply names no label, the counted vote decides instead (stop reason "vote_count"). Its tie rule: among
  the labels tied for most votes, the one given by the earliest voter wins (voter 1 acts as chair).
  Unreadable votes do not count; with none readable the claim has no verdict.
- Cooperation (CAMEL-style role play): a user agent leads the fact-check with one instruction per turn,
  an assistant agent carries each one out; when the user says TASK_DONE, or after `max_rounds`
  instruction/solution exchanges, the assistant gives the verdict.

Each takes `labels`, the dataset's LabelSet: the prompts offer its labels and the verdicts choose among them.
"""
import re
from collections import Counter

from debate.data.labels import AVERITEC
from debate.data.parsing import parse_moderator
from debate.data.prompts import evidence_kind, format_evidence, load_prompt, render, verdict_answer
from debate.engine import engine
from debate.methods import turns

RAG_COT_MODELS = {"verifier": "moderator"}  # role -> its model flag
COOPERATION_MODELS = {"user": "debater", "assistant": "moderator"}
SCHEMAS = {"rag-cot": ("ragcot",), "majority": ("ragcot", "majority_vote"), "cooperation": ("cooperation_final",)}
DONE = re.compile(r"\bTASK[_ ]DONE\b", re.IGNORECASE)
VOTER_SEED_STRIDE = 1000  # voter v samples from seed + 1000 * v: trials (seed, seed + 1, ...) stay apart


def _meta(name, claim):
    return render(name, claim=claim["claim"], evidence=format_evidence(claim["evidence"]),
                  evidence_kind=evidence_kind(claim))


def _verify(agent, claims, settings, generator, labels):
    """One RAG-CoT pass over `claims`: (conversations, prompts, replies)."""
    # HerO sends everything as one user message, with no system prompt.
    convs = [engine.Conversation(system="") for _ in claims]
    prompts = [render("ragcot", claim=c["claim"], evidence=format_evidence(c["evidence"]),
                      evidence_kind=evidence_kind(c), label_choices=labels.choices(), answer=verdict_answer(labels))
               for c in claims]
    replies = turns.speak(agent, convs, prompts, settings, generator, "ragcot", labels)
    return convs, prompts, replies


def rag_cot(agents, claims, settings, streams=None, on_finish=None, labels=AVERITEC):
    generator = turns.stream(agents, streams, settings.seed, settings)
    convs, prompts, replies = _verify(agents["verifier"], claims, settings, generator, labels)
    records = []
    for claim, conv, prompt, reply in zip(claims, convs, prompts, replies):
        outcome = parse_moderator(reply, conv.structured, labels)
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


def voter_seed(seed, v):
    return seed + VOTER_SEED_STRIDE * v


def vote_prompt(claim, replies, labels=AVERITEC):
    """FACT-AUDIT's voting prompt over the voters' `replies` to `claim`."""
    answers = "\n\n".join(render("majority_ballot", index=v, reply=r.strip()) for v, r in enumerate(replies, 1))
    return render("majority_vote", count=len(replies), answers=answers, claim=claim["claim"],
                  evidence=format_evidence(claim["evidence"]), label_choices=labels.choices(),
                  answer=verdict_answer(labels))


def majority(agents, claims, settings, voters=3, streams=None, on_finish=None, labels=AVERITEC):
    ballots = []  # per voter: (convs, prompts, replies)
    for v in range(voters):
        ballots.append(_verify(agents["verifier"], claims, settings,
                               turns.stream(agents, streams, voter_seed(settings.seed, v), settings), labels))
    # The vote is one more call of the verifier's model, drawing on voter 1's stream after its answers.
    vote_convs = [engine.Conversation(system="") for _ in claims]
    vote_prompts = [vote_prompt(claim, [replies[i] for _, _, replies in ballots], labels)
                    for i, claim in enumerate(claims)]
    vote_replies = turns.speak(agents["verifier"], vote_convs, vote_prompts, settings,
                               turns.stream(agents, streams, settings.seed, settings), "majority_vote", labels)
    records = []
    for i, claim in enumerate(claims):
        outcomes = [parse_moderator(replies[i], convs[i].structured, labels) for convs, _, replies in ballots]
        label, counts, tie = majority_vote([o["verdict"] for o in outcomes])
        said = [{"round": 1, "role": f"voter_{v + 1}", "prompt": prompts[i], "response": replies[i],
                 "parse_status": o["status"], **turns.structured_note(convs[i])}
                for v, ((convs, prompts, replies), o) in enumerate(zip(ballots, outcomes))]
        voted = parse_moderator(vote_replies[i], vote_convs[i].structured, labels)
        said.append({"round": "vote", "role": "vote", "prompt": vote_prompts[i], "response": vote_replies[i],
                     "parse_status": voted["status"], **turns.structured_note(vote_convs[i])})
        if voted["verdict"] is not None:
            outcome, reply, stop = voted, vote_replies[i], "vote"
        else:
            # The voting reply named no label: the counted vote decides, with the first winning voter's
            # justification (with no readable vote, the first voter's reply, so its status says why),
            # and as label distribution that of the count itself (each voter independent, same tie rule).
            chosen = next((v for v, o in enumerate(outcomes) if o["verdict"] == label), 0)
            outcome = dict(outcomes[chosen], label_probs=turns.outcome_probs(
                [o.get("label_probs") for o in outcomes], lambda votes: majority_vote(votes)[0], labels.labels))
            reply, stop = ballots[chosen][2][i], "vote_count"
        records.append(turns.record(
            claim, outcome, said, [convs[i] for convs, _, _ in ballots] + [vote_convs[i]], reply=reply,
            rounds=1, stop_reason=stop,
            votes=[o["verdict"] for o in outcomes], vote_counts=counts, tie=tie,
            voter_seeds=[voter_seed(settings.seed, v) for v in range(voters)]))
        if on_finish:
            on_finish(records[-1])
    return records


def cooperation(agents, claims, settings, max_rounds=3, streams=None, on_finish=None, labels=AVERITEC):
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

    finals = [render("cooperation_final", evidence_kind=evidence_kind(c), label_choices=labels.choices(),
                     answer=verdict_answer(labels)) for c in claims]
    replies = turns.speak(agents["assistant"], assistants, finals, settings, generator, "cooperation_final", labels)
    records = []
    for i, (claim, reply) in enumerate(zip(claims, replies)):
        outcome = parse_moderator(reply, assistants[i].structured, labels)
        said[i].append({"round": "final", "role": "assistant", "prompt": finals[i], "response": reply,
                        "parse_status": outcome["status"], **turns.structured_note(assistants[i])})
        records.append(turns.record(claim, outcome, said[i], [users[i], assistants[i]], reply=reply,
                                    rounds=rounds[i], stop_reason=stop[i]))
        if on_finish:
            on_finish(records[-1])
    return records
