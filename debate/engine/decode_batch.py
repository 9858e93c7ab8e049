"""A model's persistent decode batch: rows join it at any step and leave it at the step they stop.

One batch per model, kept for the run, over the model's Memory (debate.engine.kv_pool: its place of slots and its
arena of pages, allocated once). A row is one conversation's turn: its context's ids, its settings, its random
stream's key, its schema or none, its adapter or none. `advance()` is one step of the batch, as Orca, vLLM and
SGLang schedule:
1. join: waiting rows take free slots, oldest first, and wait there for their prompts to be fed;
2. step: one forward of the model carries every decoding row's one token AND up to Settings.prefill_tokens prompt
   tokens of joining rows (Sarathi-Serve's and vLLM's chunked prefill: several joining rows share a forward, a long
   prompt is spread over steps, no decoding row waits for another row's prefill; a forward is all prompt only when
   nothing decodes). The forward is one packed sequence, each token written at its own slot and column and attending
   to its own slot (debate.engine.decode_step.Inputs, debate.engine.attention: one call over every token), eager or
   compiled and replayed per bucket where asked. A joining row's cached prefix is copied from its pages into its
   slot when it is first given a piece, its full pages are published as they are written (kv_pool), and a row whose
   next page another joining row is writing waits for it instead of encoding it too. Every row's next token is
   picked on the device (`_pick`): greedy rows by argmax, sampled rows by the Gumbel race over their own random
   stream (debate.engine.sampling), schema rows
   by their device state (ids forced from a queue, free text under a mask until a closing id or a cap, or a wait for
   the host); a row whose last prompt piece ran picks its first token from that piece's last logits and decodes from
   the next step;
3. the step's packet: each row's count of picked ids, its last two ids, whether it ended and how often it waited,
   copied towards the host in one small tensor. The host reads the packet of the step BEFORE, once the next step is
   launched (the lookahead: on CUDA the device never waits for the host between steps; on a CPU the same code runs
   in the same order, so the tests run the path CUDA runs): one read a step. From it the host keeps each row's ids,
   hands a waiting schema row's next Plan back to the device (debate.engine.constrained_row.SchemaDriver: a choice
   scored as whole values, a number's next id, the end of a text), and lets rows that ended leave: their caches
   copied out to pages, their slots free at once for the next step's joins;
4. pack: when nothing waits, the last rows move down into the holes, so a step runs as few rows as are in use.

What still synchronises with the device (docs/layout.md says the same): the packet's read, once a step and a step
behind; a schema row's wait (a choice's scoring pass reads its totals once, a number's next id reads that row's
allowed logits once: a few times a Moderator reply, each costing that row one idle step). A prompt fed inside a step
reads nothing back (the step's attention is given its metadata, no mask for transformers to check). Host-to-device
writes go through pinned memory without waiting (`_upload`).

The batch's state lives on the device for the run, one entry a slot (debate.engine.batch_state: the tensors, the
device's picking and the packet); a step's inputs are packed by debate.engine.step_inputs. A row's sampled tokens
depend only on its own logits and its key (never on the rows beside it or the step the host reads), and a row that
waits for the host only idles: the same tokens at any batch size, with or without the lookahead.

A row that cannot run at all (wider than the whole place, or out of memory twice) gets an `error` instead of a
result; its turn ends its claim, the others go on.
"""
import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple, cast

import torch

from debate.engine import (
    batch_state,
    compiled_step,
    decode_step,
    generator as gen,
    kv_pool,
    kv_store,
    row_adapters,
    step_inputs,
)
from debate.engine.constrained_row import Plan, SchemaDriver

log = logging.getLogger(__name__)

# Whether the host reads a step's packet after launching the next step (the default on every device), or at once
# (False: for debugging; a waiting schema row then idles no step, and rows leave a step sooner; the same tokens).
LOOKAHEAD: bool = True

# bench/bench_gpu.py --turn-lengths: a callable(context ids) -> the most tokens a free reply after that context may
# take (its drawn length), so a random model's replies end at realistic, varied lengths; None: --max-new-tokens.
reply_cap: Optional[Callable[[Sequence[int]], int]] = None

