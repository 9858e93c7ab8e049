"""The explanation task (--task explain) with scripted agents: what Zero-shot, CoT and Self-Refine ask and record,
where Self-Refine stops, and the run's settings for it."""
import json
import re

import pytest

from debate.data.prompts import load_prompt
from debate.engine import engine
from debate.methods import explain, turns
from debate.pipeline import config as run_config, config_file, method_table, runner
from debate.pipeline.config import ConfigError
from tests import scripted as engine_script

# PolitiHop's shape: the statement, a label of its own three, the ruling's sentences as evidence.
CLAIMS = [{"claim_id": i, "claim": f"Claim number {i}.", "label": "half-true",
           "evidence": [{"question": "What did the ruling find?", "answer": f"Ruling sentence {i}.", "url": ""}]}
          for i in range(3)]


def claim_of(conv):
    return int(re.search(r"Claim number (\d)", " ".join(m["content"] for m in conv.messages)).group(1))


@pytest.fixture
def scripted(monkeypatch):
    """The engine replaced: `state["script"](role, claim_id, prompt, conv)` answers; every call is logged."""
    state = {}
    calls = engine_script.install(monkeypatch, lambda model, conv, prompt: state["script"](
        model, claim_of(conv), prompt, conv))
    return engine_script.agents(explain.SELF_REFINE_MODELS), calls, state


def explanation(text):
    return json.dumps({"Explanation": text})


def feedback(count):
    return json.dumps({"Error Count": count, "Feedback": f"{count} errors"})


def test_zero_shot_asks_for_the_gold_labels_explanation_and_records_it_as_the_justification(scripted):
    agents, calls, state = scripted
    state["script"] = lambda role, cid, prompt, conv: explanation(f"Because of ruling sentence {cid}.")
    finished = []
    records = explain.zero_shot(agents, CLAIMS[:2], engine.Settings(), on_finish=finished.append)
    assert finished == records and [c.model for c in calls] == ["explainer"]
    prompt = calls[0].prompts[0]
    # Claim, label, evidence, in that order (the request of the paper's Tables 7-9), then the task.
    assert prompt.index("Claim number 0.") < prompt.index("half-true") < prompt.index("Ruling sentence 0.")
    assert calls[0].systems == ["", ""] and calls[0].schemas[0].name == "explain_zero_shot"
    # The answer's key is named, with no example value: the embedded model copied an example's "..." verbatim.
    assert '"Explanation"' in prompt and "..." not in prompt
    pred = records[0]["prediction"]
    assert pred["justification"] == "Because of ruling sentence 0." and pred["parse_status"] == "field"
    assert pred["gold_label"] == "half-true" and "label" not in pred  # given, never predicted: no verdict
    assert records[0]["transcript"]["turns"][0]["role"] == "explainer"


def test_cot_keeps_the_reasoning_beside_the_explanation(scripted):
    agents, calls, state = scripted
    state["script"] = lambda role, cid, prompt, conv: json.dumps(
        {"Reasoning": "Step one, step two.", "Explanation": "The ruling says so."})
    pred = explain.cot(agents, CLAIMS[:1], engine.Settings())[0]["prediction"]
    assert pred["justification"] == "The ruling says so." and pred["reasoning"] == "Step one, step two."
    text = calls[0].prompts[0]
    assert "step by step" in text and text.index('"Reasoning"') < text.index('"Explanation"')


def self_refine_script(counts, revised="Revised {cid}-{i}."):
    """The explainer writes E-<cid>; feedback i of claim cid counts counts(cid)[i - 1] errors."""
    def reply(role, cid, prompt, conv):
        if role == "explainer":
            return explanation(f"E-{cid}.")
        i = sum(m["content"] == load_prompt("self_refine_feedback") for m in conv.messages if m["role"] == "user")
        if prompt == load_prompt("self_refine_feedback"):
            count = counts(cid)[i - 1]
            return count if isinstance(count, str) else feedback(count)
        return explanation(revised.format(cid=cid, i=i))
    return reply


def test_self_refine_stops_when_the_feedback_counts_no_error(scripted):
    agents, calls, state = scripted
    state["script"] = self_refine_script(lambda cid: [2, 1, 0, 3])
    record = explain.self_refine(agents, CLAIMS[:1], engine.Settings(), max_iterations=5)[0]
    pred = record["prediction"]
    assert pred["self_refine"] == {"revisions": 2, "stop_reason": "no_errors", "error_counts": [2, 1, 0]}
    assert pred["justification"] == "Revised 0-2." and pred["justification_unrefined"] == "E-0."
    assert [c.model for c in calls] == ["explainer"] + ["self_refiner"] * 5
    assert [t["round"] for t in record["transcript"]["turns"]] == [
        "explain", "feedback-1", "revise-1", "feedback-2", "revise-2", "feedback-3"]


def test_self_refine_stops_after_n_revisions_with_no_feedback_after_the_last(scripted):
    agents, calls, state = scripted
    state["script"] = self_refine_script(lambda cid: [1, "I am not sure.", 4])  # an unreadable count goes on
    pred = explain.self_refine(agents, CLAIMS[:1], engine.Settings(), max_iterations=2)[0]["prediction"]
    assert pred["self_refine"] == {"revisions": 2, "stop_reason": "max_iterations", "error_counts": [1, None]}
    assert len(calls) == 1 + 4  # explain, then (feedback, revise) twice


