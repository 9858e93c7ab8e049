"""What a run shows while it works: its lines, and its progress bar (claims done, and the turns spoken inside the
claims still in progress).

The lines: every module logs through its own logger under `debate` (`logging.getLogger(__name__)`): INFO for
what a run says, WARNING for a warning, DEBUG for detail nobody is shown. `lines` hands them, for the length of a
block, to whatever prints them: run_debate.py's stdout (warnings on stderr), train_moderator.py's, a caller's
`log` in debate.api. Nothing stays attached after the block, so two runs in one process never print a line twice.

A claim takes minutes on a CPU, and a short run's claims end together at its end, so a bar that counts claims only
stands still for most of the run. Every agent turn is reported by `turns.speak` (through `turns.on_turn`) with the
tokens it generated, and the run's decode steps (one a token, for every row of a model call together) are read as they
happen, so the bar moves inside a turn too. The time left is the decode steps still to come at the seconds a step has
taken so far: the claim-turns still to come (the claims not yet written, times the turns a claim takes: measured once
one has finished, else `turns_hint`, the most it can take) at the steps a claim-turn takes (measured once a turn has
ended, else a turn's most tokens shared by the claims that run side by side). A decode step costs about the same for
one row as for several, and the prompts' encoding is small beside the steps, so this holds from the first minute;
without steps to read, turns stand in for them.
"""
import contextlib
import logging
import sys
import threading
import time

from tqdm import tqdm

# debate.methods.turns (where a turn is reported) imports torch: it is imported when a bar starts, so the CLIs' lines
# (`lines`) cost nothing before a command line is known to be sound.


class Lines(logging.Handler):
    """A record's message as a plain line (no level, no logger name): `say(text)` below WARNING, `warn(text)`
    from WARNING up."""

    def __init__(self, say, warn):
        super().__init__(logging.INFO)
        self.say, self.warn = say, warn

    def emit(self, record):
        (self.warn if record.levelno >= logging.WARNING else self.say)(record.getMessage())


def to_stderr(text):
    """A warning's line on the sys.stderr of the moment, where a warning with no logging set up goes too."""
    print(text, file=sys.stderr)


@contextlib.contextmanager
def lines(say=print, warn=to_stderr, logger="debate"):
    """During the block, what the `logger` loggers log at INFO and up goes to `say` and `warn` as plain lines
    (print: the sys.stdout of the moment); the logger is lowered to INFO for the block if it was above. Both are
    undone on leaving, however the block ends."""
    target = logging.getLogger(logger)
    handler, level = Lines(say, warn), target.level
    target.addHandler(handler)
    if not target.isEnabledFor(logging.INFO):
        target.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        target.removeHandler(handler)
        target.setLevel(level)


