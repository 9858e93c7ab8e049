"""MADR control flow with scripted agents: who sees what, when the debate stops, what the record gets."""
import json

import pytest

from debate.engine import engine
from debate.methods import madr
from debate.data.labels import REFUTED
from debate.data.prompts import load_prompt
from tests import scripted as engine_script

CLAIMS = [{"claim_id": i, "claim": f"Claim number {i}.", "label": REFUTED,
           "evidence": [{"question": "Q?", "answer": f"A{i}.", "url": "https://example.org"}]} for i in range(3)]


def record_of(claim, justification="The bridge was built in 1990 by the mayor.", label=REFUTED):
    """A method's finished record, shaped like debate.methods.turns.record's."""
    return {"prediction": {"claim_id": claim["claim_id"], "label": label, "justification": justification,
                           "parse_status": "json", "prompt_tokens": 100, "encoded_tokens": 80,
                           "completion_tokens": 20, "gold_label": claim["label"]},
            "transcript": {"claim_id": claim["claim_id"], "claim": claim["claim"],
                           "turns": [{"round": 1, "role": "verifier", "prompt": "p", "response": "r"}]}}


def judge(agreement):
    return json.dumps({"Reason": "compared", "Agreement": agreement})


REFINED = json.dumps({"Refined Justification": "The evidence says the bridge was built in 1990."})


def claim_of_system(system):
    return int(system.split("Claim number ")[1][0])


def claim_of(conv):
    return claim_of_system(conv.system)


@pytest.fixture
def scripted(monkeypatch):
    """Replace the engine: replies come from `script(role, claim_id, turn)`; every call is logged."""
    state = {"script": None}
    calls = engine_script.install(monkeypatch, lambda model, conv, prompt: state["script"](
        model, claim_of(conv), 1 + sum(m["role"] == "assistant" for m in conv.messages)))
    agents = engine_script.agents(madr.MODEL_OF)
    return agents, calls, state


def script(agree_at=None, judge_reply=None, refiner=REFINED):
    """Debaters say "<ROLE>-<claim>-<turn>"; the judge agrees at the turn `agree_at(claim)` (never if None)."""
    def reply(role, cid, turn):
        if role == "madr_judge":
            if judge_reply:
                return judge_reply(cid, turn)
            return judge("Yes" if agree_at and turn == agree_at(cid) else "No")
        if role == "madr_refiner":
            return refiner
        return f"{role.upper()}-{cid}-{turn}"
    return reply


def refine(agents, records, claims=CLAIMS, iterations=3):
    return madr.refine(agents, records, claims, engine.Settings(), iterations)


def test_stops_on_agreement_and_records_the_iteration(scripted):
    agents, calls, state = scripted
    state["script"] = script(agree_at=lambda cid: 2)
    pred = refine(agents, [record_of(CLAIMS[0])])[0]["prediction"]
    assert pred["madr"] == {"iterations": 2, "stop_reason": "agreement", "refine_status": "field"}
    assert [c.model for c in calls] == ["madr_typology", "madr_free", "madr_judge"] * 2 + ["madr_refiner"]


def test_stops_at_the_cap_when_the_judge_never_agrees(scripted):
    agents, calls, state = scripted
    state["script"] = script()
    pred = refine(agents, [record_of(CLAIMS[0])], iterations=3)[0]["prediction"]
    assert pred["madr"]["iterations"] == 3 and pred["madr"]["stop_reason"] == "max_iterations"
    assert sum(c.model == "madr_judge" for c in calls) == 3


def test_unreadable_judge_reply_continues_and_template_copy_is_not_agreement(scripted):
    agents, calls, state = scripted
    # turn 1: garbled; turn 2: the template copied verbatim ("Yes or No"); turn 3: a clear Yes.
    state["script"] = script(judge_reply=lambda cid, turn: {1: "I am unsure.", 2: judge("Yes or No")}.get(
        turn, judge("Yes")))
    record = refine(agents, [record_of(CLAIMS[0])], iterations=5)[0]
    assert record["prediction"]["madr"]["iterations"] == 3
    assert record["prediction"]["madr"]["stop_reason"] == "agreement"
    judged = [t for t in record["transcript"]["turns"] if t["role"] == "madr_judge"]
    assert [t["agreement"] for t in judged] == [None, None, True]
    assert judged[0]["parse_status"] == "unparsed" and judged[2]["parse_status"] == "json"


def test_from_iteration_two_each_debater_reads_the_others_previous_feedback(scripted):
    agents, calls, state = scripted
    state["script"] = script()
    turns = refine(agents, [record_of(CLAIMS[1])], iterations=3)[0]["transcript"]["turns"]
    said = {(t["round"], t["role"]): t for t in turns}
    first = said[("madr-1", "madr_typology")]["prompt"], said[("madr-1", "madr_free")]["prompt"]
    assert "MADR_" not in first[0] + first[1]
    assert said[("madr-1", "madr_typology")]["response"] == "MADR_TYPOLOGY-1-1"
    for i in (2, 3):
        assert f"MADR_FREE-1-{i - 1}" in said[(f"madr-{i}", "madr_typology")]["prompt"]
        assert f"MADR_TYPOLOGY-1-{i - 1}" in said[(f"madr-{i}", "madr_free")]["prompt"]
        # Not the feedback the other gave in this same iteration.
        assert f"MADR_TYPOLOGY-1-{i}" not in said[(f"madr-{i}", "madr_free")]["prompt"]
    # The judge and the refiner read both debaters' latest feedback.
    assert "MADR_TYPOLOGY-1-3" in said[("madr-3", "madr_judge")]["prompt"]
    assert "MADR_FREE-1-3" in said[("madr-3", "madr_judge")]["prompt"]
    refine_prompt = said[("madr-refine", "madr_refiner")]["prompt"]
    assert "MADR_TYPOLOGY-1-3" in refine_prompt and "MADR_FREE-1-3" in refine_prompt


