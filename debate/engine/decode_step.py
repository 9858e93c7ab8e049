"""One decode step of a model's persistent batch: every row of the first slots of the place feeds one token, writes
its keys and values at its own length, and attends to the first columns of its slot. What torch.compile turns into
one graph and a CUDA graph replays.

The step's inputs are views of tensors the batch keeps for the run (debate.engine.decode_batch): the tokens fed, the
rows' lengths (each row's write column and position: a slot holds its context from column 0), whether each row is
live, and the cache's views of the place. The additive attention masks are built inside the step from the lengths:
a live row sees its columns up to its length (a sliding-window layer, the last `window` of them, as Gemma 3's do),
a row that has stopped or an empty slot sees column 0 alone (finite, masked out of every pick).

Buckets. Eagerly a step runs exactly the rows and columns in use. Compiled (`--compile`), rows are rounded up to
ROW_BUCKETS and columns to a multiple of COLUMN_BUCKET, so a handful of shapes serve a run; the forward is compiled
once per model with dynamic sizes (one graph for every bucket, a second for buckets as wide as the slots, whose
keys are contiguous: never one a step). On CUDA each bucket's step is
captured as a CUDA graph the second time it runs (the first warms it on a side stream) and replayed from then on, every
bucket's graph in one memory pool: nothing is allocated for a step.

The step checks itself (issue 58): the first step through each compiled path (flex attention, then the masked
attention) and each bucket's first replay are compared with the eager step's logits on the same inputs (`mismatch`,
CHECK_TOLERANCE). Where one fails or disagrees, the run says what failed and what runs instead in one line and falls
back: flex -> the masked attention -> eager; a bucket's CUDA graph -> that bucket compiled without one (the other
buckets keep theirs). Streams, events and captures are made on the model's device (`on_device`).

Grouped-query attention reads each key head once: for one token the step regroups a key head's queries side by side
(DECODE_ATTENTION, which `decoding` switches a model to for its steps) where transformers, compiled, would repeat
every key and value to all its heads first.

Each row over its own columns (issue 53). Eagerly on a CPU each row attends alone (_rows_alone). Compiled, a step
attends with flex attention (torch.nn.attention.flex_attention) under a block mask built in the step from the lengths
(block_masks): a row lists the blocks of BLOCK columns from its first seen column (0, or a sliding window's start) to
its length, and the kernel reads those alone, the mask function masking the partial ones; a row that is not live
lists block 0 and sees column 0. The mask's shapes follow the bucket, its values the lengths: no host sync, no shape
that depends on data, one graph for every bucket, and a CUDA graph replays it (on CUDA flex is a Triton kernel; that
path is not measured here, no GPU being lent). Measured on a CPU (docs/BENCHMARKS.md, issue 53): attention alone, 32
rows with one of 4096 columns, 1 ms against 23 ms for sdpa under the mask over every column; the masked step
(ROW_ATTENTION = "masked", `masks`) stays as the fallback for a model whose flex kernel fails to compile
(Step._compiled) and for eager steps (flex run eagerly is a slow reference implementation). torch 2.13's CPU flex
kernel needs two workarounds: its mask function may read only the step's inputs (`_seen`), and a naming bug in its
code generation is patched while it runs (_distinct_block_size_names).
"""
import contextlib
import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, cast

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right
from torch.nn.attention.flex_attention import BlockMask, flex_attention
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from debate.engine import memory

log = logging.getLogger(__name__)

COLUMN_BUCKET = memory.COLUMN_BUCKET  # a compiled step's columns are rounded up to a multiple of this
DECODE_ATTENTION = "debatecv_decode"
# A compiled step's attention: "flex" (each row reads the blocks of its own columns, flex attention under a block
# mask) or "masked" (every row reads every column of the bucket under an additive mask: the fallback, and what the
# benchmark sets beside it). Read when a model's Step is made.
ROW_ATTENTION = "flex"
BLOCK = 128  # columns a block of the flex block mask covers: a row reads whole blocks, the partial ones masked


