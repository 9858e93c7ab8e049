"""The baselines' control flow with scripted agents: RAG-CoT, majority vote and its tie rule, cooperation."""
import json

import pytest

from debate.data.labels import CEC, NEE, REFUTED, SUPPORTED
from debate.engine import engine
from debate.methods import baselines, turns
from tests import scripted

CLAIMS = [{"claim_id": i, "claim": f"Claim number {i}.", "label": SUPPORTED,
           "evidence": [{"question": "Who said it?", "answer": f"Answer {i}.", "url": "https://example.org"}]}
          for i in range(3)]


def verdict(label, why="because"):
    return json.dumps({"Justification for Verdict": why, "Verdict": label})


def claim_of(conv):
    """The claim a conversation is about: from its system prompt, else its first message (RAG-CoT has none)."""
    text = conv.system or conv.messages[0]["content"]
    return int(text.split("Claim number ")[1][0])


def test_rag_cot_reads_the_verdict_and_keeps_an_unreadable_reply_as_text(monkeypatch):
    calls = scripted.install(monkeypatch, lambda model, conv, prompt: (
        verdict(REFUTED, "step 1, step 2") if claim_of(conv) == 0 else "I think it is hard to say."))
    records = baselines.rag_cot(scripted.agents(["verifier"]), CLAIMS[:2], engine.Settings())
    first, second = (r["prediction"] for r in records)
    assert (first["label"], first["justification"], first["parse_status"]) == (REFUTED, "step 1, step 2", "json")
    assert (second["label"], second["parse_status"]) == (None, "unparsed")
    assert second["justification"] == "I think it is hard to say."  # what the system said, not an invented label
    assert len(calls) == 1 and len(calls[0].prompts) == 2  # one batched turn for both claims
    system, prompt = calls[0].systems[0], calls[0].prompts[0]
    assert system == ""  # HerO's prompt is one user message
    assert "Claim: Claim number 0." in prompt and "Answer 0." in prompt and "Cherrypicking" in prompt
    assert "Claim number 1." in calls[0].prompts[1]
    assert prompt.index("step by step") < prompt.index("Claim number 0.") < prompt.index('"Verdict"')
    assert first["prompt_tokens"] == 10 and first["completion_tokens"] == 5


@pytest.mark.parametrize("votes, expected", [
    ([SUPPORTED, REFUTED, SUPPORTED], (SUPPORTED, {SUPPORTED: 2, REFUTED: 1}, False)),
    ([REFUTED, SUPPORTED, NEE], (REFUTED, {REFUTED: 1, SUPPORTED: 1, NEE: 1}, True)),  # tie: voter 1's label
    ([None, CEC, NEE], (CEC, {CEC: 1, NEE: 1}, True)),  # unreadable votes do not count; earliest readable wins
    ([None, REFUTED, REFUTED], (REFUTED, {REFUTED: 2}, False)),
    ([None, None, None], (None, {}, False)),
])
def test_majority_vote_and_tie_rule(votes, expected):
    assert baselines.majority_vote(votes) == expected