@dataclass
class RowResult:
    ids: List[int]  # every picked id, the stop token included when the turn ended on one
    reused: int  # context tokens taken from the cache (not encoded)
    structured: Optional[Dict[str, Any]] = None  # the schema result, or None for a free reply


@dataclass(eq=False)
class Row:
    """One conversation's turn in a batch: what it needs, then where it is and what it gave."""

    conv: Any
    target: List[int]  # the context's ids
    settings: Any  # engine.Settings
    stop_ids: Tuple[int, ...]
    key: int  # its random stream (debate.engine.sampling.reply_key); unused when greedy
    schema: Any  # schema_program.Compiled or None
    adapter: Optional[str]
    pad_id: int
    tokenizer: Any
    slot: Optional[int] = None
    reused: int = 0
    # The column its next token is written at, as the host knows it: exact whenever the row feeds a token (a row
    # that stopped or waits on the device feeds none; the host corrects it when it reads that).
    length: int = 0
    ids: List[int] = field(default_factory=list)  # the ids picked so far, as the packets tell them
    waits: int = 0  # the device's waits the host has answered
    driver: Optional[SchemaDriver] = None
    # While its prompt is fed (debate.engine.decode_batch.Batch.joining): the columns written so far, whether its
    # cached prefix is in its slot, and the keys of the pages it will write that no one has (kv_pool.page_keys).
    fed: int = 0
    loaded: bool = False
    writes: set = field(default_factory=set)
    page_keys: Optional[List[bytes]] = None  # its context's full pages' keys (kv_pool.page_keys), made once a turn
    table: int = 0  # its tokenizer's first row in the batch's mask tables (a schema row)
    result: Optional[RowResult] = None
    error: Optional[str] = None

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None

    @property
    def width(self) -> int:
        """Columns the row may fill: its context, its new tokens, and a choice's tree past them."""
        scratch = self.schema.scratch_columns if self.schema is not None else 0
        return len(self.target) + self.settings.max_new_tokens + scratch

    @property
    def limit(self) -> int:
        if reply_cap is None or self.schema is not None:
            return self.settings.max_new_tokens
        return max(1, min(self.settings.max_new_tokens, reply_cap(self.target)))


