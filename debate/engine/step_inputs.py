"""A step's packed inputs (debate.engine.decode_step.Inputs) from a batch's rows (debate.engine.decode_batch).

The decode rows [0, in_use) feed one token each at their length (the device state's), then the joining rows' prompt
pieces their tokens; the logits kept are the decode rows', then each prompt's last token's once it is whole. Eagerly
every size is exact and the tensors are made for the step; compiled, every size is rounded up to its bucket and
written into that bucket's buffers (the same tensors at every step of the bucket: a compiled graph's inputs, what a
CUDA graph replays), the padding repeating the last token. The host's own view of the step (which slots hold which
tokens, at which positions) rides along for the eager attention (debate.engine.attention.Packed.host).
"""
import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from debate.engine import attention, decode_step, generator as gen, kv_store
from debate.engine.batch_state import State

Buffers = Dict[Tuple[int, ...], decode_step.Inputs]  # a compiled step's input buffers and cache, one set a bucket


def build(model: torch.nn.Module, store: kv_store.Store, state: State, active: Dict[int, Any], in_use: int,
          pieces: Sequence[Tuple[Any, int, int]], columns: int, buffers: Optional[Buffers]) -> decode_step.Inputs:
    """A step's inputs (module doc): `active` the decode rows by slot (the host's view of their lengths), `pieces`
    the prompt pieces (row, first column, end column), `columns` the columns the step reads; `buffers` a compiled
    step's, by bucket (None: an eager step)."""
    ids: List[int] = []
    slots: List[int] = []
    positions: List[int] = []
    kept: List[int] = []
    host: Dict[int, Tuple[List[int], List[int]]] = {slot: ([slot], [row.length]) for slot, row in active.items()}
    grid: List[Tuple[int, int, int]] = []  # (slot, first position, tokens) of each piece's slot
    for row, first, end in pieces:
        slot = row.slot
        at = in_use + len(ids)
        ids += row.target[first:end]
        slots += [slot] * (end - first)
        positions += range(first, end)
        if end == len(row.target):
            kept.append(at + end - first - 1)
        places, where = list(range(at, at + end - first)), list(range(first, end))
        if slot < in_use:  # and its decode token after the piece (decode_batch's step writes it there)
            places, where = places + [slot], where + [end]
        host[slot] = (places, where)
        grid.append((slot, first, len(places)))
    tokens, rows = in_use + len(ids), max([in_use] + [slot + 1 for slot, _, _ in grid])
    width, keep = max([1] + [n for _, _, n in grid]), in_use + len(kept)
    if buffers is not None:
        # Every column of the slots: flex reads a token's own blocks alone whatever the view's width, and a view
        # as wide as the slots is the same kind of input at every step (a narrower one is not contiguous: a guard)
        sizes = (decode_step.bucket_tokens(tokens), decode_step.bucket_rows(rows, store.rows),
                 decode_step.bucket_width(width), store.columns, decode_step.bucket_tokens(keep))
        made = buffers.get(sizes)
        if made is None:
            made = buffers[sizes] = _buffer(model, store, state, *sizes)
    else:
        made = _buffer(model, store, state, tokens, rows, width, columns, keep)
    packed = made.packed
    # The host's part (the pieces and what they change) in one upload, split on the device.
    n, g = len(ids), len(grid)
    shipped = kv_store.to_device(ids + slots + positions + kept + [p[0] for p in grid] + [p[1] for p in grid]
                                 + [p[2] for p in grid], state.device)
    parts = torch.split(shipped, [n, n, n, len(kept), g, g, g])
    for target, decode, host_part in ((made.tokens, state.tokens[:in_use, 0], parts[0]),
                                      (made.positions, state.lengths[:in_use], parts[2]),
                                      (packed.slot, state.columns[:in_use], parts[1]),
                                      (made.keep, state.columns[:in_use], parts[3])):
        filled = in_use + host_part.shape[0]
        target[:in_use].copy_(decode)
        target[in_use:filled].copy_(host_part)
        if filled < target.shape[0]:
            target[filled:].copy_(target[filled - 1].expand(target.shape[0] - filled))
    packed.start.copy_(state.lengths[:packed.start.shape[0]])
    packed.span.copy_(state.live[:packed.span.shape[0]])
    if g:
        packed.start.index_copy_(0, parts[4], parts[5])
        packed.span.index_copy_(0, parts[4], parts[6])
    torch.sub(made.positions, packed.start[packed.slot], out=packed.offset)
    # What the host knows, for the eager step (a compiled one reads the tensors alone; it falls back to this). A
    # bucket's padding repeats the last token: listed with it, so that it writes the same keys and values there.
    padding = list(range(tokens, made.tokens.shape[0]))
    for places, where in host.values():
        if padding and places and places[-1] == tokens - 1:
            places += padding
            where += [where[-1]] * len(padding)
    return dataclasses.replace(made, packed=packed._replace(host=[(slot, *host[slot]) for slot in sorted(host)],
                                                            rows=in_use, parts={}))


def _buffer(model: torch.nn.Module, store: kv_store.Store, state: State, tokens: int, rows: int, width: int,
            columns: int, keep: int) -> decode_step.Inputs:
    """A step's input tensors of these sizes, and the cache over the place's first `rows` slots and `columns`
    columns writing at them."""
    token_ids, positions, keep_at, slot_of, offset, start, span = (
        torch.zeros(n, dtype=torch.long, device=state.device)
        for n in (tokens, tokens, keep, tokens, tokens, rows, rows))
    packed = attention.Packed(slot_of, offset, start, span, torch.empty(width, device=state.device))
    cache = store.step_cache(rows, columns, slot_of, positions)
    return decode_step.Inputs(token_ids, positions, keep_at, packed, state.columns[:columns],
                              gen.cache_kwarg(model, cache), mixed=width > 1)