def test_majority_voters_sample_from_their_own_seeded_streams_and_a_voting_call_decides(monkeypatch):
    # Voter v's vote depends on its stream's seed, so the test sees which stream answered.
    by_seed = {10: verdict(NEE, "voter 1 says"), 1010: verdict(REFUTED, "voter 2 says"),
               2010: verdict(REFUTED, "v3")}
    current = {}

    def reply(model, conv, prompt):
        if prompt.startswith("This is a fact-checking task. Vote on the 3 answers"):
            # FACT-AUDIT's voting call: claim 0's vote merges into a label; claim 1's names none.
            return verdict(CEC, "merged") if claim_of(conv) == 0 else "I cannot tell."
        return by_seed[current["seed"]]

    calls = scripted.install(monkeypatch, reply)
    fake = engine.generate

    def seeded(model, tokenizer, convs, prompts, settings, generator=None, schemas=None):
        current["seed"] = generator.initial_seed()
        return fake(model, tokenizer, convs, prompts, settings, generator, schemas)

    monkeypatch.setattr(engine, "generate", seeded)
    streams = turns.Streams("cpu")
    settings = engine.Settings(temperature=0.7, seed=10)
    records = baselines.majority(scripted.agents(["verifier"]), CLAIMS[:2], settings, voters=3, streams=streams)
    # One batched call per voter, voter v on seed + 1000 v, then the vote on voter 1's stream.
    assert [c.generator.initial_seed() for c in calls] == [10, 1010, 2010, 10]
    assert calls[3].generator is calls[0].generator
    vote_prompt = calls[3].prompts[0]
    assert vote_prompt.index("Answer 1:\n" + by_seed[10]) < vote_prompt.index("Answer 3:\n" + by_seed[2010])
    assert "Claim: Claim number 0." in vote_prompt
    first, second = records[0]["prediction"], records[1]["prediction"]
    # The voting call's verdict is the claim's, even against the count.
    assert (first["label"], first["justification"], first["stop_reason"]) == (CEC, "merged", "vote")
    assert (first["vote_counts"], first["tie"]) == ({NEE: 1, REFUTED: 2}, False)
    assert first["votes"] == [NEE, REFUTED, REFUTED] and first["voter_seeds"] == [10, 1010, 2010]
    # A vote that names no label: the counted majority decides, with its first winning voter's justification.
    assert (second["label"], second["justification"], second["stop_reason"]) == (REFUTED, "voter 2 says", "vote_count")
    assert first["prompt_tokens"] == 40  # every voter's conversation and the vote's count
    assert [t["role"] for t in records[0]["transcript"]["turns"]] == ["voter_1", "voter_2", "voter_3", "vote"]
    # The next batch goes on drawing from the same three streams, not from fresh copies of them.
    baselines.majority(scripted.agents(["verifier"]), CLAIMS[2:], settings, voters=3, streams=streams)
    assert all(calls[4 + v].generator is calls[v].generator for v in range(3))


def test_cooperation_user_leads_assistant_answers_until_task_done(monkeypatch):
    def reply(model, conv, prompt):
        claim = claim_of(conv)
        turn = 1 + sum(m["role"] == "assistant" for m in conv.messages)  # this agent's turn, 1-based
        if model == "user":
            # Claim 0's lead closes after seeing one solution; claim 1's never does.
            return "TASK_DONE" if claim == 0 and turn == 2 else f"Instruction: step {turn} of claim {claim}"
        if prompt.startswith("The task is done."):
            return verdict(SUPPORTED if claim == 0 else CEC, f"final {claim}")
        return f"Solution: result {turn} of claim {claim}"

    calls = scripted.install(monkeypatch, reply)
    agents = scripted.agents(["user", "assistant"])
    records = baselines.cooperation(agents, CLAIMS[:2], engine.Settings(), max_rounds=3)
    by_id = {r["prediction"]["claim_id"]: r for r in records}
    p0, p1 = by_id[0]["prediction"], by_id[1]["prediction"]
    assert (p0["rounds"], p0["stop_reason"], p0["label"]) == (2, "user_done", SUPPORTED)
    assert (p1["rounds"], p1["stop_reason"], p1["label"]) == (3, "max_rounds", CEC)
    said = by_id[1]["transcript"]["turns"]
    assert [t["role"] for t in said] == ["user", "assistant"] * 3 + ["assistant"]
    assert said[1]["prompt"] == said[0]["response"]  # the assistant carries out the user's instruction
    assert said[2]["prompt"] == said[1]["response"]  # the user reads the assistant's solution
    assert said[-1]["round"] == "final" and p1["justification"] == "final 1"
    # Rows per call: both users, both assistants, then claim 0's lead is done and only claim 1 goes on.
    assert [(c.model, len(c.prompts)) for c in calls] == [
        ("user", 2), ("assistant", 2), ("user", 2), ("assistant", 1), ("user", 1), ("assistant", 1), ("assistant", 2)]
    assert "TASK_DONE" in calls[0].systems[0] and "Solution:" in calls[1].systems[0]
