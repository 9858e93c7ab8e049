"""MADR control flow with scripted agents: Algorithm 1's iterations, who sees what, when the debate stops,
what the record gets, and MADR as an explanation method (--task explain --method madr)."""
import json
import re

import pytest

from debate.data.labels import REFUTED
from debate.data.prompts import load_prompt
from debate.engine import engine
from debate.methods import explain, madr, turns
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


def claim_of(conv):
    """The claim a conversation is about: named in its system text or in its first messages."""
    text = conv.system + " ".join(m["content"] for m in conv.messages)
    return int(re.search(r"Claim number (\d)", text).group(1))


def generated_turn(conv):
    """1 + the replies the model has generated in `conv` (recalled turns do not count)."""
    return 1 + sum(m["role"] == "assistant" for m in conv.messages) - len(conv.generated)


@pytest.fixture
def scripted(monkeypatch):
    """Replace the engine: replies come from `script(role, claim_id, turn)`; every call is logged."""
    state = {"script": None}
    calls = engine_script.install(monkeypatch, lambda model, conv, prompt: state["script"](
        model, claim_of(conv), generated_turn(conv)))
    agents = engine_script.agents({**madr.MODEL_OF, "explainer": "moderator"})
    return agents, calls, state


def script(agree_at=None, judge_reply=None, refiner=REFINED):
    """Debaters say "<ROLE>-<claim>-<turn>"; the judge agrees at its call `agree_at(claim)` (never if None).
    Each judge call is a fresh conversation, so the script counts the calls itself."""
    judged = {}

    def reply(role, cid, turn):
        if role == "madr_judge":
            turn = judged[cid] = judged.get(cid, 0) + 1
            if judge_reply:
                return judge_reply(cid, turn)
            return judge("Yes" if agree_at and turn == agree_at(cid) else "No")
        if role == "madr_refiner":
            return refiner
        if role == "explainer":
            return json.dumps({"Explanation": f"EXPLANATION-{cid}."})
        return f"{role.upper()}-{cid}-{turn}"
    return reply


def refine(agents, records, claims=CLAIMS, iterations=3):
    return madr.refine(agents, records, claims, engine.Settings(), iterations)


DEBATE = ["madr_typology", "madr_free"]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_n_iterations_mean_n_revisions_with_the_judge_asked_before_each(scripted, n):
    agents, calls, state = scripted
    state["script"] = script()  # the judge never agrees
    pred = refine(agents, [record_of(CLAIMS[0])], iterations=n)[0]["prediction"]
    # Algorithm 1: the first feedback, then N times (judge, both debaters revise), never a judge after the last.
    assert [c.model for c in calls] == DEBATE + (["madr_judge"] + DEBATE) * n + ["madr_refiner"]
    assert pred["madr"] == {"revisions": n, "judge_calls": n, "stop_reason": "max_iterations", "refine_status": "field"}


def test_agreement_before_a_revision_stops_the_debate_there(scripted):
    agents, calls, state = scripted
    state["script"] = script(agree_at=lambda cid: 2)
    pred = refine(agents, [record_of(CLAIMS[0])])[0]["prediction"]
    assert pred["madr"] == {"revisions": 1, "judge_calls": 2, "stop_reason": "agreement", "refine_status": "field"}
    assert [c.model for c in calls] == DEBATE + ["madr_judge"] + DEBATE + ["madr_judge", "madr_refiner"]


def test_agreement_on_the_first_feedback_refines_with_no_revision(scripted):
    agents, calls, state = scripted
    state["script"] = script(agree_at=lambda cid: 1)
    pred = refine(agents, [record_of(CLAIMS[0])])[0]["prediction"]
    assert pred["madr"] == {"revisions": 0, "judge_calls": 1, "stop_reason": "agreement", "refine_status": "field"}
    assert [c.model for c in calls] == DEBATE + ["madr_judge", "madr_refiner"]


def test_unreadable_judge_reply_continues_and_template_copy_is_not_agreement(scripted):
    agents, calls, state = scripted
    # call 1: garbled; call 2: the template copied verbatim ("Yes or No"); call 3: a clear Yes.
    state["script"] = script(judge_reply=lambda cid, turn: {1: "I am unsure.", 2: judge("Yes or No")}.get(
        turn, judge("Yes")))
    record = refine(agents, [record_of(CLAIMS[0])], iterations=5)[0]
    assert record["prediction"]["madr"]["revisions"] == 2 and record["prediction"]["madr"]["judge_calls"] == 3
    assert record["prediction"]["madr"]["stop_reason"] == "agreement"
    judged = [t for t in record["transcript"]["turns"] if t["role"] == "madr_judge"]
    assert [t["agreement"] for t in judged] == [None, None, True]
    assert judged[0]["parse_status"] == "unparsed" and judged[2]["parse_status"] == "json"


