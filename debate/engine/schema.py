"""Structured decoding: the JSON object a prompt asks for, declared beside the prompt, decoded so that
any model, however small, answers with a readable object.

`prompts/<name>.schema.json` declares the object's fields in the order the prompt shows them:

    {"reasoning": false,              # true: free text may come first (the prompt asks for it), then the object
     "reasoning_share": 2,            # its part of the free tokens, against the fields' shares
     "fields": [
       {"key": "Primary Insight", "type": "text", "share": 1},
       {"key": "Proceeding Necessity", "type": "choice", "values": ["Yes", "No"]},
       {"key": "Verdict", "type": "choice", "values": "labels", "when": {"Proceeding Necessity": "No"}},
       {"key": "Relevance", "type": "number", "min": 0, "max": 1, "step": 0.1},
       {"key": "Premises", "type": "list", "max_items": 5, "share": 2}]}

- text: the model's own words inside quotes; a token that would break the string (a quote not at its
  start, a backslash, a control character) is never chosen; a token starting with a quote, or an
  end-of-turn token, closes the field.
- choice: one of `values` ("labels": the four AVeriTeC labels), picked from the model's probability of
  each whole value (every token of it, plus the token that closes it): greedy takes the most probable,
  sampling draws from them; the probabilities are kept (`label_probs`).
- number: a choice among min, min+step, ..., max, written as a JSON number.
- list: text items, at most `max_items`; after each item a choice between going on and closing the list.
- when: the field is written empty ("") unless the earlier fields named hold those values.

Keys, quotes and punctuation are forced tokens. Each piece of the object is tokenised on its own, so
the tokens an object needs besides free text are known in advance: free text gets what is left of
--max-new-tokens, shared out field by field, and the object always closes within the limit.

`program(compiled, limit)` is the decoder of one reply as a generator the engine drives; it yields
    ("force", ids)            feed these ids, one per step
    ("text", cap, mode)       sample under `mode`'s mask ("text" or "reasoning") until a closing token or
                              `cap` tokens; send back the ids
    ("choose", candidates)    score each candidate id list as a whole; send back (index, probabilities)
and returns {"schema", "reasoning", "fields", "probs", "offsets"} (offsets: where each choice's value starts
within the reply's ids).
"""
import functools
import json
from dataclasses import dataclass, field as dataclass_field

import torch

from debate.labels import LABELS
from debate.prompts import PROMPT_DIR, PromptError

KINDS = ("text", "choice", "number", "list")
NAMED_VALUES = {"labels": list(LABELS)}
INDENT = "\n  "


class SchemaBudgetError(ValueError):
    """--max-new-tokens cannot hold a schema's keys and punctuation."""


@dataclass(frozen=True)
class Field:
    key: str
    kind: str
    values: tuple = ()  # choice and number: the values as written
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
        values = ()
        if kind == "choice":
            values = spec.get("values")
            values = NAMED_VALUES.get(values, values) if isinstance(values, str) else values
            if not values or not all(isinstance(v, str) and v and '"' not in v for v in values):
                raise PromptError(f"{where}: 'values' must be a list of non-empty strings or one of "
                                  f"{', '.join(NAMED_VALUES)}")
        elif kind == "number":
            values = _number_values(spec, where)
        when = spec.get("when") or {}
        if not isinstance(when, dict) or any(k not in [f.key for f in fields] for k in when):
            raise PromptError(f"{where}: 'when' must name earlier fields")
        if when and kind not in ("text", "choice"):
            raise PromptError(f"{where}: only text and choice fields can be conditional (they are left empty)")
        fields.append(Field(key=spec["key"], kind=kind, values=tuple(values), share=float(spec.get("share", 1)),
                            max_items=int(spec.get("max_items", 1)), when=tuple(when.items())))
    if not fields:
        raise PromptError(f"{path}: no fields")
    return Spec(name=name, fields=tuple(fields), reasoning=bool(raw.get("reasoning", False)),
                reasoning_share=float(raw.get("reasoning_share", 1)))


def _quoted(f):
    return f.kind in ("text", "choice")


