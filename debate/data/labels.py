"""Verdict labels: a dataset's label set (its labels, what each means, the roles they play) and the rule
that maps spelling variants onto them.

A LabelSet belongs to a dataset (debate.data.datasets): AVeriTeC's four labels below, Check-COVID's
SUPPORT / REFUTE / NOTENOUGHINFO, PolitiHop's true / false / half-true, a user's own card. Prompts list
its labels and their definitions, schemas choose among its labels, and methods with a verdict vocabulary
of their own (PROClaim's panel) map onto it through its roles: which label says the evidence backs the
claim (`supported`), contradicts it (`refuted`), is too thin to say (`nei`), or pulls both ways (`mixed`).
"""
import re
from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional, Tuple

SUPPORTED = "Supported"
REFUTED = "Refuted"
NEE = "Not Enough Evidence"
CEC = "Conflicting Evidence/Cherrypicking"
LABELS = (SUPPORTED, REFUTED, NEE, CEC)


def squeeze(text: str) -> str:
    """A spelling as the aliases key it: lowercase letters only ("Cherry-picking" -> "cherrypicking")."""
    return re.sub(r"[^a-z]", "", text.lower())


@dataclass(frozen=True)
class LabelSet:
    name: str  # the dataset's name
    labels: Tuple[str, ...]  # as the dataset spells them, in its order
    definitions: Tuple[str, ...]  # one per label: what the label means (its paper's sense, our words)
    supported: str  # the label of a claim the evidence backs
    refuted: str  # the label of a claim the evidence contradicts
    nei: Optional[str] = None  # the label of a claim the evidence cannot decide, where the dataset has one
    mixed: Optional[str] = None  # the label of a claim the evidence supports in part (conflicting, half-true), if any
    aliases: Tuple[Tuple[str, str], ...] = ()  # ((squeezed spelling, label), ...) besides each label's own spelling

    def __post_init__(self) -> None:
        if len(self.definitions) != len(self.labels) or len(set(self.labels)) != len(self.labels):
            raise ValueError(f"label set {self.name!r}: one definition per label, and no label twice")
        for role in (self.supported, self.refuted, self.nei, self.mixed):
            if role is not None and role not in self.labels:
                raise ValueError(f"label set {self.name!r}: {role!r} is not one of its labels")

    def canonical(self, text: Any) -> Optional[str]:
        """The label `text` names (case- and punctuation-blind, aliases included), or None."""
        if not isinstance(text, str):
            return None
        key = squeeze(text)
        for label in self.labels:
            if squeeze(label) == key:
                return label
        return dict(self.aliases).get(key)

    def choices(self) -> str:
        """The labels as a prompt offers them: '"A", "B", "C" or "D"'."""
        quoted = [f'"{label}"' for label in self.labels]
        return " or ".join(quoted) if len(quoted) < 3 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"

    def answer_format(self) -> str:
        """The Verdict value of a JSON example: 'A, B, C, or D' ('A or B' for two)."""
        if len(self.labels) < 3:
            return " or ".join(self.labels)
        return f"{', '.join(self.labels[:-1])}, or {self.labels[-1]}"

    def as_dict(self) -> Dict[str, Any]:
        """The set as JSON holds it (SynDeC records carry it, so training renders the run's prompts)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "LabelSet":
        # JSON's lists back to tuples, key by key (as_dict's keys): mypy cannot tell which key holds which type
        return cls(**{k: tuple(tuple(x) if isinstance(x, list) else x for x in v)  # type: ignore[arg-type]
                      if isinstance(v, list) else v
                      for k, v in d.items()})

    def criteria(self) -> str:
        """One line per label: '- Label: its definition'."""
        return "\n".join(f"- {label}: {definition}" for label, definition in zip(self.labels, self.definitions))


AVERITEC = LabelSet(
    name="averitec",
    labels=LABELS,
    definitions=(
        "the credible evidence given backs the claim in full.",
        "the credible evidence contradicts the claim directly.",
        "there is too little credible evidence to confirm the claim or to refute it.",
        "the claim misleads, because the evidence conflicts or because the information behind it is selective.",
    ),
    supported=SUPPORTED, refuted=REFUTED, nei=NEE, mixed=CEC,
    # Keys are squeezed, so "Cherry-picking", "conflicting evidence / cherry picking" and "NOT ENOUGH
    # EVIDENCE" all land on the same key.
    aliases=(("support", SUPPORTED), ("true", SUPPORTED), ("refute", REFUTED), ("false", REFUTED),
             ("notenoughinfo", NEE), ("notenoughinformation", NEE), ("nee", NEE),
             ("conflictingevidence", CEC), ("cherrypicking", CEC), ("conflictingevidenceandcherrypicking", CEC),
             ("conflictingevidenceorcherrypicking", CEC), ("cec", CEC)),
)


def canonical_label(text: Any) -> Optional[str]:
    """AVeriTeC's label for `text`, or None if it names none of the four (AVERITEC.canonical)."""
    return AVERITEC.canonical(text)
