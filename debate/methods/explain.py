"""Explanation generation (--task explain): the claim, its evidence and its gold label in, the explanation of
why the claim has that label out. MADR's paper (Kim et al. 2024) compares four ways of writing it:

- zero-shot: one request (claim, label, evidence), answered with {"Explanation"}.
- cot: the same request, asking for the reasoning first and the explanation after it ({"Reasoning",
  "Explanation"}); only the explanation is scored, the reasoning is kept beside it.
- self-refine (Madaan et al. 2023, with the feedback and refinement prompts of MADR's Table 7): the
  zero-shot explanation, then one agent in one conversation: asked for the error types (answered with the
  typology), asked for the explanation (answered with the zero-shot one, as its own earlier turn), then
  alternately its feedback on its latest explanation (the error count first, then five steps per error)
  and its revision by that feedback. It stops when a feedback counts no error ("no_errors"), or after
  `max_iterations` revisions ("max_iterations"); a feedback whose count cannot be read goes on.
- madr: debate.methods.madr.explain.

The label is the dataset's own text (true / false / half-true for PolitiHop), given, never predicted: a
record's `gold_label` is the label it explains and it has no `label`. Its `justification` is the
explanation, so every tool that reads justifications reads it; the refining methods keep the zero-shot one
as `justification_unrefined`. Every method runs over a batch of
claims, each role's turn one batched call, and hands each finished record to `on_finish`.
"""
import json
from dataclasses import dataclass, field

from debate.data.parsing import number_in, read_fields
from debate.data.prompts import format_evidence, load_prompt, render
from debate.engine import engine
from debate.methods import turns

EXPLAINER = {"explainer": "moderator"}  # role -> its model flag
SELF_REFINE_MODELS = {"explainer": "moderator", "self_refiner": "refine"}
SCHEMAS = {"zero-shot": ("explain_zero_shot",), "cot": ("explain_cot",),
           "self-refine": ("explain_zero_shot", "self_refine_feedback", "self_refine_revise")}
EXPLANATION, REASONING, ERROR_COUNT = "Explanation", "Reasoning", "Error Count"
MAX_ERROR_COUNT = 10  # the top of the feedback schema's count


def request(claim, label=None, name="explain_zero_shot"):
    """The explanation request `name` for `claim`: its text, `label` (default: its gold label) and its evidence."""
    return render(name, claim=claim["claim"], label=claim["label"] if label is None else label,
                  evidence=format_evidence(claim["evidence"]))


def answer_text(explanation):
    """`explanation` as an agent answers the request: the JSON object its schema writes, for a recalled turn."""
    return json.dumps({EXPLANATION: explanation}, indent=2, ensure_ascii=False)


def read_answer(reply, key, aliases=None):
    """(text, status) of a reply asked for {key: text}: the key's value ("field"), else the reply's own text
    ("text"); "" with "empty" when neither holds any text."""
    fields, _ = read_fields(reply, (key,), aliases=aliases)
    if key in fields:
        # The key was there: its value is the answer, even when empty; the JSON around it is no explanation.
        value = fields[key]
        text = value.strip() if isinstance(value, str) else "" if value is None else str(value).strip()
        return (text, "field") if text else ("", "empty")
    text = reply.strip() if isinstance(reply, str) else ""
    return (text, "text") if text else ("", "empty")


def error_count(reply, structured=None):
    """The feedback's error count (an int >= 0), or None when it cannot be read."""
    if structured is not None and ERROR_COUNT in structured["fields"]:
        return int(structured["fields"][ERROR_COUNT])
    fields, _ = read_fields(reply, (ERROR_COUNT, "Feedback"), required=(ERROR_COUNT,),
                            aliases={"errors": ERROR_COUNT, "numberoferrors": ERROR_COUNT})
    fraction = number_in(fields.get(ERROR_COUNT), MAX_ERROR_COUNT)
    return None if fraction is None else round(fraction * MAX_ERROR_COUNT)


def record(claim, explanation, status, said, convs, **extra):
    """A claim's explanation as the run writes it: its prediction line and its transcript line. The explanation
    is the `justification`; the label it explains is `gold_label`. There is no `label`: no verdict was asked
    for, so no tool counts the record right or wrong."""
    return {
        "prediction": {"claim_id": claim["claim_id"], "justification": explanation, "parse_status": status,
                       **extra, **turns.token_counts(convs), "gold_label": claim["label"]},
        "transcript": {"claim_id": claim["claim_id"], "claim": claim["claim"], "turns": said},
    }


