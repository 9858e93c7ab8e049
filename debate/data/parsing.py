"""Read the Moderator's answer: JSON if possible, key regexes if not, a lone label name as a last resort.

`parse_moderator(text)` returns
    {"fields": {canonical key: value found}, "proceed": True | False | None,
     "verdict": label | None, "justification": str, "status": str}

status says how the decision was recovered, from most to least trustworthy:
    "structured"    decoded under the prompt's schema (debate.engine.schema_program): the object is well formed by
                    construction and the verdict was chosen among the dataset's labels
    "json"          the whole answer is one clean JSON object
    "json_repaired" a JSON object was found after repair: code fences, prose around it, single quotes,
                    trailing commas, Python literals (True/None), curly quotes
    "fields_regex"  no object would parse; the fields were pulled out by their key names
    "label_in_text" no fields at all, but the text names exactly one label, never negated
    "unparsed"      neither a verdict nor a proceeding decision could be recovered
Invariant: status is "unparsed" exactly when verdict and proceed are both None. A verdict is never
guessed: when in doubt it stays None and the caller decides what that means.
"""
import ast
import json
import re

from debate.data.labels import AVERITEC, CEC, LABELS, NEE, REFUTED, SUPPORTED, squeeze

KEYS = ("Primary Insight", "Evidence Gaps", "Justification for Proceeding", "Proceeding Necessity",
        "Justification for Verdict", "Verdict")
DECISION_KEYS = ("Verdict", "Proceeding Necessity")
STATUSES = ("structured", "json", "json_repaired", "fields_regex", "label_in_text", "unparsed")

# Keys compared squeezed to lowercase letters, so "proceeding_necessity" and "Proceeding-Necessity" match.
MODERATOR_ALIASES = {"finalverdict": "Verdict", "justification": "Justification for Verdict"}

# Label names as they appear in running prose; the short aliases of labels.py ("true", "false")
# are far too common in prose to count as a verdict.
_LABEL_PATTERNS = {
    SUPPORTED: r"\bsupported\b",
    REFUTED: r"\brefuted\b",
    NEE: r"\bnot\s+enough\s+(?:evidence|information|info)\b",
    CEC: r"\bconflicting\s+evidence\b|\bcherry[\s-]?pick(?:ing|ed)\b",
}
_NEGATION = re.compile(r"(?:\b(?:not|no|never|nor|neither|cannot)|n['\u2019]t)\W*(?:\w+\W+){0,2}$",
                       re.IGNORECASE)


def parse_moderator(text, structured=None, labels=AVERITEC):
    """Parse one Moderator response (round or final) into fields, decision and status; see module doc.
    The verdict is one of `labels` (a LabelSet: the run's dataset's; AVeriTeC's by default).

    `structured` is the engine's schema result for the reply (engine.Conversation.structured): its fields
    are taken as they are (status "structured"), with the Verdict choice's probabilities as
    `label_probs`. A reply decoded under a schema that asks for reasoning first keeps that reasoning as
    the justification when the justification field is empty.
    """
    if structured is not None:
        return _from_structured(structured, labels)
    text = text if isinstance(text, str) else ""
    fields, status = read_fields(text, KEYS, DECISION_KEYS, MODERATOR_ALIASES)

    verdict = _verdict(fields.get("Verdict"), labels)
    proceed = yes_no(fields.get("Proceeding Necessity"))
    if not fields:
        verdict = _single_label(text, labels)
        status = "label_in_text"
    if verdict is None and proceed is None:
        status = "unparsed"
    justification = fields.get("Justification for Verdict")
    return {"fields": fields, "proceed": proceed, "verdict": verdict,
            "justification": justification.strip() if isinstance(justification, str) else "",
            "status": status}


def _from_structured(structured, labels):
    fields = dict(structured["fields"])
    verdict = labels.canonical(fields.get("Verdict"))
    justification = fields.get("Justification for Verdict")
    justification = justification.strip() if isinstance(justification, str) else ""
    probs = structured["probs"].get("Verdict")
    return {"fields": fields, "proceed": yes_no(fields.get("Proceeding Necessity")), "verdict": verdict,
            "justification": justification or structured.get("reasoning", ""), "status": "structured",
            "label_probs": {labels.canonical(k): v for k, v in probs.items()} if probs else None}


