"""What a run shows while it works: its lines, and its progress bar (claims done, and the turns spoken inside the
claims still in progress).

The lines: every module logs through its own logger under `debate` (`logging.getLogger(__name__)`): INFO for
what a run says, WARNING for a warning, DEBUG for detail nobody is shown. `lines` hands them, for the length of a
block, to whatever prints them: run_debate.py's stdout (warnings on stderr), train_moderator.py's, a caller's
`log` in debate.api. Nothing stays attached after the block, so two runs in one process never print a line twice.

A claim takes minutes on a CPU, so a bar that counts claims only stands still, then jumps. Every agent turn is reported
by `turns.speak` (through `turns.on_turn`), and
the time left is estimated from turns: the claims still to do, times the turns a claim has taken so far
(until one has finished: `turns_hint`, the most a claim can take), over the turn rate.
"""
import contextlib
import logging
import sys
import time

from tqdm import tqdm

from debate.methods import turns


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


class ClaimBar:
    """A context manager: a tqdm bar over claims whose postfix shows turns, the turn rate and the time left."""

    def __init__(self, total, done=0, desc=None, turns_hint=None, clock=time.monotonic):
        self.total, self.done, self.desc, self.turns_hint, self.clock = total, done, desc, turns_hint, clock
        self.claims_finished = 0  # claims written by this process
        self.turns = 0  # claim-turns spoken by this process (a batched turn over n claims counts n)
        self.finished_turns = 0  # of those, the turns of the claims already written
        self.bar = None

    def __enter__(self):
        self.start = self.clock()
        self.bar = tqdm(total=self.total, initial=self.done, unit="claim", desc=self.desc, dynamic_ncols=True,
                        bar_format="{desc}: {n_fmt}/{total_fmt} claims |{bar}| {elapsed}{postfix}")
        self._previous, turns.on_turn = turns.on_turn, self.turn
        self._show()
        return self

    def __exit__(self, *exc):
        turns.on_turn = self._previous
        self.bar.close()
        return False

    def turn(self, n=1):
        self.turns += n
        self._show()

    def claim_done(self, turns_taken):
        """A claim is written; it spoke `turns_taken` turns (its transcript's)."""
        self.claims_finished += 1
        self.finished_turns += turns_taken
        self.bar.update(1)
        self._show()

    def turns_per_claim(self):
        """Turns one claim takes: measured over the claims written, else the hint (None: not known yet)."""
        if self.claims_finished:
            return self.finished_turns / self.claims_finished
        return self.turns_hint

    def eta(self):
        """Seconds left, or None until a turn rate and the turns a claim takes are known: the turns the
        claims not yet written still take (those in progress have spoken some) over the turn rate."""
        elapsed = self.clock() - self.start
        per_claim = self.turns_per_claim()
        if not self.turns or elapsed <= 0 or not per_claim:
            return None
        left = (self.total - self.done - self.claims_finished) * per_claim - (self.turns - self.finished_turns)
        return max(0.0, left) / (self.turns / elapsed)

    def _show(self):
        if self.bar is None:
            return
        elapsed = self.clock() - self.start
        parts = [f"{self.turns} turn{'' if self.turns == 1 else 's'}"]
        if self.turns and elapsed > 0:
            rate = self.turns / elapsed
            parts.append(f"{rate:.2f} turn/s" if rate >= 1 else f"{1 / rate:.1f} s/turn")
        eta = self.eta()
        parts.append("left ?" if eta is None else f"left ~{_clock(eta)}")
        self.bar.set_postfix_str(", ".join(parts), refresh=True)
