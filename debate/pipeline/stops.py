"""Clean stops: Ctrl-C, SIGTERM and a full disk end a run (or a training stage) in one line, losing nothing done.

    with stops.handled(signal.SIGINT, signal.SIGTERM), stops.one_line():   # the CLIs' frame (main_guard)
        ...
        with stops.deferred():       # a record being written, a training step: not cut in the middle
            ...

While `handled` is on, SIGINT (Ctrl-C) and SIGTERM (a scheduler's preemption, `timeout`) raise `Stopped` in the
main thread, which runs the model calls and the continuous-batching scheduler (debate/engine/scheduler.py):
the claims in progress are cancelled, their threads unwound and joined, and the with-blocks on the way out
put the output directory in order (records.RunDir) and release its lock. What is done is on disk already:
a claim's record is fsynced when it is written. Inside `deferred()` the first signal is only noted and
raised when the section ends, so a record is written whole or not at all; a second signal raises at once.

`one_line` turns a stop into "stopped: 8 of 30 claims written to DIR; the same command resumes" (exit
128 + the signal: 130 for SIGINT, 143 for SIGTERM) and a full disk (ENOSPC, or EDQUOT: a quota) into
"error: no space left on device (PATH); kept: ...". What was kept is said by the code that knows it, on
the way out (`note`); the innermost note wins.
"""
import contextlib
import errno
import os
import signal
import sys
import threading

FULL = {errno.ENOSPC, errno.EDQUOT}
RESUME = "the same command resumes"


class Stopped(KeyboardInterrupt):
    """A stop asked for by a signal. A KeyboardInterrupt, so that whatever unwinds on Ctrl-C unwinds on it, and
    no `except Exception` of a protocol can swallow it."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# Deferred sections open in the main thread (the messages they show on a held-back signal); a signal held back.
_state = {"sections": [], "pending": None}


def _raise(signum, frame):
    if _state["sections"] and _state["pending"] is None:
        _state["pending"] = signum  # the section ends first (deferred), then the stop
        message = next((m for m in reversed(_state["sections"]) if m), None)
        if message:  # os.write: print() could re-enter a stderr write (a progress bar's) this signal cut
            os.write(2, f"\n{message} (again to stop at once)\n".encode())
        return
    _state["pending"] = None  # a second signal: the one held back is this stop too
    raise Stopped(signum)


def pending():
    """The signal a deferred section holds back, or None."""
    return _state["pending"]


def stop_now(signum=signal.SIGTERM):
    """Raise the stop a deferred section held back, else a stop by `signum` (a process of a multi-process
    launch stopping with the others); the caller has put its work in order first."""
    held, _state["pending"] = _state["pending"], None
    raise Stopped(held or signum)


@contextlib.contextmanager
def deferred(message=None):
    """A section a first signal does not cut: it is raised when the section ends (or earlier, where the section
    asks `pending()` and calls `stop_now()`), after `message` is shown if the wait may be long. Signals reach
    only the main thread, so in any other thread (a claim of the scheduler) this does nothing: the main thread
    stops and joins the claim's thread, which finishes the write it is in."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _state["sections"].append(message)
    try:
        yield
    finally:
        _state["sections"].pop()
    if not _state["sections"] and _state["pending"] is not None:
        stop_now()


@contextlib.contextmanager
def handled(*signums):
    """While in the block, the given signals raise Stopped in the main thread (elsewhere nothing changes).
    SIGINT is taken only from Python's own handler: a process started with SIGINT ignored (a background job
    of a non-interactive shell) keeps ignoring it, and a host program's own handler is left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for signum in signums:
        if signum == signal.SIGINT and signal.getsignal(signum) is not signal.default_int_handler:
            continue
        previous[signum] = signal.signal(signum, _raise)
    _state["pending"] = None
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _state["pending"] = None


def note(err, kept, resume=RESUME, replace=False):
    """Say on `err`, on its way out, what is kept ("3 of 8 claims written to DIR") and how to go on; the first
    (innermost) note stays unless `replace`."""
    if replace or not hasattr(err, "debatecv_kept"):
        err.debatecv_kept, err.debatecv_resume = kept, resume
    return err


def _noted(err):
    """(kept, resume) of the first note on `err` or on an error it was raised while handling; (None, None)."""
    for e in _chain(err):
        if hasattr(e, "debatecv_kept"):
            return e.debatecv_kept, e.debatecv_resume
    return None, None


def stopped_line(err):
    """The one line a stop prints."""
    kept, resume = _noted(err)
    if kept is None:
        return "stopped before anything was written; the same command starts again"
    return f"stopped: {kept}; {resume}"


def full(err):
    """The full-disk OSError `err` is or was raised while handling (a file's close failing after its write
    did), or None."""
    return next((e for e in _chain(err) if isinstance(e, OSError) and e.errno in FULL), None)


def full_line(err):
    """The one line a full disk prints: what filled up, where, and what is kept."""
    cause = full(err)
    path = next((e.filename for e in _chain(err) if getattr(e, "filename", None)), None)
    kept, resume = _noted(err)
    return (f"error: {cause.strerror}{f' ({path})' if path else ''}; "
            f"{f'kept: {kept}' if kept else 'nothing written was lost'}; free some space, then "
            f"{resume if kept else 'run the same command again'}")


def _chain(err):
    """`err` and the errors it was raised while handling."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__context__


@contextlib.contextmanager
def one_line():
    """A CLI's ending: a stop prints stopped_line and exits 128 + the signal; a full disk prints full_line and
    exits 1. Anything else passes through."""
    try:
        yield
    except Stopped as stop:
        print(stopped_line(stop), file=sys.stderr)
        raise SystemExit(128 + stop.signum) from None
    except Exception as err:
        if full(err) is None:
            raise
        print(full_line(err), file=sys.stderr)
        raise SystemExit(1) from None
