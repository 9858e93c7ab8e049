"""Continuous batching (debate/engine/scheduler.py): claims share every decode step, a claim's next turn joins at the
step after its last one ended, a finished claim's place is taken at once, errors stop the run cleanly, and greedy
records equal the fixed-batch run's."""
import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

import run_debate
from debate.engine import engine, scheduler
from debate.methods import turns
from debate.pipeline import records

SETTINGS = engine.Settings(max_new_tokens=4, temperature=0.0)


class FakeModel:
    def __init__(self):
        self.adapters = []  # the adapter each begun turn's rows were given


def fake_agent(adapter=None, model=None):
    return SimpleNamespace(model=model or FakeModel(), tokenizer=None, adapter=adapter)


class FakeCall:
    """A turn's rows in a fake batch: each prompt "claim-turn/steps" takes that many decode steps."""

    def __init__(self, prompts, adapter):
        self.prompts, self.adapter = list(prompts), adapter
        self.left = max(int(p.split("/")[1]) if "/" in p else 1 for p in prompts)

    @property
    def done(self):
        return self.left <= 0


@pytest.fixture
def calls(monkeypatch):
    """engine.begin/advance/end replaced by a fake batch; each advance appends the prompts it stepped (sorted), each
    reply is its prompt, upper-cased."""
    steps, running = [], []

    def begin(model, tokenizer, convs, prompts, settings, generator=None, schemas=None, adapter="current"):
        if isinstance(model, FakeModel):
            model.adapters.append(adapter)
        call = FakeCall(prompts, adapter)
        running.append(call)
        return call

    def advance():
        live = [c for c in running if not c.done]
        steps.append(sorted(p for c in live for p in c.prompts))
        for call in live:
            call.left -= 1

    monkeypatch.setattr(scheduler.engine, "begin", begin)
    monkeypatch.setattr(scheduler.engine, "advance", advance)
    monkeypatch.setattr(scheduler.engine, "end", lambda call: [p.upper() for p in call.prompts])
    monkeypatch.setattr(scheduler.engine, "cancel", lambda call: None)
    return steps


def talker(agent, turns_of, done):
    """A protocol over a one-claim batch: claim c speaks one turn of n steps for each n in turns_of[c], then writes
    its record."""
    def verify(claim):
        replies = [turns.speak(agent, [None], [f"{claim}{i}/{n}"], SETTINGS)[0] for i, n in enumerate(turns_of[claim])]
        done.append((claim, replies))
    return verify


def test_a_claims_next_turn_joins_at_the_next_step_and_a_finished_claim_is_replaced_at_once(calls):
    done = []
    # Two claims in progress at a time; each number is a turn's decode steps.
    turns_of = {"a": [1], "b": [2, 2, 1], "c": [1, 2], "d": [1]}
    scheduler.run(list(turns_of), talker(fake_agent(), turns_of, done), running=2)
    # a ends after step 1 and c starts at step 2; c's second turn joins at step 3 while b is mid-turn; d takes c's
    # place at step 5, the step after c ends, b still in its third turn. By the turn, every step would wait for the
    # slowest turn of its call.
    assert calls == [["a0/1", "b0/2"], ["b0/2", "c0/1"], ["b1/2", "c1/2"], ["b1/2", "c1/2"], ["b2/1", "d0/1"]]
    assert [claim for claim, _ in done] == ["a", "c", "b", "d"]
    assert dict(done)["b"] == ["B0/2", "B1/2", "B2/1"]


def test_turns_on_different_adapters_share_steps_each_row_with_its_own_adapter(calls):
    base = fake_agent()
    tuned = fake_agent(adapter="moderator", model=base.model)  # one base, two roles: the adapter tells them apart
    done = []

    def verify(claim):
        first = turns.speak(base, [None], [f"{claim}-debater"], SETTINGS)[0]
        second = turns.speak(tuned, [None], [f"{claim}-moderator"], SETTINGS)[0]
        done.append((claim, first, second))

    scheduler.run(["x", "y"], verify, running=2)
    assert calls == [["x-debater", "y-debater"], ["x-moderator", "y-moderator"]]
    assert base.model.adapters == [None, None, "moderator", "moderator"]  # each turn's rows carry their role's adapter
    assert done == [("x", "X-DEBATER", "X-MODERATOR"), ("y", "Y-DEBATER", "Y-MODERATOR")]