def test_self_refine_first_feedback_of_none_keeps_the_zero_shot_explanation(scripted):
    agents, calls, state = scripted
    state["script"] = self_refine_script(lambda cid: [0] if cid == 0 else [1, 0])
    records = explain.self_refine(agents, CLAIMS[:2], engine.Settings(), max_iterations=3)
    first, second = (r["prediction"] for r in records)
    assert first["justification"] == "E-0." and first["self_refine"]["revisions"] == 0
    assert second["justification"] == "Revised 1-1." and second["self_refine"]["stop_reason"] == "no_errors"
    # Batched: the claim that stopped leaves the next calls.
    assert [len(c.prompts) for c in calls] == [2, 2, 1, 1]


def test_self_refine_reads_a_structured_count_and_leaves_an_empty_explanation_alone(scripted):
    agents, calls, state = scripted

    def reply(role, cid, prompt, conv):
        if role == "explainer":
            return explanation("" if cid == 1 else "E.")
        return engine_script.Decoded(text=feedback(0), fields={"Error Count": 0, "Feedback": "fine"},
                                     probs={"Error Count": {"0": 0.9, "1": 0.1}})

    state["script"] = reply
    records = explain.self_refine(agents, CLAIMS[:2], engine.Settings(), max_iterations=3)
    assert records[0]["prediction"]["self_refine"]["stop_reason"] == "no_errors"
    assert records[0]["transcript"]["turns"][1]["parse_status"] == "structured"
    assert records[1]["prediction"]["self_refine"] == {"revisions": 0, "stop_reason": "no_explanation",
                                                       "error_counts": []}
    assert [len(c.prompts) for c in calls] == [2, 1]


def test_self_refine_has_one_agent_whose_earlier_answers_are_the_typology_and_the_explanation(scripted,
                                                                                               monkeypatch):
    agents, calls, state = scripted
    state["script"] = self_refine_script(lambda cid: [0])
    kept = []
    original = explain.start_refinement
    monkeypatch.setattr(explain, "start_refinement", lambda claim, text: kept.append(original(claim, text)) or kept[-1])
    explain.self_refine(agents, CLAIMS[:1], engine.Settings(), max_iterations=2)
    conv = kept[0].conv
    assert [m["role"] for m in conv.messages] == ["user", "assistant"] * 3
    assert conv.messages[1]["content"] == load_prompt("madr_error_typology")
    assert conv.messages[2]["content"] == explain.request(CLAIMS[0])
    assert conv.messages[3]["content"] == explain.answer_text("E-0.")
    assert conv.messages[4]["content"] == load_prompt("self_refine_feedback")
    # Table 7's feedback: the error count first, then five steps for each error.
    text = load_prompt("self_refine_feedback")
    assert text.index("Error count") < text.index("Step 1") < text.index("Step 5")
    assert "changing nothing beyond what the feedback asks" in load_prompt("self_refine_revise")


def test_the_run_settings_of_the_explanation_task():
    built = run_config.build(task="explain", method="madr", split="demo", model="m")
    assert built.generation.temperature == 0.0 and built.madr.madr_temperature == 0.0
    assert built.output.output_dir == "runs/demo-golden-explain-madr"
    assert method_table.model_roles(built) == {"explainer": "moderator", **{r: "refine" for r in (
        "madr_typology", "madr_free", "madr_judge", "madr_refiner")}}
    assert run_config.build(task="explain", method="cot", model="m", temperature=0.5).generation.temperature == 0.5
    assert run_config.build(method="debatecv", model="m").generation.temperature == 0.7  # verification unchanged
    saved = config_file.config_json(run_config.build(task="explain", method="zero-shot", model="m"),
                               method_table.model_roles(run_config.build(task="explain", method="zero-shot",
                                                                         model="m")))
    assert saved["task"] == "explain" and "madr_iterations" not in saved and "self_refine_iterations" not in saved
    for settings, message in [({"task": "explain"}, "--task explain takes --method"),
                              ({"task": "explain", "method": "madr", "refine": "madr"}, "MADR is --method madr"),
                              ({"method": "cot"}, "a method of --task explain"),
                              ({"task": "explain", "method": "cot", "madr_temperature": -1}, "--madr-temperature"),
                              ({"task": "summarise"}, "--task must be one of")]:
        with pytest.raises(ConfigError, match=message):
            run_config.build(model="m", **settings)


def test_an_explanation_run_refuses_claims_without_a_gold_label_before_any_model_loads(monkeypatch):
    built = run_config.build(task="explain", method="zero-shot", split="demo", model="m")
    from debate.data.inputs import DataError

    monkeypatch.setattr(runner.models, "check_roles", lambda *a, **k: None)
    claims = [dict(CLAIMS[0]), dict(CLAIMS[1], label=None)]
    with pytest.raises(DataError, match="claim 1 of --split demo has none"):
        runner.check_run(built, claims)


def test_the_continuous_and_fixed_runners_hand_every_explanation_to_write(scripted):
    agents, calls, state = scripted
    state["script"] = self_refine_script(lambda cid: [1, 0])
    for continuous in (True, False):
        built = run_config.build(task="explain", method="self-refine", model="m", continuous=continuous,
                                 batch_size=2)
        written = []
        runner.verify_claims(built, agents, CLAIMS, engine.Settings(), turns.Streams(),
                             method_table.method_entry(built)[2](built), written.append)
        assert sorted(r["prediction"]["claim_id"] for r in written) == [0, 1, 2]
        assert all(r["prediction"]["self_refine"]["revisions"] == 1 for r in written)
