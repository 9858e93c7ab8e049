"""A turn's KV buffer, and each conversation's cache moved in and out of it.

Layout. A batch is a block of rows, each left-padded and contiguous: `[pad][cached][new][generated]`.
When rows have new chunks of different lengths, a row re-encodes a few of its last cached tokens instead
of leaving a gap in the middle; gaps would change what a sliding-window layer sees, since its window is
counted in columns.

Storage. A turn's batch gets one buffer per layer, allocated once for the whole turn (cached + new +
--max-new-tokens columns) and written in place by the prefill and by every decode step, as gpt-fast does:
no per-step concatenation over the whole cache. When the turn ends each row's own columns are copied out
(`copy_out`) into tensors of the conversation's own, and the buffer is freed with the turn: a conversation
holds its tokens' keys and values and nothing of its batch's padding or of other rows. The next turn gathers
the rows it reuses into its own buffer (`batch_cache`). debate.engine.kv_pool counts those tensors against the
memory budget and may drop them.
"""
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

# A layer that runs out of room (it never should: a turn knows its length) grows by at least this much.
GROW_COLUMNS = 256


class BufferLayer(DynamicLayer):
    """One layer's keys/values of a batch in a preallocated buffer, written in place.

    While the prefill runs, `keys`/`values` are views of the filled columns of the rows fed, so the model and the
    structured decoder's side pass see an ordinary cache layer. For the decode steps (`decode(column)`) each
    update writes its one token a row at the column a device tensor holds and the whole buffer is attended, masked
    (debate.engine.decode_step): the same shapes every step, no Python number read. Every layer keeps all its
    columns (no sliding-window eviction): a row's columns can then be copied out to its conversation after the
    turn. The buffer may have more rows than the prefill feeds (a compiled turn's bucket): those stay zeros.
    """

    is_compileable = True

    def __init__(self, capacity, keys=None, values=None, filled=0, rows=None):
        super().__init__()
        self.capacity, self.filled, self.rows = capacity, filled, rows
        self.buffer_keys, self.buffer_values = keys, values
        self.column = None  # decode mode: the device tensor of the column each update writes
        if keys is not None:
            self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
            self._expose(keys.shape[0])

    def _expose(self, rows):
        self.keys = self.buffer_keys[:rows, :, :self.filled]
        self.values = self.buffer_values[:rows, :, :self.filled]

    def lazy_initialization(self, key_states, value_states):
        rows, heads, _, dim = key_states.shape
        rows = max(rows, self.rows or 0)
        # Zeros: a decode step attends to every column, the unwritten ones masked, and a NaN there would still
        # poison the softmax's weighted sum.
        self.buffer_keys = key_states.new_zeros((rows, heads, self.capacity, dim))
        self.buffer_values = value_states.new_zeros((rows, value_states.shape[1], self.capacity,
                                                     value_states.shape[3]))
        self.dtype, self.device, self.is_initialized = key_states.dtype, key_states.device, True

    def _grow(self, needed):
        extra = max(needed - self.capacity, GROW_COLUMNS)
        pad = lambda t: torch.cat([t, t.new_zeros(t.shape[:2] + (extra,) + t.shape[3:])], dim=2)  # noqa: E731
        self.buffer_keys, self.buffer_values = pad(self.buffer_keys), pad(self.buffer_values)
        self.capacity += extra

    def decode(self, column):
        """From now on each update writes at `column` (a (1,) device tensor the steps advance)."""
        self.column = column

    def update(self, key_states, value_states, *args, **kwargs):
        if self.column is not None:
            self.buffer_keys.index_copy_(2, self.column, key_states)
            self.buffer_values.index_copy_(2, self.column, value_states)
            return self.buffer_keys, self.buffer_values
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.filled + key_states.shape[-2]
        if end > self.capacity:
            self._grow(end)
        rows = key_states.shape[0]
        self.buffer_keys[:rows, :, self.filled:end].copy_(key_states)
        self.buffer_values[:rows, :, self.filled:end].copy_(value_states)
        self.filled = end
        self._expose(rows)
        return self.keys, self.values

    def get_seq_length(self):
        return self.filled


