"""The courtroom's (PROClaim's) arithmetic, apart from any model: admissibility, reflection scores, the
stopping rules, P-RAG's stopping criteria (recorded per round), the judges' vote, its mapping onto a
dataset's labels and the confidence formula.

Label rule (the panel votes Supported / Not Supported / Inconclusive; `labels` is the dataset's LabelSet):
- a strict majority of the readable votes decides: Supported -> labels.supported, Not Supported ->
  labels.refuted (H.9's note), Inconclusive -> labels.nei where the dataset has one (`inconclusive="nee"`,
  the default), else labels.supported: the paper's burden of refutation (Appendix C), which
  `inconclusive="supported"` applies on any dataset;
- no strict majority (a three-way split): the Chief Justice's vote decides, as in the paper
  (`split="chief-justice"`, the first judge's seat unless told otherwise). With `split="conflicting"`,
  or when the Chief Justice's vote is unreadable: if some judges found the claim supported and others
  not supported, the evidence pulls both ways -> labels.mixed (AVeriTeC's Conflicting
  Evidence/Cherrypicking); otherwise, or on a dataset without such a label, it is decided as an
  Inconclusive panel;
- no readable vote: no verdict.
"""
import re
from collections import Counter

from debate.data.labels import AVERITEC

PANEL_SUPPORTED, PANEL_NOT_SUPPORTED, PANEL_INCONCLUSIVE = "Supported", "Not Supported", "Inconclusive"
PANEL_LABELS = (PANEL_SUPPORTED, PANEL_NOT_SUPPORTED, PANEL_INCONCLUSIVE)
_PANEL_ALIASES = {
    "supported": PANEL_SUPPORTED, "support": PANEL_SUPPORTED, "true": PANEL_SUPPORTED,
    "notsupported": PANEL_NOT_SUPPORTED, "unsupported": PANEL_NOT_SUPPORTED, "refuted": PANEL_NOT_SUPPORTED,
    "refute": PANEL_NOT_SUPPORTED, "false": PANEL_NOT_SUPPORTED,
    "inconclusive": PANEL_INCONCLUSIVE, "notenoughevidence": PANEL_INCONCLUSIVE, "undetermined": PANEL_INCONCLUSIVE,
}


def verdict_labels(labels=AVERITEC, inconclusive="nee"):
    """{panel label: the dataset's label} under the --inconclusive rule (see the module doc)."""
    undecided = labels.nei if inconclusive == "nee" and labels.nei else labels.supported
    return {PANEL_SUPPORTED: labels.supported, PANEL_NOT_SUPPORTED: labels.refuted, PANEL_INCONCLUSIVE: undecided}


def panel_label(value):
    """A judge's verdict field as one of PANEL_LABELS, or None."""
    if not isinstance(value, str):
        return None
    return _PANEL_ALIASES.get(re.sub(r"[^a-z]", "", value.lower()))


def admissibility(relevance, credibility, admit=0.5, dispute=0.1):
    """(weight, status): weight = relevance x credibility; admitted above `admit`, disputed above
    `dispute`, dropped at or below it; "unscored" when either score could not be read."""
    if relevance is None or credibility is None:
        return None, "unscored"
    weight = relevance * credibility
    if weight > admit:
        return weight, "admitted"
    return weight, "disputed" if weight > dispute else "dropped"


def reflection_score(logic, novelty, rebuttal, weights=(0.4, 0.3, 0.3)):
    """The self-reflection total, weights . (logic, novelty, rebuttal); None if any part is unreadable."""
    parts = (logic, novelty, rebuttal)
    if any(p is None for p in parts):
        return None
    return sum(w * p for w, p in zip(weights, parts))


# The authors' orchestrator checks every stopping rule only after round 2 (framework/mad_orchestrator.py):
# round 1 has no previous reflection total to compare, and the critic and the court do not end it either.
FIRST_STOP_ROUND = 2


def plateaued(totals, delta=0.05):
    """True when the reflection total changed by less than `delta` from the previous round to this one:
    |S_t - S_(t-1)| < delta (Appendix O's Delta S; in Appendix J's example round 2's Delta S = 0.097 lets
    the debate go on, and the court ends it at round 3).

    `totals` is S per round, the SUM of both counsels' totals (in [0, 2]); a round without one (an
    unreadable reflection) is compared with nothing.
    """
    if len(totals) < 2 or totals[-1] is None or totals[-2] is None:
        return False
    return abs(totals[-1] - totals[-2]) < delta


def novelty_exhausted(means, floor=0.10):
    """True when the mean novelty of the last two rounds' discoveries was below `floor` both times.

    `means` holds, per round, the mean novelty of the passages P-RAG admitted that round, 0.0 when it
    admitted none (the authors' orchestrator): with the 0.20 admission threshold the rule fires after two
    rounds running that found nothing new."""
    return len(means) >= 2 and all(m is not None and m < floor for m in means[-2:])


