"""A decode batch's state on the device, one entry a slot, and what a step does to it (debate.engine.decode_batch).

`State` holds, for the run of a place, the tensors a step reads and writes without the host (`STATE`: each row's
next token, its length, whether it is live or ended, its picks, its sampling and a schema row's program state), the
schema rows' mask tables and the logits a waiting row holds. `pick` is a step's picking on the device: greedy rows by
argmax, sampled rows by the Gumbel race over their own stream (debate.engine.sampling), schema rows by their state
(ids forced from a queue, free text under a mask until a closing id or a cap, or a wait for the host); `packet` is
what the host reads of a step, once. Host writes (`upload`) are fills or copies from pinned memory that do not wait.
"""
from typing import Any, Dict, List, Optional, Tuple, cast

import torch

from debate.engine import kv_store, sampling, schema_program
from debate.engine.constrained_row import Plan

# A schema row's device state (`kind`): FREE (not a schema row), FORCE (ids from its queue), TEXT (free text under a
# mask), WAIT (the host's turn).
FREE, FORCE, TEXT, WAIT = 0, 1, 2, 3
QUEUE = 64  # the most ids a Plan queues at once (a schema's forced pieces are a few tokens each)
MODES = ("text", "reasoning")  # a mask table's two entries per tokenizer and stop ids (schema_program.masks)


# The device state, one entry a slot: (name, dtype, trailing shape). `tokens` the id each row feeds next, `lengths`
# its write column and position, `live` whether it feeds one, `ended` whether its reply ended (a stop id or its
# limit), `picked` how many ids it has picked (also the number of its next draw), `last` its last two ids (the
# packet's), `stops` its stop ids, `keys`/`temps`/`top_ps` its sampling, and a schema row's state: `kind`, `mode`
# (its mask's row in the tables), `cap` (text ids left), `forced`/`qpos`/`qlen` (its queue of ids to force) and what
# follows the queue (`then_kind`, `then_mode`, `then_cap`), `waits` (how often it has waited for the host).
STATE = (("tokens", torch.long, (1,)), ("lengths", torch.long, ()), ("live", torch.bool, ()),
          ("ended", torch.bool, ()), ("picked", torch.long, ()), ("limits", torch.long, ()),
          ("stops", torch.long, (1,)), ("pads", torch.long, ()), ("last", torch.long, (2,)),
          ("keys", torch.long, ()), ("temps", torch.float32, ()), ("top_ps", torch.float32, ()),
          ("kind", torch.long, ()), ("mode", torch.long, ()), ("cap", torch.long, ()),
          ("forced", torch.long, (QUEUE,)), ("qpos", torch.long, ()), ("qlen", torch.long, ()),
          ("then_kind", torch.long, ()), ("then_mode", torch.long, ()), ("then_cap", torch.long, ()),
          ("waits", torch.long, ()))