@dataclass
class Compiled:
    """A schema tokenised for one tokenizer: the forced pieces, the choices' ids and the fixed cost."""
    spec: Spec
    tokenizer: object
    prefix: list  # per field: ids of what comes before its value ('{\n  "Key": "' or ',\n  "Key": ')
    suffix: list  # per field: ids after its value ('"' for quoted fields, nothing for numbers)
    candidates: list  # per field: choice/number -> list of candidate id lists (value + closing token)
    values: list  # per field: choice/number -> value ids (what is fed once chosen)
    list_go_on: list = dataclass_field(default_factory=list)  # ids of '", "' (another item)
    list_close: list = dataclass_field(default_factory=list)  # ids of '"]'
    end: list = dataclass_field(default_factory=list)  # ids of '\n}'
    rest: list = dataclass_field(default_factory=list)  # per field: fixed cost of every later field + end

    def field_cost(self, i):
        f = self.spec.fields[i]
        cost = len(self.prefix[i]) + len(self.suffix[i])
        if f.kind in ("choice", "number"):
            cost += max(len(v) for v in self.values[i])
        if f.kind == "list":
            cost += f.max_items * max(len(self.list_go_on), len(self.list_close))
        return cost

    @property
    def fixed_cost(self):
        """Tokens the object needs besides free text, at most."""
        return self.field_cost(0) + self.rest[0]


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def compile_for(name, tokenizer):
    """The schema of prompt `name` tokenised for `tokenizer` (cached per tokenizer)."""
    cache = _compiled_cache(tokenizer)
    if name not in cache:
        cache[name] = _compile(load(name), tokenizer)
    return cache[name]


_BY_TOKENIZER = {}


def _compiled_cache(tokenizer):
    # Keyed by identity: one loaded tokenizer is shared by every role of a model.
    return _BY_TOKENIZER.setdefault(id(tokenizer), (tokenizer, {}))[1]


def _compile(spec, tokenizer):
    fields = spec.fields
    prefix, suffix, candidates, values = [], [], [], []
    for i, f in enumerate(fields):
        lead = "{" if i == 0 else ","
        opening = {"text": '"', "choice": '"', "number": "", "list": '["'}[f.kind]
        prefix.append(_ids(tokenizer, f'{lead}{INDENT}"{f.key}": {opening}'))
        suffix.append(_ids(tokenizer, '"') if _quoted(f) else [])
    end = _ids(tokenizer, "\n}")
    for i, f in enumerate(fields):
        if f.kind in ("choice", "number"):
            vals = [_ids(tokenizer, v) for v in f.values]
            # The token after the value closes it, so a value that is a prefix of another ("1" of "10")
            # is scored as itself: the quote for quoted values, the next piece's first token for numbers.
            after = suffix[i] if _quoted(f) else (prefix[i + 1] if i + 1 < len(fields) else end)
            candidates.append([v + after[:1] for v in vals])
            values.append(vals)
        else:
            candidates.append(None)
            values.append(None)
    c = Compiled(spec=spec, tokenizer=tokenizer, prefix=prefix, suffix=suffix, candidates=candidates,
                 values=values, list_go_on=_ids(tokenizer, '", "'), list_close=_ids(tokenizer, '"]'), end=end)
    rest, total = [0] * len(fields), len(end)
    for i in range(len(fields) - 1, -1, -1):
        rest[i] = total
        total += c.field_cost(i)
    c.rest = rest
    return c


def check_budget(compiled, max_new_tokens):
    """Refuse a --max-new-tokens that cannot hold the object's keys and punctuation (plus one free token
    per text field and the end-of-turn token)."""
    texts = sum(f.kind in ("text", "list") for f in compiled.spec.fields) + compiled.spec.reasoning
    need = compiled.fixed_cost + texts + 1
    if max_new_tokens < need:
        raise SchemaBudgetError(
            f"--max-new-tokens {max_new_tokens} is too small for the JSON answer of prompt "
            f"{compiled.spec.name!r}: its keys and punctuation alone need {need} tokens with this tokenizer")


