"""Continuous batching at the turn level: many claims run their protocol side by side, and every turn any
of them asks for joins the next batched model call of its model.

Each claim runs the method's ordinary function on a batch of one claim, in a thread of its own used as a
coroutine: `turns.speak` hands the turn to the scheduler (`submit`) and waits for the reply. Exactly one
thread runs at a time, the scheduler passing control back and forth, so the protocols need no locks and a
run is deterministic (the same claims, settings and seed give the same calls in the same order).

The loop: admit claims while fewer than `running` are in progress and the memory pools have room for one more
(each runs until its first turn); take the turn
that has waited longest and every other waiting turn on the same model, adapter, settings and random
stream; run them as one `engine.generate` call (rows of different claims, roles and prompts, each under
its own schema or none); resume each of those claims with its reply, which runs it to its next turn or
to its end. A claim that ends frees its place at once for the next one: no claim waits for the slowest
claim of a batch, and no model call waits for a whole batch of claims to reach the same turn.

Room for a claim (`_reserve`): a claim's caches twice for it, once for its caches and once for the turn buffer and
copies a model call makes of them, and once more for every live claim that holds none yet (admitted since the last
model call, or all its caches dropped), which the pools' count cannot see. A claim's caches: the most bytes any
claim's caches have held so far (debate.engine.kv_pool); before any claim has held one, the largest first turn
among the claims admitted, estimated from its prompts (engine.turn_cache_bytes), so the first wave too is
admitted by what fits. A turn whose row cannot run (engine.generate's ContextOverflow) ends that claim alone: the
error is raised in its thread, and its run writes the claim with a note.

Methods are written once, as functions over a list of claims; `verify_claims` in debate/pipeline/runner.py still
runs them a batch at a time (`--no-continuous`), which is the reference this is tested against.
"""
import contextvars
import itertools
import threading
import weakref
from dataclasses import astuple, dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, List, Optional, Sequence, Tuple

from debate.engine import engine, kv_pool
from debate.engine.errors import ContextOverflow
from debate.engine.models import RoleModel, adapter_scope

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
    key: Optional[Tuple[Any, ...]] = None  # turns with equal keys can share a model call (see `_key`)
    replies: Optional[List[str]] = None
    error: Optional[BaseException] = None  # raised in the claim instead of replying (a row that could not run)


def _key(agent: RoleModel, settings: engine.Settings, generator: Optional["torch.Generator"]) -> Tuple[Any, ...]:
    """What a shared model call needs in common: the same weights and adapter, settings and random stream."""
    return (id(agent.model), agent.adapter, astuple(settings), id(generator))


class _Task:
    """A claim in progress: its thread and the turn it waits on (None while it runs or once it has ended)."""

    # Optional[Turn] in truth, but set for every task the scheduler reads it from (live, unfinished): Any spares
    # those reads a check the protocol already makes
    turn: Any
    error: Optional[BaseException]

    def __init__(self, index: int, claim: Any, verify_one: Callable[[Any], Any], baton: threading.Semaphore) -> None:
        self.index, self.turn, self.error = index, None, None
        self.first_turn: Optional[int] = None  # its first turn's caches in bytes, estimated once (`_reserve`)
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
    task.turn = Turn(agent, list(convs), list(prompts), settings, generator, schema, next(_orders),
                     _key(agent, settings, generator))
    task.baton.release()
    task.go.acquire()
    if task.cancelled:
        raise Cancelled
    turn, task.turn = task.turn, None
    if turn.error is not None:
        raise turn.error
    return turn.replies


def _run_turns(group: Sequence[_Task]) -> None:
    """One engine.generate call over the rows of every turn in `group` (equal keys); fills their replies."""
    first = group[0].turn
    convs = [c for t in group for c in t.turn.convs]
    prompts = [p for t in group for p in t.turn.prompts]
    schemas = [t.turn.schema for t in group for _ in t.turn.convs]
    failed: dict = {}
    with adapter_scope(first.agent):
        try:
            replies = engine.generate(first.agent.model, first.agent.tokenizer, convs, prompts, first.settings,
                                      generator=first.generator, schemas=schemas if any(schemas) else None)
        except ContextOverflow as err:  # the other rows ran; only the claims of the failed rows end
            replies, failed = err.replies, err.failed
    start = 0
    for task in group:
        n = len(task.turn.convs)
        for conv in task.turn.convs:
            if isinstance(conv, engine.Conversation):
                task.convs[id(conv)] = conv
        mine = {row - start: reason for row, reason in failed.items() if start <= row < start + n}
        if mine:
            task.turn.error = ContextOverflow(mine, replies[start:start + n])
            task.turn.error.conversations = list(task.convs.values())
        else:
            task.turn.replies = replies[start:start + n]
        start += n


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


def _reserve(live: Sequence[_Task], claim_peak: int) -> int:
    """The bytes the pools must have free to admit one more claim: twice a claim's caches for it, and a claim's
    caches for each live claim that holds none yet; a claim's caches: `claim_peak`, the most any claim has held,
    or before any has held one, the largest first turn among the live claims."""
    fresh = [t for t in live if not t.finished and kv_pool.held_by(t.convs.values()) == 0]
    per_claim = claim_peak or max((_first_turn_bytes(t) for t in fresh), default=0)
    return (len(fresh) + 2) * per_claim


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
            while waiting and len(live) < running and (not live or kv_pool.has_room(_reserve(live, claim_peak))):
                task = _Task(*waiting.pop(), verify_one, baton)
                live.append(task)
                most = max(most, len(live))
                task.resume()
            live = [t for t in live if not t.finished]
            if not live:
                continue
            oldest = min(live, key=lambda t: t.turn.order)
            group = sorted((t for t in live if t.turn.key == oldest.turn.key), key=lambda t: t.turn.order)
            _run_turns(group)
            claim_peak = max([claim_peak] + [kv_pool.held_by(task.convs.values()) for task in group])
            for task in group:
                task.resume()
            live = [t for t in live if not t.finished]
        return most
    finally:
        for task in live:  # an error or an interrupt: unwind the claims still waiting, keep nothing of them
            if not task.finished:
                task.cancelled = True
                task.go.release()  # a thread whose start a signal cut finds itself cancelled and ends
                if task.started:
                    task.thread.join()