def test_each_revision_reads_the_others_previous_feedback(scripted):
    agents, calls, state = scripted
    state["script"] = script()
    turns = refine(agents, [record_of(CLAIMS[1])], iterations=2)[0]["transcript"]["turns"]
    said = {(t["round"], t["role"]): t for t in turns}
    first = said[("madr-0", "madr_typology")]["prompt"], said[("madr-0", "madr_free")]["prompt"]
    assert "MADR_" not in first[0] + first[1]
    assert said[("madr-0", "madr_typology")]["response"] == "MADR_TYPOLOGY-1-1"
    for i in (1, 2):  # revision i is each debater's turn i + 1, against the other's turn i
        assert f"MADR_FREE-1-{i}" in said[(f"madr-{i}", "madr_typology")]["prompt"]
        assert f"MADR_TYPOLOGY-1-{i}" in said[(f"madr-{i}", "madr_free")]["prompt"]
        assert f"MADR_TYPOLOGY-1-{i + 1}" not in said[(f"madr-{i}", "madr_free")]["prompt"]
        # The judge before revision i reads the feedback of the iteration before.
        judged = said[(f"madr-{i}", "madr_judge")]["prompt"]
        assert f"MADR_TYPOLOGY-1-{i}" in judged and f"MADR_FREE-1-{i}" in judged
    refine_prompt = said[("madr-refine", "madr_refiner")]["prompt"]
    assert "MADR_TYPOLOGY-1-3" in refine_prompt and "MADR_FREE-1-3" in refine_prompt
    assert [t["round"] for t in turns[1:]] == ["madr-0"] * 2 + ["madr-1"] * 3 + ["madr-2"] * 3 + ["madr-refine"]


def test_the_explanation_is_the_debaters_own_earlier_turn(scripted, monkeypatch):
    agents, calls, state = scripted
    state["script"] = script(agree_at=lambda cid: 1)
    kept = {}
    original = madr.start_review

    def keep(claim, label, justification):
        review = original(claim, label, justification)
        kept.update(review.convs)
        return review

    monkeypatch.setattr(madr, "start_review", keep)
    refine(agents, [record_of(CLAIMS[0])])
    typology = load_prompt("madr_error_typology")
    for role in madr.DEBATERS:
        conv = kept[role]
        # Tables 8-9: asked for the error types, answered with them; asked for the explanation (claim, label,
        # evidence), answered with the explanation under review; then the debater's task.
        assert conv.system == ""
        roles = [m["role"] for m in conv.messages]
        assert roles[:5] == ["user", "assistant", "user", "assistant", "user"]
        assert conv.messages[1]["content"] == typology
        request = conv.messages[2]["content"]
        assert "Claim number 0." in request and REFUTED in request and "A0." in request
        assert conv.messages[3]["content"] == explain.answer_text("The bridge was built in 1990 by the mayor.")
        assert conv.generated[:2] == [None, None]  # recalled: tokenised from their text when the model reads them
        assert conv.messages[4]["content"] == load_prompt(madr.FIRST_REQUEST[role])
    # Only the free debater is told to find errors before going by the types (Figure 1).
    assert "without going by the error types" in kept["madr_free"].messages[4]["content"]
    assert "without going by" not in kept["madr_typology"].messages[4]["content"]
    # The refiner's own earlier turn is the explanation too; the judge reads everything up front.
    refiner = kept["madr_refiner"]
    assert [m["role"] for m in refiner.messages[:2]] == ["user", "assistant"] and "Claim number 0." in \
        refiner.messages[0]["content"] and "1990 by the mayor" in refiner.messages[1]["content"]
    assert "1990 by the mayor" in kept["madr_judge"].system and "A0." in kept["madr_judge"].system


