"""What a token of a step attends to, and the attention calls that read it (issue 59).

A step's forward is one sequence of packed tokens: the decode rows' tokens (one a slot) and the joining rows' prompt
pieces (several a slot), each token with its slot and its position. A token at position p of slot b sees columns c of
slot b with c <= p, and on a sliding-window layer of window w only c > p - w (`sees`: the rule, written once; the
block masks, the mask functions and the eager reference all call it). A slot with no token this step, a row that is
not live or a bucket's padding sees column 0 alone: finite, never read (nothing read may be NaN: a NaN value times a
zero weight is still NaN).

The step's metadata (`Packed`) travels to the attention function as a keyword argument of the model's forward
(transformers passes its extra keyword arguments down to the attention function): no module global, no change to the
model's config from step to step. Without it the function is sdpa's, so every other forward of the model (a
choice's tree pass, a prefill elsewhere, training) runs as before.

One attention call covers every token of the step (`packed_flex`): the tokens are scattered by (slot, index within
the slot's tokens this step) into a (slots, most tokens a slot) grid, the queries of a key head side by side (each key
and value block read once for all the heads that share it), and flex attention reads, for each slot and block of its
queries, only the blocks of columns those queries see (`block_masks`); the outputs are gathered back into the
sequence. A decode-only step is the grid of width 1. The eager reference (`per_slot`) attends slot by slot with sdpa,
its decode rows on a CPU in one call of debate.engine.cpu_kernel where that could be built.
"""
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from debate.engine import cpu_kernel

BLOCK = 128  # columns a block of the block masks covers
# Grid queries a block covers (a multiple of every model's groups: 32 is 8 tokens of 4 query heads a key head). The
# kernel computes a block's every query against each block of columns it lists: a slot of one token in a grid wider
# than a token would compute a whole block for it (measured: 128 made a step with a prompt of 512 tokens beside 15
# decode rows 8x slower than the eager attention; docs/BENCHMARKS.md, issue 59).
Q_BLOCK = 32


class Packed(NamedTuple):
    """A step's tokens as the attention sees them. `slot[t]`, `offset[t]`: token t's slot and its place among that
    slot's tokens this step; `start[b]`, `span[b]`: the position of slot b's first token this step and how many it
    has (0: it has none, or it is not live); `width`: a tensor whose length is the grid's width (the most tokens a
    slot has). Tensors on the model's device, inputs of a compiled step."""

    slot: torch.Tensor
    offset: torch.Tensor
    start: torch.Tensor
    span: torch.Tensor
    width: torch.Tensor
    # The eager reference's view, as the host knows it: [(slot, its tokens' places in the sequence, their
    # positions), ...] for the slots with valid tokens; None in a compiled step (it reads the tensors alone).
    host: Optional[List[Tuple[int, List[int], List[int]]]] = None
    rows: Optional[int] = None  # how many of the sequence's first tokens are decode rows' (eager; said to hooks)
    # The eager reference's slots as tensors, by window: the host's view is the same for every layer of a step, so
    # its indices and masks are made on the step's first layer of each window and read by the others (a dict the
    # step's inputs bring, filled by `per_slot`; None: made again at each layer).
    parts: Optional[Dict[Optional[int], "Parts"]] = None


def sees(position: torch.Tensor, column: torch.Tensor, window: Optional[int]) -> torch.Tensor:
    """Whether a token at `position` sees `column` of its slot (broadcast): the rule of every attention here."""
    seen = column <= position
    if window:
        seen = seen & (column > position - window)
    return seen


