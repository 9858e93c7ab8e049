"""A turn's decode step with the same shapes at every step: what torch.compile turns into one graph and a CUDA
graph replays.

Within a turn every step feeds one token a row and attends to the turn's whole buffer (kv_store.BufferLayer in
decode mode writes the token's keys and values at a column held on the device). What changes from step to step
lives in device tensors updated in place: the column, the rows' positions, and additive attention masks (one per
attention type: Gemma 3's sliding-window layers close the column that falls out of their window as the full ones
open the new one). Compiled (`--compile`), rows and columns are rounded up to buckets (ROW_BUCKETS, COLUMN_BUCKET)
so turns of similar size share a graph, and the forward is compiled once per model with dynamic sizes (two rows
at least: PyTorch would compile a size of 1 as a graph of its own), never once a step.

Grouped-query attention reads each key head once: for one token the step regroups a key head's queries side by
side (DECODE_ATTENTION, which `decoding` switches a model to for its steps) where transformers, compiled, would
repeat every key and value to all its heads first.

On CUDA the step (masks, forward, and for rows without a schema the pick of the next token, the stop check and
the next step's inputs) is captured once per turn as a CUDA graph after a warm-up step and replayed at every
later step: one launch a step, and one small copy back to the host (whether every row has stopped). Where
compiling or capturing fails, the run says why in one line and goes on eagerly.
"""
import contextlib
import logging
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from debate.engine.sampling import next_tokens

log = logging.getLogger(__name__)

COLUMN_BUCKET = 256  # a compiled turn's columns are rounded up to a multiple of this
DECODE_ATTENTION = "debatecv_decode"


def bucket_rows(rows: int) -> int:
    """A compiled turn's rows: the next power of two, two at least (at most twice the rows, a handful of buckets in
    all; PyTorch compiles a size of 1 as a graph of its own, so a lone row is padded to two)."""
    n = 2
    while n < rows:
        n *= 2
    return n


