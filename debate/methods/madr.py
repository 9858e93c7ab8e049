"""MADR (Kim et al. 2024): a debate over an explanation's errors, then a revision faithful to the evidence.

Algorithm 1, for an explanation E of claim C with evidence S and label L, and N = `max_iterations`:

    F(0,1), F(0,2)   each debater's first feedback on E
    for i = 1 .. N:  the judge reads F(i-1,1) and F(i-1,2); agreement stops the debate;
                     else each debater revises its feedback against the other's F(i-1) (both at once)
    E*               the refiner revises E with F(final,1) + F(final,2)

so at most N revisions, the judge asked before each one and never after the last (at most N judge calls).
A judge reply that says no, or cannot be read, is no agreement.

The conversations follow Tables 8-9: each debater's opens with the error types, asked for and answered
(prompts/madr_error_typology.txt), then the explanation request (claim, label, evidence) answered with E
as the debater's own earlier turn, then its task. Debater 1 goes by the typology; Debater 2 first finds
the errors on its own and only then names their types with the typology as a reference. That is how
Figure 1 and section 3 assign the two roles; the paper's Table 9 has Debater 2 find errors by the
predefined types instead (docs/FIDELITY.md). The refiner's own earlier turn is E as well; the judge (its
prompt is ours) reads the claim, label, evidence and E up front.

Two entries, each batching every role's turn over the claims still debating:
- `refine` (--refine madr): the justification of a verification method's finished record, for its
  verdict; the verdict is kept. A record is refined whenever its justification is non-empty, even with
  no readable verdict: it can still be checked against the evidence. An empty one is left as it is
  (stop reason "no_justification").
- `explain` (--task explain --method madr): the zero-shot explanation of each claim's gold label
  (debate.methods.explain), then refined the same way.
Both run MADR's roles at --madr-temperature (the runner sets it), whatever the verification method's was.
"""
from dataclasses import dataclass, field, replace

from debate.data.parsing import read_fields, yes_no
from debate.data.prompts import format_evidence, load_prompt, render
from debate.engine import engine
from debate.methods import explain as explanations, turns

MODEL_OF = {"madr_typology": "refine", "madr_free": "refine", "madr_judge": "refine",
            "madr_refiner": "refine"}  # role -> its model flag
EXPLAIN_MODELS = {**explanations.EXPLAINER, **MODEL_OF}  # --task explain: the explainer writes E first
DEBATERS = ("madr_typology", "madr_free")
SCHEMAS = ("madr_judge", "madr_refine")  # the JSON answers it asks for (debate.data.answer_schemas)
OTHER = {"madr_typology": "madr_free", "madr_free": "madr_typology"}
FIRST_REQUEST = {"madr_typology": "madr_typology_feedback", "madr_free": "madr_free_feedback"}

AGREEMENT = "Agreement"
REFINED = "Refined Justification"
# Squeezed spellings a model may use instead of the keys asked for.
JUDGE_ALIASES = {"agree": AGREEMENT, "agreed": AGREEMENT, "agreementreached": AGREEMENT}
REFINER_ALIASES = {"justification": REFINED, "revisedjustification": REFINED, "explanation": REFINED,
                   "revisedexplanation": REFINED, "refinedexplanation": REFINED,
                   "justificationforverdict": REFINED, "refinedjustificationforverdict": REFINED}


@dataclass
class Review:
    """One claim's refinement: its conversations, the debaters' latest feedback, what was said."""

    claim: dict
    justification: str
    convs: dict  # role -> engine.Conversation
    feedback: dict = field(default_factory=dict)  # debater role -> its latest feedback
    turns: list = field(default_factory=list)
    judged: list = field(default_factory=list)  # the judge's conversations of earlier calls, for their tokens
    revisions: int = 0  # Algorithm 1's i: feedback revisions done
    judge_calls: int = 0
    stop_reason: str = "max_iterations"
    refined: str = ""
    refine_status: str = None