def block_masks(packed: Packed, columns: int, windows: Dict[str, Optional[int]], groups: int
                ) -> Dict[str, BlockMask]:
    """{attention type: block mask} of a step's grid (slots x width * groups queries, a key head's `groups` query
    heads side by side for each token): each slot's block of queries lists the blocks of columns from the first one
    its first valid token sees to the one its last valid token writes (its other queries, the grid's padding past the
    slot's tokens, are never read back); a block of the slot's tokens none of them valid lists block 0, a block of
    none of its tokens lists none. The
    shapes depend on the bucket alone, the values on the step's metadata: one graph, and a CUDA graph replays it."""
    start, count = packed.start, packed.span
    queries = packed.width.shape[0] * groups
    # Two query blocks at least (a second one empty where the grid is narrower): one block or several would be two
    # graphs of a compiled step, the count being a size (sizes of 1 are specialised).
    q_blocks, kv_blocks = max(2, (queries + Q_BLOCK - 1) // Q_BLOCK), (columns + BLOCK - 1) // BLOCK
    device = start.device
    first_token = torch.arange(q_blocks, device=device) * Q_BLOCK // groups  # the first token of each query block
    last_token = torch.minimum(first_token + (Q_BLOCK - 1) // groups,
                               first_token.new_tensor(packed.width.shape[0] - 1))
    valid = first_token[None] < count[:, None]  # (slots, q_blocks): a block with a valid token
    last = start[:, None] + torch.minimum(last_token[None], (count[:, None] - 1).clamp(min=0))
    # A block of the slot's tokens none of which is valid (a row that is not live) reads block 0, so that what it
    # writes is finite; a block of no token at all (the grid's padding) reads nothing: never read back.
    present = torch.zeros_like(count).scatter_reduce(0, packed.slot, packed.offset + 1, "amax")
    real = first_token[None] < present[:, None]
    out = {}
    for kind, window in windows.items():
        first = (start[:, None] + first_token[None] - window + 1).clamp(min=0) if window else torch.zeros_like(last)
        low = torch.where(valid, first // BLOCK, 0)
        high = torch.where(valid, last // BLOCK, 0)
        number = torch.where(valid, high - low + 1, real.long()).to(torch.int32)
        index = (low[:, :, None] + torch.arange(kv_blocks, device=device)).clamp(max=kv_blocks - 1)
        out[kind] = BlockMask.from_kv_blocks(number[:, None], index.to(torch.int32)[:, None],
                                             BLOCK_SIZE=(Q_BLOCK, BLOCK),
                                             mask_mod=_mask_mod(start, count, window, groups),
                                             seq_lengths=(queries, columns), compute_q_blocks=False)
    return out


def _mask_mod(start: torch.Tensor, count: torch.Tensor, window: Optional[int], groups: int) -> Callable[..., Any]:
    """`sees` for flex's mask function, over the grid's queries (query q is token q // groups of slot b). It reads the
    step's inputs alone: inductor's CPU kernel takes only tensors already in memory into a mask function."""
    def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        token = q // groups
        valid = token < count[b]
        return (valid & sees(start[b] + token, kv, window)) | (~valid & (kv == 0))
    return mask_mod


def packed_flex(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: BlockMask, packed: Packed,
                scaling: Optional[float]) -> torch.Tensor:
    """Every token's attention in one flex call: `query` (1, heads, tokens, dim) of the packed sequence; `key` and
    `value` the place's slots in the step's bucket (slots, kv_heads, columns, dim), every token's own keys already
    written. Returns (1, tokens, heads, dim), as transformers' attention functions do."""
    slots, kv_heads, _, dim = key.shape
    heads, width = query.shape[1], packed.width.shape[0]
    groups = heads // kv_heads
    # Token t's query heads h*groups + j (those key head h serves, as transformers' repeat_kv orders them) go to row
    # index[t] * groups + j of key head h in slot slot[t]'s grid: written and read through one broadcast index, no
    # permuted copy (inductor's CPU flex kernel takes a plain 4-D buffer).
    at = (packed.slot[:, None, None], torch.arange(kv_heads, device=key.device)[None, :, None],
          packed.offset[:, None, None] * groups + torch.arange(groups, device=key.device)[None, None, :])
    tokens = query[0].view(kv_heads, groups, -1, dim).permute(2, 0, 1, 3)  # (tokens, kv_heads, groups, dim)
    grid = query.new_zeros((slots, kv_heads, width * groups, dim))
    grid[at] = tokens  # a bucket's padding repeats a token: the same values at the same place
    out = flex_attention(grid, key, value, block_mask=mask, scale=scaling)
    assert isinstance(out, torch.Tensor)
    return out[at].reshape(1, -1, heads, dim)


def grid_masks(packed: Packed, columns: torch.Tensor, windows: Dict[str, Optional[int]], groups: int,
               dtype: torch.dtype) -> Dict[str, torch.Tensor]:
    """{attention type: (slots, 1, width * groups, columns) additive mask} of a step's grid: what `block_masks` says
    over every column (the compiled fallback where flex fails, for steps whose grid is one token wide)."""
    low = torch.finfo(dtype).min
    token = torch.arange(packed.width.shape[0] * groups, device=columns.device) // groups
    valid = token[None] < packed.span[:, None]
    position = (packed.start[:, None] + token[None])[:, :, None]
    out = {}
    for kind, window in windows.items():
        seen = (valid[:, :, None] & sees(position, columns[None, None], window)) | (
            ~valid[:, :, None] & (columns[None, None] == 0))
        out[kind] = torch.where(seen, 0.0, low).to(dtype)[:, None]
    return out


def packed_masked(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, packed: Packed,
                  scaling: Optional[float]) -> torch.Tensor:
    """`packed_flex` under an additive mask over every column (`grid_masks`)."""
    slots, kv_heads, _, dim = key.shape
    heads, width = query.shape[1], packed.width.shape[0]
    groups = heads // kv_heads
    at = (packed.slot[:, None, None], torch.arange(kv_heads, device=key.device)[None, :, None],
          packed.offset[:, None, None] * groups + torch.arange(groups, device=key.device)[None, None, :])
    grid = query.new_zeros((slots, kv_heads, width * groups, dim))
    grid[at] = query[0].view(kv_heads, groups, -1, dim).permute(2, 0, 1, 3)
    out = F.scaled_dot_product_attention(grid, key, value, attn_mask=mask, scale=scaling)
    return out[at].reshape(1, -1, heads, dim)


def host_of(packed: Packed) -> List[Tuple[int, List[int], List[int]]]:
    """The host's view of a step's metadata read from its tensors (one read: the self-check's eager reference, which
    must see what the compiled step sees): a valid token at its position, one that is not (a row that is not live)
    at position 0, so that it sees column 0 alone. Every token is listed: a token left out would attend to nothing,
    and a bucket's padding (a copy of a real token) would then write other keys and values at the same place."""
    slots, index = packed.slot.tolist(), packed.offset.tolist()
    start, count = packed.start.tolist(), packed.span.tolist()
    by_slot: Dict[int, Tuple[List[int], List[int]]] = {}
    alone: List[Tuple[int, List[int], List[int]]] = []
    for at, (slot, i) in enumerate(zip(slots, index)):
        if i >= count[slot]:
            alone.append((slot, [at], [0]))
            continue
        places, positions = by_slot.setdefault(slot, ([], []))
        places.append(at)  # a bucket's padding repeats a token: listed too, so it writes the same keys and values
        positions.append(start[slot] + i)
    return [(slot, places, positions) for slot, (places, positions) in sorted(by_slot.items())] + alone


# A prompt piece of at least this many tokens, at consecutive positions over columns no window cuts, attends on a CPU
# in two calls (`in_two`): faster from about 128 tokens on the tiny Llama, no slower on Gemma 3 270M; below, no faster
# (bench/bench_eager_attention.py).
SPLIT_TOKENS = 128


class Part(NamedTuple):
    """A slot's tokens in the eager reference: `at` their places in the step's sequence (a slice where they follow
    one another, as a piece's do), `low`:`high` the columns they read, `mask` what each of them sees there (None: one
    token, which sees every column of its range, or a piece attending in two calls from column `split` of them)."""

    slot: int
    at: Union[slice, torch.Tensor]
    low: int
    high: int
    mask: Optional[torch.Tensor]
    split: Optional[int] = None


class Parts(NamedTuple):
    """A step's slots as the eager reference reads them on a layer of one window: every slot (`slots`), and its
    one-token slots (decode rows) again as the CPU kernel's table (`rows`: (n, 4) int64, a row's slot, its token's
    place, its first column and the one past its last; `widest`: the most columns a row reads)."""

    slots: List[Part]
    rows: torch.Tensor
    widest: int


def parts_of(packed: Packed, window: Optional[int], device: torch.device) -> Parts:
    """The host's view of a step (`Packed.host`) as the eager reference reads it on a layer of this window."""
    done = packed.parts.get(window) if packed.parts is not None else None
    if done is not None:
        return done
    made, rows = [], []
    for slot, places, positions in packed.host or []:
        low = max(0, min(positions) - window + 1) if window else 0
        high = max(positions) + 1
        first, count = places[0], len(places)
        at: Union[slice, torch.Tensor] = (slice(first, first + count) if places == list(range(first, first + count))
                                          else torch.tensor(places, device=device))
        mask, split = None, None
        if (count >= SPLIT_TOKENS and device.type == "cpu" and (not window or high <= window)
                and positions == list(range(positions[0], positions[0] + count))):
            split = positions[0] - low
        elif count > 1:
            position = torch.tensor(positions, device=device)[:, None]
            mask = sees(position, torch.arange(low, high, device=device)[None], window)
        made.append(Part(slot, at, low, high, mask, split))
        if count == 1:
            rows.append((slot, first, low, high))
    table = torch.tensor(rows, dtype=torch.int64).reshape(-1, 4)  # on the host: the kernel reads it there
    done = Parts(made, table, max((high - low for _, _, low, high in rows), default=0))
    if packed.parts is not None:
        packed.parts[window] = done
    return done


def in_two(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, split: int, scaling: Optional[float]
           ) -> torch.Tensor:
    """A piece's attention on a CPU, its tokens at consecutive positions from column `split` of `keys`: the columns
    before `split`, which every token sees, in one call without a mask; the piece's own columns in a square causal
    call (the kernel skips the blocks above the diagonal); the two merged by their log-sum-exps. The same as one
    masked call up to rounding (1e-7), and no mask built or added to every score: 1.15-1.2x from 128 tokens on
    the tiny Llama's heads (bench/bench_eager_attention.py). The CPU flash kernel's own op is the one sdpa runs
    there; it is called directly because sdpa does not return the log-sum-exps."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    own, own_lse = flash(query, keys[:, :, split:], values[:, :, split:], is_causal=True, scale=scaling)
    if split == 0:
        return own
    seen, seen_lse = flash(query, keys[:, :, :split], values[:, :, :split], scale=scaling)
    top = torch.maximum(seen_lse, own_lse)
    weight_seen, weight_own = (seen_lse - top).exp_(), (own_lse - top).exp_()
    total = weight_seen + weight_own
    return seen.mul_((weight_seen / total)[..., None]).add_(own.mul_((weight_own / total)[..., None]))


def per_slot(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, packed: Packed, window: Optional[int],
             scaling: Optional[float]) -> torch.Tensor:
    """The eager reference: each slot's tokens attend with sdpa over the columns they see (`sees`), slot by slot, as
    the host lists them (`Packed.host`). A token of no listed slot gets zeros (a row that is not live: never read).
    On a CPU, in float32 or bfloat16, the decode rows attend in one call a layer of the CPU kernel
    (debate.engine.cpu_kernel) where it could be built, faster than sdpa a row (bench/bench_decode_rows.py)."""
    heads, dim, kv_heads = query.shape[1], query.shape[3], key.shape[1]
    groups = heads // kv_heads
    out = query.new_zeros((query.shape[2], heads, dim))
    parts = parts_of(packed, window, query.device)
    kernel = parts.rows.shape[0] > 0 and cpu_kernel.usable(query, key, value)
    if kernel:
        cpu_kernel.decode_rows(query, key, value, out, parts.rows, dim ** -0.5 if scaling is None else scaling,
                               parts.widest)
    for slot, at, low, high, mask, split in parts.slots:
        if kernel and mask is None and split is None:
            continue  # a decode row: done above
        keys, values = key[slot:slot + 1, :, low:high], value[slot:slot + 1, :, low:high]
        if split is not None:
            out[at] = in_two(query[:, :, at], keys, values, split, scaling)[0].transpose(0, 1)
            continue
        if mask is None:
            # One token (a decode row) sees every column from `low` to its own: no mask, and each key head's query
            # heads as one query row each over that head's keys, not the keys repeated a query head each
            # (measured 1.4-2x faster a call on a CPU: bench/bench_eager_attention.py).
            piece = F.scaled_dot_product_attention(query[:, :, at].reshape(1, kv_heads, groups, dim), keys, values,
                                                   scale=scaling)
            out[at] = piece.reshape(1, heads, dim)
            continue
        piece = F.scaled_dot_product_attention(query[:, :, at], keys, values, attn_mask=mask, scale=scaling,
                                               enable_gqa=groups > 1)
        out[at] = piece[0].transpose(0, 1)
    return out[None]


def attend(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           attention_mask: Union[None, torch.Tensor, BlockMask], scaling: Optional[float] = None, dropout: float = 0.0,
           packed: Optional[Packed] = None, **kwargs: Any) -> Tuple[torch.Tensor, None]:
    """The model's attention function while it runs a step (registered as STEP_ATTENTION): with a step's `packed`
    metadata, every token at once (flex under a block mask, or the grid under an additive mask) or slot by slot
    (the eager reference, where the host lists the slots); without it, sdpa's."""
    if packed is None:
        assert not isinstance(attention_mask, BlockMask)
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    if packed.host is not None:
        return per_slot(query, key, value, packed, getattr(module, "sliding_window", None), scaling), None
    if isinstance(attention_mask, BlockMask):
        return packed_flex(query, key, value, attention_mask, packed, scaling), None
    assert isinstance(attention_mask, torch.Tensor)
    return packed_masked(query, key, value, attention_mask, packed, scaling), None


STEP_ATTENTION = "debatecv_step"
AttentionInterface.register(STEP_ATTENTION, attend)
AttentionMaskInterface.register(STEP_ATTENTION, sdpa_mask)  # other forwards build sdpa's masks, as before