def _single_turn(agents, claims, settings, streams, prompt_name, on_finish, keep_reasoning=False):
    """One request per claim to the explainer under `prompt_name`'s schema; a record per claim."""
    generator = turns.stream(agents, streams, settings.seed, settings)
    convs = [engine.Conversation(system="") for _ in claims]
    prompts = [request(c, name=prompt_name) for c in claims]
    replies = turns.speak(agents["explainer"], convs, prompts, settings, generator, prompt_name)
    records = []
    for claim, conv, prompt, reply in zip(claims, convs, prompts, replies):
        text, status = read_answer(reply, EXPLANATION)
        status = "structured" if conv.structured is not None and text else status
        said = [{"round": "explain", "role": "explainer", "prompt": prompt, "response": reply, "parse_status": status,
                 **turns.structured_note(conv)}]
        extra = {}
        if keep_reasoning:
            reasoning = read_fields(reply, (REASONING, EXPLANATION))[0].get(REASONING)
            extra["reasoning"] = reasoning.strip() if isinstance(reasoning, str) else ""
        records.append(record(claim, text, status, said, [conv], **extra))
        if on_finish:
            on_finish(records[-1])
    return records


def zero_shot(agents, claims, settings, streams=None, on_finish=None, labels=None):
    """Zero-shot: the explanation asked for directly. `labels` (the dataset's LabelSet) is not needed: the
    gold label is given as text."""
    return _single_turn(agents, claims, settings, streams, "explain_zero_shot", on_finish)


def cot(agents, claims, settings, streams=None, on_finish=None, labels=None):
    """CoT: the reasoning first, then the explanation; the reasoning is kept as `reasoning`."""
    return _single_turn(agents, claims, settings, streams, "explain_cot", on_finish, keep_reasoning=True)


@dataclass
class Refinement:
    """One claim's Self-Refine: its conversation, its latest explanation, what was said."""
    claim: dict
    conv: engine.Conversation
    explanation: str
    turns: list = field(default_factory=list)
    revisions: int = 0
    counts: list = field(default_factory=list)  # each feedback's error count (None: unreadable)
    stop_reason: str = "max_iterations"


def start_refinement(claim, explanation):
    """The agent's conversation: the error types and the explanation as its own earlier answers (Table 7)."""
    conv = engine.Conversation(system="")
    conv.recall(load_prompt("madr_typology_question"), load_prompt("madr_error_typology"))
    conv.recall(request(claim), answer_text(explanation))
    return Refinement(claim=claim, conv=conv, explanation=explanation)


def self_refine(agents, claims, settings, max_iterations=4, streams=None, on_finish=None, labels=None):
    """Self-Refine over the zero-shot explanations of `claims` (see the module doc); at most
    `max_iterations` revisions, each after a feedback that counts some error (or none readable)."""
    if max_iterations < 1:
        raise ValueError(f"max_iterations must be at least 1, not {max_iterations}")
    first = zero_shot(agents, claims, settings, streams=streams)
    generator = turns.stream(agents, streams, settings.seed, settings)
    agent = agents["self_refiner"]
    states = [start_refinement(claim, r["prediction"]["justification"]) for claim, r in zip(claims, first)]
    for state in states:
        if not state.explanation.strip():
            state.stop_reason = "no_explanation"  # nothing to give feedback on
    active = [s for s in states if s.stop_reason != "no_explanation"]
    feedback_prompt, revise_prompt = load_prompt("self_refine_feedback"), load_prompt("self_refine_revise")
    for i in range(1, max_iterations + 1):
        if not active:
            break
        replies = turns.speak(agent, [s.conv for s in active], [feedback_prompt] * len(active), settings, generator,
                              "self_refine_feedback")
        going = []
        for state, reply in zip(active, replies):
            count = error_count(reply, state.conv.structured)
            state.counts.append(count)
            state.turns.append({"round": f"feedback-{i}", "role": "self_refiner", "prompt": feedback_prompt,
                                "response": reply, "error_count": count, **turns.structured_note(state.conv)})
            if count == 0:
                state.stop_reason = "no_errors"
                state.conv.drop_cache()
            else:
                going.append(state)
        replies = turns.speak(agent, [s.conv for s in going], [revise_prompt] * len(going), settings, generator,
                              "self_refine_revise")
        for state, reply in zip(going, replies):
            text, status = read_answer(reply, EXPLANATION)
            state.turns.append({"round": f"revise-{i}", "role": "self_refiner", "prompt": revise_prompt,
                                "response": reply, "parse_status": status, **turns.structured_note(state.conv)})
            state.explanation = text or state.explanation  # an empty revision keeps the explanation it had
            state.revisions = i
        active = going

    records = []
    for state, done in zip(states, first):
        state.conv.drop_cache()
        prediction, transcript = done["prediction"], done["transcript"]
        out = record(state.claim, state.explanation, prediction["parse_status"],
                     transcript["turns"] + state.turns, [state.conv],
                     justification_unrefined=prediction["justification"],
                     self_refine={"revisions": state.revisions, "stop_reason": state.stop_reason,
                                  "error_counts": state.counts})
        for key in turns.TOKEN_KEYS:
            out["prediction"][key] += prediction[key]
        records.append(out)
        if on_finish:
            on_finish(out)
    return records