@contextlib.contextmanager
def quiet(logger="debate"):
    """During the block, the `logger` loggers say nothing below WARNING (a rank other than 0: rank 0 speaks for
    the run)."""
    target = logging.getLogger(logger)
    level = target.level
    target.setLevel(max(target.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        target.setLevel(level)


def _clock(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60:02d}:{seconds % 60:02d}"


log = logging.getLogger(__name__)

# Decode steps before the pace is trusted: the first includes the first prompts' encoding (28 s against 3 s a step on
# a busy 2-core machine), so one step alone would put the time left at hours.
MIN_STEPS = 8


# A slow-down is judged over this many decode steps (a turn's prompt encoding between two steps is small beside them),
# and said once the steps take this many times what the run's own first ones took: a step costs a little more as the
# context grows and rows join, never several times more, unless the CPU is shared (issue 54: 4 s a step, not 0.3).
PACE_WINDOW, SLOW_FACTOR = 64, 3.0


class SlowSteps:
    """One warning line when decode steps run far slower than the run's own first ones, and what to try.

    Fed (time, decode steps so far) each time the bar is drawn; the first pace is taken over the PACE_WINDOW steps
    after the first MIN_STEPS (those include the first prompts' encoding), the recent one over the last PACE_WINDOW.
    The steps are the engine's own count (debate.engine.step_stats.stats_of); nothing here reaches into the engine."""

    def __init__(self, window=PACE_WINDOW, factor=SLOW_FACTOR):
        self.window, self.factor = window, factor
        self.samples = []  # (time, steps) since the first pace's start
        self.first = None  # seconds a step, over the run's first steps
        self.warned = False

    def sample(self, now, steps):
        """The warning line, the first time the steps run slow; else None."""
        if steps < MIN_STEPS or self.warned:
            return None
        if not self.samples or steps > self.samples[-1][1]:
            self.samples.append((now, steps))
        start_time, start_steps = self.samples[0]
        if self.first is None:
            if steps - start_steps >= self.window:
                self.first = (now - start_time) / (steps - start_steps)
                self.samples = self.samples[-1:]
            return None
        past = [(t, n) for t, n in self.samples if n <= steps - self.window]
        if not past or self.first <= 0:
            return None
        self.samples = self.samples[len(past) - 1:]  # older samples are no longer needed
        then, before = past[-1]
        recent = (now - then) / (steps - before)
        if recent < self.factor * self.first:
            return None
        self.warned = True
        return (f"decode steps now take {recent:.2f} s each, {recent / self.first:.0f}x this run's first steps "
                f"({self.first:.2f} s): the CPU is shared with other work, or runs more threads than it has free "
                "cores; try --threads 1 (or OMP_NUM_THREADS=1), or a less busy machine")


class ClaimBar:
    """A context manager: a tqdm bar over claims whose postfix shows the turns spoken, the tokens they generated, the
    decode steps and their pace, and the time left; it is drawn again every `tick` seconds (None: only on events).

    `steps`: a callable giving the run's decode steps so far (counted from the bar's start); `tokens`: one giving the
    tokens those steps generated, so the count moves inside a turn; `max_new_tokens`: the most steps a turn takes;
    `side_by_side`: the claims that share a model call at most (the batch size). `warn(line)`: where the slow-steps
    line goes (SlowSteps; default: this module's logger, the run's stderr)."""

    def __init__(self, total, done=0, desc=None, turns_hint=None, clock=time.monotonic, steps=None,
                 max_new_tokens=None, side_by_side=1, tick=2.0, tokens=None, warn=None):
        self.total, self.done, self.desc, self.turns_hint, self.clock = total, done, desc, turns_hint, clock
        self.steps_source, self.max_new_tokens, self.side_by_side, self.tick = steps, max_new_tokens, side_by_side, tick
        self.tokens_source, self.warn = tokens, warn or log.warning
        self.slow = SlowSteps()
        self.rounds = {}  # claim id -> (round, of) of the claims in progress that said so (debate.methods.turns)
        self.claims_finished = 0  # claims written by this process
        self.turns = 0  # claim-turns spoken by this process (a batched turn over n claims counts n)
        self.tokens = 0  # tokens those turns generated
        self.finished_turns = 0  # of those, the turns of the claims already written
        self.steps_at_turn = 0  # decode steps when the last turn ended
        # Turns whose model call is known to be over (steps have been taken since), and the steps when it ended: the
        # replies of one call come in one by one at the same step, and the first alone must not count as the call.
        self.settled_turns, self.settled_steps = 0, 0
        self.bar = None
        self._lock = threading.Lock()  # the ticker and the run's thread both draw the bar
        self._stop = threading.Event()

    def __enter__(self):
        self.start = self.clock()
        self._steps_before = self.steps_source() if self.steps_source else 0
        self._tokens_before = self.tokens_source() if self.tokens_source else 0
        self.bar = tqdm(total=self.total, initial=self.done, unit="claim", desc=self.desc, dynamic_ncols=True,
                        bar_format="{desc}: {n_fmt}/{total_fmt} claims |{bar}| {elapsed}{postfix}")
        self._ticker = None
        if self.tick:
            try:  # a signal may land in start(): nothing is left drawing, and no one hears turns for a dead bar
                self._ticker = threading.Thread(target=self._tick, name="progress", daemon=True)
                self._ticker.start()
            except BaseException:
                self._stop.set()
                self.bar.close()
                raise
        from debate.methods import turns

        self._previous, turns.on_turn = turns.on_turn, self.turn
        self._previous_round, turns.on_round = turns.on_round, self.round
        self._show()
        return self

    def __exit__(self, *exc):
        from debate.methods import turns

        turns.on_turn, turns.on_round = self._previous, self._previous_round
        self._stop.set()
        if self._ticker is not None and self._ticker.ident is not None:
            self._ticker.join()
        self.bar.close()
        return False

    def _tick(self):
        while not self._stop.wait(self.tick):
            self._show()

    def steps(self):
        """Decode steps since the bar started (0 without a source)."""
        return self.steps_source() - self._steps_before if self.steps_source else 0

    def turn(self, n=1, tokens=0):
        """`n` claim-turns ended, generating `tokens` tokens."""
        steps = self.steps()
        if steps > self.steps_at_turn:  # steps since the last reply: the turns before it had their whole call
            self.settled_turns, self.settled_steps = self.turns, self.steps_at_turn
        self.turns += n
        self.tokens += tokens
        self.steps_at_turn = steps
        self._show()

    def round(self, claim_ids, round_no, of):
        """Claims begin round `round_no` ("final": the verdict after the last) of `of`."""
        for claim_id in claim_ids:
            self.rounds[claim_id] = (round_no, of)
        self._show()

    def tokens_so_far(self):
        """Tokens generated since the bar started: as the steps make them where they are counted (a little ahead, see
        runner.decode_tokens), never fewer than the ended turns' own count."""
        live = self.tokens_source() - self._tokens_before if self.tokens_source else 0
        return max(self.tokens, live)

    def claim_done(self, turns_taken, claim_id=None):
        """A claim is written; it spoke `turns_taken` turns (its transcript's)."""
        self.rounds.pop(claim_id, None)
        self.claims_finished += 1
        self.finished_turns += turns_taken
        self.bar.update(1)
        self._show()

    def turns_per_claim(self):
        """Turns one claim takes: measured over the claims written, else the hint (None: not known yet)."""
        if self.claims_finished:
            return self.finished_turns / self.claims_finished
        return self.turns_hint

    def turns_left(self):
        """Claim-turns still to come, or None while the turns a claim takes are not known: those of the claims not yet
        written, less what the claims in progress have spoken."""
        per_claim = self.turns_per_claim()
        if not per_claim:
            return None
        claims_left = self.total - self.done - self.claims_finished
        return max(0.0, claims_left * per_claim - (self.turns - self.finished_turns))

    def steps_per_turn(self):
        """Decode steps a claim-turn takes: measured over the turns whose model call is over, else a turn's most tokens
        over the claims that run side by side (None: not known)."""
        if self.turns and self.steps() > self.steps_at_turn:
            return self.steps_at_turn / self.turns
        if self.settled_turns:
            return self.settled_steps / self.settled_turns
        if not self.max_new_tokens:
            return None
        side_by_side = max(1, min(self.side_by_side, self.total - self.done))
        return self.max_new_tokens / side_by_side

    def eta(self):
        """Seconds left, or None until the pace is known: the decode steps to come (the turns left's, less the steps
        already taken inside the turns in progress) at the seconds a step has taken; without steps, the turns left
        at the turn rate."""
        return self.estimate()[0]

    def estimate(self):
        """(seconds left or None, what it is based on, in words): `eta` and its basis for the bar."""
        elapsed = self.clock() - self.start
        left = self.turns_left()
        if left is None or elapsed <= 0:
            return None, "no turn measured yet"
        steps, per_turn = self.steps(), self.steps_per_turn()
        # The turns a claim takes: measured once one is written, else the most the method can take.
        per_claim = "" if self.claims_finished else ", a claim's turns at most"
        if steps >= MIN_STEPS and per_turn:
            to_come = max(0.0, left * per_turn - (steps - self.steps_at_turn))
            return to_come * elapsed / steps, f"{to_come:,.0f} steps to come at {elapsed / steps:.2f} s{per_claim}"
        if not self.turns:
            return None, f"{steps} of {MIN_STEPS} first steps" if self.steps_source else "no turn ended yet"
        return left / (self.turns / elapsed), f"{left:,.0f} turns to come at {elapsed / self.turns:.0f} s{per_claim}"

    def rounds_text(self, shown=3):
        """Each claim's round, for the claims in progress that report one: "claim 2: round 2 of 3", the first few."""
        items = list(self.rounds.items())
        texts = [f"claim {claim_id}: " + (f"final verdict after {of} rounds" if r == "final" else f"round {r} of {of}")
                 for claim_id, (r, of) in items[:shown]]
        return "; ".join(texts) + (f"; {len(items) - shown} more" if len(items) > shown else "")

    def _show(self):
        if self.bar is None:
            return
        with self._lock:
            elapsed, steps = self.clock() - self.start, self.steps()
            parts = [self.rounds_text()] if self.rounds else []
            parts += [f"{self.turns} turn{'' if self.turns == 1 else 's'}", f"{self.tokens_so_far():,} tokens"]
            if steps and elapsed > 0:
                pace = elapsed / steps
                parts.append(f"{steps:,} steps at {pace:.1f} s" if pace >= 1 else f"{steps:,} steps, {1 / pace:.1f}/s")
            elif self.turns and elapsed > 0:
                rate = self.turns / elapsed
                parts.append(f"{rate:.2f} turn/s" if rate >= 1 else f"{1 / rate:.1f} s/turn")
            eta, basis = self.estimate()
            parts.append(f"left {'?' if eta is None else '~' + _clock(eta)} ({basis})")
            self.bar.set_postfix_str(", ".join(p for p in parts if p), refresh=True)
            slow = self.slow.sample(self.clock(), steps)
        if slow:
            self.warn(slow)
