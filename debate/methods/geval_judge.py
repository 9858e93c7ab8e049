"""G-Eval faithfulness as MADR's paper applies it (Kim et al. 2024, section 4 and Tables 5-6, after Liu et
al. 2023): a judge model rates how faithful an explanation is to the evidence, from 1 to 5.

Four protocols, by granularity and by whether the error typology is shown (the paper's Table 2 columns):
    sentence            each sentence of the explanation rated on its own, with the evidence (Table 6)
    sentence-typology   the same, with the error typology shown and the comparison step told to use it
    document            the whole explanation rated at once (Table 5)
    document-typology   the same, with the typology
Every rating is its own one-message conversation. The judge answers {"Faithfulness": n}; structured
decoding scores each value 1-5 as a whole (a number choice, debate.engine.schema_program) and keeps each one's
probability, from which eval.geval_scores takes G-Eval's score, the probability-weighted mean. Ratings are
batched through the engine, those of one granularity together and in order of length, so a batch pads
little. What a unit is (the explanation, or one of its sentences) is the caller's to say: eval.geval_scores splits
sentences as its METEOR tokenizer does.
"""
import re

from debate.data.parsing import read_fields
from debate.data.prompts import load_prompt, render
from debate.engine import engine
from debate.methods import turns

PROTOCOLS = ("sentence", "sentence-typology", "document", "document-typology")  # Table 2's column order
SCORE_KEY = "Faithfulness"
SCORES = ("1", "2", "3", "4", "5")
SCHEMA = {"document": "geval_document", "sentence": "geval_sentence"}  # granularity -> its prompt and schema
JUDGE_TOKENS = 32  # the answer is one number in its JSON object: a few forced tokens, the value and the end


def granularity(protocol):
    """"sentence" or "document"."""
    return protocol.split("-")[0]


def uses_typology(protocol):
    return protocol.endswith("-typology")


def prompt(protocol, evidence, text):
    """The judge's message rating `text` (the explanation, or one sentence of it, as `protocol` says) against
    `evidence` (the formatted evidence block)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown G-Eval protocol {protocol!r}; the protocols are {', '.join(PROTOCOLS)}")
    block, step = "", ""
    if uses_typology(protocol):
        # The paper shows these words only when the typology is applied (Tables 5-6).
        block = "\n" + render("geval_typology", typology=load_prompt("madr_error_typology")) + "\n"
        step = ", " + load_prompt("geval_typology_step")
    unit = "explanation" if granularity(protocol) == "document" else "sentence"
    return render(SCHEMA[granularity(protocol)], typology=block, typology_step=step, evidence=evidence,
                  **{unit: text})


def read_probs(reply, structured=None):
    """({score: probability} over "1".."5", how it was read) of one judge reply: the probabilities structured
    decoding gave each score ("structured"), else the one integer score the reply names, with probability 1
    ("json", "json_repaired", "fields_regex"); (None, "unparsed") when there is none."""
    if structured is not None and SCORE_KEY in structured.get("probs", {}):
        return {str(k): float(p) for k, p in structured["probs"][SCORE_KEY].items()}, "structured"
    fields, status = read_fields(reply, (SCORE_KEY,))
    value = fields.get(SCORE_KEY)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer():
        value = str(int(value))
    match = re.fullmatch(r"\s*([1-5])(?:\s*/\s*5)?\s*\.?\s*", value) if isinstance(value, str) else None
    if match is None:
        return None, "unparsed"
    return {s: float(s == match.group(1)) for s in SCORES}, status


def judge_settings():
    """The judge's generation settings: greedy (the score is read from the probabilities, not drawn), a short
    answer, structured decoding on (the memory budget is the judge's device's pool's, debate.engine.kv_pool)."""
    return engine.Settings(max_new_tokens=JUDGE_TOKENS, temperature=0.0, structured=True)


def rate(agent, units, settings, batch_size=8):
    """Rate every unit, (protocol, evidence block, text), with `agent` (the judge's models.RoleModel).

    Returns, per unit in order, {"probs": {score: p} | None, "status", "reply"}.
    """
    prompts = [prompt(protocol, evidence, text) for protocol, evidence, text in units]
    results = [None] * len(units)
    for kind in ("document", "sentence"):
        rows = sorted((i for i, unit in enumerate(units) if granularity(unit[0]) == kind),
                      key=lambda i: len(prompts[i]))
        for start in range(0, len(rows), batch_size):
            batch = rows[start:start + batch_size]
            convs = [engine.Conversation(system="") for _ in batch]
            replies = turns.speak(agent, convs, [prompts[i] for i in batch], settings, None, SCHEMA[kind])
            for i, conv, reply in zip(batch, convs, replies):
                probs, status = read_probs(reply, conv.structured)
                results[i] = {"probs": probs, "status": status, "reply": reply}
    return results