def program(c, limit):
    """Decode one reply under compiled schema `c` in at most `limit` tokens (see the module doc)."""
    spec, used = c.spec, 0
    result = {"schema": spec.name, "reasoning": "", "fields": {}, "probs": {}, "offsets": {}}
    # Shares of the free-text slots still to come; a skipped field gives its share back.
    shares = sum(f.share for f in spec.fields if f.kind in ("text", "list")) + (
        spec.reasoning_share if spec.reasoning else 0)

    def cap(share, reserve):
        free = max(0, limit - used - reserve)
        return int(free * share / shares) if shares > 0 else 0

    def decode(ids):
        return c.tokenizer.decode(ids, skip_special_tokens=True).strip()

    if spec.reasoning:
        ids = yield ("text", cap(spec.reasoning_share, c.field_cost(0) + c.rest[0]), "reasoning")
        used += len(ids)
        shares -= spec.reasoning_share
        result["reasoning"] = decode(ids)

    for i, f in enumerate(spec.fields):
        active = all(result["fields"].get(k) == v for k, v in f.when)
        yield ("force", c.prefix[i])
        used += len(c.prefix[i])
        if not active:
            shares -= f.share if f.kind == "text" else 0
            yield ("force", c.suffix[i])  # an empty string
            used += len(c.suffix[i])
            result["fields"][f.key] = ""
            continue
        if f.kind == "text":
            ids = yield ("text", cap(f.share, len(c.suffix[i]) + c.rest[i]), "text")
            used += len(ids)
            shares -= f.share
            result["fields"][f.key] = decode(ids)
        elif f.kind in ("choice", "number"):
            index, probs = yield ("choose", c.candidates[i])
            result["offsets"][f.key] = used
            result["probs"][f.key] = dict(zip(f.values, probs))
            yield ("force", c.values[i][index])
            used += len(c.values[i][index])
            value = f.values[index]
            result["fields"][f.key] = value if f.kind == "choice" else json.loads(value)
        else:  # list
            items, item_share = [], f.share / f.max_items
            close = max(len(c.list_go_on), len(c.list_close))
            for k in range(f.max_items):
                ids = yield ("text", cap(item_share, (f.max_items - k) * close + c.rest[i]), "text")
                used += len(ids)
                shares -= item_share
                items.append(decode(ids))
                # After the last allowed item the list closes; before it, the model chooses.
                index = 1 if k == f.max_items - 1 else (yield ("choose", [c.list_go_on, c.list_close]))[0]
                piece = (c.list_go_on, c.list_close)[index]
                yield ("force", piece)
                used += len(piece)
                if index == 1:
                    break
            shares -= item_share * (f.max_items - 1 - k)
            result["fields"][f.key] = items
            continue
        yield ("force", c.suffix[i])
        used += len(c.suffix[i])
    yield ("force", c.end)
    return result


@functools.lru_cache(maxsize=8)
def _token_texts(tokenizer_id, size):
    tokenizer = _BY_TOKENIZER[tokenizer_id][0]
    return tokenizer.batch_decode([[i] for i in range(size)], skip_special_tokens=False)


def masks(tokenizer, vocab_size, stop_ids, device):
    """{"text": (banned, closing), "reasoning": (banned, closing)} as bool tensors over the vocabulary.

    In a string: a token with a quote after its first character, a backslash or a control character is
    banned; a token starting with a quote closes it. In reasoning before the object: a token with '{'
    closes it. Special tokens are banned in both, except the end-of-turn ones, which close.
    """
    key = (id(tokenizer), vocab_size, tuple(stop_ids), str(device))
    if key not in _MASKS:
        _compiled_cache(tokenizer)
        size = min(len(tokenizer), vocab_size)
        texts = _token_texts(id(tokenizer), size)
        special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
        stops = set(stop_ids)
        bad = set(chr(i) for i in range(32)) | {chr(127), "\\"}
        # Plain lists first: one tensor per mask, not one tensor write per vocabulary entry.
        text_banned, text_close = [True] * vocab_size, [False] * vocab_size
        reason_banned, reason_close = [True] * vocab_size, [False] * vocab_size
        for i, t in enumerate(texts):
            if i in stops:
                text_close[i] = reason_close[i] = True
                text_banned[i] = reason_banned[i] = False
            elif i not in special:
                reason_banned[i] = False
                reason_close[i] = "{" in t
                if t.startswith('"'):
                    text_close[i], text_banned[i] = True, False
                else:
                    text_banned[i] = '"' in t or not bad.isdisjoint(t)
        as_tensor = lambda values: torch.tensor(values, dtype=torch.bool, device=device)  # noqa: E731
        _MASKS[key] = {"text": (as_tensor(text_banned), as_tensor(text_close)),
                       "reasoning": (as_tensor(reason_banned), as_tensor(reason_close))}
    return _MASKS[key]


_MASKS = {}
