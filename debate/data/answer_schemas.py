"""The JSON object a prompt asks for, declared beside the prompt: read and checked here, compiled for a
tokenizer and decoded by the engine (debate.engine.schema_program).

`prompts/<name>.schema.json` declares the object's fields in the order the prompt shows them:

    {"reasoning": false,              # true: free text may come first (the prompt asks for it), then the object
     "reasoning_share": 2,            # its part of the free tokens, against the fields' shares
     "fields": [
       {"key": "Primary Insight", "type": "text", "share": 1},
       {"key": "Proceeding Necessity", "type": "choice", "values": ["Yes", "No"]},
       {"key": "Verdict", "type": "choice", "values": "labels", "when": {"Proceeding Necessity": "No"}},
       {"key": "Relevance", "type": "number", "min": 0, "max": 1, "step": 0.1},
       {"key": "Faithfulness", "type": "number", "min": 1, "max": 5, "step": 1, "scored": true},
       {"key": "Premises", "type": "list", "max_items": 5, "share": 2}]}

- text: the model's own words inside quotes; a token that would break the string (a quote not at its
  start, a backslash, a control character) is never chosen; a token starting with a quote, or an
  end-of-turn token, closes the field.
- choice: one of `values` ("labels": the run's dataset's labels, filled in when the schema is compiled),
  picked from the model's probability of each whole value (every token of it, plus the token that closes
  it): greedy takes the most probable, sampling draws from them; the probabilities are kept (`label_probs`).
- number: one of min, min+step, ..., max, written as a JSON number and generated token by token like text,
  at the role's temperature (greedy at 0), each token limited to those that keep the text on the way to an
  allowed value; no probabilities are kept. `"scored": true` makes it a choice instead (every value scored
  whole, the probabilities kept): for a score whose distribution is read, as G-Eval's 1-5 is.
- list: text items, at most `max_items`; after each item a choice between going on and closing the list.
- when: the field is written empty ("") unless the earlier fields named hold those values.
"""
import functools
import json
from dataclasses import dataclass, replace

from debate.data.prompts import PROMPT_DIR, PromptError

KINDS = ("text", "choice", "number", "list")
NAMED_VALUES = ("labels",)  # value lists a schema names rather than lists: the dataset's verdict labels


@dataclass(frozen=True)
class Field:
    key: str
    kind: str
    values: tuple = ()  # choice and number: the values as written (none for a named list)
    named: str = None  # choice: the named value list it takes ("labels"), filled in when compiled
    scored: bool = False  # number: scored as a choice (its probabilities kept) rather than generated
    share: float = 1.0  # text and list: part of the free tokens
    max_items: int = 1  # list
    when: tuple = ()  # ((key, value), ...) that must hold, else the field is written empty


@dataclass(frozen=True)
class Spec:
    name: str
    fields: tuple
    reasoning: bool = False
    reasoning_share: float = 1.0

    @property
    def keys(self):
        return tuple(f.key for f in self.fields)


def schema_path(name):
    """The schema file of prompt `name`, prompts/<name>.schema.json (it may not exist)."""
    return PROMPT_DIR / f"{name}.schema.json"


def _number_values(spec, where):
    try:
        low, high, step = (float(spec[k]) for k in ("min", "max", "step"))
    except (KeyError, TypeError, ValueError):
        raise PromptError(f"{where}: a number field needs numeric min, max and step") from None
    if step <= 0 or high < low:
        raise PromptError(f"{where}: a number field needs step > 0 and min <= max")
    decimals = len(repr(step).split(".")[1].rstrip("0")) if "." in repr(step) and not step.is_integer() else 0
    count = int(round((high - low) / step)) + 1
    return tuple(f"{low + i * step:.{decimals}f}" for i in range(count))


@functools.lru_cache(maxsize=None)
def load(name):
    """The declared schema of prompt `name` (prompts/<name>.schema.json); errors name the file and field."""
    path = schema_path(name)
    if not path.is_file():
        raise PromptError(f"prompt {name!r}: no schema file {path}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise PromptError(f"{path}: not JSON ({err})") from None
    fields = []
    for i, spec in enumerate(raw.get("fields") or []):
        where = f"{path}: fields[{i}]"
        kind = spec.get("type")
        if kind not in KINDS or not isinstance(spec.get("key"), str):
            raise PromptError(f"{where}: needs a string 'key' and a 'type' among {', '.join(KINDS)}")
        values, named = (), None
        if kind == "choice":
            values = spec.get("values")
            if isinstance(values, str) and values in NAMED_VALUES:
                values, named = (), values
            elif not values or isinstance(values, str) or not all(
                    isinstance(v, str) and v and '"' not in v for v in values):
                raise PromptError(f"{where}: 'values' must be a list of non-empty strings or one of "
                                  f"{', '.join(NAMED_VALUES)}")
        elif kind == "number":
            values = _number_values(spec, where)
        scored = spec.get("scored", False)
        if not isinstance(scored, bool) or (scored and kind != "number"):
            raise PromptError(f"{where}: 'scored' is true or false, on a number field only (choices are always scored)")
        when = spec.get("when") or {}
        if not isinstance(when, dict) or any(k not in [f.key for f in fields] for k in when):
            raise PromptError(f"{where}: 'when' must name earlier fields")
        if when and kind not in ("text", "choice"):
            raise PromptError(f"{where}: only text and choice fields can be conditional (they are left empty)")
        fields.append(Field(key=spec["key"], kind=kind, values=tuple(values), named=named, scored=scored,
                            share=float(spec.get("share", 1)),
                            max_items=int(spec.get("max_items", 1)), when=tuple(when.items())))
    if not fields:
        raise PromptError(f"{path}: no fields")
    return Spec(name=name, fields=tuple(fields), reasoning=bool(raw.get("reasoning", False)),
                reasoning_share=float(raw.get("reasoning_share", 1)))


def resolve(spec, labels):
    """`spec` with its named value lists filled in: a "labels" choice takes `labels` (the dataset's label strings,
    in their order)."""
    if not any(f.named for f in spec.fields):
        return spec
    return replace(spec, fields=tuple(replace(f, values=tuple(labels)) if f.named == "labels" else f
                                      for f in spec.fields))
