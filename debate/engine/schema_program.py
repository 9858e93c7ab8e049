"""Structured decoding, the engine's side: a declared schema (debate.data.answer_schemas) tokenised for one
tokenizer, and the decoder of one reply under it.

Keys, quotes and punctuation are forced tokens. Each piece of the object is tokenised on its own, so
the tokens an object needs besides free text are known in advance: free text gets what is left of
--max-new-tokens, shared out field by field, and the object always closes within the limit.

`program(compiled, limit)` is the decoder of one reply as a generator the engine drives; it yields
    ("force", ids)            feed these ids, one per step
    ("text", cap, mode)       sample under `mode`'s mask ("text" or "reasoning") until a closing token or
                              `cap` tokens; send back the ids
    ("choose", candidates)    score each candidate id list as a whole; send back (index, probabilities)
    ("generate", trie)        sample a value token by token inside `trie` (see `trie`), feeding each; send
                              back the index of the value reached (its closing token is the next forced id)
and returns {"schema", "reasoning", "fields", "probs", "offsets"} (probs: each choice's probabilities;
offsets: where each choice's or number's value starts within the reply's ids).

Choices (and numbers declared `scored`) are scored as whole candidates; other numbers are generated. A
generated number feeds exactly the ids a scored one would: the trie is built over the same tokenisation
of each value, so only the way of picking the value differs.
"""
import functools
import json
import weakref
from dataclasses import dataclass, field as dataclass_field

import torch

from debate.data import answer_schemas
from debate.data.answer_schemas import Spec
from debate.data.labels import LABELS

INDENT = "\n  "


class SchemaBudgetError(ValueError):
    """--max-new-tokens cannot hold a schema's keys and punctuation."""


def _quoted(f):
    return f.kind in ("text", "choice")


@dataclass
class Compiled:
    """A schema tokenised for one tokenizer: the forced pieces, the choices' ids and the fixed cost."""
    spec: Spec
    tokenizer_ref: object  # weakref.ref to the tokenizer: a compiled schema must not keep it alive
    prefix: list  # per field: ids of what comes before its value ('{\n  "Key": "' or ',\n  "Key": ')
    suffix: list  # per field: ids after its value ('"' for quoted fields, nothing for numbers)
    candidates: list  # per field: choice/number -> list of candidate id lists (value + closing token)
    values: list  # per field: choice/number -> value ids (what is fed once chosen)
    tries: list  # per field: generated number -> trie over its candidates (see `trie`), else None
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

    @property
    def tokenizer(self):
        return self.tokenizer_ref()

    @functools.cached_property
    def scratch_columns(self):
        """The most tokens one scoring pass feeds (the largest prefix tree of a scored choice): the cache
        columns a batch keeps free past its end for it."""
        scored = [c for f, c in zip(self.spec.fields, self.candidates) if c is not None and not generated(f)]
        if any(f.kind == "list" and f.max_items > 1 for f in self.spec.fields):
            scored.append([self.list_go_on, self.list_close])
        return max((len(prefix_tree(c)[0]) for c in scored), default=0)


def generated(f):
    """Whether field `f`'s value is generated token by token (a number not declared `scored`)."""
    return f.kind == "number" and not f.scored


def prefix_tree(candidates):
    """The candidates' distinct proper prefixes as a tree to feed in one pass: (tokens, parents, depths, node)
    where prefix c[:k] (k >= 1) is fed as `tokens[m]` (its last token), m = node[tuple(c[:k])], under parent
    node `parents[m]` (-1 for a first token), `depths[m]` = k - 1. The logits at node m score c[k]."""
    tokens, parents, depths, node = [], [], [], {}
    for c in candidates:
        for k in range(1, len(c)):
            prefix = tuple(c[:k])
            if prefix not in node:
                node[prefix] = len(tokens)
                tokens.append(c[k - 1])
                parents.append(node[prefix[:-1]] if k > 1 else -1)
                depths.append(k - 1)
    return tokens, parents, depths, node


def trie(candidates, where):
    """The candidates (value ids + closing token) as nested dicts {id: child}; a leaf is the value's index.
    A candidate that is a prefix of another could not be told apart while generating: refused."""
    root = {}
    for index, c in enumerate(candidates):
        node = root
        for token in c[:-1]:
            node = node.setdefault(token, {})
            if not isinstance(node, dict):
                raise ValueError(f"{where}: value {index} runs past the end of another value's tokens")
        if c[-1] in node:
            raise ValueError(f"{where}: value {index} ends where another value's tokens go on")
        node[c[-1]] = index
    return root


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def compile_for(name, tokenizer, labels=LABELS):
    """The schema of prompt `name` tokenised for `tokenizer`, a "labels" choice among `labels` (the dataset's
    label strings; AVeriTeC's by default); cached per tokenizer."""
    cache = _per_tokenizer(tokenizer)["compiled"]
    key = (name, tuple(labels))
    if key not in cache:
        cache[key] = _compile(answer_schemas.resolve(answer_schemas.load(name), labels), tokenizer)
    return cache[key]


# What is worked out once per tokenizer (compiled schemas, vocabulary masks, token texts), held only as long
# as the tokenizer lives: one loaded tokenizer is shared by every role of a model, and a dropped model's is
# freed with it. Nothing stored here refers back to the tokenizer (Compiled holds a weak reference).
_BY_TOKENIZER = weakref.WeakKeyDictionary()


def _per_tokenizer(tokenizer):
    if tokenizer not in _BY_TOKENIZER:
        _BY_TOKENIZER[tokenizer] = {"compiled": {}, "masks": {}, "texts": {}}
    return _BY_TOKENIZER[tokenizer]


def _compile(spec, tokenizer):
    fields = spec.fields
    prefix, suffix, candidates, values, tries = [], [], [], [], []
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
            tries.append(trie(candidates[-1], f"schema {spec.name!r}, field {f.key!r}") if generated(f) else None)
        else:
            candidates.append(None)
            values.append(None)
            tries.append(None)
    c = Compiled(spec=spec, tokenizer_ref=weakref.ref(tokenizer), prefix=prefix, suffix=suffix,
                 candidates=candidates, values=values, tries=tries, list_go_on=_ids(tokenizer, '", "'),
                 list_close=_ids(tokenizer, '"]'), end=end)
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
        elif generated(f):
            result["offsets"][f.key] = used
            index = yield ("generate", c.tries[i])  # its ids are fed as they are sampled
            used += len(c.values[i][index])
            result["fields"][f.key] = json.loads(f.values[index])
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


def masks(tokenizer, vocab_size, stop_ids, device):
    """{"text": (banned, closing), "reasoning": (banned, closing)} as bool tensors over the vocabulary.

    In a string: a token with a quote after its first character, a backslash or a control character is
    banned; a token starting with a quote closes it. In reasoning before the object: a token with '{'
    closes it. Special tokens are banned in both, except the end-of-turn ones, which close.
    """
    cache = _per_tokenizer(tokenizer)
    key = (vocab_size, tuple(stop_ids), str(device))
    if key not in cache["masks"]:
        size = min(len(tokenizer), vocab_size)
        if size not in cache["texts"]:
            cache["texts"][size] = tokenizer.batch_decode([[i] for i in range(size)], skip_special_tokens=False)
        texts = cache["texts"][size]
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
        cache["masks"][key] = {"text": (as_tensor(text_banned), as_tensor(text_close)),
                               "reasoning": (as_tensor(reason_banned), as_tensor(reason_close))}
    return cache["masks"][key]