def test_an_error_in_one_claim_stops_the_run_and_leaves_no_thread_behind(calls):
    threads = threading.active_count()
    done = []

    def verify(claim):
        turns.speak(fake_agent(), [None], [claim], SETTINGS)
        if claim == "bad":
            raise ValueError("claim bad broke")
        turns.speak(fake_agent(), [None], [claim + "-again"], SETTINGS)
        done.append(claim)

    with pytest.raises(ValueError, match="claim bad broke"):
        scheduler.run(["ok", "bad", "later"], verify, running=2)
    assert done == [] and "later" not in [p for call in calls for p in call]
    assert threading.active_count() == threads


def test_an_error_in_the_model_call_cancels_every_waiting_claim(calls, monkeypatch):
    threads = threading.active_count()

    def advance():
        raise KeyboardInterrupt

    monkeypatch.setattr(scheduler.engine, "advance", advance)
    unwound = []

    def verify(claim):
        try:
            turns.speak(fake_agent(), [None], [claim], SETTINGS)
        finally:
            unwound.append(claim)

    with pytest.raises(KeyboardInterrupt):
        scheduler.run(["a", "b", "c"], verify, running=3)
    assert sorted(unwound) == ["a", "b", "c"] and threading.active_count() == threads


@pytest.mark.parametrize("thread_runs", [False, True])
def test_a_stop_raised_while_a_claim_thread_starts_unwinds_with_that_stop(calls, monkeypatch, thread_runs):
    # A signal handler runs in the main thread; Thread.start() waits there for the new thread, so a Ctrl-C can
    # land before the thread is marked started, or after it exists but before start() returns. Either way the
    # run must end with that stop, not "cannot join thread before it is started", and the claim must not run.
    threads = threading.active_count()
    real_start = threading.Thread.start
    cut = []

    def start(thread):
        if thread.name == "claim-1" and not cut:
            cut.append(thread)
            if thread_runs:
                real_start(thread)
            raise KeyboardInterrupt
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    ran = []
    with pytest.raises(KeyboardInterrupt):
        scheduler.run(["a", "b", "c"], lambda claim: ran.append(claim), running=3)
    if thread_runs:
        cut[0].join(timeout=10)
        assert not cut[0].is_alive()
    assert ran == ["a"] and threading.active_count() == threads


def test_speak_outside_the_scheduler_calls_the_engine_itself(monkeypatch):
    seen = []

    def generate(model, tokenizer, convs, prompts, settings, generator=None, schemas=None):
        seen.append(list(prompts))
        return [p.upper() for p in prompts]

    monkeypatch.setattr(turns.engine, "generate", generate)
    assert turns.speak(fake_agent(), [None, None], ["p", "q"], SETTINGS) == ["P", "Q"]
    assert seen == [["p", "q"]]


def read(out, name):
    """{claim id: record} less `encoded_tokens`, which follows what the claims run before left in the shared pages."""
    return {row["claim_id"]: {k: v for k, v in row.items() if k != "encoded_tokens"}
            for row in map(json.loads, (Path(out) / name).read_text().splitlines())}


# Structured where the JSON budgets allow it (the tiny tokenizer needs ~100 tokens for the Moderator's
# keys), so one model call mixes rows under a schema with free rows of other claims.
@pytest.mark.parametrize("method, extra", [
    ("debatecv", ("--max-rounds", "2", "--max-new-tokens", "110")),
    ("cooperation", ("--max-rounds", "1", "--max-new-tokens", "110")),
    ("rag-cot", ("--refine", "madr", "--madr-iterations", "1", "--max-new-tokens", "110")),
    ("courtroom", ("--max-rounds", "1", "--max-new-tokens", "8", "--no-structured")),
])
def test_continuous_batching_gives_the_fixed_batches_records_under_greedy(tiny, tmp_path, method, extra):
    outs = {}
    for mode in ("--continuous", "--no-continuous"):
        outs[mode] = tmp_path / mode
        run_debate.main(["--split", "demo", "--method", method, "--model", tiny, "--batch-size", "2",
                         "--limit", "3", "--temperature", "0", "--output-dir", str(outs[mode]), mode, *extra])
    for name in (records.PREDICTIONS, records.TRANSCRIPTS):
        continuous, fixed = read(outs["--continuous"], name), read(outs["--no-continuous"], name)
        assert sorted(continuous) == [0, 1, 2] and continuous == fixed
