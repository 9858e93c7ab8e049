"""The courtroom's arithmetic on hand-computed cases: admissibility, reflection, stopping rules, vote, confidence."""
import pytest

from debate.data.labels import CEC, NEE, REFUTED, SUPPORTED
from debate.methods.courtroom import rules

S, N, I = rules.PANEL_SUPPORTED, rules.PANEL_NOT_SUPPORTED, rules.PANEL_INCONCLUSIVE  # noqa: E741 (the panel's words)


@pytest.mark.parametrize("relevance, credibility, weight, status", [
    (0.9, 0.9, 0.81, "admitted"),
    (1.0, 0.5, 0.5, "disputed"),  # exactly 0.5 is not above the admission threshold
    (0.6, 0.5, 0.3, "disputed"),
    (0.5, 0.2, 0.1, "dropped"),  # exactly 0.1 is dropped
    (0.0, 1.0, 0.0, "dropped"),
])
def test_admissibility_thresholds(relevance, credibility, weight, status):
    w, s = rules.admissibility(relevance, credibility)
    assert w == pytest.approx(weight) and s == status


def test_admissibility_unreadable_and_custom_thresholds():
    assert rules.admissibility(None, 0.9) == (None, "unscored")
    assert rules.admissibility(0.8, 0.8, admit=0.7, dispute=0.2)[1] == "disputed"
    assert rules.admissibility(0.4, 0.4, admit=0.7, dispute=0.2)[1] == "dropped"


def test_reflection_score_weights():
    assert rules.reflection_score(1.0, 0.5, 0.0) == pytest.approx(0.4 + 0.15)
    assert rules.reflection_score(0.5, 0.5, 0.5, weights=(1, 0, 0)) == pytest.approx(0.5)
    assert rules.reflection_score(0.5, None, 0.5) is None


def test_plateau_compares_the_summed_total_round_to_round_as_appendix_j():
    # Appendix J: round 1's S_total is 1.183 (the change from 0; a sum of two counsels, a mean could not
    # reach it), round 2 changed it by 0.097 > 0.05 and the debate went on.
    s1 = rules.reflection_score(0.6, 0.6, 0.6) + rules.reflection_score(0.6, 0.55, 0.6)  # 0.6 + 0.585
    s2 = s1 + 0.097
    assert not rules.plateaued([s1])  # round 1: nothing to compare with
    assert not rules.plateaued([s1, s2])
    assert rules.plateaued([s1, s2, s2 + 0.049])  # |delta| 0.049 < 0.05: stop after round 3
    assert rules.plateaued([s1, s2, s2 - 0.049])  # the size of the change counts, not its sign
    assert not rules.plateaued([s1, s2, s2 + 0.05])  # exactly 0.05 is not below it
    # The same counsels' mean would have moved 0.0485 in round 2 and stopped a round early: the sum is what counts.
    assert rules.plateaued([s1 / 2, s2 / 2])
    assert not rules.plateaued([0.5, None, 0.5]) and not rules.plateaued([None, 0.5])  # unreadable: no comparison
    assert not rules.plateaued([0.5, 0.53], delta=0.02)


def test_novelty_exhaustion_needs_two_low_retrievals_running():
    assert not rules.novelty_exhausted([0.05])
    assert rules.novelty_exhausted([0.5, 0.05, 0.09])
    assert rules.novelty_exhausted([0.5, 0.0, 0.0])  # two rounds that admitted nothing (the authors' mean)
    assert not rules.novelty_exhausted([0.05, 0.5, 0.05])
    assert not rules.novelty_exhausted([0.05, None])


def test_stop_reason_order_and_cap():
    # All four hold: the paper's order (2.5) and the authors' orchestrator decide which is reported.
    common = dict(totals=[0.5, 0.5, 0.5], novelty_means=[0.0, 0.0])
    assert rules.stop_reason(3, 10, True, True, **common) == "reflection_plateau"
    assert rules.stop_reason(3, 10, True, True, [0.1, 0.5, 0.9], [0.0, 0.0]) == "critic_resolved"
    assert rules.stop_reason(3, 10, False, True, [0.1, 0.5, 0.9], [0.0, 0.0]) == "novelty_exhausted"
    assert rules.stop_reason(3, 10, False, True, [0.1, 0.5, 0.9], [0.5, 0.0]) == "court_ready"
    assert rules.stop_reason(10, 10, False, False, [0.1, 0.5, 0.9], [0.5, 0.5]) == "max_rounds"
    assert rules.stop_reason(9, 10, False, False, [0.1, 0.5, 0.9], [0.5, 0.5]) is None