def read_fields(text, keys, required=None, aliases=None):
    """The values of `keys` in a model's reply, and how they were read ("json", "json_repaired",
    "fields_regex"; None when no key was found at all).

    The reply's JSON object is used when one carries any of `required` (default: any of `keys`);
    otherwise `Key: value` pairs are pulled out of the text. Keys match case- and punctuation-blind;
    `aliases` maps further squeezed spellings ("finalverdict") to a key.
    """
    text = text if isinstance(text, str) else ""
    table = {_squeeze(k): k for k in keys}
    table.update(aliases or {})
    required = tuple(required or keys)
    has = lambda fields: any(k in fields for k in required)  # noqa: E731
    try:
        obj = json.loads(text.strip())
    except ValueError:
        obj = None
    if isinstance(obj, dict) and has(_canonical_fields(obj, table)):
        return _canonical_fields(obj, table), "json"
    for candidate in reversed(_object_spans(text)):
        obj = _load_lenient(candidate)
        if isinstance(obj, dict) and has(_canonical_fields(obj, table)):
            return _canonical_fields(obj, table), "json_repaired"
    fields = _fields_from_regex(text, keys)
    return fields, ("fields_regex" if fields else None)


def _squeeze(key):
    return re.sub(r"[^a-z]", "", str(key).lower())


def _object_spans(text):
    """Substrings that look like top-level {...} objects, in order of appearance.

    Quotes are tracked only inside an object, so an apostrophe in the prose before it cannot
    swallow the opening brace. If an object never closes (a broken string), fall back to the span
    from its first brace to the last one in the text.
    """
    spans, depth, start, quote, escaped = [], 0, None, None, False
    for i, ch in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif depth and ch in "\"'":
            quote = ch
        elif depth and ch == "}":
            depth -= 1
            if depth == 0:
                spans.append(text[start:i + 1])
    if depth and start is not None and text.rfind("}") > start:
        spans.append(text[start:text.rfind("}") + 1])
    return spans


# A quoted string (either quote style), a bare JSON literal, or a trailing comma: lets the repairs
# below edit only what lies outside strings.
_OUTSIDE_STRINGS = re.compile(r"(\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*')|\b(true|false|null)\b|,(\s*[}\]])",
                              re.DOTALL)
_PYTHON_LITERALS = {"true": "True", "false": "False", "null": "None"}


def _repair(candidate, python):
    """Drop trailing commas; with python=True also spell JSON literals the Python way."""
    def fix(m):
        if m.group(1):
            return m.group(1)
        if m.group(2):
            return _PYTHON_LITERALS[m.group(2)] if python else m.group(2)
        return m.group(3)
    return _OUTSIDE_STRINGS.sub(fix, candidate)


def _load_lenient(candidate):
    """Try JSON, JSON without trailing commas, then a Python literal (single quotes, True/None)."""
    curly_fixed = candidate.replace("\u201c", '"').replace("\u201d", '"')
    for attempt in (candidate, curly_fixed) if curly_fixed != candidate else (candidate,):
        for text in (attempt, _repair(attempt, python=False)):
            try:
                return json.loads(text, strict=False)
            except ValueError:
                pass
        try:
            return ast.literal_eval(_repair(attempt, python=True))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
    return None


def _canonical_fields(obj, table):
    """Known keys under their canonical names; looks one level into nested objects if the top has none."""
    fields = {}
    for key, value in obj.items():
        name = table.get(_squeeze(key))
        if name:
            fields[name] = value.strip() if isinstance(value, str) else value
    if not fields:
        for value in obj.values():
            if isinstance(value, dict):
                fields = _canonical_fields(value, table) or fields
    return fields


