"""A model's persistent decode batch: rows join it at any step and leave it at the step they stop.

One batch per model, kept for the run, over the model's Memory (debate.engine.kv_pool: its place of slots and its
arena of pages, allocated once). A row is one conversation's turn: its context's ids, its settings, its schema or
none, its adapter or none. `advance()` is one step of the batch, as Orca, vLLM and SGLang schedule:
1. join: waiting rows take free slots, oldest first. A row's cached prefix is copied from its pages into its slot
   (once a turn), its new tokens are prefilled there in pieces (debate.engine.generator.prefill), and its first token
   is picked from the prefill's logits; it decodes with the others from the next step;
2. step: every row in use feeds one token (debate.engine.decode_step: compiled and replayed per bucket where asked);
   the picks stay on the device: greedy rows by argmax, sampled rows by their own random stream and settings, and
   only a row under a schema (the Moderator's JSON) has its logits read by the host, which picks its token
   (debate.engine.constrained_row) and writes it back;
3. leave: the rows that stopped (their stop token, or their limit) are read back (their ids, once), their caches
   copied out to pages, their slots free at once for the next step's joins;
4. pack: when nothing waits, the last rows move down into the holes, so a step runs as few rows as are in use.

The batch's state lives on the device for the run, one entry a slot: the token each row feeds next, its length (the
column its token is written at, which is also its position), whether it is live, how many ids it has picked, its
limit, its stop ids, and every id it picked. The host learns once a step which rows are still live (one small copy).

A row that cannot run at all (wider than the whole place, or out of memory twice) gets an `error` instead of a
result; its turn ends its claim, the others go on.
"""
import collections
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple, cast

import torch

from debate.engine import decode_step, generator as gen, kv_pool, row_adapters, schema_program
from debate.engine.constrained_row import SchemaRow
from debate.engine.sampling import next_tokens

log = logging.getLogger(__name__)