class BatchCache(DynamicCache):
    """A transformers cache made of BufferLayers (created on first use when nothing is reused), of `rows` rows at
    least."""

    def __init__(self, capacity, layers=None, rows=None):
        if layers:
            Cache.__init__(self, layers=layers)
        else:
            Cache.__init__(self, layer_class_to_replicate=lambda: BufferLayer(capacity, rows=rows))


@dataclass
class Layout:
    """Where each row's tokens go in the batch: `reuse[row]` cached tokens kept, `chunk` columns fed now
    (left-padded), the cached part right-aligned to column `width`."""

    reuse: list
    width: int
    chunk: int

    def start(self, row, target_len):
        """The row's first column in the batch (its cached and new tokens run from there to width + chunk)."""
        return self.width + self.chunk - target_len


def common_prefix(a, b):
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def usable(conv, target, reuse_cache):
    """How many of `target`'s first tokens `conv`'s cache still holds (at least one token must be fed)."""
    if not reuse_cache or conv.kv is None:
        return 0
    return min(common_prefix(conv.cached_ids, target), len(target) - 1)


def layout(targets, usables):
    """The batch layout for rows whose contexts are `targets`, `usables[row]` of them cached."""
    chunk = max(len(t) - u for t, u in zip(targets, usables))
    reuse = [max(0, len(t) - chunk) for t in targets]  # <= usable: rows with short deltas re-encode a bit
    return Layout(reuse, max(reuse), chunk)


def batch_cache(convs, plan, capacity, device, rows=None):
    """A BatchCache of `capacity` columns and `rows` rows (at least one a conversation) holding each row's reused
    keys/values right-aligned to `plan.width`: one copy per reused row and layer; empty (filled by the prefill)
    when nothing is reused."""
    if plan.width == 0:
        return BatchCache(capacity, rows=rows)
    template = next(c.kv for c, r in zip(convs, plan.reuse) if r)
    rows = max(len(convs), rows or 0)
    layers = []
    for layer, (k0, v0) in enumerate(template):
        # Zeros, not empty: pad columns are read (masked out, but a NaN would still poison the softmax). Each layer
        # on its own device (a model spread over GPUs keeps each layer's keys and values beside it).
        keys = torch.zeros((rows, k0.shape[0], capacity, k0.shape[2]), dtype=k0.dtype, device=k0.device)
        values = torch.zeros((rows, v0.shape[0], capacity, v0.shape[2]), dtype=v0.dtype, device=v0.device)
        for row, (conv, r) in enumerate(zip(convs, plan.reuse)):
            if r:
                src_k, src_v = conv.kv[layer]
                keys[row, :, plan.width - r:plan.width] = src_k[:, :r]
                values[row, :, plan.width - r:plan.width] = src_v[:, :r]
        layers.append(BufferLayer(capacity, keys, values, filled=plan.width))
        layers[-1]._expose(len(convs))
    return BatchCache(capacity, layers)


def copy_out(cache, plan, targets, lengths):
    """Each row's own cache after the turn: per layer (keys, values) of its `lengths[row]` fed tokens, from its
    start column on, in tensors of its own (kv_heads, length, head_dim), so the turn's buffer can go."""
    out = []
    for row, (t, n) in enumerate(zip(targets, lengths)):
        start = plan.start(row, len(t))
        # clone in contiguous format: a view (or a copy keeping the buffer's strides) would keep the buffer alive.
        out.append([(layer.buffer_keys[row, :, start:start + n].clone(memory_format=torch.contiguous_format),
                     layer.buffer_values[row, :, start:start + n].clone(memory_format=torch.contiguous_format))
                    for layer in cache.layers])
    return out