def test_no_rule_but_the_cap_ends_round_one():
    assert rules.stop_reason(1, 10, True, True, [0.5], [0.0]) is None
    assert rules.stop_reason(1, 1, True, True, [0.5], [0.0]) == "max_rounds"
    assert rules.stop_reason(2, 10, False, True, [None, None], [0.5, 0.5]) == "court_ready"


def test_plateau_is_the_change_of_the_summed_total_between_two_rounds():
    assert rules.plateaued([1.0, 1.04]) and rules.plateaued([1.04, 1.0])
    assert not rules.plateaued([1.0, 1.05]) and not rules.plateaued([1.0, 1.097])  # Appendix J: goes on
    assert not rules.plateaued([1.0]) and not rules.plateaued([None, 1.0])


def test_panel_labels_are_read_strictly():
    assert rules.panel_label("Not Supported") == N and rules.panel_label("supported") == S
    assert rules.panel_label("INCONCLUSIVE") == I and rules.panel_label("Refuted") == N
    assert rules.panel_label("Supported, Not Supported or Inconclusive") is None  # a copied template
    assert rules.panel_label(None) is None


@pytest.mark.parametrize("votes, expected", [
    ([S, S, N], (S, 2, SUPPORTED)),
    ([N, N, N], (N, 3, REFUTED)),
    ([I, I, S], (I, 2, NEE)),
    ([S, N, I], (S, 1, SUPPORTED)),  # a three-way split: the Chief Justice (first seat) decides
    ([I, S, N], (I, 1, NEE)),
    ([None, S, N], (None, 1, CEC)),  # the Chief Justice's vote is unreadable: our rule
    ([S, None, None], (S, 1, SUPPORTED)),  # the one readable vote is a strict majority of readable votes
    ([N, S], (N, 1, REFUTED)),
    ([None, None, None], (None, 0, None)),
])
def test_vote_and_its_mapping(votes, expected):
    assert rules.vote(votes) == expected


@pytest.mark.parametrize("votes, expected", [
    ([S, N, I], (None, 1, CEC)),  # supported and not supported both voted, no majority
    ([S, I, None], (None, 1, NEE)),  # a tie without both sides
    ([S, N], (None, 1, CEC)),
    ([N, N, S], (N, 2, REFUTED)),  # a majority is a majority under either rule
])
def test_split_decided_by_our_rule_when_asked(votes, expected):
    assert rules.vote(votes, split="conflicting") == expected


def test_chief_justice_seat_and_the_inconclusive_mapping():
    assert rules.vote([S, N, I], chief=2) == (I, 1, NEE)
    assert rules.vote([S, N, I], chief=2, inconclusive="supported") == (I, 1, SUPPORTED)
    # The paper's burden of refutation: an Inconclusive panel leaves the claim standing.
    assert rules.vote([I, I, N], inconclusive="supported") == (I, 2, SUPPORTED)
    assert rules.vote([I, I, N]) == (I, 2, NEE)
    assert rules.vote([N, N, I], inconclusive="supported") == (N, 2, REFUTED)


@pytest.mark.parametrize("consistency, delta", [
    (10.0, 0.10), (7.0, 0.10), (6.99, 0.0), (5.0, 0.0), (4.99, -0.05), (0.0, -0.05), (None, 0.0)])
def test_role_switch_delta_is_the_papers_step_function(consistency, delta):
    assert rules.role_switch_delta(consistency) == delta