def start_review(claim, label, justification):
    """A review of `justification`, the explanation of `label` (text) for `claim`: E is each debater's and
    the refiner's own earlier answer to the explanation request; the debaters were told the error types first."""
    asked, answered = explanations.request(claim, label), explanations.answer_text(justification.strip())
    question, typology = load_prompt("madr_typology_question"), load_prompt("madr_error_typology")
    convs = {}
    for role in (*DEBATERS, "madr_refiner"):
        conv = convs[role] = engine.Conversation(system="")
        if role != "madr_refiner":
            conv.recall(question, typology)
        conv.recall(asked, answered)
    context = render("madr_context", claim=claim["claim"], evidence=format_evidence(claim["evidence"]),
                     verdict=label, justification=justification.strip())
    convs["madr_judge"] = engine.Conversation(system=render("madr_judge_meta", context=context))
    return Review(claim=claim, justification=justification, convs=convs)


def _speak(agents, role, reviews, prompts, round_name, settings, generator, schema_name=None):
    replies = turns.speak(agents[role], [r.convs[role] for r in reviews], prompts, settings, generator, schema_name)
    for review, prompt, reply in zip(reviews, prompts, replies):
        review.turns.append({"round": round_name, "role": role, "prompt": prompt, "response": reply})
    return replies


def judge_agrees(reply):
    """(True | False | None, how it was read); None (not readable) is treated as "not agreed"."""
    fields, status = read_fields(reply, (AGREEMENT, "Reason"), required=(AGREEMENT,), aliases=JUDGE_ALIASES)
    agreed = yes_no(fields.get(AGREEMENT))
    return agreed, (status if agreed is not None else "unparsed")


def read_refined(reply, original):
    """(justification, status): the JSON key's value ("field"), else the reply's own text ("text");
    the original when neither gives any text ("empty")."""
    text, status = explanations.read_answer(reply, REFINED, REFINER_ALIASES)
    return (text, status) if text else (original, "empty")


def _feedback(agents, reviews, round_name, settings, generator, first):
    """Every debater's feedback at once: its first (F(0,n)), or its revision against the other's previous one."""
    previous = [dict(r.feedback) for r in reviews]  # both read the other's of the iteration before
    for role in DEBATERS:
        if first:
            prompts = [load_prompt(FIRST_REQUEST[role])] * len(reviews)
        else:
            prompts = [render("madr_revise", other_feedback=p[OTHER[role]]) for p in previous]
        replies = _speak(agents, role, reviews, prompts, round_name, settings, generator)
        for review, reply in zip(reviews, replies):
            review.feedback[role] = reply


def _judge(agents, reviews, round_name, settings, generator):
    """Ask the judge whether each review's debaters agree; returns the reviews that go on."""
    for review in reviews:
        # Algorithm 1's J(F1, F2) reads the two current feedbacks only: each call is a fresh conversation over
        # the same context, so the judge's earlier questions and its earlier "No" are not in front of it.
        asked = review.convs["madr_judge"]
        if asked.messages:
            asked.drop_cache()
            review.judged.append(asked)
            review.convs["madr_judge"] = engine.Conversation(system=asked.system)
    prompts = [render("madr_judge", typology_feedback=r.feedback["madr_typology"],
                      free_feedback=r.feedback["madr_free"]) for r in reviews]
    replies = _speak(agents, "madr_judge", reviews, prompts, round_name, settings, generator, "madr_judge")
    going = []
    for review, reply in zip(reviews, replies):
        review.judge_calls += 1
        agreed, status = judge_agrees(reply)
        # A structured reply's note says "structured" in place of how the text was read.
        review.turns[-1].update({"parse_status": status, "agreement": agreed,
                                 **turns.structured_note(review.convs["madr_judge"])})
        if agreed:
            review.stop_reason = "agreement"
            for role in (*DEBATERS, "madr_judge"):
                review.convs[role].drop_cache()  # the memory goes to the claims still debating
        else:
            going.append(review)
    return going