class State:
    """The device state of a batch's place: one entry a slot (and one more, never used: a step's views [:in use] are
    then always part of a larger tensor, so a compiled step sees the same kind of input at every bucket)."""

    # Annotations of the state tensors `__init__` makes (STATE): one entry a slot of the place, and one more.
    tokens: torch.Tensor
    lengths: torch.Tensor
    live: torch.Tensor
    ended: torch.Tensor
    picked: torch.Tensor
    limits: torch.Tensor
    stops: torch.Tensor
    pads: torch.Tensor
    last: torch.Tensor
    keys: torch.Tensor
    temps: torch.Tensor
    top_ps: torch.Tensor
    kind: torch.Tensor
    mode: torch.Tensor
    cap: torch.Tensor
    forced: torch.Tensor
    qpos: torch.Tensor
    qlen: torch.Tensor
    then_kind: torch.Tensor
    then_mode: torch.Tensor
    then_cap: torch.Tensor
    waits: torch.Tensor

    def __init__(self, rows: int, columns: int, device: torch.device) -> None:
        self.rows, self.device = rows, device
        for name, dtype, shape in STATE:
            setattr(self, name, torch.zeros((rows + 1, *shape), dtype=dtype, device=device))
        self.stops.fill_(-1)
        self.limits.fill_(1)
        self.columns = torch.arange(columns + 1, device=device)  # an arange a step's slots and columns are views of
        # The schema rows' mask tables (schema_program.masks stacked: MODES entries per tokenizer and stop ids) and
        # the logits a waiting row holds for the host: made when the first schema row joins.
        self.banned: Optional[torch.Tensor] = None
        self.closing: Optional[torch.Tensor] = None
        self._tables: Dict[Tuple[int, int, Tuple[int, ...]], int] = {}
        self.held: Optional[torch.Tensor] = None

    def upload(self, slot: int, **values: Any) -> None:
        """Set state entries of one slot. A number is written by a fill (no copy); a list goes through pinned memory
        and a copy that does not wait (a copy from ordinary memory would wait for every step queued before it)."""
        for name, value in values.items():
            target = getattr(self, name)[slot]
            if isinstance(value, list):
                target[:len(value)].copy_(kv_store.to_device(value, self.device))
            else:
                target.fill_(value)

    def stop_ids(self, slot: int, stops: List[int]) -> None:
        """A row's stop ids (the state grows for the most stop ids a row has had, rarely)."""
        if len(stops) > self.stops.shape[1]:
            self.stops = torch.cat([self.stops, self.stops.new_full((self.stops.shape[0], len(stops) -
                                                                     self.stops.shape[1]), -1)], dim=1)
        self.upload(slot, stops=stops + [-1] * (self.stops.shape[1] - len(stops)))

    def table(self, tokenizer: Any, vocab: int, stop_ids: Tuple[int, ...]) -> int:
        """The first of a schema row's MODES rows in the mask tables (its tokenizer's masks, added on first use)."""
        key = (id(tokenizer), vocab, tuple(stop_ids))
        if key not in self._tables:
            masks = schema_program.masks(tokenizer, vocab, list(stop_ids), self.device)
            banned = torch.stack([masks[m][0] for m in MODES])
            closing = torch.stack([masks[m][1] for m in MODES])
            self._tables[key] = 0 if self.banned is None else self.banned.shape[0]
            self.banned = banned if self.banned is None else torch.cat([self.banned, banned])
            self.closing = closing if self.closing is None else torch.cat([self.closing, closing])
        if self.held is None or self.held.shape[1] != vocab:
            self.held = torch.zeros((self.rows + 1, vocab), dtype=torch.float32, device=self.device)
        return self._tables[key]

    def load(self, slot: int, plan: Plan, base: int) -> None:
        """A schema row's Plan as its device state: the queue, then free text or a wait."""
        if len(plan.queue) > QUEUE:
            raise RuntimeError(f"a schema forces {len(plan.queue)} ids at once, more than the queue's {QUEUE}")
        then_kind, then_mode, then_cap = WAIT, 0, 0
        if plan.text is not None:
            then_kind, then_mode, then_cap = TEXT, base + MODES.index(plan.text[0]), plan.text[1]
        if plan.queue:
            self.upload(slot, kind=FORCE, forced=list(plan.queue), qpos=0, qlen=len(plan.queue), then_kind=then_kind,
                         then_mode=then_mode, then_cap=then_cap)
        else:
            self.upload(slot, kind=then_kind, mode=then_mode, cap=then_cap)

    def pick(self, logits: torch.Tensor, lo: int, hi: int, fed: torch.Tensor, sampled: bool, nucleus: bool,
             schema: bool) -> None:
        """Rows lo..hi-1's next ids from their logits, on the device, and their state after it (debate.engine
        .decode_batch's module doc, 2). What the host knows of the rows: `sampled` (some row samples), `nucleus` (some
        row's top_p < 1), `schema` (some row is a schema row's)."""
        kind, picked = self.kind[lo:hi], self.picked[lo:hi]
        scores = logits
        if schema:
            banned, closing, held_all = (cast(torch.Tensor, t) for t in (self.banned, self.closing, self.held))
            mode, cap, qpos = self.mode[lo:hi], self.cap[lo:hi], self.qpos[lo:hi]
            texting, forcing = kind == TEXT, kind == FORCE
            scores = logits.masked_fill(banned[mode] & texting[:, None], float("-inf"))
        pick = sampling.pick(scores, self.temps[lo:hi], self.top_ps[lo:hi], self.keys[lo:hi], picked, sampled,
                             nucleus)
        if schema:
            forced = self.forced[lo:hi].gather(1, qpos.clamp(max=QUEUE - 1)[:, None])[:, 0]
            pick = torch.where(forcing, forced, pick)
            closes = texting & ((cap <= 0) | closing[mode, pick])
            waiting = fed & ((kind == WAIT) | closes)
            emit = fed & ~waiting
            cap -= (emit & texting).long()
            qpos += (emit & forcing).long()
            after = emit & forcing & (qpos >= self.qlen[lo:hi])
            mode.copy_(torch.where(after, self.then_mode[lo:hi], mode))
            cap.copy_(torch.where(after, self.then_cap[lo:hi], cap))
            kind.copy_(torch.where(waiting, WAIT, torch.where(after, self.then_kind[lo:hi], kind)))
            self.waits[lo:hi] += waiting.long()
            held = held_all[lo:hi]
            held.copy_(torch.where(waiting[:, None], logits.float(), held))
        else:
            emit = fed
        picked += emit.long()
        last = self.last[lo:hi]
        last.copy_(torch.where(emit[:, None], torch.stack([last[:, 1], pick], dim=1), last))
        ended = emit & ((pick[:, None] == self.stops[lo:hi]).any(dim=1) | (picked >= self.limits[lo:hi]))
        self.ended[lo:hi] |= ended
        live = emit & ~ended
        self.live[lo:hi] = live
        self.tokens[lo:hi, 0] = torch.where(live, pick, self.pads[lo:hi])

    def packet(self, in_use: int) -> Tuple[Any, torch.Tensor]:
        """A step's packet on its way to the host: (an event, its host copy): each row's count of picked ids, its
        last two ids, whether it ended and how often it waited."""
        values = torch.stack([self.picked[:in_use], self.last[:in_use, 0], self.last[:in_use, 1],
                              self.ended[:in_use].long(), self.waits[:in_use]], dim=1)
        if self.device.type != "cuda":
            return _Done(), values
        host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        host.copy_(values, non_blocking=True)  # queued on the model's device's stream
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))  # that stream: the current device's may be another
        return event, host

    def move(self, source: int, target: int) -> None:
        """Slot `source`'s entries to slot `target` (the batch packs its rows down)."""
        for name, _, _ in STATE:
            state = getattr(self, name)
            state[target] = state[source]
        if self.held is not None:
            self.held[target] = self.held[source]


class _Done:
    """A CPU's stand-in for a CUDA event: its work is done when the call that queued it returns."""

    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        pass