def _fields_from_regex(text, keys):
    """Pull `Key: value` pairs out of text that is not valid JSON; the last occurrence of a key wins."""
    fields = {}
    for key in keys:
        words = r"[\s_-]*".join(re.escape(w) for w in key.split())
        # "for" before it: that is "Justification for Verdict", not "Verdict".
        pattern = rf"(?<![A-Za-z])(?<!for[\s_-]){words}\s*[\"'*]*\s*[:=]\s*\**\s*"
        matches = list(re.finditer(pattern, text, re.IGNORECASE))
        if matches:
            fields[key] = _value_at(text, matches[-1].end())
    return fields


def _value_at(text, pos):
    rest = text[pos:]
    if rest[:1] in ("\"", "'"):
        q = rest[0]
        # The closing quote is the one followed by a separator, so quotes inside the value survive.
        m = re.match(rf"{q}(.*?)(?<!\\){q}\s*(?=,|}}|\n|$)", rest, re.DOTALL)
        value = m.group(1) if m else rest[1:]  # unclosed: the answer was cut off mid-string
        if q == "\"":
            try:
                value = json.loads(f"\"{value}\"", strict=False)
            except ValueError:
                pass
        return value.strip()
    return re.match(r"[^\n]*", rest).group(0).strip().rstrip(",}").strip(" *\"'")


def _verdict(value, labels):
    if value is None or isinstance(value, bool):
        return None
    value = str(value).strip()
    return (labels.canonical(value) or _single_label(value, labels)) if value else None


def yes_no(value):
    """True for a reply field that starts with yes/true, False for no/false, None otherwise."""
    if isinstance(value, bool):
        return value
    if value is None:
        return None
    # The first word decides ("No. The sides agree..."), but a copied template ("Yes or No") decides nothing.
    m = re.match(r"\W*(yes|no|true|false)\b(\s*(?:or|/|\|)\s*(?:yes|no|true|false)\b)?", str(value),
                 re.IGNORECASE)
    if m is None or m.group(2):
        return None
    return m.group(1).lower() in ("yes", "true")


def number_in(value, top):
    """A score field as a fraction of its scale, clamped to [0, 1]; None when no number can be read.

    The scale is `top` unless the value names one ("7/10", "70%"). A bare number above `top` is read on
    the next scale of ten it fits (an 8 asked for on a 0-1 scale means 8 out of 10).
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        number, scale = float(value), None
    else:
        m = re.search(r"(-?\d+(?:\.\d+)?)\s*(%|/\s*(\d+(?:\.\d+)?))?", str(value))
        if m is None:
            return None
        number = float(m.group(1))
        scale = 100.0 if m.group(2) == "%" else float(m.group(3)) if m.group(3) else None
    if scale is None:
        scale = top
        while number > scale and scale < 100 * top:
            scale *= 10
    if scale <= 0:
        return None
    return min(1.0, max(0.0, number / scale))


def _label_patterns(labels):
    """Regexes of the ways running prose names each label: AVeriTeC's hand-made ones; for another label set each
    label's spelling and its aliases of more than four letters, any non-letters allowed between the letters
    ("NOTENOUGHINFO" matches "not enough info", "half-true" matches "half true")."""
    if labels.labels == LABELS:
        return _LABEL_PATTERNS
    patterns = {}
    for label in labels.labels:
        keys = [squeeze(label)] + [key for key, target in labels.aliases if target == label and len(key) > 4]
        patterns[label] = "|".join(r"\b" + r"[^a-z]*".join(key) + r"\b" for key in keys if key)
    return patterns


def _single_label(text, labels=AVERITEC):
    """The one label `text` names, or None if it names none, several, or any of them negated."""
    found = set()
    for label, pattern in _label_patterns(labels).items():
        for m in re.finditer(pattern, text, re.IGNORECASE):
            if _NEGATION.search(text[max(0, m.start() - 40):m.start()]):
                return None  # "not supported" could mean refuted or NEE: refuse to guess
            found.add(label)
    return found.pop() if len(found) == 1 else None


assert set(_LABEL_PATTERNS) == set(LABELS)
