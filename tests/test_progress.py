"""The run's progress bar (debate/pipeline/progress.py): turns, tokens and decode steps as they happen, and a time
left that is about right from the first minutes of a short run, whose claims all end together at its end."""
import json

import pytest

import run_debate
from debate.pipeline import progress
from tests.conftest import run_argv


class Clock:
    """A fake clock and a fake decode-step counter that a simulated run moves forward together."""

    def __init__(self):
        self.now, self.steps = 0.0, 0

    def __call__(self):
        return self.now


def demo_like_run(bar, clock, rounds=3, claims=3, step_seconds=5.0, prefill_seconds=10.0, on_step=None):
    """DebateCV's turns as the demo runs them: `claims` claims side by side, each round an Affirmative, a Negative and a
    Moderator turn (the Moderator's JSON stops early), then a final Moderator turn; every batched turn encodes its
    prompts, then takes one decode step a token for all its rows together. `on_step(clock)` is called after each
    step. Returns the run's length in seconds."""
    turns = [96, 96, 70] * rounds + [70]
    for tokens in turns:
        clock.now += prefill_seconds
        for _ in range(tokens):
            clock.now += step_seconds
            clock.steps += 1
            if on_step:
                on_step(clock)
        for _ in range(claims):  # the scheduler hands each claim its reply: one event a claim, at the same moment
            bar.turn(1, tokens)
    for _ in range(claims):
        bar.claim_done(len(turns))
    return clock.now


def bar_for(clock, **settings):
    return progress.ClaimBar(**dict(dict(total=3, desc="t", turns_hint=10, clock=clock, steps=lambda: clock.steps,
                                         max_new_tokens=96, side_by_side=3, tick=None), **settings))


def test_the_time_left_is_about_right_by_the_second_minute_before_any_turn_has_ended():
    """The demo on a busy 2-core machine took minutes a turn (issue 49): a bar of claims and turns said nothing for
    the first turn, then `left ~4:21:11` as the first of three simultaneous replies came in. Decode steps give the pace
    from the first ones."""
    clock, seen = Clock(), {}
    with bar_for(clock) as bar:
        total = demo_like_run(bar, clock, on_step=lambda c: seen.setdefault(round(c.now), bar.eta()))
    assert 100 < min(t for t in seen if t >= 120) < 130 and bar.turns == 30 == bar.claims_finished * 10
    for t, eta in seen.items():
        truth = total - t
        if t >= 120:  # from the second minute on: within a factor of 1.5 either way, or a tenth of the run near its end
            assert truth / 1.5 - total / 10 <= eta <= truth * 1.5 + total / 10, (t, eta, truth)
            if truth > total / 2:
                assert truth / 1.5 <= eta <= truth * 1.5, (t, eta, truth)
    # ... and no wild jump as three replies of one model call come in one by one.
    clock2 = Clock()
    with bar_for(clock2) as bar:
        clock2.now, clock2.steps = 490.0, 96
        etas = []
        for _ in range(3):
            bar.turn(1, 96)
            etas.append(bar.eta())
    assert max(etas) <= 2 * min(etas)


def test_the_turn_rate_stands_in_where_no_steps_are_counted_and_tokens_are_summed():
    clock = Clock()
    with bar_for(clock, steps=None) as bar:
        clock.now = 100.0
        assert bar.eta() is None  # no turn ended, no step to read: nothing to go on
        for _ in range(3):
            bar.turn(1, 96)
        # 30 claim-turns at most, 3 spoken in 100 s: 27 more at the same pace.
        assert bar.eta() == pytest.approx(900.0) and bar.tokens == 288


def test_the_bar_shows_turns_tokens_and_steps(capsys):
    clock = Clock()
    with bar_for(clock) as bar:
        clock.now, clock.steps = 120.0, 22
        bar._show()
        shown = bar.bar.postfix
    assert shown.startswith("0 turns, 0 tokens, 22 steps at 5.5 s, left ~") and "left ?" not in shown


def test_a_run_reports_its_turns_tokens_and_steps_to_the_bar(tiny, tmp_path, monkeypatch):
    bars = []

    class Recording(progress.ClaimBar):
        def __exit__(self, *exc):
            bars.append((self.turns, self.tokens, self.steps()))
            return super().__exit__(*exc)

    monkeypatch.setattr(progress, "ClaimBar", Recording)
    run_debate.main(run_argv(tiny, tmp_path / "run", max_new_tokens=4, max_rounds=1, limit=2, temperature=0))
    (turns, tokens, steps), = bars
    spoken = [t for line in (tmp_path / "run" / "transcripts.jsonl").read_text().splitlines()
              for t in json.loads(line)["turns"]]
    assert turns == len(spoken) >= 2 * 3  # two claims, one round: Affirmative, Negative, Moderator at least
    assert 0 < tokens <= turns * 4 and 0 < steps <= turns * 4


