"""A model's KV memory as tensors: one flat storage per layer for keys and one for values, allocated once
(debate.engine.kv_pool decides its size from the run's budget) and kept at its addresses for the run, seen two ways
at once (`Store`):
- the decode place, from its start: `rows` slots of `columns` columns, (rows, kv_heads, columns, head_dim). A turn's
  row owns one slot: its context from column 0 (left aligned, so a token's column is its position), its new tokens
  after it. Every step writes each of its tokens at its own slot and column (`StepLayer`) and attends to its own
  slot's columns (debate.engine.attention);
- the page arena, past the place's end: pages of PAGE tokens, (pages, kv_heads, PAGE, head_dim). A conversation that
  waits for its next turn holds the pages its tokens were copied to when its turn ended (`copy_out`); its next turn
  copies them back into its slot (`copy_in`) and gives them back. One copy each way a turn, never one a step.

Where the place ends moves when it is empty (kv_pool: more slots, or wider ones, as the rows waiting need): the pages
it grows over are first moved to free pages past its new end. So a budget is not split once for all between slots
and pages: a lone conversation may take nearly all of it, many short ones leave it to the waiting caches.

Why both: decoding from pages would gather every row's keys and values into one tensor at every step (PyTorch has
no paged attention kernel for the CPU and sdpa), three times the attention's memory traffic; a slot per waiting
conversation would hold each one at the widest row's columns. The place is dense where the steps read, the pages
tight where caches wait.

Nothing read may be NaN: a decode step attends to every column of its bucket, the unwritten ones masked, and a NaN
there would still poison the softmax's weighted sum. The storage is made with `torch.empty` (on a CPU the pages of
memory are only touched when written) and zeroed column by column as the steps' buckets first reach them
(`Store.ready`); a view of the place anew zeroes it again (a page's tokens were there).
"""
from typing import Any, List, Optional, Sequence, Tuple

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from debate.engine import memory

PAGE = memory.PAGE  # tokens a page of the arena holds


def to_device(values: Sequence[Any], device: torch.device) -> torch.Tensor:
    """Python numbers as a tensor on `device`. On CUDA through pinned memory and a copy that does not wait: a copy from
    ordinary memory waits for every kernel queued before it, which would stall the decode steps in flight."""
    tensor = torch.tensor(values)
    if device.type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


class BufferLayer(DynamicLayer):
    """One layer's keys/values of some rows in a preallocated buffer (views of the place), written in place from
    column `filled` on: what a prefill piece and a choice's tree pass give the model as its cache layer. `keys` and
    `values` are views of the filled columns, so the model sees an ordinary cache layer."""

    is_compileable = True

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, filled: int = 0) -> None:
        super().__init__()
        self.buffer_keys, self.buffer_values, self.filled = keys, values, filled
        self.capacity = keys.shape[2]
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self._expose()

    def _expose(self) -> None:
        self.keys = self.buffer_keys[:, :, :self.filled]
        self.values = self.buffer_values[:, :, :self.filled]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> Tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        end = self.filled + key_states.shape[-2]
        if end > self.capacity:  # the place's geometry (kv_pool) gives every row its columns: a bug if it happens
            raise RuntimeError(f"a slot of {self.capacity} columns cannot take tokens up to column {end}")
        self.buffer_keys[:, :, self.filled:end].copy_(key_states)
        self.buffer_values[:, :, self.filled:end].copy_(value_states)
        self.filled = end
        self._expose()
        return self.buffer_keys[:, :, :end], self.buffer_values[:, :, :end]

    def get_seq_length(self) -> int:
        return self.filled


class StepLayer(DynamicLayer):
    """One layer of a step (debate.engine.decode_step): the place's first slots and columns (the step's bucket), every
    token of the step written at its own (slot, column) in place, the whole view handed to the attention (which reads
    each slot's own columns). The same shapes and addresses at every step of a bucket: what a CUDA graph replays."""

    is_compileable = True

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor, columns: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values, self.slots, self.columns = keys, values, slots, columns
        self.view_keys, self.view_values = keys, values  # typed tensors (DynamicLayer's keys may be None)
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> Tuple[torch.Tensor, torch.Tensor]:
        # (1, kv_heads, tokens, dim) written by one in-place index_put_ with the slot, head and column indices
        # broadcast side by side. Written through a permuted view instead (as before issue 53), inductor copied the
        # whole slots x columns view in and back at every layer of a compiled step (21 ms against 0.03 ms for one
        # layer's keys at 32 x 4,096, bench/bench_row_attention.py). No permuted view is kept on the layer either: two
        # inputs of a compiled step aliasing one storage, one of them written, send aot_autograd down a path that
        # fails under dynamic shapes ("size_bytes_is_heap_allocated").
        keys, values = self.view_keys, self.view_values
        index = (self.slots[:, None], torch.arange(keys.shape[1], device=keys.device)[None], self.columns[:, None])
        keys.index_put_(index, key_states[0].transpose(0, 1))
        values.index_put_(index, value_states[0].transpose(0, 1))
        return keys, values

    def get_seq_length(self) -> int:
        return 0  # no position is derived from it: a step's positions are given