# Whether the host launches a step before it reads which rows the step before stopped (None: on CUDA, where the
# device then never waits for the host between steps; the tests set it on a CPU, where it changes nothing but when
# rows leave, one step later, masked in the meantime).
LOOKAHEAD: Optional[bool] = None

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
    generator: Optional[torch.Generator]
    schema: Any  # schema_program.Compiled or None
    adapter: Optional[str]
    pad_id: int
    tokenizer: Any
    slot: Optional[int] = None
    reused: int = 0
    length: int = 0  # columns of its slot that hold its tokens (exact for a schema row; at most that otherwise)
    driven: Optional[SchemaRow] = None
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
        self.step = decode_step.Step(model, decode_step.layer_windows(model), self.dtype)
        self.queue: Deque[Row] = collections.deque()
        self.active: Dict[int, Row] = {}
        self._groups: Optional[List[Tuple[Any, torch.Tensor]]] = None  # sampled rows by random stream and settings
        # With lookahead: the step before's live flags on their way to the host (an event, the flags in pinned memory,
        # the rows they are of); they are read once the next step is launched.
        self.lookahead = LOOKAHEAD if LOOKAHEAD is not None else self.device.type == "cuda"
        self._pending: Optional[Tuple[Any, torch.Tensor, List[Optional[Row]]]] = None
        self._state()

    def _state(self) -> None:
        """The device state, one entry a slot of the place as it is seen now (made again when it is seen anew)."""
        rows, device = self.memory.store.rows, self.device
        self.rows = rows
        # One entry more than the slots, never used: a step's views ([:rows in use]) are then always part of a larger
        # tensor, so a compiled step sees the same kind of input at every bucket (a view as long as its base
        # recompiled the graph once a run).
        rows += 1
        self.tokens = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.lengths = torch.zeros(rows, dtype=torch.long, device=device)
        self.live = torch.zeros(rows, dtype=torch.bool, device=device)
        self.picked = torch.zeros(rows, dtype=torch.long, device=device)  # ids picked so far
        self.limits = torch.ones(rows, dtype=torch.long, device=device)
        self.stops = torch.full((rows, 1), -1, dtype=torch.long, device=device)
        self.history = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.pads = torch.zeros(rows, dtype=torch.long, device=device)
        self.columns = torch.arange(self.memory.store.columns + 1, device=device)
        # Two flag buffers in turn for lookahead: one written by this step while the host reads the other.
        self._flags = [torch.zeros(rows, dtype=torch.bool, pin_memory=device.type == "cuda") for _ in range(2)]
        self._pending = None
        self.adapters = row_adapters.RowAdapters(self.model, rows)
        self.memory.store.forget_views()  # views and graphs of the state before read tensors that are gone
        self.step.close()

    # -- rows in and out -------------------------------------------------------------------------------------------

    def submit(self, rows: Sequence[Row]) -> None:
        """Queue rows; they join at the next steps, oldest first."""
        self.queue.extend(rows)

    @torch.inference_mode()
    def cancel(self, rows: Sequence[Row]) -> None:
        """Take rows out, waiting or running (their turn is given up: an error or an interrupt elsewhere)."""
        doomed = {id(r) for r in rows}
        self.queue = collections.deque(r for r in self.queue if id(r) not in doomed)
        for slot, row in list(self.active.items()):
            if id(row) in doomed:
                self._free(slot)

    def busy(self) -> bool:
        return bool(self.queue or self.active)

    @torch.inference_mode()  # its tensors are made in inference mode (batch_for), and only updated in it
    def advance(self) -> List[Row]:
        """Join, one step, leave, pack (module doc); the rows done since the last call."""
        done = self._join()
        if self.active:
            try:
                self._step()
            except torch.OutOfMemoryError:  # twice: the rows of this step end their claims, the others go on
                for slot, row in list(self.active.items()):
                    row.error = "its decode step ran out of memory twice"
                    self._free(slot)
                    done.append(row)
                return done
            done += self._leave()
        if not self.queue:
            self._pack()
        return done

    def _join(self) -> List[Row]:
        done: List[Row] = []
        mem = self.memory
        if not self.active and self.queue and mem.reshape([r.width for r in self.queue]):
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
            self._prefill(row, slot)
            if row.done:
                done.append(row)
        return done

    def _prefill(self, row: Row, slot: int) -> None:
        """The row into `slot`: its cached prefix copied in, its new tokens fed, its first token picked."""
        mem = self.memory
        row.slot = slot
        self.adapters.assign(slot, row.adapter)
        # Zeroed before anything is written: a column is zeroed once, the first time a row may reach it.
        mem.store.ready(min(row.width, mem.store.columns))
        try:
            row.reused = mem.load(row.conv, row.target, slot, row.settings.reuse_cache)
            logits = self._retried(lambda: self._feed(row))
        except torch.OutOfMemoryError:
            row.error = f"one conversation of {len(row.target)} context tokens ran out of memory in its prefill twice"
            self._free(slot)
            return
        row.length = len(row.target)
        self.active[slot] = row
        if row.schema is not None:
            masks = schema_program.masks(row.tokenizer, logits.shape[-1], list(row.stop_ids), logits.device)
            row.driven = SchemaRow(row.schema, row.settings.max_new_tokens - 1, masks, row.settings, row.generator,
                                   self._scorer(row))
            token = row.driven.next_token(logits)
            first: Any = row.stop_ids[0] if token is None else token
        elif row.settings.temperature > 0:
            first = next_tokens(logits[None], row.settings, row.generator)[0]
        else:
            first = logits.argmax()
        stops = list(row.stop_ids)
        if len(stops) > self.stops.shape[1]:  # the state grows for the most stop ids and ids a row has had, rarely
            more = self.stops.new_full((self.stops.shape[0], len(stops) - self.stops.shape[1]), -1)
            self.stops = torch.cat([self.stops, more], dim=1)
        self.stops[slot] = -1
        self.stops[slot, :len(stops)] = torch.tensor(stops)
        limit = row.limit
        if limit > self.history.shape[1]:
            more = self.history.new_zeros((self.history.shape[0], limit - self.history.shape[1]))
            self.history = torch.cat([self.history, more], dim=1)
        self.limits[slot] = limit
        self.pads[slot] = row.pad_id
        self.lengths[slot] = row.length
        self.picked[slot] = 1
        self.history[slot, 0] = first
        first_t = torch.as_tensor(first, device=self.device)
        live = ~(first_t == self.stops[slot]).any() & (limit > 1)
        self.live[slot] = live
        self.tokens[slot, 0] = torch.where(live, first_t, self.pads[slot])
        self._groups = None

    def _feed(self, row: Row) -> torch.Tensor:
        slot = cast(int, row.slot)
        cache = self.memory.store.slot_cache(slot, row.reused)
        with self.adapters.over(slot, slot + 1):
            return gen.prefill(self.model, cache, row.target[row.reused:], row.reused)

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

    def _step(self) -> None:
        place = self.memory.store
        in_use = max(self.active) + 1
        columns = min(max(row.length for row in self.active.values()) + 1, place.columns)
        compiled = decode_step.compiling(self.model, next(iter(self.active.values())).settings)
        if compiled:
            in_use = decode_step.bucket_rows(in_use, place.rows)
            columns = decode_step.bucket_columns(columns, place.columns)
        place.ready(columns)
        began = time.perf_counter()
        cache = place.decode_cache(in_use, columns, self.lengths, keep=compiled)
        # Eagerly on a CPU each row attends to its own columns (decode_step._rows_alone): the host knows them exactly
        # here, every active row being live (no lookahead on a CPU) and a free slot reading nothing.
        ends = None
        if not compiled and not self.lookahead and self.device.type == "cpu":
            ends = [self.active[slot].length + 1 if slot in self.active else 0 for slot in range(in_use)]
        with self.adapters.over(0, in_use), decode_step.decoding(self.model, ends):
            logits = self._retried(lambda: self.step.run(
                compiled, gen.cache_kwarg(self.model, cache), self.tokens[:in_use], self.lengths[:in_use],
                self.live[:in_use], self.columns[:columns]))
        picks = self._picks(logits, in_use)
        self._update(picks, in_use)
        self.step.stats.row_steps += in_use
        self.step.stats.seconds += time.perf_counter() - began
        for row in self.active.values():
            row.length += 1  # at most: a row that stopped on the device stays (its leave reads the truth)

    def _picks(self, logits: torch.Tensor, in_use: int) -> torch.Tensor:
        """Every row's pick on the device: argmax; sampled rows' by their streams; schema rows' by the host."""
        picks = logits.argmax(dim=-1)
        if self._groups is None:
            groups: Dict[Tuple[Any, ...], Tuple[Any, List[int]]] = {}
            for slot, row in sorted(self.active.items()):
                if row.settings.temperature > 0 and row.schema is None:
                    key = (id(row.generator), row.settings.temperature, row.settings.top_p)
                    groups.setdefault(key, (row, []))[1].append(slot)
            self._groups = [(row, torch.tensor(slots, device=self.device)) for row, slots in groups.values()]
        for row, slots in self._groups:  # every active slot is below in_use
            picks[slots] = next_tokens(logits[slots], row.settings, row.generator)
        hosted = [(slot, row) for slot, row in self.active.items() if row.driven is not None]
        if hosted:
            chosen = []
            for slot, row in sorted(hosted):
                row.length += 1  # the token fed now is in its slot: a choice's tree goes after it
                token = cast(SchemaRow, row.driven).next_token(logits[slot])
                row.length -= 1
                chosen.append(row.stop_ids[0] if token is None else token)
            picks[torch.tensor([s for s, _ in sorted(hosted)], device=self.device)] = torch.tensor(
                chosen, device=self.device)
        return picks

    def _update(self, picks: torch.Tensor, in_use: int) -> None:
        """The rows' state after a step's picks, on the device: lengths, history, live, the next tokens."""
        live = self.live[:in_use]
        was = live.clone()
        self.lengths[:in_use] += was
        count = self.picked[:in_use]
        column = count.clamp(max=self.history.shape[1] - 1)
        rows = torch.arange(in_use, device=self.device)
        self.history[rows, column] = torch.where(was, picks, self.history[rows, column])
        count += was
        stopped = (picks[:, None] == self.stops[:in_use]).any(dim=1)
        live &= ~stopped & (count < self.limits[:in_use])
        self.tokens[:in_use, 0] = torch.where(live, picks, self.pads[:in_use])

    def _leave(self) -> List[Row]:
        """The rows that stopped: their ids read back, their caches stored, their slots freed. With lookahead (and no
        schema row, whose picks the host has just made), those of the step before: this step's flags go to the host
        while the next step runs."""
        in_use = max(self.active) + 1
        rows: List[Optional[Row]] = [self.active.get(slot) for slot in range(in_use)]
        pending, self._pending = self._pending, None
        stopped: List[Row] = []
        if pending is not None:
            event, flags, of = pending
            event.synchronize()
            stopped = [row for row, on in zip(of, flags[:len(of)].tolist()) if row is not None and not on]
        if self.lookahead and not any(row.driven is not None for row in self.active.values()):
            index = 0 if pending is None or pending[1] is not self._flags[0] else 1
            flags = self._flags[index]
            flags[:in_use].copy_(self.live[:in_use], non_blocking=True)
            event = torch.cuda.Event() if self.device.type == "cuda" else _Done()
            event.record()
            self._pending = (event, flags, rows)
        else:
            now = self.live[:in_use].tolist()
            stopped += [row for row, on in zip(rows, now) if row is not None and not on]
        gone = sorted({row.slot for row in stopped if row.slot is not None and not row.done})
        if not gone:
            return []
        counts = self.picked[gone].tolist()
        histories = self.history[gone].tolist()
        done = []
        for slot, count, history in zip(gone, counts, histories):
            row = self.active[slot]
            ids = history[:count]
            stops = set(row.stop_ids)
            end = next((i + 1 for i, token in enumerate(ids) if token in stops), len(ids))
            ids = ids[:end]
            self.step.stats.tokens += max(0, len(ids) - 1)  # the first id came from the prefill's logits
            if row.settings.reuse_cache:
                # The last id was picked, never fed: the slot holds the context and the ids before it.
                self.memory.store_cache(row.conv, slot, row.target + ids[:-1])
            row.result = RowResult(ids, row.reused, row.driven.result if row.driven is not None else None)
            self._free(slot)
            done.append(row)
        return done

    def _free(self, slot: int) -> None:
        row = self.active.pop(slot, None)
        if row is not None:
            row.slot = None
        self.live[slot] = False
        self.lengths[slot] = 0  # a free slot's step writes at column 0 (masked, overwritten by the next row)
        self.tokens[slot] = 0
        self.memory.give_slot(slot)
        self._groups = None

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
            self.memory.store.move(top, target, row.length + 1)
            for state in (self.tokens, self.lengths, self.live, self.picked, self.limits, self.stops, self.history,
                          self.pads):
                state[target] = state[top]
            self.adapters.move(top, target)
            self.active[target] = row
            row.slot = target
            self.live[top] = False
            self.lengths[top] = 0
            self.memory.give_slot(top)
            self._groups = None


class _Done:
    """A CPU's stand-in for a CUDA event: its work is done when the call that queued it returns."""

    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        pass


@torch.inference_mode()
def batch_for(model: torch.nn.Module, rows: Sequence[Row]) -> Batch:
    """The model's batch, kept by its Memory (debate.engine.kv_pool): made on first use, sized for `rows` or the
    run's rows where it said, and made anew with the Memory when its device's pool is given a new budget."""
    pool = kv_pool.pool_for(gen.model_device(model))
    new_tokens = max((r.settings.max_new_tokens for r in rows), default=1)
    trie = max((r.schema.scratch_columns for r in rows if r.schema is not None), default=0)
    memory = pool.memory_of(model, [r.width for r in rows] or [1], new_tokens, trie)
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