def _debate(agents, reviews, settings, max_iterations, generator):
    """Algorithm 1 up to the refiner: the first feedback, then judge-and-revise until agreement or N revisions."""
    _feedback(agents, reviews, "madr-0", settings, generator, first=True)
    active = list(reviews)
    for i in range(1, max_iterations + 1):
        active = _judge(agents, active, f"madr-{i}", settings, generator)
        if not active:
            break
        _feedback(agents, active, f"madr-{i}", settings, generator, first=False)
        for review in active:
            review.revisions = i


def _refine_all(agents, reviews, settings, generator):
    """The refiner's revision of each review's explanation with both debaters' final feedback."""
    prompts = [render("madr_refine", typology_feedback=r.feedback["madr_typology"],
                      free_feedback=r.feedback["madr_free"]) for r in reviews]
    replies = _speak(agents, "madr_refiner", reviews, prompts, "madr-refine", settings, generator, "madr_refine")
    for review, reply in zip(reviews, replies):
        review.refined, review.refine_status = read_refined(reply, review.justification)
        review.turns[-1].update({"parse_status": review.refine_status,
                                 **turns.structured_note(review.convs["madr_refiner"])})
        for conv in review.convs.values():
            conv.drop_cache()


def refine(agents, records, claims, settings, max_iterations, streams=None, on_finish=None, gold=False):
    """Refine the justification of each of `records` (a method's output for `claims`, matched by claim_id)
    for its label (with `gold`, its claim's gold label: an explanation's); returns new records in the same
    order (each also handed to `on_finish`). See the module doc.

    Each refined prediction gets `justification_unrefined` (the original), the refined `justification`,
    `madr` = {revisions, judge_calls, stop_reason, refine_status} and the MADR conversations' tokens added
    to its own; every MADR turn is appended to the transcript.
    """
    if max_iterations < 1:
        raise ValueError(f"max_iterations must be at least 1, not {max_iterations}")
    by_id = {c["claim_id"]: c for c in claims}
    generator = turns.stream(agents, streams, settings.seed, settings)
    reviews = {}  # index into records -> Review
    for index, record in enumerate(records):
        prediction = record["prediction"]
        if (prediction.get("justification") or "").strip():
            claim = by_id[prediction["claim_id"]]
            label = claim["label"] if gold else prediction.get("label") or load_prompt("madr_no_verdict")
            reviews[index] = start_review(claim, label, prediction["justification"])
    chosen = list(reviews.values())
    if chosen:
        _debate(agents, chosen, settings, max_iterations, generator)
        _refine_all(agents, chosen, settings, generator)

    out = []
    for index, record in enumerate(records):
        prediction = dict(record["prediction"])
        transcript = dict(record["transcript"])
        prediction["justification_unrefined"] = prediction.get("justification")
        review = reviews.get(index)
        if review is None:
            prediction["madr"] = {"revisions": 0, "judge_calls": 0, "stop_reason": "no_justification",
                                  "refine_status": None}
        else:
            prediction["justification"] = review.refined
            prediction["madr"] = {"revisions": review.revisions, "judge_calls": review.judge_calls,
                                  "stop_reason": review.stop_reason, "refine_status": review.refine_status}
            for key, count in turns.token_counts([*review.convs.values(), *review.judged]).items():
                prediction[key] = prediction.get(key, 0) + count
            transcript["turns"] = list(transcript.get("turns", [])) + review.turns
        out.append({**record, "prediction": prediction, "transcript": transcript})
        if on_finish:
            on_finish(out[-1])
    return out


def explain(agents, claims, settings, max_iterations=3, streams=None, on_finish=None, labels=None, temperature=None):
    """--task explain --method madr: the explainer's zero-shot explanation of each claim's gold label at
    `settings`, then MADR at `temperature` (None: the same settings)."""
    first = explanations.zero_shot(agents, claims, settings, streams=streams)
    debating = settings if temperature is None else replace(settings, temperature=temperature)
    return refine(agents, first, claims, debating, max_iterations, streams, on_finish, gold=True)
