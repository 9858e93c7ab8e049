"""The four AVeriTeC verdict labels and the one rule that maps spelling variants onto them."""
import re

SUPPORTED = "Supported"
REFUTED = "Refuted"
NEE = "Not Enough Evidence"
CEC = "Conflicting Evidence/Cherrypicking"
LABELS = (SUPPORTED, REFUTED, NEE, CEC)

# Keys are labels squeezed to lowercase letters only, so "Cherry-picking", "conflicting evidence /
# cherry picking" and "NOT ENOUGH EVIDENCE" all land on the same key.
_ALIASES = {
    "supported": SUPPORTED,
    "support": SUPPORTED,
    "true": SUPPORTED,
    "refuted": REFUTED,
    "refute": REFUTED,
    "false": REFUTED,
    "notenoughevidence": NEE,
    "notenoughinfo": NEE,
    "notenoughinformation": NEE,
    "nee": NEE,
    "conflictingevidencecherrypicking": CEC,
    "conflictingevidence": CEC,
    "cherrypicking": CEC,
    "conflictingevidenceandcherrypicking": CEC,
    "conflictingevidenceorcherrypicking": CEC,
    "cec": CEC,
}


def _squeeze(text):
    return re.sub(r"[^a-z]", "", text.lower())


def canonical_label(text):
    """Return the canonical label for `text`, or None if it names none of the four."""
    if not isinstance(text, str):
        return None
    return _ALIASES.get(_squeeze(text))