class Batch:
    """The persistent decode batch of one model (see the module doc)."""

    def __init__(self, model: torch.nn.Module, memory: kv_pool.Memory) -> None:
        self.model, self.memory = model, memory
        self.device = gen.model_device(model)
        self.dtype = kv_pool.dtype_of(model)
        self.step = compiled_step.Step(model, decode_step.layer_windows(model), self.dtype)
        # A compiled step's input buffers and cache, one set a bucket (decode_step.Inputs.bucket), for the state's run
        self._buffers: step_inputs.Buffers = {}
        self.queue: Deque[Row] = collections.deque()
        self.active: Dict[int, Row] = {}
        self.joining: Dict[int, Row] = {}  # slot -> a row whose prompt the next steps feed, in the order they joined
        self.solo = False  # one prompt a step, after a step of several ran out of memory twice, until none joins
        self.lookahead = LOOKAHEAD
        # The step before's packet on its way to the host: (event, its host copy, the rows it is of, the step's
        # timing events or None).
        self._pending: Optional[Tuple[Any, torch.Tensor, List[Optional[Row]], Any]] = None
        self._state()

    def _state(self) -> None:
        """The device state, one entry a slot of the place as it is seen now (made again when it is seen anew)."""
        self.rows = self.memory.store.rows
        self.state = batch_state.State(self.rows, self.memory.store.columns, self.device)
        self._pending = None
        self.adapters = row_adapters.RowAdapters(self.model, self.rows + 1)
        self._buffers = {}  # buffers and graphs of the state before read tensors that are gone
        self.step.close()

    # -- rows in and out -------------------------------------------------------------------------------------------

    def submit(self, rows: Sequence[Row]) -> None:
        """Queue rows; they join at the next steps, oldest first."""
        self.queue.extend(rows)

    @torch.inference_mode()
    def cancel(self, rows: Sequence[Row]) -> None:
        """Take rows out, waiting, feeding their prompt or running (their turn is given up: an error or an interrupt
        elsewhere)."""
        doomed = {id(r) for r in rows}
        self.queue = collections.deque(r for r in self.queue if id(r) not in doomed)
        for slot, row in [*self.active.items(), *self.joining.items()]:
            if id(row) in doomed:
                self._free(slot)

    def busy(self) -> bool:
        return bool(self.queue or self.active or self.joining)

    @torch.inference_mode()  # its tensors are made in inference mode (batch_for), and only updated in it
    def advance(self) -> List[Row]:
        """Join, one step, the packet of the step before, pack (module doc); the rows done since the last call."""
        done = self._join()
        if self.active or self.joining:
            try:
                with compiled_step.on_device(self.device):  # its streams and events on the model's device
                    packet = self._step(done)
            except torch.OutOfMemoryError:  # twice: the rows of this step end their claims, the others go on
                for slot, row in [*self.active.items(), *self.joining.items()]:
                    row.error = "its decode step ran out of memory twice"
                    self._free(slot)
                    done.append(row)
                self._pending = None
                return done
            pending, self._pending = self._pending, packet
            if pending is not None:
                done += self._read(pending)
            if not self.lookahead and packet is not None:
                self._pending = None
                done += self._read(packet)
        if not self.active:
            self._pending = None  # what it held is of rows that have left
        if not self.queue:
            self._pack()
        return done

    def _join(self) -> List[Row]:
        """Waiting rows into free slots, oldest first; their prompts are fed by the next steps (`_pieces`)."""
        done: List[Row] = []
        mem = self.memory
        if not self.active and not self.joining and self.queue and mem.reshape([r.width for r in self.queue]):
            self._state()
        while self.queue:
            row = self.queue[0]
            if not mem.fits(row.width):
                self.queue.popleft()
                row.error = (f"one conversation of {len(row.target)} context tokens and {row.settings.max_new_tokens} "
                             f"new ones needs {row.width} columns of keys and values, more than the memory budget "
                             f"holds ({mem.store.tokens}; {kv_pool.describe(mem.pool)}, {mem.pool.source})")
                done.append(row)
                continue
            slot = mem.take_slot(row.width)
            if slot is None:
                break  # every slot taken, or the first in line waits for the place to empty (then it is reshaped)
            self.queue.popleft()
            row.slot, row.loaded, row.fed, row.writes, row.page_keys = slot, False, 0, set(), None
            self.adapters.assign(slot, row.adapter)
            # Zeroed before anything is written: a column is zeroed once, the first time a row may reach it.
            mem.store.ready(min(row.width, mem.store.columns))
            self.state.upload(slot, live=False, ended=False, kind=batch_state.FREE, lengths=0)
            self.joining[slot] = row
        return done

    def _pieces(self) -> List[Tuple[Row, int, int]]:
        """This step's prompt pieces, (row, first column, end column): the joining rows' next tokens, oldest row
        first, up to the step's budget of prompt tokens (Settings.prefill_tokens; a long prompt spreads over steps).
        A row's cached prefix is copied into its slot when it is first given a piece. A row whose context's next page
        another joining row is writing now waits for it (the courtroom's judge seats read one case file: the first
        writes its pages, the others take them once published, rather than each encoding the file)."""
        budget = min(r.settings.prefill_tokens for r in self.joining.values())
        pieces: List[Tuple[Row, int, int]] = []
        writing = {key for r in self.joining.values() for key in r.writes}
        for row in list(self.joining.values()):
            if budget <= 0:
                break
            if not row.loaded:
                if row.settings.reuse_cache and self._waits(row, writing):
                    continue
                row.reused = self.memory.load(row.conv, row.target, cast(int, row.slot), row.settings.reuse_cache,
                                              row.adapter)
                row.fed, row.loaded = row.reused, True
                if row.settings.reuse_cache:  # the pages it will write that no one has
                    keys = self._page_keys(row)
                    row.writes = {k for k in keys[row.reused // kv_store.PAGE:] if k not in self.memory.index}
                    writing |= row.writes
            n = min(len(row.target) - row.fed, budget)
            pieces.append((row, row.fed, row.fed + n))
            budget -= n
            if self.solo:
                break
        return pieces

    def _waits(self, row: Row, writing: set) -> bool:
        """Whether the page after the longest run of `row`'s context the index has is being written by another
        joining row (and its own cache holds no more)."""
        if not writing:
            return False
        keys = self._page_keys(row)[:(len(row.target) - 1) // kv_store.PAGE]
        run = next((i for i, key in enumerate(keys) if key not in self.memory.index), len(keys))
        if run == len(keys) or keys[run] not in writing:
            return False
        return self.memory.usable(row.conv, row.target, row.adapter) <= run * kv_store.PAGE

    @staticmethod
    def _page_keys(row: Row) -> List[bytes]:
        """The keys of the row's context's full pages, hashed once while it waits and joins (not at every step)."""
        if row.page_keys is None:
            row.page_keys = kv_pool.page_keys(row.target, row.adapter, len(row.target) // kv_store.PAGE)
        return row.page_keys

    def _fed(self, row: Row, end: int, logits: Optional[torch.Tensor]) -> None:
        """A row's prompt written up to column `end`: its full pages published; when that is its whole prompt, it
        decodes from the next step, its first token picked now from `logits` (its last prompt token's)."""
        mem, slot = self.memory, cast(int, row.slot)
        row.fed = end
        if row.settings.reuse_cache:
            mem.publish(slot, row.target[:end], row.adapter)
        if end < len(row.target):
            return
        assert logits is not None
        row.writes = set()
        del self.joining[slot]
        row.length = len(row.target)
        row.ids, row.waits = [], 0
        self.active[slot] = row
        state, settings = self.state, row.settings
        state.stop_ids(slot, list(row.stop_ids))
        sampled = settings.temperature > 0
        state.upload(slot, limits=row.limit, pads=row.pad_id, lengths=row.length, picked=0, keys=row.key,
                     temps=settings.temperature if sampled else 0.0, top_ps=settings.top_p, live=True, ended=False,
                     waits=0, last=[row.pad_id, row.pad_id])
        if row.schema is not None:
            row.table = state.table(row.tokenizer, logits.shape[-1], row.stop_ids)
            row.driver = SchemaDriver(row.schema, settings.max_new_tokens - 1, row.stop_ids[0], settings, row.key,
                                      self._scorer(row))
            state.load(slot, row.driver.plan(None, row.ids), row.table)
        else:
            row.driver = None
            state.upload(slot, kind=batch_state.FREE)
        self._pick(logits[None], slot, slot + 1, state.live[slot:slot + 1].clone())

    def _scorer(self, row: Row) -> Callable[[Any, torch.Tensor], List[float]]:
        """A choice's scoring for a schema row: its tree fed over its slot past the row's end, wherever the row is."""
        def score(candidates: Any, logits: torch.Tensor) -> List[float]:
            slot = cast(int, row.slot)  # where the row is now: packing may have moved it
            cache = self.memory.store.slot_cache(slot, row.length)
            with self.adapters.over(slot, slot + 1):
                return gen.tree_logprobs(self.model, cache, candidates, logits)
        return score

    def _retried(self, call: Callable[[], torch.Tensor]) -> torch.Tensor:
        """call(), once more after an out-of-memory error (the allocator's cache emptied: a fragmentation the plan
        cannot see); a second one is raised."""
        try:
            return call()
        except torch.OutOfMemoryError:
            pass  # retried below, outside this block: here the traceback still holds the failed attempt's tensors
        log.warning("out of memory in a model call; retrying it once with the allocator's cache emptied")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return call()

    # -- the step --------------------------------------------------------------------------------------------------

    def _step(self, done: List[Row]) -> Optional[Tuple[Any, torch.Tensor, List[Optional[Row]], Any]]:
        """One step launched: the forward (the decode rows' tokens, and the joining rows' prompt pieces beside them,
        one packed sequence), every row's pick and state; its packet on its way to the host (None: no row has
        picked)."""
        place = self.memory.store
        self.solo = self.solo and bool(self.joining)
        pieces = self._pieces() if self.joining else []
        in_use = max(self.active) + 1 if self.active else 0
        # A joining row below the last decode row feeds a token too (the decode rows are slots [0, in_use)): at the
        # column after its prompt's piece, which its next piece or first token overwrites before anything reads it.
        after = {cast(int, row.slot): end for row, _, end in pieces}
        for slot, row in self.joining.items():
            if slot < in_use:
                self.state.upload(slot, lengths=after.get(slot, row.fed))
        ends = ([r.length + 1 for r in self.active.values()]
                + [after.get(s, r.fed) + 1 for s, r in self.joining.items() if s < in_use]
                + [end for _, _, end in pieces])
        columns = min(max(ends, default=1), place.columns)
        settings = next(iter({**self.active, **self.joining}.values())).settings
        compiled = compiled_step.compiling(self.model, settings)
        inputs = step_inputs.build(self.model, place, self.state, self.active, in_use, pieces, columns,
                                   self._buffers if compiled else None)
        place.ready(inputs.columns.shape[0])
        timing = self.step.clock.start(mixed=bool(pieces))
        began = time.perf_counter()
        try:
            with self.adapters.tokens(inputs.packed.slot, inputs.bucket if compiled else None):
                logits = self._retried(lambda: self.step.run(compiled, inputs))
        except torch.OutOfMemoryError:
            if not pieces:
                raise
            # Twice. With several prompts in it, the next steps feed one at a time (whichever one it was fails alone
            # then); with one, its row ends its claim. The decode rows picked nothing: they run again.
            if len(pieces) > 1:
                self.solo = True
                return None
            row = pieces[0][0]
            row.error = f"one conversation of {len(row.target)} context tokens ran out of memory in its prefill twice"
            self._free(cast(int, row.slot))
            done.append(row)
            return None
        stepped = list(self.active.values())
        if in_use:
            fed = self.state.live[:in_use].clone()
            self.state.lengths[:in_use] += fed
            self._pick(logits[:in_use], 0, in_use, fed)
        at = in_use
        for row, first, end in pieces:
            last = end == len(row.target)
            self._fed(row, end, logits[at] if last else None)
            at += last
        self.step.clock.stop(timing)  # before the packet's event: once that is done, so is the step's end event
        stats = self.step.stats
        if pieces:
            stats.prefill_tokens += sum(end - first for _, first, end in pieces)
            if stepped:
                stats.mixed += 1
                stats.mixed_rows += len(stepped)
            else:
                stats.prefill_only += 1
        stats.row_steps += in_use
        stats.launch_seconds += time.perf_counter() - began
        for row in stepped:
            row.length += 1  # exact for a row that fed a token; corrected for one that did not (`_read`)
        if not self.active:
            self.step.clock.add(timing)
            return None
        return (*self._packet(max(self.active) + 1), timing)

    def _pick(self, logits: torch.Tensor, lo: int, hi: int, fed: torch.Tensor) -> None:
        """Rows lo..hi-1's next ids from their logits, on the device, and their state after it (module doc, 2)."""
        rows = [r for r in (self.active.get(s) for s in range(lo, hi)) if r is not None]
        self.state.pick(logits, lo, hi, fed, sampled=any(r.settings.temperature > 0 for r in rows),
                        nucleus=any(r.settings.temperature > 0 and r.settings.top_p < 1.0 for r in rows),
                        schema=any(r.driver is not None for r in rows))

    def _packet(self, in_use: int) -> Tuple[Any, torch.Tensor, List[Optional[Row]]]:
        """The step's packet on its way to the host: (an event, its host copy, the rows it is of)."""
        return (*self.state.packet(in_use), [self.active.get(slot) for slot in range(in_use)])

    def _read(self, packet: Tuple[Any, torch.Tensor, List[Optional[Row]], Any]) -> List[Row]:
        """A step's packet read (its one read): each row's new ids; a row that waits gets its next Plan; the rows
        that ended leave. The rows done."""
        event, host, of, timing = packet
        event.synchronize()
        self.step.clock.add(timing)
        done: List[Row] = []
        for row, (count, before, last, ended, waits) in zip(of, host.tolist()):
            if row is None or row.done or row.slot is None or self.active.get(row.slot) is not row:
                continue  # left already, or given up
            new = count - len(row.ids)
            if new > 0:  # at most two: a join's first id and a step's (the host adds the ids it picks itself)
                row.ids += [before, last][2 - new:]
            if ended:
                done.append(self._leave(row))
            elif waits > row.waits:
                row.waits = waits
                row.length = len(row.target) + len(row.ids)  # it fed no token since it began to wait
                finished = self._resume(row)
                if finished is not None:
                    done.append(finished)
        return done

    def _resume(self, row: Row) -> Optional[Row]:
        """A waiting schema row's next Plan from the logits it held: its first id picked here, the rest on the
        device. The row when that ends its reply."""
        slot = cast(int, row.slot)
        driver = cast(SchemaDriver, row.driver)
        assert self.state.held is not None
        plan = driver.plan(self.state.held[slot], row.ids)
        if not plan.queue:
            raise RuntimeError("a schema row's plan after a wait has no id to feed")  # schema_program never does
        first, rest = plan.queue[0], Plan(plan.queue[1:], plan.text, plan.done)
        row.ids.append(first)
        if first in row.stop_ids or len(row.ids) >= row.limit:
            self.state.upload(slot, picked=len(row.ids), ended=True)
            return self._leave(row)
        self.state.load(slot, rest, row.table)
        self.state.upload(slot, tokens=first, picked=len(row.ids), live=True)
        return None

    def _leave(self, row: Row) -> Row:
        """A row whose reply ended: its ids to the stop, its cache stored, its slot freed."""
        slot = cast(int, row.slot)
        stops = set(row.stop_ids)
        ids = row.ids[:next((i + 1 for i, token in enumerate(row.ids) if token in stops), len(row.ids))]
        self.step.stats.tokens += max(0, len(ids) - 1)  # the first id came from the prefill's logits
        if row.settings.reuse_cache:
            # The last id was picked, never fed: the slot holds the context and the ids before it.
            self.memory.store_cache(row.conv, slot, row.target + ids[:-1], row.adapter)
        row.result = RowResult(ids, row.reused, row.driver.result if row.driver is not None else None)
        self._free(slot)
        return row

    def _free(self, slot: int) -> None:
        row = self.active.pop(slot, None) or self.joining.pop(slot, None)
        if row is not None:
            row.slot, row.writes = None, set()
        self.state.upload(slot, live=False, ended=False, lengths=0, tokens=0, kind=batch_state.FREE)
        # lengths 0: a free slot's step writes at column 0 (masked, overwritten by the next row)
        self.memory.give_slot(slot)

    def _pack(self) -> None:
        """The last rows into the lowest free slots, so the next steps run as few rows as are in use."""
        while self.active:
            top = max(self.active)
            free = [s for s in self.memory.free_slots if s < top]
            if not free:
                return
            target = min(free)
            row = self.active.pop(top)
            self.memory.free_slots.remove(target)
            self.memory.store.move(top, target, min(row.length + 1, self.memory.store.columns))
            self.state.move(top, target)
            self.adapters.move(top, target)
            self.active[target] = row
            row.slot = target
            self.state.upload(top, live=False, ended=False, lengths=0, kind=batch_state.FREE)
            self.memory.give_slot(top)


@torch.inference_mode()
def batch_for(model: torch.nn.Module, rows: Sequence[Row]) -> Batch:
    """The model's batch, kept by its Memory (debate.engine.kv_pool): made on first use, sized for `rows` or the
    run's rows where it said, and made anew with the Memory when its device's pool is given a new budget."""
    pool = kv_pool.pool_for(gen.model_device(model))
    new_tokens = max((r.settings.max_new_tokens for r in rows), default=1)
    trie = max((r.schema.scratch_columns for r in rows if r.schema is not None), default=0)
    # The widest a row may be by the run's settings (--max-context, a turn's new tokens included, and a choice's
    # tree past it); None where one has none: the model's window.
    limits = [r.settings.max_context for r in rows]
    longest = max(limits) + trie if limits and None not in limits else None
    piece = max((r.settings.prefill_tokens for r in rows), default=kv_pool.memory.PREFILL_CHUNK)
    memory = pool.memory_of(model, [r.width for r in rows] or [1], new_tokens, trie, longest,
                            max(piece, kv_pool.memory.PREFILL_CHUNK))
    if memory.batch is None:
        memory.batch = Batch(model, memory)
    return memory.batch


def existing(model: torch.nn.Module) -> Optional[Batch]:
    """The model's batch if it has one now (none is made)."""
    memory = kv_pool.pool_for(gen.model_device(model)).memories.get(model)
    return memory.batch if memory is not None else None


def busy_batches() -> List[Batch]:
    """Every batch with rows waiting or running."""
    return [m.batch for m in kv_pool.memories() if m.batch is not None and m.batch.busy()]