def bucket_rows(rows: int, most: int) -> int:
    """A compiled step's rows: powers of two to 8, then multiples of 8 (vLLM's capture sizes), at most `most` (the
    place's slots), at least two (PyTorch compiles a size of 1 as a graph of its own)."""
    n = 2
    while n < rows and n < 8:
        n *= 2
    if rows > n:
        n = -(-rows // 8) * 8
    return max(min(n, most), rows)


def bucket_columns(columns: int, most: int) -> int:
    return max(min(-(-columns // COLUMN_BUCKET) * COLUMN_BUCKET, most), columns)


# An eager step on a CPU: each row's columns in use (its length and the token written now; 0: a free slot or a row
# that has stopped), set by `decoding` for the step's forward (see _rows_alone).
_row_ends: Optional[List[int]] = None


@dataclass
class Mix:
    """A mixed forward's layout (debate.engine.decode_batch): one sequence whose first `rows` tokens are the decode
    rows' (slot r's token at column lengths[r]), then each prefill piece's tokens in order, (slot, first column, end
    column): a piece's tokens are its row's columns first..end-1 and attend to its slot's columns before them."""

    rows: int
    lengths: torch.Tensor  # the decode rows' write columns, on the device
    live: torch.Tensor  # whether each decode row feeds a token
    columns: int  # the decode rows' columns in use at most (the masked path's width)
    ends: Optional[List[int]]  # on a CPU each decode row's columns in use (_rows_alone); None: masked by lengths
    pieces: List[Tuple[int, int, int]]


_mix: Optional[Mix] = None


def _decode_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], scaling: Optional[float] = None, dropout: float = 0.0,
                      **kwargs: Any) -> Any:
    """sdpa, except that one token's queries are regrouped by key head (heads h*g .. h*g+g-1 read key head h, as
    transformers' repeat_kv orders them), so no key or value is repeated; a mixed forward's tokens each attend to their
    own slot (_mixed_attention)."""
    if _mix is not None:
        return _mixed_attention(module, query, key, value, _mix, scaling), None
    groups = getattr(module, "num_key_value_groups", 1)
    if isinstance(attention_mask, BlockMask):
        return _flex(query, key, value, attention_mask, groups, scaling), None
    if query.shape[2] != 1 or (groups == 1 and _row_ends is None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    rows, heads, _, dim = query.shape
    grouped = query.reshape(rows, heads // groups, groups, dim)
    if _row_ends is not None and len(_row_ends) == rows:
        out = _rows_alone(grouped, key, value, getattr(module, "sliding_window", None), scaling, _row_ends)
    else:
        out = F.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(rows, heads, 1, dim).transpose(1, 2).contiguous(), None


def _rows_alone(grouped: torch.Tensor, key: torch.Tensor, value: torch.Tensor, window: Optional[int],
                scaling: Optional[float], ends: List[int]) -> torch.Tensor:
    """Each row's attention over its own columns only (a sliding window's last `window` of them), no mask: the
    rows of a step have different lengths (a Moderator's context beside a Debater's), and one batched call reads every
    row's keys and values to the longest row's end, masked. Eagerly on a CPU, where reading is the step's cost, this
    reads a fifth to a third less (the rows' lengths vary that much in a debate); a row that reads nothing (a free
    slot, a row that has stopped) gets zeros, never read."""
    out = grouped.new_zeros(grouped.shape)
    for row, end in enumerate(ends):
        if end > 0:
            start = max(0, end - window) if window else 0
            out[row] = F.scaled_dot_product_attention(grouped[row:row + 1], key[row:row + 1, :, start:end],
                                                      value[row:row + 1, :, start:end], scale=scaling)[0]
    return out


def _mixed_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mix: Mix,
                     scaling: Optional[float]) -> torch.Tensor:
    """A mixed forward's attention, (1, tokens, heads, dim): `key`/`value` are the whole place (slots, kv_heads,
    columns, dim), every token's keys already written at its (slot, column) (kv_store.MixedLayer). The decode rows as a
    decode step attends them; each piece over its own slot alone: its columns before it in full and its own causally
    (the lower-right causal bias: no mask is made, and grouped-query attention reads each key head once where the
    kernel allows), a sliding-window layer over its window only, under a band mask of piece x (piece + window)."""
    heads, dim = query.shape[1], query.shape[3]
    groups = getattr(module, "num_key_value_groups", 1)
    window = getattr(module, "sliding_window", None)
    out = query.new_empty((query.shape[2], heads, dim))
    if mix.rows:
        rows = mix.rows
        grouped = query[0, :, :rows].transpose(0, 1).reshape(rows, heads // groups, groups, dim)
        if mix.ends is not None:
            done = _rows_alone(grouped, key[:rows], value[:rows], window, scaling, mix.ends)
        else:
            kind = "sliding_attention" if window else "full_attention"
            columns = torch.arange(mix.columns, device=query.device)
            mask = masks(mix.lengths, mix.live, columns, {kind: window}, query.dtype)[kind]
            done = F.scaled_dot_product_attention(grouped, key[:rows, :, :mix.columns], value[:rows, :, :mix.columns],
                                                  attn_mask=mask, scale=scaling)
        out[:rows] = done.reshape(rows, heads, dim)
    at = mix.rows
    for slot, first, end in mix.pieces:
        n = end - first
        q = query[:, :, at:at + n]
        if window and end > window:
            lo = max(0, first - window + 1)
            column = torch.arange(lo, end, device=query.device)
            position = torch.arange(first, end, device=query.device)[:, None]
            band = (column[None] <= position) & (column[None] > position - window)
            piece = F.scaled_dot_product_attention(q, key[slot:slot + 1, :, lo:end], value[slot:slot + 1, :, lo:end],
                                                   attn_mask=band, scale=scaling, enable_gqa=groups > 1)
        else:
            piece = F.scaled_dot_product_attention(q, key[slot:slot + 1, :, :end], value[slot:slot + 1, :, :end],
                                                   attn_mask=causal_lower_right(n, end), scale=scaling,
                                                   enable_gqa=groups > 1)
        out[at:at + n] = piece[0].transpose(0, 1)
        at += n
    return out[None]


def _flex(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: BlockMask, groups: int,
          scaling: Optional[float]) -> torch.Tensor:
    """A compiled step's attention under its block mask (block_masks): a key head's queries side by side as the
    query's positions, as for sdpa, so each block of keys and values is read once for all of them (measured faster
    on a CPU than flex's enable_gqa, which reads it once a query head: docs/BENCHMARKS.md, issue 53)."""
    rows, heads, _, dim = query.shape
    if groups > 1:  # the same blocks, seen by `groups` query positions
        mask = BlockMask.from_kv_blocks(mask.kv_num_blocks, mask.kv_indices, BLOCK_SIZE=mask.BLOCK_SIZE,
                                        mask_mod=mask.mask_mod, seq_lengths=(groups, mask.seq_lengths[1]),
                                        compute_q_blocks=False)
    out = flex_attention(query.reshape(rows, heads // groups, groups, dim), key, value, block_mask=mask,
                         scale=scaling)
    assert isinstance(out, torch.Tensor)
    return out.reshape(rows, heads, 1, dim).transpose(1, 2).contiguous()


AttentionInterface.register(DECODE_ATTENTION, _decode_attention)
AttentionMaskInterface.register(DECODE_ATTENTION, sdpa_mask)  # were a 2-D mask ever given, sdpa's mask is right


def _configs(model: torch.nn.Module) -> List[Any]:
    config: Any = model.config
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return [config] if text is config else [config, text]


@contextlib.contextmanager
def decoding(model: torch.nn.Module, row_ends: Optional[List[int]] = None) -> Iterator[None]:
    """The model's sdpa attention as DECODE_ATTENTION while a step runs (other implementations stay); with
    `row_ends` (an eager step on a CPU), each row attends to its own columns alone (_rows_alone)."""
    global _row_ends
    configs = [c for c in _configs(model) if c._attn_implementation == "sdpa"]
    for config in configs:
        config._attn_implementation = DECODE_ATTENTION
    _row_ends = row_ends if configs else None
    try:
        yield
    finally:
        _row_ends = None
        for config in configs:
            config._attn_implementation = "sdpa"


@contextlib.contextmanager
def mixing(model: torch.nn.Module, mix: Mix) -> Iterator[None]:
    """The model's attention as a mixed forward's (`mix`) while it runs."""
    global _mix
    with decoding(model):
        _mix = mix
        try:
            yield
        finally:
            _mix = None


def mixed_forward(model: torch.nn.Module, cache_kwarg: Dict[str, Any], tokens: torch.Tensor, positions: torch.Tensor,
                  keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A mixed forward's logits at the positions `keep` (the decode rows', and each prompt's last token's) of one
    sequence of `tokens` at `positions` (under `mixing`). The attention mask given is a placeholder, never read:
    transformers then makes none of its own (a 4-D mask is taken as given)."""
    placeholder = torch.zeros((1, 1, 1, 1), dtype=dtype, device=tokens.device)
    out = model(input_ids=tokens[None], position_ids=positions[None], use_cache=True, attention_mask=placeholder,
                logits_to_keep=keep, **cache_kwarg)
    return out.logits[0]


def layer_windows(model: torch.nn.Module) -> Dict[str, Optional[int]]:
    """{attention type: its sliding window or None} of the model's layers (one entry where all are alike)."""
    config = _configs(model)[-1]
    window = getattr(config, "sliding_window", None)
    types = set(getattr(config, "layer_types", None) or ["sliding_attention" if window else "full_attention"])
    unknown = types - {"full_attention", "sliding_attention"}
    if unknown:
        raise NotImplementedError(f"decoding: layers of type {', '.join(sorted(unknown))} are not supported")
    return {t: (window if t == "sliding_attention" else None) for t in sorted(types)}


@dataclass
class Stats:
    """How one model's decode steps ran: graphs made (the first, then each recompile), CUDA graphs captured (one a
    bucket), steps compiled and eager, why it runs eagerly where it does, and occupancy's counts."""

    graphs: int = 0
    cuda_graphs: int = 0
    steps: int = 0  # decode steps through the compiled forward
    eager_steps: int = 0
    failed: Optional[str] = None
    flex_failed: Optional[str] = None  # why the compiled step attends under a mask (its flex attention failed)
    graph_failed: Optional[str] = None  # why a bucket runs without a CUDA graph (the last one that does)
    # What the self-check found equal to the eager step: compiled paths, then captured buckets (Step, CHECK_TOLERANCE)
    checked: List[str] = field(default_factory=list)
    # The steps' time as the device spends it (CUDA events around each step, read with its packet; on a CPU the
    # wall time), for ms a step; and the host's time launching them (on CUDA the kernels may still run after it).
    seconds: float = 0.0
    launch_seconds: float = 0.0
    mixed_seconds: float = 0.0  # the same for the forwards that carried prompt tokens (below)
    # Occupancy: tokens the decode steps produced over the rows they ran (a row that has stopped, an empty slot below
    # the last row in use, or a bucket's padding runs and produces nothing).
    tokens: int = 0
    row_steps: int = 0
    # Forwards that carried prompt tokens (debate.engine.decode_batch's prefill inside the step): beside decode rows
    # (`mixed`, with `mixed_rows` decode rows in all) or alone (`prefill_only`: nothing decoded), and their tokens.
    mixed: int = 0
    mixed_rows: int = 0
    prefill_only: int = 0
    prefill_tokens: int = 0

    @property
    def occupancy(self) -> Optional[float]:
        return self.tokens / self.row_steps if self.row_steps else None

    def as_record(self) -> Dict[str, Any]:
        return {"compiled": self.steps > 0 and self.failed is None, "graphs": self.graphs,
                "decode_tokens": self.tokens, "decode_row_steps": self.row_steps,
                "occupancy": None if self.occupancy is None else round(self.occupancy, 4),
                "recompiles": max(0, self.graphs - 1), "cuda_graphs": self.cuda_graphs, "compiled_steps": self.steps,
                "eager_steps": self.eager_steps, "mixed_forwards": self.mixed, "mixed_decode_rows": self.mixed_rows,
                "prefill_only_forwards": self.prefill_only, "prefill_tokens": self.prefill_tokens,
                "checked": list(self.checked), **({"fallback": self.failed} if self.failed else {}),
                **({"flex_fallback": self.flex_failed} if self.flex_failed else {}),
                **({"graph_fallback": self.graph_failed} if self.graph_failed else {})}


class Clock:
    """A step's time as the device spends it: on CUDA a pair of timing events around the step, added once the host
    has read the step's packet (so reading the time never waits); on a CPU the step's wall time."""

    def __init__(self, stats: Stats, device: torch.device) -> None:
        self.stats, self.device, self.cuda = stats, device, device.type == "cuda"

    def start(self, mixed: bool = False) -> Any:
        """A step's timing begun; `mixed`: a forward that carries prompt tokens (counted apart)."""
        if not self.cuda:
            return [time.perf_counter(), mixed]
        began = torch.cuda.Event(enable_timing=True)
        began.record(torch.cuda.current_stream(self.device))  # the model's stream, not the current device's
        return [began, None, mixed]

    def stop(self, timing: Any) -> None:
        if not self.cuda:
            self._count(timing[1], time.perf_counter() - timing[0])
            return
        timing[1] = torch.cuda.Event(enable_timing=True)
        timing[1].record(torch.cuda.current_stream(self.device))

    def add(self, timing: Any) -> None:
        """The step's device time, once its packet is read (its events are then done)."""
        if self.cuda and timing is not None:
            timing[1].synchronize()  # done already where a packet was read after it
            self._count(timing[2], timing[0].elapsed_time(timing[1]) / 1000)

    def _count(self, mixed: bool, seconds: float) -> None:
        if mixed:
            self.stats.mixed_seconds += seconds
        else:
            self.stats.seconds += seconds


_compiled: "weakref.WeakKeyDictionary[torch.nn.Module, Callable[..., torch.Tensor]]" = weakref.WeakKeyDictionary()
_stats: "weakref.WeakKeyDictionary[torch.nn.Module, Stats]" = weakref.WeakKeyDictionary()
_no_flex: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()  # models whose flex attention failed once


def stats_of(model: torch.nn.Module) -> Optional[Stats]:
    """The model's decode statistics (compiled and eager steps), or None when it has not decoded."""
    return _stats.get(model)


def stats_for(model: torch.nn.Module) -> Stats:
    return _stats.setdefault(model, Stats())


def masks(lengths: torch.Tensor, live: torch.Tensor, columns: torch.Tensor, windows: Dict[str, Optional[int]],
          dtype: torch.dtype) -> Dict[str, torch.Tensor]:
    """{attention type: (rows, 1, 1, columns) additive mask} of a step: a live row sees its columns up to its length
    (the one written now included; a sliding window's last `window` of them), any other row column 0 alone."""
    low = torch.finfo(dtype).min
    position, column, on = lengths[:, None], columns[None], live[:, None]
    alone = (column == 0) & ~on
    out = {}
    for kind, window in windows.items():
        seen = column <= position
        if window is not None:
            seen = seen & (column > position - window)
        out[kind] = torch.where((seen & on) | alone, 0.0, low).to(dtype)[:, None, None]
    return out


def block_masks(lengths: torch.Tensor, live: torch.Tensor, columns: int,
                windows: Dict[str, Optional[int]]) -> Dict[str, BlockMask]:
    """{attention type: block mask} of a compiled step, what `masks` says as blocks of BLOCK columns: a live row reads
    the blocks from the one its first seen column is in (0, or its window's start) to the one its length is in, an
    other row block 0; the mask function masks the columns of those blocks it does not see. Shapes depend on the
    bucket alone (rows, and columns // BLOCK block indices a row, those past the row's count unused), the values on
    the lengths: a CUDA graph replays it, and flex's kernels skip the blocks a row does not list."""
    blocks = (columns + BLOCK - 1) // BLOCK
    end = torch.where(live, lengths, 0)
    out = {}
    for kind, window in windows.items():
        first = torch.where(live, (lengths - window + 1).clamp(min=0), 0) // BLOCK if window else end * 0
        count = (end // BLOCK - first + 1).to(torch.int32)
        index = (first[:, None] + torch.arange(blocks, device=lengths.device)).clamp(max=blocks - 1)
        out[kind] = BlockMask.from_kv_blocks(count[:, None, None], index.to(torch.int32)[:, None, None],
                                             BLOCK_SIZE=BLOCK, mask_mod=_seen(lengths, live, window),
                                             seq_lengths=(1, columns), compute_q_blocks=False)
    return out


def _seen(lengths: torch.Tensor, live: torch.Tensor, window: Optional[int]) -> Callable[..., torch.Tensor]:
    """The columns a row sees, as `masks` says, for flex's mask function. It reads the step's inputs alone: inductor's
    CPU kernel takes only tensors already in memory into a mask function (a tensor computed in the step, as `end`
    above, fails its lowering)."""
    def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        on, position = live[b], lengths[b]
        seen = kv <= position
        if window:
            seen = seen & (kv > position - window)
        return (seen & on) | ((kv == 0) & ~on)
    return mask_mod


def forward(model: torch.nn.Module, cache_kwarg: Dict[str, Any], tokens: torch.Tensor, lengths: torch.Tensor,
            live: torch.Tensor, columns: torch.Tensor, windows: Dict[str, Optional[int]],
            dtype: torch.dtype, flex: bool = False) -> torch.Tensor:
    """One decode step's logits (rows x vocabulary): the function a step compiles and a CUDA graph captures. With
    `flex` (compiled only: flex attention run eagerly is a slow reference), the attention reads each row's own
    blocks (block_masks); else every column under an additive mask (masks)."""
    built: Dict[str, Any] = (block_masks(lengths, live, columns.shape[0], windows) if flex
                             else masks(lengths, live, columns, windows, dtype))
    out = model(input_ids=tokens, position_ids=lengths[:, None], use_cache=True,
                attention_mask=built if len(built) > 1 else next(iter(built.values())), **cache_kwarg)
    return out.logits[:, -1, :]


# The torch versions whose CPU flex attention kernel needs _distinct_block_size_names (the ones it was written for and
# checked on: a version not listed runs its own code generation, and where that fails the self-check falls back).
PATCHED_TORCH = ("2.13.",)


def patch_applies(device: torch.device, version: str = torch.__version__) -> bool:
    """Whether the inductor patch is for this device and torch: a CPU's flex kernel (inductor's C++ template; a GPU's
    is a Triton kernel, which has no such naming) on the versions in PATCHED_TORCH."""
    return device.type == "cpu" and version.startswith(PATCHED_TORCH)


def _distinct_block_size_names() -> bool:
    """Works around torch 2.13's CPU flex attention kernel (inductor's CppFlexAttentionTemplate.modification): it
    names the two block sizes known only at run time as the next size arguments (ks3, say), then swaps those names
    for its runtime variables by plain text replacement in the mask function's code, which also rewrites any longer
    name they begin (a row count named ks37 becomes cur_kvSplitSize7: a C++ compile error). With dynamic shapes a
    mask function that reads a tensor by row nearly always names such a size. Here the two get names no other name
    begins with while that method runs. Whether it was applied (False: the torch internals have moved; a step whose
    kernel then fails falls back to the masked attention, Step._compiled)."""
    try:
        import torch._inductor.compile_fx  # noqa: F401  (imported first: the template's module imports circularly)
        from torch._inductor.codegen import common, cpp_flex_attention_template as template
    except ImportError:
        return False
    flex_template = getattr(template, "CppFlexAttentionTemplate", None)
    original = getattr(flex_template, "modification", None)
    lookup = getattr(common.KernelArgs, "_lookup", None)
    if original is None or lookup is None:
        return False
    if getattr(original, "_debatecv", False):
        return True

    def modification(self: Any, *args: Any, **kwargs: Any) -> Any:
        sizes = set(getattr(self, "block_vars", ()))

        def named(prefix: str, names: Dict[Any, str], name: Any) -> str:
            if name in sizes and name not in names:
                names[name] = f"{prefix}_block{len(names)}_"  # the trailing _: no other name begins with it
            return lookup(prefix, names, name)

        setattr(common.KernelArgs, "_lookup", staticmethod(named))
        try:
            return original(self, *args, **kwargs)
        finally:
            setattr(common.KernelArgs, "_lookup", staticmethod(lookup))

    setattr(modification, "_debatecv", True)
    setattr(flex_template, "modification", modification)
    return True


def compiled(model: torch.nn.Module) -> Callable[..., torch.Tensor]:
    """The model's compiled decode forward, made on first use; its graphs counted by the backend."""
    fn = _compiled.get(model)
    if fn is None:
        if patch_applies(next(model.parameters()).device):
            _distinct_block_size_names()
        # dynamo counts the graphs of `forward` over every model compiled in the process (one code object), and its
        # default limit (8) is reached at four models of two graphs each (a courtroom's judges on models of their
        # own, a test session): past it a model's step would run eagerly. Room for 32 models.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        stats = stats_for(model)
        inductor = torch._dynamo.lookup_backend("inductor")
        seen: set = set()

        def counting(graph: torch.fx.GraphModule, example_inputs: List[torch.Tensor]) -> Callable[..., Any]:
            # One graph per compile of the frame: dynamo may restart a compile's analysis and call back again.
            compile_id = torch._guards.CompileContext.current_compile_id()
            key = (compile_id.frame_id, compile_id.frame_compile_id) if compile_id is not None else len(seen)
            if key not in seen:
                seen.add(key)
                stats.graphs += 1
            return inductor(graph, example_inputs)

        fn = torch.compile(forward, backend=counting, fullgraph=True, dynamic=True)
        _compiled[model] = fn
    return fn


def compiling(model: torch.nn.Module, settings: Any) -> bool:
    """Whether a step goes through the compiled forward: asked for, and not failed for this model."""
    stats = _stats.get(model)
    return bool(getattr(settings, "compile", False)) and (stats is None or stats.failed is None)


# The self-check (issue 58): the first step through each compiled path of a model (flex attention, the masked
# attention) and each captured bucket's first replay are compared with the eager step's logits on the same inputs.
# Allowed: this share of each row's logit range (its largest less its smallest eager logit) at the model's compute
# precision. Compiled and eager sum in other orders: measured on this CPU (tiny Gemma 3, one step of 5 rows beside a
# 700-column one, docs/BENCHMARKS.md issue 58), float32 steps differ by 3.5e-7 of the range, bf16 by 6.6e-3; a wrong
# attention (a row reading another's columns, or none of its own) moves logits by a large part of their range. The
# half precisions' allowance is 7x what was measured: a GPU's kernels sum in other orders again, and a check that
# fails for rounding alone would take --compile away from a run that is right.
CHECK_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-3}
HALF_TOLERANCE = 5e-2  # bf16 and fp16


def tolerance(dtype: torch.dtype) -> float:
    return CHECK_TOLERANCE.get(dtype, HALF_TOLERANCE)


def mismatch(logits: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> Optional[str]:
    """Why a compiled step's `logits` are not the eager step's `reference` (rows x vocabulary), or None: a value
    that is not finite where the reference's is, or a row further from it than `tolerance(dtype)` of its range."""
    got, want = logits.float(), reference.float()
    finite = torch.isfinite(want)
    if bool((finite & ~torch.isfinite(got)).any()):
        return "gave logits that are not finite where the eager step's are"
    span = (want.masked_fill(~finite, float("-inf")).amax(dim=-1) -
            want.masked_fill(~finite, float("inf")).amin(dim=-1)).clamp(min=1e-6)
    gap = float(((got - want).abs().masked_fill(~finite, 0.0).amax(dim=-1) / span).max())
    if gap > tolerance(dtype):
        return (f"gave logits {gap:.3g} of their range away from the eager step's (tolerance "
                f"{tolerance(dtype):g} at {str(dtype).replace('torch.', '')})")
    return None


def _one_line(err: BaseException) -> str:
    return " ".join(f"failed ({type(err).__name__}: {err})".split())[:300]


def on_device(device: torch.device) -> Any:
    """The model's device as the current CUDA device while its step runs: side streams, events and captures are
    made on the current device, which need not be the model's (a model on cuda:1 while cuda:0 is current)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


class Step:
    """A model's decode steps: eagerly, or through its compiled forward, on CUDA each bucket captured once as a CUDA
    graph (one memory pool for all) and replayed; each compiled path and captured bucket checked once against the
    eager step (CHECK_TOLERANCE), falling back flex -> masked attention -> eager, a bucket's graph -> no graph."""

    def __init__(self, model: torch.nn.Module, windows: Dict[str, Optional[int]], dtype: torch.dtype) -> None:
        self.model, self.windows, self.dtype = model, windows, dtype
        self.name = type(model).__name__
        self.stats = stats_for(model)
        # The compiled step's attention (ROW_ATTENTION): flex until it fails or its check does for this model.
        self.flex = ROW_ATTENTION == "flex" and model not in _no_flex
        self.device = next(model.parameters()).device
        self.capture = self.device.type == "cuda"  # whether buckets are captured as CUDA graphs
        self.clock = Clock(self.stats, self.device)
        self.checked: set = set()  # the compiled paths ("flex", "masked") whose first step matched the eager step
        self.graphs: Dict[Tuple[int, int], Tuple[Any, torch.Tensor]] = {}
        self.warm: set = set()  # buckets that ran once on a side stream: the next run captures them
        self.failed: set = set()  # buckets whose capture failed once
        self.no_graph: set = set()  # buckets that run compiled without a CUDA graph (failed twice, or their check)
        self.pool: Any = None

    def run(self, compile_step: bool, cache_kwarg: Dict[str, Any], tokens: torch.Tensor, lengths: torch.Tensor,
            live: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        """The logits of one step over these views (rows x vocabulary)."""
        args = (self.model, cache_kwarg, tokens, lengths, live, columns, self.windows, self.dtype)
        if not compile_step or self.stats.failed is not None:
            self.stats.eager_steps += 1
            return forward(*args)
        bucket = (tokens.shape[0], columns.shape[0])
        with on_device(self.device):
            if self.capture and bucket not in self.no_graph:
                return self._replayed(bucket, args)
            return self._compiled(args)

    def _path(self) -> str:
        return "flex attention" if self.flex else "masked attention"

    def _compiled(self, args: tuple, reference: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The compiled step; the first through each path checked against the eager step, which runs first (so the
        keys and values the compiled step writes are the ones kept)."""
        path = self._path()
        if path not in self.checked and reference is None:
            reference = forward(*args).clone()
        try:
            logits = compiled(self.model)(*args, self.flex)
        except torch.OutOfMemoryError:
            raise
        except Exception as err:
            return self._fall_back(args, _one_line(err), reference)
        if path not in self.checked:
            problem = mismatch(logits, cast(torch.Tensor, reference), self.dtype)
            if problem is not None:
                return self._fall_back(args, problem, reference)
            self.checked.add(path)
            self.stats.checked.append(path)
        self.stats.steps += 1
        return logits

    def _fall_back(self, args: tuple, why: str, reference: Optional[torch.Tensor]) -> torch.Tensor:
        """flex -> masked attention (compiled, checked in turn) -> eager, said in one line each."""
        if self.flex:  # flex's kernel failed or disagreed: the masked attention, compiled, from now on
            self.flex = False
            _no_flex.add(self.model)
            self.stats.flex_failed = why
            log.warning("--compile: the decode step of %s with flex attention %s; it attends under a mask instead",
                        self.name, why)
            return self._compiled(args, reference)
        # A graph break, a backend failure, wrong logits: this model decodes eagerly from now on, this step too (run
        # again, so that the cache holds the eager step's keys and values).
        self.stats.failed = why
        log.warning("--compile: the decode step of %s with masked attention %s; it runs eagerly", self.name, why)
        self.stats.eager_steps += 1
        return forward(*args)

    def _replayed(self, bucket: Tuple[int, int], args: tuple) -> torch.Tensor:
        """The bucket's CUDA graph replayed; captured the second time the bucket runs (the first runs it on a side
        stream, where lazy initialisations happen outside any capture, as PyTorch's CUDA graph notes advise), its
        first replay checked against the eager step. A bucket whose capture fails twice or whose check fails runs
        compiled without a graph; the other buckets keep theirs."""
        if bucket in self.graphs:
            graph, out = self.graphs[bucket]
            graph.replay()
            self.stats.steps += 1
            return out
        stream = torch.cuda.current_stream(self.device)
        if bucket not in self.warm:
            self.warm.add(bucket)
            side = torch.cuda.Stream(device=self.device)
            side.wait_stream(stream)
            with torch.cuda.stream(side):
                out = self._compiled(args)
            stream.wait_stream(side)
            return out
        try:
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                out = compiled(self.model)(*args, self.flex)  # recorded, not run: counted at the replay below
        except torch.OutOfMemoryError:
            raise
        except Exception as err:
            # A first failure of a bucket is most often a recompile inside the capture (a guard that failed on this
            # bucket's shapes): the bucket warms again outside any capture, then is captured. A second failure
            # leaves this bucket without a graph, said once.
            self.warm.discard(bucket)
            if bucket in self.failed:
                self._no_graph(bucket, _one_line(err))
            self.failed.add(bucket)
            return self._compiled(args)
        reference = forward(*args).clone()  # before the replay: the replay's keys and values are the ones kept
        graph.replay()
        problem = mismatch(out, reference, self.dtype)
        if problem is not None:
            self._no_graph(bucket, problem)
            return self._compiled(args)
        self.graphs[bucket] = (graph, out)
        self.stats.checked.append(f"CUDA graph {bucket[0]}x{bucket[1]}")
        self.stats.cuda_graphs += 1
        self.stats.steps += 1
        return out

    def _no_graph(self, bucket: Tuple[int, int], why: str) -> None:
        self.no_graph.add(bucket)
        self.stats.graph_failed = why
        log.warning("--compile: the CUDA graph of %s's decode step for %d rows x %d columns %s; that bucket runs "
                    "compiled without a graph, the others keep theirs", self.name, bucket[0], bucket[1], why)

    def close(self) -> None:
        """Let go of the captured graphs and their pool (the place seen anew: every bucket warms again before it is
        captured, over the new state's tensors)."""
        self.graphs.clear()
        self.warm.clear()
        self.failed.clear()
        self.pool = None


def summary(models: Any) -> str:
    """How the models' decode steps ran, in one line."""
    parts = []
    for model in models:
        stats = stats_of(model)
        if stats is None:
            continue
        name = type(model).__name__
        steps = stats.steps + stats.eager_steps
        ms = f", {stats.seconds / steps * 1000:.1f} ms a step" if steps else ""
        ms += f", occupancy {stats.occupancy:.2f}" if stats.occupancy is not None else ""
        if stats.graphs:
            parts.append(f"{name} compiled, {stats.graphs} graph(s) ({max(0, stats.graphs - 1)} recompiles), "
                         f"{stats.steps} steps through them, {stats.cuda_graphs} CUDA graphs, {stats.eager_steps} "
                         f"eager steps{ms}" + (f" (compiling failed: {stats.failed})" if stats.failed else "")
                         + (f" (flex attention failed: {stats.flex_failed})" if stats.flex_failed else "")
                         + (f" (a CUDA graph failed: {stats.graph_failed})" if stats.graph_failed else "")
                         + (f"; checked against eager: {', '.join(stats.checked)}" if stats.checked else ""))
        else:
            parts.append(f"{name} eager, {stats.eager_steps} steps{ms}")
        if stats.mixed or stats.prefill_only:
            beside = f" beside {stats.mixed_rows / stats.mixed:.1f} decode rows on average" if stats.mixed else ""
            parts[-1] += (f"; prompts fed in {stats.mixed} steps{beside} and {stats.prefill_only} forwards of "
                          f"prompt tokens alone ({stats.prefill_tokens:,} tokens, "
                          f"{stats.mixed_seconds / (stats.mixed + stats.prefill_only) * 1000:.1f} ms a forward)")
    return "; ".join(parts) or "no decode step"
