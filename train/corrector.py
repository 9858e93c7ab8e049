"""The Corrector: for each wrong SynDeC prediction, a justification of how the gold verdict follows.

It reads exactly the paper's inputs (Appendix B.3): the debate recording (both Debaters' arguments,
round by round), the Moderator's "Primary Insight" of each round and the gold verdict, with no system
prompt; it answers with "Justification for Verdict" in JSON. The claim, evidence and wrong verdict are
left out as the paper leaves them out.
The justification comes from the key when it can be found (status "field", JSON or not); a reply
without it keeps its whole text (status "text"); an empty one is recorded with
status "empty" and that record stays out of D-DPO.
"""
from pathlib import Path

from debate.data import jsonl
from debate.data.parsing import parse_moderator
from debate.data.prompts import render
from debate.engine import engine, schema_program
from debate.engine.models import adapter_scope
from debate.pipeline import records, stops

SPEAKERS = {"affirmative": "Affirmative Debater", "negative": "Negative Debater"}


def prompt_for(record):
    """The Corrector's user message for one wrong record."""
    debate = "\n\n".join(
        render("debate_turn", round=t.get("round", ""), speaker=SPEAKERS[t["role"]], argument=t["response"].strip())
        for t in record["debate"] if t["role"] in SPEAKERS and t.get("kind") != "query")  # queries argue nothing
    insights = []
    for t in record["debate"]:
        if t["role"] == "moderator" and t.get("round") != "final":
            insight = parse_moderator(t["response"])["fields"].get("Primary Insight")
            if isinstance(insight, str) and insight.strip():
                insights.append(f"Round {t.get('round')}: {insight.strip()}")
    return render("corrector", debate=debate or "(no arguments were recorded)",
                  insights="\n".join(insights) or "(none)", gold_verdict=record["gold_label"])


def read_justification(reply, structured=None):
    """(justification, status): from the JSON key if it is there, else the reply's own text; decoded under
    the schema, the key's value ("structured", or "empty" when the model wrote nothing)."""
    if structured is not None:
        text = structured["fields"]["Justification for Verdict"]
        return (text, "structured") if text else ("", "empty")
    justification = parse_moderator(reply)["justification"]
    if justification:
        return justification, "field"
    text = reply.strip()
    return (text, "text") if text else ("", "empty")


def read_done(path):
    """{claim_id: correction row} already written; a torn last line is cut off (that claim is redone)."""
    return {row["claim_id"]: row for row in records.read_jsonl(Path(path))}


def correct(agent, rows, out_path, settings, batch_size=8, on_batch=None):
    """Write a correction for every wrong record not yet in `out_path` (JSONL, appended batch by batch)."""
    done = read_done(out_path)
    todo = [r for r in rows if not r["correct"] and r["claim_id"] not in done]
    with open(out_path, "a", encoding="utf-8", newline="\n") as f:
        for i in range(0, len(todo), batch_size):
            batch = todo[i:i + batch_size]
            convs = [engine.Conversation(system="") for _ in batch]
            compiled = schema_program.compile_for("corrector", agent.tokenizer) if settings.structured else None
            with adapter_scope(agent):
                replies = engine.generate(agent.model, agent.tokenizer, convs, [prompt_for(r) for r in batch],
                                          settings, schemas=[compiled] * len(batch) if compiled else None)
            rows = []
            for record, reply, conv in zip(batch, replies, convs):
                justification, status = read_justification(reply, conv.structured)
                rows.append({"claim_id": record["claim_id"], "corrected_justification": justification,
                             "status": status, "response": reply})
                done[record["claim_id"]] = rows[-1]
            with stops.deferred():  # a batch is durable before the next one runs, and never cut by Ctrl-C
                jsonl.append_durably(f, rows)
            if on_batch:
                on_batch(len(batch))
    return done


def merge(rows, corrections):
    """The records with their corrected justifications filled in (wrong records only)."""
    out = []
    for r in rows:
        c = corrections.get(r["claim_id"])
        text = c["corrected_justification"] if c and not r["correct"] else None
        out.append(dict(r, corrected_justification=text or None))
    return out
