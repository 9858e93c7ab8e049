"""MADR (Kim et al. 2024): a debate over a justification's errors, then a rewrite faithful to the evidence.

Works on the finished records of any method. Per claim, iteration 1: Debater 1 lists the justification's
errors by a fixed typology (prompts/madr_error_typology.txt); Debater 2 sees the same typology but finds
the errors without going by it and only names their types with it afterwards (the paper's Figure 1). From
iteration 2 on, each debater reads the other's feedback of the iteration before (both at once, so
neither answers a reply to itself) and revises its own, point by point. After every iteration the
judge says whether the two agree; a clear "Yes" stops the debate, anything else (a "No", an
unreadable reply) goes on, up to `max_iterations`. The refiner then revises the justification with
both final feedbacks, changing nothing the feedback does not ask for; the verdict is kept.

A record is refined whenever its justification is non-empty, even with no readable verdict: the
justification can still be checked against the evidence, and the verdict is never changed. An empty
justification is left as it is (stop reason "no_justification").

Claims are refined in batches: each role's turn for every claim still debating is one batched call.
"""
from dataclasses import dataclass, field

from debate.engine import engine
from debate.methods import turns
from debate.data.parsing import read_fields, yes_no
from debate.data.prompts import format_evidence, load_prompt, render

MODEL_OF = {"madr_typology": "refine", "madr_free": "refine", "madr_judge": "refine",
            "madr_refiner": "refine"}  # role -> its model flag
DEBATERS = ("madr_typology", "madr_free")
SCHEMAS = ("madr_judge", "madr_refine")  # the JSON answers it asks for (debate.data.schemas)
OTHER = {"madr_typology": "madr_free", "madr_free": "madr_typology"}
FIRST_REQUEST = {"madr_typology": "madr_typology_feedback", "madr_free": "madr_free_feedback"}

AGREEMENT = "Agreement"
REFINED = "Refined Justification"
# Squeezed spellings a model may use instead of the keys asked for.
JUDGE_ALIASES = {"agree": AGREEMENT, "agreed": AGREEMENT, "agreementreached": AGREEMENT}
REFINER_ALIASES = {"justification": REFINED, "revisedjustification": REFINED,
                   "justificationforverdict": REFINED, "refinedjustificationforverdict": REFINED}


@dataclass
class Review:
    """One claim's refinement: its conversations, the debaters' latest feedback, what was said."""

    claim: dict
    justification: str
    convs: dict  # role -> engine.Conversation
    feedback: dict = field(default_factory=dict)  # debater role -> its latest feedback
    turns: list = field(default_factory=list)
    iterations: int = 0
    stop_reason: str = "max_iterations"
    refined: str = ""
    refine_status: str = None


def start_review(claim, prediction):
    """A review of `prediction`'s justification; every role reads the same claim, evidence and verdict."""
    justification = prediction["justification"]
    verdict = prediction.get("label") or load_prompt("madr_no_verdict")
    context = render("madr_context", claim=claim["claim"], evidence=format_evidence(claim["evidence"]),
                     verdict=verdict, justification=justification.strip())
    typology = load_prompt("madr_error_typology")
    # Both debaters see the typology (the paper's Tables 8-9 open both conversations with it); the free
    # one is told to find errors without going by it and to use it only to name what it found (Figure 1).
    systems = {
        "madr_typology": render("madr_typology_meta", typology=typology, context=context),
        "madr_free": render("madr_free_meta", typology=typology, context=context),
        "madr_judge": render("madr_judge_meta", context=context),
        "madr_refiner": render("madr_refiner_meta", context=context),
    }
    return Review(claim=claim, justification=justification,
                  convs={role: engine.Conversation(system=text) for role, text in systems.items()})


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
    fields, _ = read_fields(reply, (REFINED,), aliases=REFINER_ALIASES)
    if REFINED in fields:
        # The key was there: its value is the answer, even when empty; the JSON around it is no justification.
        value = fields[REFINED]
        text = value.strip() if isinstance(value, str) else "" if value is None else str(value).strip()
        return (text, "field") if text else (original, "empty")
    text = reply.strip() if isinstance(reply, str) else ""
    return (text, "text") if text else (original, "empty")


