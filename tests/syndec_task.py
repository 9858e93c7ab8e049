"""A synthetic SynDeC-shaped task whose correct verdict is written in the debate itself.

Each record is a real DebateCV transcript shape (real prompt files, one round, then the final prompt):
both Debaters keep saying the claim is "supported" or "refuted", and the gold verdict is that word.
A Moderator that reads the debate can get every claim right; one that ignores it gets half.
"""
import json

from debate.data.labels import AVERITEC, REFUTED, SUPPORTED
from debate.data.prompts import render

AV = {"label_choices": AVERITEC.choices(), "label_answer": AVERITEC.answer_format()}

JUSTIFICATION = "The debate settles it."
PROCEED = json.dumps({"Primary Insight": "both sides repeat", "Evidence Gaps": "", "Justification for Proceeding": "",
                      "Proceeding Necessity": "Yes", "Justification for Verdict": "", "Verdict": ""})


def final_reply(verdict):
    return json.dumps({"Justification for Verdict": JUSTIFICATION, "Verdict": verdict})


def record(i, gold, predicted=None, corrected=None):
    """Record `i` with gold verdict `gold`; `predicted` (default: gold) is what the Moderator said."""
    predicted = gold if predicted is None else predicted
    word = "supported" if gold == SUPPORTED else "refuted"
    aff = " ".join([f"The claim is {word} by the evidence."] * 4)
    neg = " ".join([f"The claim is {word}."] * 8)
    claim = f"Claim {i}: the minister said it."
    return {
        "claim_id": i, "claim": claim,
        "evidence": [{"question": "Who said it?", "answer": "The minister.", "url": ""}],
        "debate": [
            {"round": 1, "role": "affirmative", "prompt": render("affirmative_opening", claim=claim), "response": aff},
            {"round": 1, "role": "negative", "prompt": render("negative_opening", opponent_argument=aff),
             "response": neg},
            {"round": 1, "role": "moderator", "response": PROCEED,
             "prompt": render("moderator_round", round=1, affirmative_argument=aff, negative_argument=neg, **AV)},
            {"round": "final", "role": "moderator", "response": final_reply(predicted),
             "prompt": render("moderator_final", affirmative_argument=aff, negative_argument=neg, claim=claim, **AV)},
        ],
        "gold_label": gold, "predicted_label": predicted, "predicted_justification": JUSTIFICATION,
        "correct": predicted == gold, "corrected_justification": corrected,
    }


def records(n, start=0, wrong=False):
    """n records alternating Supported / Refuted; `wrong`: the Moderator said the other label (corrected)."""
    out = []
    for i in range(start, start + n):
        gold = SUPPORTED if i % 2 else REFUTED
        other = REFUTED if gold == SUPPORTED else SUPPORTED
        out.append(record(i, gold, other, JUSTIFICATION) if wrong else record(i, gold))
    return out
