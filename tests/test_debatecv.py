"""DebateCV control flow with scripted agents: who speaks, what each sees, when the debate stops."""
import json

import pytest

from debate.data.labels import REFUTED, SUPPORTED
from debate.engine import engine
from debate.methods import debatecv
from tests import scripted as engine_script

CLAIMS = [{"claim_id": i, "claim": f"Claim number {i}.", "label": SUPPORTED,
           "evidence": [{"question": "Q?", "answer": f"A{i}.", "url": "https://example.org"}]} for i in range(3)]

PROCEED = json.dumps({"Primary Insight": "new points", "Evidence Gaps": "none", "Justification for Proceeding":
                      "open questions", "Proceeding Necessity": "Yes", "Justification for Verdict": "", "Verdict": ""})


def stop_with(verdict):
    return json.dumps({"Primary Insight": "p", "Evidence Gaps": "g", "Justification for Proceeding": "",
                       "Proceeding Necessity": "No", "Justification for Verdict": f"because {verdict}",
                       "Verdict": verdict})


@pytest.fixture
def scripted(monkeypatch):
    """Replace the engine: replies come from `script(role, conversation, turn_index)`; calls are logged."""
    state = {"script": None}
    calls = engine_script.install(monkeypatch, lambda model, conv, prompt: state["script"](
        model, conv, 1 + sum(m["role"] == "assistant" for m in conv.messages)))
    return engine_script.agents(debatecv.ROLES), calls, state


def claim_of(conv):
    return int(conv.system.split("Claim number ")[1][0])


def test_round_one_order_and_what_each_side_sees(scripted):
    agents, calls, state = scripted
    state["script"] = lambda role, conv, turn: {
        "affirmative": f"AFF-{claim_of(conv)}-{turn}", "negative": f"NEG-{claim_of(conv)}-{turn}",
        "moderator": stop_with(SUPPORTED)}[role]
    records = debatecv.run_batch(agents, CLAIMS[:1], engine.Settings(), max_rounds=3)
    turns = records[0]["transcript"]["turns"]
    assert [t["role"] for t in turns] == ["affirmative", "negative", "moderator"]
    assert turns[0]["prompt"].startswith("Claim: Claim number 0.")  # the paper's opening shows the claim
    assert "AFF-0-1" in turns[1]["prompt"]  # the Negative rebuts the Affirmative's opening
    assert "AFF-0-1" in turns[2]["prompt"] and "NEG-0-1" in turns[2]["prompt"]
    assert "Claim number 0." in records[0]["transcript"]["claim"]
    pred = records[0]["prediction"]
    assert (pred["label"], pred["rounds"], pred["stop_reason"], pred["parse_status"]) == (
        SUPPORTED, 1, "moderator", "json")
    assert pred["justification"] == f"because {SUPPORTED}"
    assert pred["prompt_tokens"] == 30 and pred["completion_tokens"] == 15


def test_later_rounds_answer_the_opponents_last_argument_and_stop_when_moderator_says_no(scripted):
    agents, calls, state = scripted
    # Claim i: the Moderator says "No" after round i+1.
    state["script"] = lambda role, conv, turn: (
        (stop_with(REFUTED) if turn == claim_of(conv) + 1 else PROCEED) if role == "moderator"
        else f"{role[:3].upper()}-{claim_of(conv)}-{turn}")
    finished = []
    records = debatecv.run_batch(agents, CLAIMS, engine.Settings(), max_rounds=3,
                                 on_finish=lambda r: finished.append(r["prediction"]["claim_id"]))
    assert finished == [0, 1, 2]  # each written as soon as it ends, not at the end of the batch
    by_id = {r["prediction"]["claim_id"]: r for r in records}
    assert [by_id[i]["prediction"]["rounds"] for i in range(3)] == [1, 2, 3]
    assert all(by_id[i]["prediction"]["label"] == REFUTED for i in range(3))
    turns = by_id[2]["transcript"]["turns"]
    round2 = [t for t in turns if t["round"] == 2]
    assert "NEG-2-1" in round2[0]["prompt"]  # Affirmative answers the Negative's round-1 argument
    assert "AFF-2-2" in round2[1]["prompt"]  # Negative answers the Affirmative's round-2 argument
    # Batches shrink as claims finish: three claims in round 1, two in round 2, one in round 3.
    assert [len(c.prompts) for c in calls if c.model == "moderator"] == [3, 2, 1]


def test_final_prompt_after_max_rounds_and_unparsed_verdict_is_recorded_not_guessed(scripted):
    agents, calls, state = scripted
    state["script"] = lambda role, conv, turn: (
        ("I cannot decide." if turn == 3 else PROCEED) if role == "moderator" else "arg")
    records = debatecv.run_batch(agents, CLAIMS[:1], engine.Settings(), max_rounds=2)
    pred = records[0]["prediction"]
    turns = records[0]["transcript"]["turns"]
    assert turns[-1]["round"] == "final" and turns[-1]["role"] == "moderator"
    # The paper's final prompt: both last arguments, the claim, a step-by-step justification before the JSON.
    final = turns[-1]["prompt"]
    assert "Claim number 0." in final and final.index("step by step") < final.index('"Verdict"')
    assert (pred["label"], pred["parse_status"], pred["stop_reason"], pred["rounds"]) == (
        None, "unparsed", "max_rounds", 2)


def test_unreadable_round_decision_continues_the_debate(scripted):
    agents, calls, state = scripted
    state["script"] = lambda role, conv, turn: (
        ("garbled" if turn == 1 else stop_with(SUPPORTED)) if role == "moderator" else "arg")
    pred = debatecv.run_batch(agents, CLAIMS[:1], engine.Settings(), max_rounds=3)[0]["prediction"]
    assert (pred["rounds"], pred["label"], pred["stop_reason"]) == (2, SUPPORTED, "moderator")


def test_stop_without_a_known_label_is_recorded_as_no_verdict(scripted):
    agents, calls, state = scripted
    state["script"] = lambda role, conv, turn: stop_with("Half true") if role == "moderator" else "arg"
    record = debatecv.run_batch(agents, CLAIMS[:1], engine.Settings(), max_rounds=3)[0]
    pred, turns = record["prediction"], record["transcript"]["turns"]
    assert (pred["rounds"], pred["label"], pred["parse_status"], pred["stop_reason"]) == (
        1, None, "no_verdict", "moderator")
    # The final prompt was asked for the verdict right after the round that stopped the debate.
    assert [t["round"] for t in turns] == [1, 1, 1, "final"]


def test_stop_without_a_label_then_a_verdict_in_the_final_answer(scripted):
    agents, calls, state = scripted
    state["script"] = lambda role, conv, turn: (
        (stop_with("") if turn == 1 else stop_with(REFUTED)) if role == "moderator" else "arg")
    pred = debatecv.run_batch(agents, CLAIMS[:1], engine.Settings(), max_rounds=3)[0]["prediction"]
    assert (pred["rounds"], pred["label"], pred["parse_status"], pred["stop_reason"]) == (
        1, REFUTED, "json", "moderator")
