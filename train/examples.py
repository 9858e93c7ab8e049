"""SynDeC records as token sequences for the Moderator: its debate conversation, then a target reply.

The context is exactly what the Moderator saw when it gave its verdict: its meta prompt with the
claim and evidence, every earlier round prompt with its own reply, and the prompt of the turn that
ended the debate (a round prompt answered "No", or the final prompt). The target is that turn's
reply, written as clean JSON with the keys that prompt asks for, followed by the template's
end-of-turn marker. Only target tokens carry a loss (labels are -100 elsewhere).

Too long for `max_length` (the rule, in order): drop the oldest earlier rounds (prompt and reply);
then drop evidence items from the end of the list; if the bare prompt plus target still does not
fit, the record is skipped. The target is never cut. Each step is counted.
"""
import json
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from debate.data.parsing import KEYS, parse_moderator
from debate.engine import chat, engine
from debate.methods import debatecv
from train import syndec

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

IGNORE = -100
FINAL_KEYS = ("Justification for Verdict", "Verdict")
Record = Dict[str, Any]  # a SynDeC record (train/syndec.py)
Example = Optional[Dict[str, Any]]  # {"input_ids", "labels"} or {"chosen", "rejected"}; None: skipped


def dialogue(record: Record) -> Tuple[List[Tuple[str, str]], str, str, bool]:
    """(earlier [(prompt, reply)], last prompt, last reply, ended by the final prompt) of the Moderator."""
    turns = [t for t in record["debate"] if t["role"] == "moderator"]
    earlier = [(t["prompt"], t["response"]) for t in turns[:-1]]
    last = turns[-1]
    return earlier, last["prompt"], last["response"], last.get("round") == "final"


def reply_json(fields: Mapping[str, Any], final: bool) -> str:
    """A Moderator reply as the prompt asks for it: the final prompt's two keys or a round's six."""
    keys = FINAL_KEYS if final else KEYS
    return json.dumps({k: str(fields.get(k) or "") for k in keys}, ensure_ascii=False, indent=2)


def sft_target(record: Record) -> str:
    """The Moderator's own final reply, cleaned to the JSON its prompt asked for; for a wrong record
    (trained only with --sft-include-corrected), the gold verdict with the corrected justification."""
    if not record["correct"]:
        return dpo_pair(record)[0]
    _, _, reply, final = dialogue(record)
    parsed = parse_moderator(reply, labels=syndec.labels_of(record))
    fields = dict(parsed["fields"], Verdict=parsed["verdict"] or "")
    if not final:
        fields["Proceeding Necessity"] = "No"
    return reply_json(fields, final)


def dpo_pair(record: Record) -> Tuple[str, str]:
    """(chosen, rejected): the gold verdict with the corrected justification against the original reply.

    Both are written the same way (clean JSON, the other keys copied from the original), so the pair
    differs in verdict and justification only, not in formatting. A reply with no readable fields is
    the rejected one verbatim.
    """
    _, _, reply, final = dialogue(record)
    parsed = parse_moderator(reply, labels=syndec.labels_of(record))
    fields = dict(parsed["fields"])
    if not final:
        fields["Proceeding Necessity"] = "No"
    chosen = reply_json(dict(fields, Verdict=record["gold_label"],
                             **{"Justification for Verdict": record["corrected_justification"]}), final)
    if parsed["fields"]:
        rejected = reply_json(dict(fields, Verdict=parsed["verdict"] or fields.get("Verdict") or ""), final)
    else:
        rejected = reply.strip()
    return chosen, rejected


def conversation(tokenizer: "PreTrainedTokenizerBase", record: Record,
                 earlier: Optional[Sequence[Tuple[str, str]]] = None,
                 evidence: Optional[List[Dict[str, Any]]] = None) -> Tuple[engine.Conversation, str]:
    """(the Moderator's Conversation up to its last turn, that turn's prompt), for the engine to answer."""
    all_earlier, last_prompt, _, _ = dialogue(record)
    earlier = all_earlier if earlier is None else earlier
    evidence = record["evidence"] if evidence is None else evidence
    conv = engine.Conversation(system=debatecv.moderator_system(record["claim"], evidence, syndec.labels_of(record)))
    for prompt, reply in earlier:
        conv.messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]
        conv.generated.append(chat.encode_text(tokenizer, reply))
    return conv, last_prompt


def _context(tokenizer: "PreTrainedTokenizerBase", record: Record, earlier: Sequence[Tuple[str, str]],
             last_prompt: str, evidence: List[Dict[str, Any]]) -> List[int]:
    conv, last_prompt = conversation(tokenizer, record, earlier, evidence)
    conv.messages.append({"role": "user", "content": last_prompt})
    return chat.context_ids(tokenizer, conv)


def fit_context(tokenizer: "PreTrainedTokenizerBase", record: Record,
                budget: int) -> Tuple[Optional[List[int]], str]:
    """The longest context under the truncation rule that leaves `budget` tokens; (ids, how) or (None, why)."""
    earlier, last_prompt, _, _ = dialogue(record)
    evidence = list(record["evidence"])
    ids = _context(tokenizer, record, earlier, last_prompt, evidence)
    how = "kept"
    while len(ids) > budget and earlier:
        earlier, how = earlier[1:], "dropped_rounds"
        ids = _context(tokenizer, record, earlier, last_prompt, evidence)
    while len(ids) > budget and evidence:
        evidence, how = evidence[:-1], "dropped_evidence"
        ids = _context(tokenizer, record, earlier, last_prompt, evidence)
    if len(ids) > budget:
        return None, "skipped_too_long"
    return ids, how


def target_ids(tokenizer: "PreTrainedTokenizerBase", text: str) -> List[int]:
    return chat.encode_text(tokenizer, text) + chat.turn_end_ids(tokenizer)


def sft_example(tokenizer: "PreTrainedTokenizerBase", record: Record, max_length: int) -> Tuple[Example, str]:
    """{"input_ids", "labels"} for one correct record, or (None, why); second value says what was cut."""
    target = target_ids(tokenizer, sft_target(record))
    context, how = fit_context(tokenizer, record, max_length - len(target))
    if context is None:
        return None, how
    return {"input_ids": context + target, "labels": [IGNORE] * len(context) + target}, how


def dpo_example(tokenizer: "PreTrainedTokenizerBase", record: Record, max_length: int) -> Tuple[Example, str]:
    """{"chosen": {...}, "rejected": {...}} over one shared context, or (None, why)."""
    chosen, rejected = (target_ids(tokenizer, t) for t in dpo_pair(record))
    context, how = fit_context(tokenizer, record, max_length - max(len(chosen), len(rejected)))
    if context is None:
        return None, how
    def side(target: List[int]) -> Dict[str, Any]:
        return {"input_ids": context + target, "labels": [IGNORE] * len(context) + target}

    return {"chosen": side(chosen), "rejected": side(rejected)}, how


def build(tokenizer: "PreTrainedTokenizerBase", rows: Iterable[Record],
          make: Callable[["PreTrainedTokenizerBase", Record, int], Tuple[Example, str]],
          max_length: int) -> Tuple[List[Dict[str, Any]], Counter]:
    """Tokenise every record with `make`; returns (examples, Counter of kept/dropped_rounds/...)."""
    examples: List[Dict[str, Any]]
    counts: Counter  # kept / dropped_rounds / ... -> records
    examples, counts = [], Counter()
    for row in rows:
        example, how = make(tokenizer, row, max_length)
        counts[how] += 1
        if example is not None:
            examples.append(example)
    return examples, counts