def stop_reason(round_no, max_rounds, critic_resolved, court_ready, totals, novelty_means,
                plateau_delta=0.05, novelty_floor=0.10):
    """Why the hearing ends after round `round_no`, or None: from round 2 on, the first of the four rules
    that holds in the paper's order (2.5: reflection plateau, critic resolution, novelty exhaustion, judicial
    signal; the authors' orchestrator checks them in that order), then the round cap."""
    if round_no >= FIRST_STOP_ROUND:
        if plateaued(totals, plateau_delta):
            return "reflection_plateau"
        if critic_resolved:
            return "critic_resolved"
        if novelty_exhausted(novelty_means, novelty_floor):
            return "novelty_exhausted"
        if court_ready:
            return "court_ready"
    if round_no >= max_rounds:
        return "max_rounds"
    return None


# Appendix I's iteration cap of P-RAG and the authors' engine's (prag_engine.py): a fixed 10, counted from each
# hearing's round 1 (the rerun resets the counter), whatever the hearing's own round cap.
PRAG_MAX_ITERATIONS = 10


def prag_criterion(retrieved_novelty, relevance, previous_relevance, round_no, max_iterations=PRAG_MAX_ITERATIONS,
                   redundancy_limit=0.70, gain_floor=0.05, duplicate_novelty=0.15):
    """Which of Appendix I's P-RAG stopping criteria holds after this round's retrievals, or None. It is
    recorded, not obeyed: the next round retrieves again (see docs/FIDELITY.md, row 8: the paper reports
    discovery in every active round, and the authors' code only logs the criterion).

    `retrieved_novelty`: the novelty of every passage retrieved this round; a passage is redundant when
    its novelty is below `duplicate_novelty` (cosine above 0.85 to the novelty pool, the authors' code). In
    the authors' order: the round counter reached the fixed cap ("max_iterations", PRAG_MAX_ITERATIONS: a
    hearing capped below 10 rounds never reaches it); the redundant share is above `redundancy_limit`
    ("redundancy"); from round 2 on, the mean relevance (query cosine) of the passages admitted this round
    gained less than `gain_floor` over the previous round's ("relevance_gain"; a round that admitted
    nothing has relevance 0).
    """
    if round_no >= max_iterations:
        return "max_iterations"
    if retrieved_novelty:
        redundant = sum(n < duplicate_novelty for n in retrieved_novelty) / len(retrieved_novelty)
        if redundant > redundancy_limit:
            return "redundancy"
    if round_no > 1 and previous_relevance is not None and relevance - previous_relevance < gain_floor:
        return "relevance_gain"
    return None


def vote(votes, split="chief-justice", chief=0, inconclusive="nee", labels=AVERITEC):
    """(panel label or None, its vote count, the dataset's label or None) for the judges' PANEL_LABELS/None
    in seat order; `chief` is the Chief Justice's seat index; see the module doc for the rules."""
    mapping = verdict_labels(labels, inconclusive)
    counts = Counter(v for v in votes if v is not None)
    if not counts:
        return None, 0, None
    top = max(counts.values())
    leaders = [label for label, n in counts.items() if n == top]
    if len(leaders) == 1 and top > sum(counts.values()) / 2:
        return leaders[0], top, mapping[leaders[0]]
    head = votes[chief] if split == "chief-justice" and chief < len(votes) else None
    if head is not None:
        return head, counts[head], mapping[head]
    if counts[PANEL_SUPPORTED] and counts[PANEL_NOT_SUPPORTED] and labels.mixed:
        return None, top, labels.mixed
    return None, top, mapping[PANEL_INCONCLUSIVE]


def role_switch_delta(consistency):
    """The paper's step function of the 0-10 role-switch consistency: +0.10 at 7 or above, 0 from 5 to
    below 7, -0.05 below 5; 0 when there was no role switch or its score is unreadable."""
    if consistency is None:
        return 0.0
    return 0.10 if consistency >= 7 else 0.0 if consistency >= 5 else -0.05


def reflection_delta(winner_total):
    """The winning side's last reflection total t as (t - 0.5) x 0.6, kept within [-0.15, +0.30]."""
    if winner_total is None:
        return 0.0
    return min(0.30, max(-0.15, (winner_total - 0.5) * 0.6))


def confidence(vote_share, mean_quality, consistency, winner_total, vote_weight=0.8, quality_weight=0.3,
               floor=0.10):
    """c = clamp(vote_weight * vote_share + quality_weight * mean_quality / 10 + role-switch delta
    + reflection delta, 0, 1), then at least `floor` when at least two thirds of the judges agree;
    mean_quality is the judges' mean 0-10 score (None counts as 0). Returns (c, its parts)."""
    parts = {"votes": vote_weight * vote_share,
             "quality": quality_weight * (mean_quality or 0.0) / 10,
             "role_switch": role_switch_delta(consistency),
             "reflection": reflection_delta(winner_total)}
    c = min(1.0, max(0.0, sum(parts.values())))
    if vote_share >= 2 / 3 - 1e-9:  # 2 of 3 judges, given as the float 0.666...
        c = max(c, floor)
    return c, parts
