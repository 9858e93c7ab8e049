"""Continuous batching: many claims run their protocol side by side, and every turn any of them asks for joins its
model's decode batch at the next step (debate.engine.decode_batch: rows join and leave at any step).

Each claim runs the method's ordinary function on a batch of one claim, in a thread of its own used as a
coroutine: `turns.speak` hands the turn to the scheduler (`submit`) and waits for the reply. Exactly one
thread runs at a time, the scheduler passing control back and forth, so the protocols need no locks and a
run is deterministic (the same claims, settings and seed give the same calls in the same order).

The loop, one decode step at a time: admit claims while fewer than `running` are in progress and the memory
authority has room for one more (each runs until its first turn, which is queued at once: engine.begin); step every
model's batch once (engine.advance: waiting rows join, oldest first, every row in use feeds a token, rows that
stopped leave); resume each claim whose turn is done, oldest turn first, with its replies (engine.end), which runs it
to its next turn (queued at once, so it joins at the next step) or to its end. Rows of different claims, roles (each
with its own adapter or none), settings, random streams and schemas share every step: no claim waits for the slowest
row of a batch, and a claim that ends frees its place at once for the next one.

Room for a claim is the memory authority's to say (kv_pool.admits_claim): a claim's caches in the arenas' free
pages, for it and for every live claim that holds none yet. A claim's caches: the most bytes any claim's caches have
held so far (debate.engine.kv_pool); before any claim has held one, the largest first turn among the claims
admitted, estimated from its prompts (engine.turn_cache_bytes), so the first wave too is admitted by what fits. A
turn whose row cannot run (engine.end's ContextOverflow) ends that
claim alone: the error is raised in its thread, and its run writes the claim with a note.

Methods are written once, as functions over a list of claims; `verify_claims` in debate/pipeline/runner.py still
runs them a batch at a time (`--no-continuous`), which is the reference this is tested against.
"""
import contextvars
import itertools
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, List, Optional, Sequence

from debate.engine import engine, kv_pool
from debate.engine.errors import ContextOverflow
from debate.engine.models import RoleModel

if TYPE_CHECKING:
    import torch

_local = threading.local()  # the claim a thread runs, so `submit` knows whom to suspend
_orders = itertools.count()  # the order turns are asked for in, over the whole process


class Cancelled(BaseException):
    """Raised in a suspended claim when the run stops early (an error elsewhere, Ctrl-C): the claim unwinds
    without a record. A BaseException, so a protocol's `except Exception` cannot swallow it."""


@dataclass
class Turn:
    """One batched turn a claim asked for: what `turns.speak` was called with."""

    agent: RoleModel
    convs: List[engine.Conversation]
    prompts: List[str]
    settings: engine.Settings
    generator: Optional["torch.Generator"]
    schema: Any  # a schema_program.Compiled for every row, or None
    order: int  # when it was asked for: the oldest turn goes first
    call: Optional[engine.Call] = None  # its rows in the model's batch, once begun
    replies: Optional[List[str]] = None
    error: Optional[BaseException] = None  # raised in the claim instead of replying (a row that could not run)


class _Task:
    """A claim in progress: its thread and the turn it waits on (None while it runs or once it has ended)."""

    # Optional[Turn] in truth, but set for every task the scheduler reads it from (live, unfinished): Any spares
    # those reads a check the protocol already makes
    turn: Any
    error: Optional[BaseException]

    def __init__(self, index: int, claim: Any, verify_one: Callable[[Any], Any], baton: threading.Semaphore) -> None:
        self.index, self.turn, self.error = index, None, None
        self.first_turn: Optional[int] = None  # its first turn's caches in bytes, estimated once (`_admits`)
        self.started = self.finished = self.cancelled = False
        # The conversations its turns have used, weakly: what its caches hold is read off them (kv_pool.held_by).
        self.convs: "weakref.WeakValueDictionary[int, engine.Conversation]" = weakref.WeakValueDictionary()
        self.go = threading.Semaphore(0)
        self.baton = baton
        # A copy of the starting context: the claim's thread reads what its run set there (the run's prompt
        # set, debate/data/prompts.py), where a bare thread would start from an empty context.
        context = contextvars.copy_context()
        self.thread = threading.Thread(target=context.run, args=(self._body, claim, verify_one), daemon=True,
                                       name=f"claim-{index}")

    def _body(self, claim: Any, verify_one: Callable[[Any], Any]) -> None:
        _local.task = self
        self.go.acquire()
        try:
            if not self.cancelled:
                verify_one(claim)
        except Cancelled:
            pass
        except BaseException as err:  # handed to the scheduler's thread, which raises it
            self.error = err
        finally:
            self.finished, self.turn = True, None
            self.baton.release()

    def resume(self) -> None:
        """Let the claim run until its next turn or its end; raise what it raised."""
        if not self.started:
            # Marked only once start() returned: a signal raised inside start() (it waits for the new thread)
            # leaves a thread that may or may not run, which the unwinding cannot join but can release.
            self.thread.start()
            self.started = True
        self.go.release()
        self.baton.acquire()
        if self.error is not None:
            error, self.error = self.error, None
            raise error