def test_both_debaters_see_the_typology_but_only_debater_one_goes_by_it(scripted, monkeypatch):
    agents, calls, state = scripted
    state["script"] = script()
    systems = {}
    original = madr.start_review

    def keep(claim, prediction):
        review = original(claim, prediction)
        systems.update({role: conv for role, conv in review.convs.items()})
        return review

    monkeypatch.setattr(madr, "start_review", keep)
    turns = refine(agents, [record_of(CLAIMS[0])], iterations=2)[0]["transcript"]["turns"]
    typology = load_prompt("madr_error_typology")
    # The paper's Figure 1 and Tables 8-9: both conversations open with the typology; the free debater
    # finds errors without going by it and uses it only to name them.
    assert typology in systems["madr_typology"].system and typology in systems["madr_free"].system
    assert "without going by the error types" in systems["madr_free"].system
    assert "without going by" not in systems["madr_typology"].system
    # Every debater sees the claim, the evidence, the verdict and the justification under review.
    for role in madr.DEBATERS:
        assert "Claim number 0." in systems[role].system and "A0." in systems[role].system
        assert REFUTED in systems[role].system and "built in 1990 by the mayor" in systems[role].system
    assert [t["round"] for t in turns[1:]] == ["madr-1"] * 3 + ["madr-2"] * 3 + ["madr-refine"]


def test_refined_justification_replaces_the_original_and_keeps_the_label(scripted):
    agents, calls, state = scripted
    state["script"] = script(agree_at=lambda cid: 1)
    original = record_of(CLAIMS[0])
    record = refine(agents, [original])[0]
    pred = record["prediction"]
    assert pred["justification"] == "The evidence says the bridge was built in 1990."
    assert pred["justification_unrefined"] == "The bridge was built in 1990 by the mayor."
    assert pred["label"] == REFUTED and pred["parse_status"] == "json"
    # Four conversations of 10/7/5 tokens per turn: 2 debaters + judge + refiner, one turn each.
    assert (pred["prompt_tokens"], pred["encoded_tokens"], pred["completion_tokens"]) == (140, 108, 40)
    turns = record["transcript"]["turns"]
    assert turns[0]["role"] == "verifier"  # the method's own turns stay first
    assert turns[-1] == {"round": "madr-refine", "role": "madr_refiner", "prompt": turns[-1]["prompt"],
                         "response": REFINED, "parse_status": "field"}
    assert original["prediction"]["justification"] == "The bridge was built in 1990 by the mayor."


@pytest.mark.parametrize("reply, expected, status", [
    ("The bridge dates from 1990.", "The bridge dates from 1990.", "text"),
    ("   ", "The bridge was built in 1990 by the mayor.", "empty"),
    (json.dumps({"Refined Justification": ""}), "The bridge was built in 1990 by the mayor.", "empty"),
])
def test_refiner_reply_without_the_key_or_without_text(scripted, reply, expected, status):
    agents, calls, state = scripted
    state["script"] = script(agree_at=lambda cid: 1, refiner=reply)
    pred = refine(agents, [record_of(CLAIMS[0])])[0]["prediction"]
    assert pred["justification"] == expected and pred["madr"]["refine_status"] == status


def test_empty_justification_is_left_alone(scripted):
    agents, calls, state = scripted
    state["script"] = script(agree_at=lambda cid: 1)
    records = [record_of(CLAIMS[0], justification=""), record_of(CLAIMS[1], label=None)]
    empty, no_label = refine(agents, records)
    pred = empty["prediction"]
    assert pred["justification"] == "" and pred["justification_unrefined"] == ""
    assert pred["madr"] == {"iterations": 0, "stop_reason": "no_justification", "refine_status": None}
    assert pred["prompt_tokens"] == 100 and len(empty["transcript"]["turns"]) == 1
    # A justification without a readable verdict is still checked against the evidence.
    assert no_label["prediction"]["madr"]["stop_reason"] == "agreement"
    assert no_label["prediction"]["label"] is None
    assert all([claim_of_system(s) for s in c.systems] == [1] for c in calls)


def test_batched_calls_drop_claims_that_agreed(scripted):
    agents, calls, state = scripted
    # Claim i agrees at iteration i + 1; records come in another order than the claims.
    state["script"] = script(agree_at=lambda cid: cid + 1)
    records = refine(agents, [record_of(CLAIMS[i]) for i in (2, 0, 1)], iterations=3)
    assert [r["prediction"]["claim_id"] for r in records] == [2, 0, 1]
    assert [r["prediction"]["madr"]["iterations"] for r in records] == [3, 1, 2]
    rows = [(c.model, len(c.prompts)) for c in calls]
    assert rows == [(role, n) for n in (3, 2, 1) for role in ("madr_typology", "madr_free", "madr_judge")] + [
        ("madr_refiner", 3)]
    # The conversations really belong to the right claims.
    for r in records:
        cid = r["prediction"]["claim_id"]
        assert all(f"-{cid}-" in t["response"] for t in r["transcript"]["turns"] if t["role"] in madr.DEBATERS)