def _debate(agents, reviews, settings, max_iterations, generator):
    """Run the debaters and the judge until each review agrees or hits the cap."""
    active = list(reviews)
    for i in range(1, max_iterations + 1):
        if not active:
            break
        round_name = f"madr-{i}"
        # Both debaters revise against the other's feedback of the previous iteration.
        previous = [dict(r.feedback) for r in active]
        for role in DEBATERS:
            if i == 1:
                prompts = [load_prompt(FIRST_REQUEST[role])] * len(active)
            else:
                prompts = [render("madr_revise", other_feedback=p[OTHER[role]]) for p in previous]
            replies = _speak(agents, role, active, prompts, round_name, settings, generator)
            for review, reply in zip(active, replies):
                review.feedback[role] = reply
        prompts = [render("madr_judge", typology_feedback=r.feedback["madr_typology"],
                          free_feedback=r.feedback["madr_free"]) for r in active]
        replies = _speak(agents, "madr_judge", active, prompts, round_name, settings, generator, "madr_judge")
        still = []
        for review, reply in zip(active, replies):
            review.iterations = i
            agreed, status = judge_agrees(reply)
            # A structured reply's note says "structured" in place of how the text was read.
            review.turns[-1].update({"parse_status": status, "agreement": agreed,
                                     **turns.structured_note(review.convs["madr_judge"])})
            if agreed:
                review.stop_reason = "agreement"
                for role in (*DEBATERS, "madr_judge"):
                    review.convs[role].drop_cache()  # the memory goes to the claims still debating
            else:
                still.append(review)
        active = still


def refine(agents, records, claims, settings, max_iterations, streams=None):
    """Refine the justification of each of `records` (a method's output for `claims`, matched by
    claim_id); returns new records in the same order. See the module doc for the protocol.

    Each refined prediction gets `justification_unrefined` (the original), the refined `justification`,
    `madr` = {iterations, stop_reason, refine_status} and the MADR conversations' tokens added to its
    own; every MADR turn is appended to the transcript.
    """
    if max_iterations < 1:
        raise ValueError(f"max_iterations must be at least 1, not {max_iterations}")
    by_id = {c["claim_id"]: c for c in claims}
    generator = turns.stream(agents, streams, settings.seed, settings)
    reviews = {}  # index into records -> Review
    for index, record in enumerate(records):
        prediction = record["prediction"]
        if (prediction.get("justification") or "").strip():
            reviews[index] = start_review(by_id[prediction["claim_id"]], prediction)
    chosen = list(reviews.values())
    _debate(agents, chosen, settings, max_iterations, generator)

    prompts = [render("madr_refine", typology_feedback=r.feedback["madr_typology"],
                      free_feedback=r.feedback["madr_free"]) for r in chosen]
    replies = _speak(agents, "madr_refiner", chosen, prompts, "madr-refine", settings, generator, "madr_refine")
    for review, reply in zip(chosen, replies):
        review.refined, review.refine_status = read_refined(reply, review.justification)
        review.turns[-1].update({"parse_status": review.refine_status,
                                 **turns.structured_note(review.convs["madr_refiner"])})
        for conv in review.convs.values():
            conv.drop_cache()

    out = []
    for index, record in enumerate(records):
        prediction = dict(record["prediction"])
        transcript = dict(record["transcript"])
        prediction["justification_unrefined"] = prediction.get("justification")
        review = reviews.get(index)
        if review is None:
            prediction["madr"] = {"iterations": 0, "stop_reason": "no_justification", "refine_status": None}
        else:
            prediction["justification"] = review.refined
            prediction["madr"] = {"iterations": review.iterations, "stop_reason": review.stop_reason,
                                  "refine_status": review.refine_status}
            for key, count in turns.token_counts(review.convs.values()).items():
                prediction[key] = prediction.get(key, 0) + count
            transcript["turns"] = list(transcript.get("turns", [])) + review.turns
        out.append({**record, "prediction": prediction, "transcript": transcript})
    return out