def submit(agent: RoleModel, convs: Iterable[engine.Conversation], prompts: Iterable[str], settings: engine.Settings,
           generator: Optional["torch.Generator"], schema: Any) -> Optional[List[str]]:
    """Called by `turns.speak` in a claim's thread: wait for the scheduler to run this turn; the replies.
    None when the calling thread is not a scheduled claim (the caller then runs the turn itself)."""
    task = getattr(_local, "task", None)
    if task is None:
        return None
    task.turn = Turn(agent, list(convs), list(prompts), settings, generator, schema, next(_orders))
    task.baton.release()
    task.go.acquire()
    if task.cancelled:
        raise Cancelled
    turn, task.turn = task.turn, None
    if turn.error is not None:
        raise turn.error
    return turn.replies


def _begin(task: _Task) -> None:
    """Queue the rows of the turn the claim waits on in its model's batch (engine.begin), with its role's adapter."""
    turn = task.turn
    turn.call = engine.begin(turn.agent.model, turn.agent.tokenizer, turn.convs, turn.prompts, turn.settings,
                             generator=turn.generator, schemas=[turn.schema] * len(turn.convs) if turn.schema else None,
                             adapter=turn.agent.adapter)
    for conv in turn.convs:
        if isinstance(conv, engine.Conversation):
            task.convs[id(conv)] = conv


def _end(task: _Task) -> None:
    """The replies of the claim's finished turn (engine.end), or the error of its rows that could not run."""
    turn = task.turn
    try:
        turn.replies = engine.end(turn.call)
    except ContextOverflow as err:  # the other rows ran; only this claim ends
        err.conversations = list(task.convs.values())
        turn.error = err


def _first_turn_bytes(task: _Task) -> int:
    """What the claim's caches will hold after the turn it waits on, estimated once (engine.turn_cache_bytes);
    0 for a turn on a model the pools do not count (no config or tokenizer: a scripted stand-in)."""
    if task.first_turn is None:
        turn = task.turn  # a live, unfinished claim waits on a turn
        rows = [(c, p) for c, p in zip(turn.convs, turn.prompts) if isinstance(c, engine.Conversation)]
        model, tokenizer = turn.agent.model, turn.agent.tokenizer
        if not rows or getattr(model, "config", None) is None or tokenizer is None:
            task.first_turn = 0
        else:
            convs, prompts = zip(*rows)
            task.first_turn = engine.turn_cache_bytes(model, tokenizer, convs, prompts, turn.settings)
    return task.first_turn


def _admits(live: Sequence[_Task], claim_peak: int) -> bool:
    """Whether the memory authority admits one more claim (kv_pool.admits_claim): a claim's caches are `claim_peak`,
    the most any claim has held, or before any has held one, the largest first turn among the live claims that hold
    none yet."""
    fresh = [t for t in live if not t.finished and kv_pool.held_by(t.convs.values()) == 0]
    per_claim = claim_peak or max((_first_turn_bytes(t) for t in fresh), default=0)
    return kv_pool.admits_claim(per_claim, len(fresh), sum(not t.finished for t in live))


def run(claims: Iterable[Any], verify_one: Callable[[Any], Any], running: int) -> int:
    """Verify `claims` with `verify_one(claim)` (a method on a one-claim batch, writing its own record),
    at most `running` claims in progress at once, fewer when the memory pools have no room for another;
    returns the most claims that were in progress at once."""
    if running < 1:
        raise ValueError(f"running must be at least 1, not {running}")
    baton = threading.Semaphore(0)
    waiting = list(enumerate(claims))[::-1]  # popped from the end: claims start in their given order
    live: List[_Task] = []
    claim_peak = 0  # the most bytes one claim's caches have held so far
    most = 0
    try:
        while waiting or live:
            while waiting and len(live) < running and (not live or _admits(live, claim_peak)):
                task = _Task(*waiting.pop(), verify_one, baton)
                live.append(task)
                most = max(most, len(live))
                task.resume()
                if not task.finished:
                    _begin(task)
            live = [t for t in live if not t.finished]
            if not live:
                continue
            engine.advance()
            done = sorted((t for t in live if t.turn.call.done), key=lambda t: t.turn.order)
            for task in done:
                _end(task)
                claim_peak = max(claim_peak, kv_pool.held_by(task.convs.values()))
                task.resume()
                if not task.finished:
                    _begin(task)
            live = [t for t in live if not t.finished]
        return most
    finally:
        for task in live:  # an error or an interrupt: unwind the claims still waiting, keep nothing of them
            if not task.finished and task.turn is not None and task.turn.call is not None:
                engine.cancel(task.turn.call)
            if not task.finished:
                task.cancelled = True
                task.go.release()  # a thread whose start a signal cut finds itself cancelled and ends
                if task.started:
                    task.thread.join()