def test_confidence_formula_hand_computed():
    # 0.8 * 2/3 + 0.3 * 6/10 + 0.10 (consistency 8 >= 7) + (0.7 - 0.5) * 0.6
    c, parts = rules.confidence(2 / 3, 6.0, 8.0, 0.7)
    assert parts == pytest.approx({"votes": 0.8 * 2 / 3, "quality": 0.18, "role_switch": 0.10, "reflection": 0.12})
    assert c == pytest.approx(0.8 * 2 / 3 + 0.18 + 0.10 + 0.12)
    # Everything at its best clamps to 1; the reflection delta is capped at +0.30.
    c, parts = rules.confidence(1.0, 10.0, 10.0, 1.0)
    assert c == 1.0 and parts["reflection"] == pytest.approx(0.30) and parts["role_switch"] == pytest.approx(0.10)
    # A weak winner's reflection takes at most 0.15 off; nothing readable counts as zero.
    c, parts = rules.confidence(1 / 3, None, None, 0.0)
    assert parts["reflection"] == pytest.approx(-0.15) and parts["quality"] == 0.0 and parts["role_switch"] == 0.0
    assert c == pytest.approx(0.8 / 3 - 0.15)
    # No votes and a contradictory role switch clamp at 0.
    assert rules.confidence(0.0, None, 0.0, None)[0] == 0.0
    # The weights are flags.
    c, _ = rules.confidence(1.0, 10.0, None, None, vote_weight=0.5, quality_weight=0.1)
    assert c == pytest.approx(0.6)


def test_confidence_floor_needs_two_thirds_of_the_judges():
    # 0.8 * 2/3 - 0.05 - 0.15 = 0.333 is above the floor: unchanged.
    assert rules.confidence(2 / 3, None, 0.0, 0.0)[0] == pytest.approx(0.8 * 2 / 3 - 0.2)
    # Weights that would take a 2-of-3 majority to 0 are lifted to 0.10 ...
    assert rules.confidence(2 / 3, None, 0.0, 0.0, vote_weight=0.1)[0] == pytest.approx(0.10)
    assert rules.confidence(1.0, None, 0.0, 0.0, vote_weight=0.0)[0] == pytest.approx(0.10)
    # ... but a single vote (a Chief Justice's decision, 1 of 3) is not.
    assert rules.confidence(1 / 3, None, 0.0, 0.0, vote_weight=0.1)[0] == 0.0
    assert rules.confidence(2 / 3, None, 0.0, 0.0, vote_weight=0.1, floor=0.0)[0] == 0.0


def test_prag_stopping_criteria():
    # Redundancy: 3 of 4 retrieved passages (0.75 > 0.70) are near-duplicates (novelty < 0.15).
    assert rules.prag_criterion([0.05, 0.1, 0.14, 0.9], 0.6, None, 1) == "redundancy"
    assert rules.prag_criterion([0.05, 0.1, 0.5, 0.9], 0.6, None, 1) is None  # exactly half
    # Relevance gain below 0.05 over the previous round, from round 2 on.
    assert rules.prag_criterion([0.5], 0.62, 0.60, 2) == "relevance_gain"
    assert rules.prag_criterion([0.5], 0.66, 0.60, 2) is None
    assert rules.prag_criterion([0.5], 0.0, 0.60, 1) is None  # round 1 has no previous round
    assert rules.prag_criterion([], 0.0, 0.5, 3) == "relevance_gain"  # nothing admitted: no gain
    assert rules.prag_criterion([0.5], 0.62, 0.60, 2, gain_floor=0.0) is None
    assert rules.prag_criterion([0.05, 0.1, 0.14, 0.9], 0.6, None, 1, redundancy_limit=0.8) is None
    # The round counter at the cap comes first, as in the authors' engine.
    assert rules.prag_criterion([0.05, 0.1, 0.14, 0.9], 0.6, 0.6, 10) == "max_iterations"
    # The cap is Appendix I's fixed 10, not the hearing's round cap: round 2 of a 2-round rerun is not it.
    assert rules.PRAG_MAX_ITERATIONS == 10
    assert rules.prag_criterion([0.5], 0.9, 0.6, 9) is None
    assert rules.prag_criterion([0.5], 0.9, 0.6, 2) is None