def test_each_judge_call_reads_only_the_current_feedback_and_every_calls_tokens_count(scripted):
    agents, calls, state = scripted
    inner, seen = script(agree_at=lambda cid: 3), []

    def watched(role, cid, turn):
        if role == "madr_judge":
            seen.append(turn)  # the reply's place in its own conversation
        return inner(role, cid, turn)

    state["script"] = watched
    record = refine(agents, [record_of(CLAIMS[0])], iterations=3)[0]
    pred = record["prediction"]
    assert pred["madr"] == {"revisions": 2, "judge_calls": 3, "stop_reason": "agreement", "refine_status": "field"}
    # Algorithm 1's J(F1, F2): each call opens a fresh conversation, with no earlier question or "No" in it.
    assert seen == [1, 1, 1]
    judged = [t["prompt"] for t in record["transcript"]["turns"] if t["role"] == "madr_judge"]
    assert "MADR_TYPOLOGY-0-1" in judged[0] and "MADR_TYPOLOGY-0-3" in judged[2]
    # Tokens of every call count, the earlier judge conversations' too: 6 debater turns, 3 judge calls and the
    # refiner's turn at 10 prompt / 5 completion tokens each (the scripted engine), on top of the record's own.
    assert (pred["prompt_tokens"], pred["completion_tokens"]) == (100 + 10 * 10, 20 + 10 * 5)


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
    assert pred["madr"] == {"revisions": 0, "judge_calls": 0, "stop_reason": "no_justification",
                            "refine_status": None}
    assert pred["prompt_tokens"] == 100 and len(empty["transcript"]["turns"]) == 1
    # A justification without a readable verdict is still checked against the evidence.
    assert no_label["prediction"]["madr"]["stop_reason"] == "agreement"
    assert no_label["prediction"]["label"] is None
    judged = next(c for c in calls if c.model == "madr_judge")
    assert load_prompt("madr_no_verdict") in judged.systems[0]  # the label the explanation is read for
    assert all(len(c.prompts) == 1 for c in calls)  # only claim 1 ever reached the model


def test_batched_calls_drop_claims_that_agreed(scripted):
    agents, calls, state = scripted
    # Claim i agrees at judge call i + 1; records come in another order than the claims.
    state["script"] = script(agree_at=lambda cid: cid + 1)
    records = refine(agents, [record_of(CLAIMS[i]) for i in (2, 0, 1)], iterations=3)
    assert [r["prediction"]["claim_id"] for r in records] == [2, 0, 1]
    assert [r["prediction"]["madr"]["revisions"] for r in records] == [2, 0, 1]
    rows = [(c.model, len(c.prompts)) for c in calls]
    assert rows == [("madr_typology", 3), ("madr_free", 3), ("madr_judge", 3), ("madr_typology", 2),
                    ("madr_free", 2), ("madr_judge", 2), ("madr_typology", 1), ("madr_free", 1), ("madr_judge", 1),
                    ("madr_refiner", 3)]
    # The conversations really belong to the right claims.
    for r in records:
        cid = r["prediction"]["claim_id"]
        assert all(f"-{cid}-" in t["response"] for t in r["transcript"]["turns"] if t["role"] in madr.DEBATERS)


def test_madr_as_an_explanation_method_refines_the_zero_shot_explanation_of_the_gold_label(scripted):
    agents, calls, state = scripted
    state["script"] = script(agree_at=lambda cid: 1)
    finished = []
    settings = engine.Settings(temperature=0.7)
    records = madr.explain(agents, CLAIMS[:2], settings, max_iterations=2, streams=turns.Streams(),
                           on_finish=finished.append, temperature=0.0)
    assert [r["prediction"]["claim_id"] for r in finished] == [0, 1] and finished == records
    pred = records[0]["prediction"]
    assert pred["gold_label"] == REFUTED and "label" not in pred  # given, never predicted
    assert pred["justification_unrefined"] == "EXPLANATION-0."
    assert pred["justification"] == "The evidence says the bridge was built in 1990."
    assert [t["role"] for t in records[0]["transcript"]["turns"]] == ["explainer", *DEBATE, "madr_judge",
                                                                      "madr_refiner"]
    # The explainer was asked for the gold label's explanation; the debaters' recalled turn is its answer, and
    # the judge reads the gold label too (not "no verdict": an explanation record has no label of its own).
    assert calls[0].model == "explainer" and REFUTED in calls[0].prompts[0] and "A0." in calls[0].prompts[0]
    judged = next(c for c in calls if c.model == "madr_judge")
    assert REFUTED in judged.systems[0] and load_prompt("madr_no_verdict") not in judged.systems[0]
    assert calls[0].generator is not None  # the explainer samples at the run's temperature ...
    assert all(c.generator is None for c in calls[1:])  # ... MADR's roles at --madr-temperature (greedy here)


def test_madr_on_politihop_defaults_to_the_ruling_and_the_chains_stay_a_flag():
    from debate.pipeline import config as run_config

    built = run_config.build(dataset="politihop", split="test", task="explain", method="madr", model="m")
    assert built.data.evidence == "ruling" and built.output.output_dir == "runs/politihop-test-ruling-explain-madr"
    # Its baselines read what MADR reads; the annotated chains only when asked; verification keeps its default.
    assert run_config.build(dataset="politihop", task="explain", method="zero-shot",
                            model="m").data.evidence == "ruling"
    assert run_config.build(dataset="politihop", task="explain", method="madr", evidence="golden",
                            model="m").data.evidence == "golden"
    assert run_config.build(dataset="politihop", method="rag-cot", model="m").data.evidence == "golden"
    assert run_config.build(dataset="check-covid", task="explain", method="madr", model="m").data.evidence == "golden"