def cache_of(layers: Sequence[DynamicLayer]) -> DynamicCache:
    """A transformers cache made of these layers."""
    cache = DynamicCache.__new__(DynamicCache)
    Cache.__init__(cache, layers=list(layers))
    return cache


class Store:
    """One model's KV memory: per layer a flat storage of keys and one of values, `tokens` tokens long. From its
    start it is seen as the decode place, `rows` slots of `columns` columns (rows, kv_heads, columns, head_dim); all
    of it is also seen as pages of PAGE tokens (pages, kv_heads, PAGE, head_dim), of which those past the place's
    end are the arena's."""

    def __init__(self, shapes: Sequence[Tuple[int, int, torch.dtype, torch.device]], tokens: int, rows: int,
                 columns: int) -> None:
        """`shapes`: per layer (kv_heads, head_dim, dtype, device)."""
        self.shapes = list(shapes)
        self.pages = tokens // PAGE
        self.tokens = self.pages * PAGE
        self.flat: List[Tuple[torch.Tensor, torch.Tensor]] = [
            (torch.empty(self.tokens * h * d, dtype=t, device=dev), torch.empty(self.tokens * h * d, dtype=t,
                                                                                 device=dev))
            for h, d, t, dev in self.shapes]
        self.page_layers = [(k.view(self.pages, h, PAGE, d), v.view(self.pages, h, PAGE, d))
                            for (k, v), (h, d, _, _) in zip(self.flat, self.shapes)]
        self.rows = self.columns = 0
        self.layers: List[Tuple[torch.Tensor, torch.Tensor]] = []
        self.zeroed = 0  # columns [0, zeroed) of every slot hold finite values
        self.view(rows, columns)

    @property
    def first_page(self) -> int:
        """The first page past the place: the arena's pages are this one and those after it."""
        return -(-self.rows * self.columns // PAGE)

    def view(self, rows: int, columns: int) -> None:
        """See the place as `rows` slots of `columns` columns (a multiple of PAGE; rows x columns <= tokens); only
        with no row in it, and once no cache holds a page before the new first_page."""
        if rows * columns > self.tokens or columns % PAGE:
            raise ValueError(f"{rows} slots of {columns} columns do not fit {self.tokens} tokens in pages of {PAGE}")
        self.rows, self.columns = rows, columns
        self.layers = [(k[:rows * h * columns * d].view(rows, h, columns, d),
                        v[:rows * h * columns * d].view(rows, h, columns, d))
                       for (k, v), (h, d, _, _) in zip(self.flat, self.shapes)]
        self.zeroed = 0  # what was a page's may be anything

    def shrink(self, tokens: int, keep: Sequence[int]) -> None:
        """Keep only the first `tokens` tokens (a multiple of PAGE), and of them only pages `keep` (the caches' pages;
        the place is empty): each layer's storage made anew, one at a time, with those pages copied over, so the
        memory past the end goes back to the allocator (for the reserve), the copy's peak is one layer's and, on a
        CPU, storage nothing was written to stays untouched. Only with no row in the place."""
        self.layers, self.page_layers = [], []  # views of the old storage: it is freed layer by layer below
        pages = tokens // PAGE
        for i, (h, d, dtype, device) in enumerate(self.shapes):
            for which in range(2):  # keys, then values: one tensor's old storage freed before the next is made
                source = self.flat[i][which]
                target = torch.empty(tokens * h * d, dtype=dtype, device=device)
                for page in keep:  # page by page: no gathered copy of every kept page beside both storages
                    target.view(pages, h, PAGE, d)[page].copy_(source.view(self.pages, h, PAGE, d)[page])
                self.flat[i] = (target, self.flat[i][1]) if which == 0 else (self.flat[i][0], target)
                del source
        self.pages, self.tokens = pages, tokens
        self.page_layers = [(k.view(self.pages, h, PAGE, d), v.view(self.pages, h, PAGE, d))
                            for (k, v), (h, d, _, _) in zip(self.flat, self.shapes)]

    def ready(self, columns: int) -> None:
        """Columns [0, columns) of every slot finite from now on: those not yet zeroed are, once."""
        if columns > self.zeroed:
            for keys, values in self.layers:
                keys[:, :, self.zeroed:columns].zero_()
                values[:, :, self.zeroed:columns].zero_()
            self.zeroed = columns

    def slot_cache(self, slot: int, filled: int) -> DynamicCache:
        """A cache over one slot, its first `filled` columns already holding its context: a prefill writes after
        them, a choice's tree pass past the row's end."""
        return cache_of([BufferLayer(k[slot:slot + 1], v[slot:slot + 1], filled) for k, v in self.layers])

    def step_cache(self, rows: int, columns: int, slots: torch.Tensor, positions: torch.Tensor) -> DynamicCache:
        """The cache of a step over slots [0, rows) and columns [0, columns), token i written at (slots[i],
        positions[i])."""
        return cache_of([StepLayer(k[:rows, :, :columns], v[:rows, :, :columns], slots, positions)
                         for k, v in self.layers])

    def move(self, source: int, target: int, columns: int) -> None:
        """Slot `source`'s first `columns` columns to slot `target` (the rows are packed to the front: fewer rows a
        step)."""
        for keys, values in self.layers:
            keys[target, :, :columns].copy_(keys[source, :, :columns])
            values[target, :, :columns].copy_(values[source, :, :columns])

    def _in_pages(self, slot: int, pages: int, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Slot `slot`'s first `pages` x PAGE columns seen page by page, (pages, kv_heads, PAGE, head_dim)."""
        (h, d, _, _), (keys, values) = self.shapes[layer], self.layers[layer]
        return tuple(t[slot, :, :pages * PAGE].view(h, pages, PAGE, d).permute(1, 0, 2, 3)  # type: ignore[return-value]
                     for t in (keys, values))

    def copy_out(self, slot: int, pages: Sequence[int], at: Optional[Sequence[int]] = None) -> None:
        """Slot `slot`'s pages of columns `at` (its first len(pages) by default) into `pages` (a slot's columns are a
        multiple of PAGE; the pages are past the place's end)."""
        first = self.first_page
        index: Optional[torch.Tensor] = None
        chosen: Optional[torch.Tensor] = None
        span = len(pages) if at is None else max(at) + 1
        for layer, (keys, values) in enumerate(self.page_layers):
            if index is None or index.device != keys.device:
                index = to_device([p - first for p in pages], keys.device)
                chosen = None if at is None else to_device(list(at), keys.device)
            source_k, source_v = self._in_pages(slot, span, layer)
            if chosen is not None:
                source_k, source_v = source_k.index_select(0, chosen), source_v.index_select(0, chosen)
            # Written through the pages past the place alone: PyTorch refuses a write whose tensor overlaps its source.
            keys[first:].index_copy_(0, index, source_k)
            values[first:].index_copy_(0, index, source_v)

    def copy_in(self, slot: int, pages: Sequence[int]) -> None:
        """`pages` into slot `slot`'s first len(pages) x PAGE columns."""
        index: Optional[torch.Tensor] = None
        for layer, (keys, values) in enumerate(self.page_layers):
            if index is None or index.device != keys.device:
                index = to_device(list(pages), keys.device)
            target_k, target_v = self._in_pages(slot, len(pages), layer)
            target_k.copy_(keys.index_select(0, index))
            target_v.copy_(values.index_select(0, index))

    def move_page(self, source: int, target: int) -> None:
        """Page `source`'s tokens to page `target` (the place grows over the pages nearest it)."""
        for keys, values in self.page_layers:
            keys[target].copy_(keys[source])
            values[target].copy_(values[source])

    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.flat)


def layer_shapes(model: torch.nn.Module, dtype: torch.dtype) -> List[Tuple[int, int, torch.dtype, torch.device]]:
    """Per decoder layer (kv_heads, head_dim, dtype, device): each layer's keys and values beside its weights (a
    model spread over GPUs keeps each layer's cache on its own device)."""
    config: Any = model.config
    if hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    devices = _layer_devices(model, config.num_hidden_layers)
    return [(kv_heads, head_dim, dtype, device) for device in devices]


def _layer_devices(model: Any, layers: int) -> List[torch.device]:
    first = next(model.parameters()).device
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    stack = getattr(getattr(base, "model", None), "layers", None)
    if stack is None:
        stack = getattr(getattr(getattr(base, "model", None), "language_model", None), "layers", None)
    if stack is None or len(stack) != layers:
        return [first] * layers
    return [next(layer.parameters()).device for layer in stack]