def test_the_bar_moves_inside_a_turn_with_no_event_and_its_ticker_ends_with_it():
    import threading
    import time

    clock = Clock()
    with bar_for(clock, tick=0.02) as bar:
        clock.now, clock.steps = 60.0, 12
        deadline = time.monotonic() + 10
        while "12 steps" not in (bar.bar.postfix or "") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "12 steps at 5.0 s" in bar.bar.postfix and "left ~" in bar.bar.postfix
    assert not any(t.name == "progress" and t.is_alive() for t in threading.enumerate())


def test_the_first_steps_alone_give_no_time_left():
    """The first step carries the first prompts' encoding (28 s against 3 s a step in a demo on a busy machine): one
    step alone put the time left at 2:29:37 where 15 minutes was right."""
    clock = Clock()
    with bar_for(clock, turns_hint=4, total=1, side_by_side=1, max_new_tokens=80) as bar:
        clock.now, clock.steps = 28.0, 1
        assert bar.eta() is None
        clock.now, clock.steps = 58.0, 17
        assert 10 * 60 < bar.eta() < 20 * 60


def test_the_time_left_says_what_it_is_based_on():
    clock = Clock()
    with bar_for(clock) as bar:
        clock.now, clock.steps = 20.0, 2
        bar._show()
        assert bar.bar.postfix.endswith("left ? (2 of 8 first steps)")
        clock.now, clock.steps = 120.0, 22
        bar._show()
        # 30 claim-turns at most (10 a claim, 3 claims) at 32 steps each (96 tokens, 3 claims a call), 22 taken
        assert bar.bar.postfix.endswith("left ~1:25:16 (938 steps to come at 5.45 s, a claim's turns at most)")


def test_tokens_count_as_the_steps_make_them_not_only_as_turns_end():
    clock, made = Clock(), {"tokens": 0}
    with bar_for(clock, tokens=lambda: made["tokens"]) as bar:
        clock.now, clock.steps, made["tokens"] = 60.0, 12, 36  # three rows, twelve steps: no turn has ended
        bar._show()
        assert bar.turns == 0 and ", 36 tokens," in bar.bar.postfix
        bar.turn(1, 40)  # a turn's own count is never lowered by the steps' (the first token of a turn is prefill's)
        assert bar.tokens_so_far() == 40


def test_each_claim_in_progress_shows_its_round():
    clock = Clock()
    with bar_for(clock) as bar:
        bar.round([1, 2], 1, 3)
        bar.round([2], 2, 3)
        assert bar.bar.postfix.startswith("claim 1: round 1 of 3; claim 2: round 2 of 3, 0 turns")
        bar.round([1], "final", 3)
        bar.claim_done(10, 2)
        assert bar.bar.postfix.startswith("claim 1: final verdict after 3 rounds, 0 turns")
        bar.round(list(range(3, 9)), 1, 3)
        assert "claim 4: round 1 of 3; 4 more" in bar.bar.postfix


def test_a_debatecv_run_reports_each_claims_round(tiny, tmp_path, monkeypatch):
    seen = []

    class Recording(progress.ClaimBar):
        def round(self, claim_ids, round_no, of):
            seen.append((tuple(claim_ids), round_no, of))
            super().round(claim_ids, round_no, of)

    monkeypatch.setattr(progress, "ClaimBar", Recording)
    run_debate.main(run_argv(tiny, tmp_path / "run", max_new_tokens=4, max_rounds=2, limit=1, temperature=0))
    transcript = json.loads((tmp_path / "run" / "transcripts.jsonl").read_text().splitlines()[0])
    ran = list(dict.fromkeys(turn["round"] for turn in transcript["turns"]))
    assert ran == [1, 2, "final"]  # the claim went through both rounds and the verdict turn (a random model's
    # Moderator writes no JSON, so it never stops a debate early): the bar heard of each, in order, once
    assert seen == [((transcript["claim_id"],), r, 2) for r in ran]


def slowed_run(bar, clock, paces):
    """Decode steps at `paces` [(steps, seconds a step)], a turn's prompt encoding (3 steps' time) every 96 steps;
    the bar is drawn at every step, as its ticker would."""
    for count, pace in paces:
        for _ in range(count):
            if clock.steps % 96 == 0:
                clock.now += 3 * pace
            clock.now += pace
            clock.steps += 1
            bar._show()


def test_steps_far_slower_than_the_runs_first_ones_say_so_once_with_what_to_try():
    clock, warned = Clock(), []
    with bar_for(clock, warn=warned.append) as bar:
        slowed_run(bar, clock, [(300, 0.3), (200, 4.0)])  # another job takes the cores mid-run
    assert len(warned) == 1
    assert warned[0].startswith("decode steps now take") and "x this run's first steps (0.3" in warned[0]
    assert "try --threads 1 (or OMP_NUM_THREADS=1)" in warned[0]


def test_a_steady_run_with_prompt_encodings_and_a_slow_start_says_nothing():
    clock, warned = Clock(), []
    with bar_for(clock, warn=warned.append) as bar:
        clock.now, clock.steps = 28.0, 1  # the first step carries the first prompts' encoding
        slowed_run(bar, clock, [(400, 0.3), (400, 0.5)])  # longer contexts and more rows: a little slower
    assert warned == []