def bucket_columns(columns: int) -> int:
    return -(-columns // COLUMN_BUCKET) * COLUMN_BUCKET


def _decode_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], scaling: Optional[float] = None, dropout: float = 0.0,
                      **kwargs: Any) -> Any:
    """sdpa, except that one token's queries are regrouped by key head (heads h*g .. h*g+g-1 read key head h, as
    transformers' repeat_kv orders them), so no key or value is repeated."""
    groups = getattr(module, "num_key_value_groups", 1)
    if query.shape[2] != 1 or groups == 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    rows, heads, _, dim = query.shape
    grouped = query.reshape(rows, heads // groups, groups, dim)
    out = F.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(rows, heads, 1, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(DECODE_ATTENTION, _decode_attention)
AttentionMaskInterface.register(DECODE_ATTENTION, sdpa_mask)  # were a 2-D mask ever given, sdpa's mask is right


def _configs(model: torch.nn.Module) -> List[Any]:
    config = model.config
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return [config] if text is config else [config, text]


@contextlib.contextmanager
def decoding(model: torch.nn.Module) -> Iterator[None]:
    """The model's sdpa attention as DECODE_ATTENTION while a turn decodes (other implementations stay)."""
    configs = [c for c in _configs(model) if c._attn_implementation == "sdpa"]
    for config in configs:
        config._attn_implementation = DECODE_ATTENTION
    try:
        yield
    finally:
        for config in configs:
            config._attn_implementation = "sdpa"


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
    """What compiling one model's decode step came to: graphs made (the first, then each recompile), CUDA graphs
    captured (one a turn), and why it runs eagerly where it does."""

    graphs: int = 0
    cuda_graphs: int = 0
    steps: int = 0  # decode steps through the compiled forward
    eager_steps: int = 0
    failed: Optional[str] = None
    # Wall time of the turns' decode loops (the prefill's last kernels may still run as one starts; each ends on the
    # copy of its ids to the host), for milliseconds a step.
    seconds: float = 0.0
    # Occupancy: tokens the decode steps produced over the rows they ran (a row that has stopped, or pads a bucket,
    # runs and produces nothing).
    tokens: int = 0
    row_steps: int = 0

    @property
    def occupancy(self) -> Optional[float]:
        return self.tokens / self.row_steps if self.row_steps else None

    def as_record(self) -> Dict[str, Any]:
        return {"compiled": self.steps > 0 and self.failed is None, "graphs": self.graphs,
                "decode_tokens": self.tokens, "decode_row_steps": self.row_steps,
                "occupancy": None if self.occupancy is None else round(self.occupancy, 4),
                "recompiles": max(0, self.graphs - 1), "cuda_graphs": self.cuda_graphs, "compiled_steps": self.steps,
                "eager_steps": self.eager_steps, **({"fallback": self.failed} if self.failed else {})}


@dataclass
class _Compiled:
    fn: Callable[..., torch.Tensor]
    stats: Stats


_compiled: "weakref.WeakKeyDictionary[torch.nn.Module, _Compiled]" = weakref.WeakKeyDictionary()
_stats: "weakref.WeakKeyDictionary[torch.nn.Module, Stats]" = weakref.WeakKeyDictionary()  # compiled or eager
_no_graphs: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()  # models whose step could not be captured


def forward(model: torch.nn.Module, cache_kwarg: Dict[str, Any], tokens: torch.Tensor, positions: torch.Tensor,
            masks: Any) -> torch.Tensor:
    """One decode step's logits (rows x vocabulary): the forward a step compiles."""
    out = model(input_ids=tokens, position_ids=positions, attention_mask=masks, use_cache=True, **cache_kwarg)
    return out.logits[:, -1, :]


def compiled(model: torch.nn.Module) -> _Compiled:
    """The model's compiled decode forward, made on first use; its graphs counted by the backend."""
    entry = _compiled.get(model)
    if entry is None:
        stats = _stats.setdefault(model, Stats())
        inductor = torch._dynamo.lookup_backend("inductor")
        seen = set()

        def counting(graph: torch.fx.GraphModule, example_inputs: List[torch.Tensor]) -> Callable[..., Any]:
            # One graph per compile of the frame: dynamo may restart a compile's analysis and call back again.
            compile_id = torch._guards.CompileContext.current_compile_id()
            key = (compile_id.frame_id, compile_id.frame_compile_id) if compile_id is not None else len(seen)
            if key not in seen:
                seen.add(key)
                stats.graphs += 1
            return inductor(graph, example_inputs)

        entry = _Compiled(torch.compile(forward, backend=counting, fullgraph=True, dynamic=True), stats)
        _compiled[model] = entry
    return entry


def stats_of(model: torch.nn.Module) -> Optional[Stats]:
    """The model's decode statistics (compiled and eager steps), or None when it has not decoded."""
    return _stats.get(model)


@dataclass
class State:
    """The device tensors a turn's steps read and update in place (rows: the bucket's, pad rows included)."""

    tokens: torch.Tensor  # (rows, 1) the ids fed next
    positions: torch.Tensor  # (rows, 1) their positions
    column: torch.Tensor  # (1,) the column they are written to
    masks: Dict[str, torch.Tensor]  # attention type -> (rows, 1, 1, columns) additive mask
    windows: Dict[str, Optional[int]]
    live: torch.Tensor  # (rows,) bool: the row has not stopped (pad rows never live)
    history: torch.Tensor  # (rows, max steps) every picked id
    step: torch.Tensor  # (1,) the history column the next pick goes to
    stops: torch.Tensor  # the stop ids
    pad_id: int
    limits: torch.Tensor  # (rows,) the most ids each row may pick (bench_gpu.py --turn-lengths; else max steps)


def start(rows: int, bucket: int, starts: List[int], first: int, capacity: int, positions: List[int],
          windows: Dict[str, Optional[int]], dtype: torch.dtype, device: torch.device, steps: int,
          stop_ids: List[int], pad_id: int, limits: Optional[List[int]] = None) -> State:
    """The state before a turn's first decode step: row r's context in columns starts[r] .. first - 1, the first
    generated token to be written at column `first` at position positions[r]; rows past `rows` are padding (they
    see column 0 alone, zeros, so their softmax stays finite)."""
    low = torch.finfo(dtype).min
    column = torch.arange(capacity)
    begin = torch.tensor(starts + [0] * (bucket - rows))[:, None]
    end = torch.tensor([first] * rows + [1] * (bucket - rows))[:, None]
    masks = {}
    for kind, window in windows.items():
        # As of the query at column first - 1: the step at `first` opens its column and closes first - window.
        seen = (column[None] >= begin) & (column[None] < end)
        if window is not None:
            seen[:rows] &= column[None] > first - 1 - window
        masks[kind] = torch.zeros((bucket, capacity), dtype=dtype).masked_fill(~seen, low)[:, None, None].to(device)
    live = torch.tensor([True] * rows + [False] * (bucket - rows), device=device)
    return State(tokens=torch.full((bucket, 1), pad_id, dtype=torch.long, device=device),
                 positions=torch.tensor(positions + [0] * (bucket - rows), device=device)[:, None],
                 column=torch.tensor([first], device=device), masks=masks, windows=windows, live=live,
                 history=torch.full((bucket, max(1, steps)), pad_id, dtype=torch.long, device=device),
                 step=torch.zeros(1, dtype=torch.long, device=device),
                 stops=torch.tensor(stop_ids, dtype=torch.long, device=device), pad_id=pad_id,
                 limits=torch.tensor((limits or [steps] * rows) + [steps] * (bucket - rows), device=device))


def open_column(state: State) -> None:
    """Let each live row see the column this step writes, and a sliding-window layer no longer see the column
    that falls out of its window (nothing there before column 0)."""
    for kind, mask in state.masks.items():
        low = torch.finfo(mask.dtype).min
        opened = torch.where(state.live, 0.0, low).to(mask.dtype).view(-1, 1, 1, 1)
        mask.index_copy_(3, state.column, opened)
        window = state.windows[kind]
        if window is not None:
            gone = (state.column - window).clamp(min=0)
            kept = mask.index_select(3, gone)
            mask.index_copy_(3, gone, torch.where(state.column >= window, torch.full_like(kept, low), kept))


def advance(run: Callable[..., torch.Tensor], state: State, cache_kwarg: Dict[str, Any],
            model: torch.nn.Module) -> torch.Tensor:
    """One step: the fed tokens written at the column and attended; the logits (rows x vocabulary)."""
    open_column(state)
    logits = run(model, cache_kwarg, state.tokens, state.positions, state.masks if len(state.masks) > 1
                 else next(iter(state.masks.values())))
    state.column.add_(1)
    state.positions.add_(1)
    return logits


def pick(state: State, picked: torch.Tensor) -> None:
    """Record the step's `picked` ids (rows,) on the device: the history, which rows stop, what is fed next (a pad,
    masked, for a row that has stopped)."""
    state.history.index_copy_(1, state.step, picked.view(-1, 1))
    state.step.add_(1)
    state.live &= ~torch.isin(picked, state.stops) & (state.step < state.limits)
    state.tokens.copy_(torch.where(state.live, picked, state.pad_id).view(-1, 1))


def greedy(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(dim=-1)


def compiling(model: torch.nn.Module, settings: Any) -> bool:
    """Whether this turn's steps go through the compiled forward: asked for, and not failed for this model."""
    if not getattr(settings, "compile", False):
        return False
    entry = _compiled.get(model)
    return entry is None or entry.stats.failed is None


def shape(rows: int, columns: int, compiled_turn: bool) -> tuple:
    """(rows, columns) of a turn's buffer: as needed, or rounded up to the buckets when compiled."""
    return (bucket_rows(rows), bucket_columns(columns)) if compiled_turn else (rows, columns)


class Stepper:
    """A turn's decode steps over `state`: through the model's compiled forward where the settings ask for it, on
    CUDA captured as a CUDA graph after the first step and replayed; else the same step eagerly."""

    def __init__(self, model: torch.nn.Module, cache_kwarg: Dict[str, Any], state: State, settings: Any,
                 generator: Optional[torch.Generator], rows: int, pick_on_device: bool) -> None:
        self.model, self.cache_kwarg, self.state, self.settings = model, cache_kwarg, state, settings
        self.generator, self.rows, self.pick_on_device = generator, rows, pick_on_device
        self.bucket = state.tokens.shape[0]
        self.entry: Optional[_Compiled] = compiled(model) if compiling(model, settings) else None
        self.stats = _stats.setdefault(model, Stats())
        # A CUDA graph once the step has run once (compiled, and its kernels tuned); never on a CPU.
        self.capture = self.entry is not None and state.tokens.device.type == "cuda" and model not in _no_graphs
        self.graph: Any = None
        self.graph_out: Optional[torch.Tensor] = None
        self.fed = 0  # steps fed by the host (step_fed): a choice's tree pass writes past column first + fed
        self._warm = False  # the first step has run on a side stream (`_replayed`): the next one is captured

    # -- the step's body: what a CUDA graph captures ---------------------------------------------------------------

    def _forward(self) -> torch.Tensor:
        if self.entry is None:
            self.stats.eager_steps += 1
            return advance(forward, self.state, self.cache_kwarg, self.model)
        try:
            logits = advance(self.entry.fn, self.state, self.cache_kwarg, self.model)
            self.stats.steps += 1
            return logits
        except torch.OutOfMemoryError:
            raise
        except Exception as err:  # a graph break, a backend failure: this model decodes eagerly from now on
            self.entry.stats.failed = " ".join(f"{type(err).__name__}: {err}".split())[:300]
            log.warning("--compile: the decode step of %s could not be compiled (%s); it runs eagerly",
                        type(self.model).__name__, self.entry.stats.failed)
            self.entry, self.capture = None, False
            return self._forward()  # the masks' update is the same again; nothing else moved

    def _greedy_step(self) -> torch.Tensor:
        pick(self.state, greedy(self._forward()))
        return self.state.live

    def _sample(self, logits: torch.Tensor) -> None:
        picked = next_tokens(logits[:self.rows], self.settings, self.generator)  # the rows' own draws, as eagerly
        if self.bucket > self.rows:
            picked = torch.cat([picked, picked.new_full((self.bucket - self.rows,), self.state.pad_id)])
        pick(self.state, picked)

    def _replayed(self, body: Callable[[], torch.Tensor]) -> torch.Tensor:
        """body() itself, or its CUDA graph: the first step runs it on a side stream (lazy initialisations happen
        there, outside any capture, as PyTorch's CUDA graph notes advise), the second captures and replays it, the
        later ones replay it."""
        if self.graph is not None:
            self.graph.replay()
            self.stats.steps += 1
            assert self.graph_out is not None
            return self.graph_out
        if not self.capture:
            return body()
        if not self._warm:
            self._warm = True
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                out = body()
            torch.cuda.current_stream().wait_stream(side)
            return out
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                out = body()  # recorded, not run: the step's Python bookkeeping counts the replay below
            self.graph, self.graph_out = graph, out
            self.stats.cuda_graphs += 1
            graph.replay()
            return out
        except torch.OutOfMemoryError:
            raise
        except Exception as err:  # said once a model (a model spread over GPUs, say): its later turns do not try
            log.warning("--compile: the decode step of %s could not be captured as a CUDA graph (%s); it runs "
                        "compiled, without one", type(self.model).__name__, " ".join(str(err).split())[:200])
            _no_graphs.add(self.model)
            self.capture = False
            return body()

    # -- the loops ------------------------------------------------------------------------------------------------

    def run(self, first_logits: torch.Tensor) -> List[List[int]]:
        """Every row's ids, the turn decoded with no schema row: each step's pick stays on the device, and the host
        learns only whether every row has stopped (one small copy a step: on CUDA into pinned memory, read a step
        late, so the next step is launched before the host waits; one more step may run, its picks unread) and,
        at the end, the ids."""
        state, greedy_pick = self.state, self.settings.temperature <= 0
        if greedy_pick:
            first = greedy(first_logits)
            pick(state, torch.cat([first, first.new_full((self.bucket - self.rows,), state.pad_id)])
                 if self.bucket > self.rows else first)
        else:
            self._sample(first_logits)
        cuda = state.live.device.type == "cuda"
        pending: Optional[tuple] = None  # (event, pinned flag) of the step before, on CUDA
        # Two flags in turn: one is written by this step while the host reads the other, the step before's.
        flags = [torch.empty(1, dtype=torch.bool, pin_memory=True) for _ in range(2)] if cuda else []
        steps = 1
        for _ in range(1, self.settings.max_new_tokens if bool(state.live.any()) else 1):
            if not cuda and not bool(state.live.any()):
                break
            if greedy_pick:
                self._replayed(self._greedy_step)
            else:
                self._sample(self._replayed(self._forward))
            steps += 1
            if cuda:
                flag = flags[steps % 2]
                flag.copy_(state.live.any().view(1), non_blocking=True)
                event = torch.cuda.Event()
                event.record()
                if pending is not None:
                    pending[0].synchronize()
                    if not bool(pending[1]):  # every row had stopped a step ago: this step's picks are never read
                        break
                pending = (event, flag)
        stops = set(state.stops.tolist())
        ids = []
        for row, limit in zip(state.history[:self.rows, :steps].tolist(), state.limits.tolist()):
            end = next((i + 1 for i, token in enumerate(row) if token in stops), len(row))
            ids.append(row[:min(end, limit)])
        self.count(ids)
        return ids

    def count(self, ids: List[List[int]]) -> None:
        """Occupancy's counts for a finished turn: every id after the first (which the prefill's logits gave) came
        from a decode step, and each step ran the whole bucket."""
        forwards = max(len(row) for row in ids) - 1 if ids else 0
        self.stats.tokens += sum(max(0, len(row) - 1) for row in ids)
        self.stats.row_steps += forwards * self.bucket

    def close(self) -> None:
        """Let go of the turn's CUDA graph (its memory pool) and the step's tensors."""
        self.graph = self.graph_out = None
        del self.state

    def step_fed(self, tokens: List[Optional[int]]) -> torch.Tensor:
        """One step feeding `tokens` (None: the row has stopped, a masked pad goes in); the logits, rows first."""
        pad = self.state.pad_id
        fed = [pad if t is None else t for t in tokens] + [pad] * (self.bucket - self.rows)
        live = [t is not None for t in tokens] + [False] * (self.bucket - self.rows)
        self.state.tokens.copy_(torch.tensor(fed)[:, None])
        self.state.live.copy_(torch.tensor(live))
        self.fed += 1
        return self._replayed(self._forward)


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
                         f"eager steps{ms}" + (f" (compiling failed: {stats.failed})" if stats.failed else ""))
        else:
            parts.append(f"{name} eager, {stats.eager_steps} steps{ms}")
    return "; ".join(parts) or "no decode step"
