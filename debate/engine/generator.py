"""Prefill and decode for one batch of rows: the model calls of a turn, nothing else.

Reads the conversations (their contexts and caches) but changes none of them: it returns each row's ids and
its new cache (kv_store.copy_out), so a batch that fails (out of memory) can be split and run again as if it had
never started. A long prefill runs in pieces of memory.PREFILL_CHUNK new tokens a row, so no call's transient
grows with the context beyond its mask. The decode steps are debate.engine.decode_step's (static shapes, compiled
under --compile): without a schema row the picks and stop checks stay on the device; with one, the host picks each
step's tokens (`_host_driven`).
"""
import inspect
import time
from dataclasses import dataclass
from functools import lru_cache

import torch

from debate.engine import decode_step, kv_store, memory, schema_program
from debate.engine.constrained_row import SchemaRow
from debate.engine.sampling import next_tokens


@dataclass
class RowResult:
    ids: list  # every sampled id, the stop token included when the turn ended on one
    reused: int  # context tokens taken from the cache (not encoded)
    kv: list  # the row's own cache of the context plus the fed ids (kv_store.copy_out), or None without reuse
    structured: dict = None  # the schema result, or None for a free reply


# bench/bench_gpu.py --turn-lengths: a callable(context ids) -> the most tokens a free reply after that context may
# take (its drawn length), so a random model's replies end at realistic, varied lengths; None: --max-new-tokens.
reply_cap = None


def model_device(model):
    return next(model.parameters()).device


@lru_cache(maxsize=None)
def _cache_name_of(model_class):
    # transformers 5.x renamed the forward's `past_key_values` to `cache`; the old name still works there but
    # warns on every call and goes in 5.40. The name is read off the installed version's own signature.
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def cache_kwarg(model, cache):
    """{name: cache} for the model's forward under the installed transformers (a PEFT wrapper: its base's)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {_cache_name_of(type(base)): cache}


def _layer_masks(model, seen, distance, dtype, device):
    """The additive attention mask(s) of a side pass: `seen[q, k]` says whether token q may attend to column k,
    `distance[q, k]` is q's position minus k's. One 4-D tensor where every layer sees alike, else {layer
    type: tensor} (sliding-window beside full-attention layers, as Gemma 3 has; transformers takes either
    as given and builds no mask of its own)."""
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    window = getattr(config, "sliding_window", None)
    types = set(getattr(config, "layer_types", None) or ["sliding_attention" if window else "full_attention"])
    unknown = types - {"full_attention", "sliding_attention"}
    if unknown:
        raise NotImplementedError(f"choice scoring: layers of type {', '.join(sorted(unknown))} are not supported")

    def additive(allowed):
        return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[None, None].to(
            device)

    # A sliding-window layer sees a key less than `window` positions back (transformers' own rule).
    masks = {t: additive(seen if t == "full_attention" else seen & (distance < window)) for t in types}
    return masks.popitem()[1] if len(masks) == 1 else masks


def tree_logprobs(model, cache, row, start, candidates, first_logits, filled=None):
    """Each candidate id list's summed log-probability after `row`'s context, whose keys/values fill the
    columns from `start` to `filled` of `cache` (a kv_store.BatchCache; None: its filled columns).

    The first tokens are scored from `first_logits` (the row's logits now); the rest in one side pass that
    feeds the candidates' distinct prefixes as a tree (schema_program.prefix_tree): each fed token attends to the
    row's context and to its own ancestors, at the position it would have in its candidate. The pass runs
    on the row alone, over views of its cache: the tree's keys/values go to the columns past the row's end,
    which no one reads and the next decode step overwrites; no cache is copied, no other row is touched.
    """
    logp = torch.log_softmax(first_logits.float(), dim=-1)
    totals = [float(logp[c[0]]) for c in candidates]
    tokens, parents, depths, node = schema_program.prefix_tree(candidates)
    if not tokens:
        return totals
    device, n = first_logits.device, len(tokens)
    layers = cache.layers
    filled = layers[0].filled if filled is None else filled
    if filled + n > layers[0].capacity:
        raise RuntimeError(f"choice scoring needs {n} free cache columns past column {filled}, the batch has "
                           f"{layers[0].capacity - filled}")  # run() reserves them: a bug if it happens
    view = kv_store.BatchCache(0, [kv_store.BufferLayer(layer.capacity, layer.buffer_keys[row:row + 1],
                                                        layer.buffer_values[row:row + 1], filled=filled)
                                   for layer in layers])
    # Who each tree token sees: the row's context (columns start..filled-1) and its ancestors (itself included);
    # a token at depth d sits at position filled + d in the row's columns, as in its candidate.
    ancestor = torch.eye(n, dtype=torch.bool)
    for m, p in enumerate(parents):
        if p >= 0:
            ancestor[m] |= ancestor[p]
    depth = torch.tensor(depths)
    seen = torch.zeros((n, filled + n), dtype=torch.bool)
    seen[:, start:filled] = True
    seen[:, filled:] = ancestor
    column = torch.arange(filled + n)
    key_at = torch.where(column < filled, column, filled + depth[(column - filled).clamp(min=0)])
    distance = (filled + depth)[:, None] - key_at[None]
    masks = _layer_masks(model, seen, distance, layers[0].buffer_keys.dtype, device)
    positions = (filled - start + depth)[None].to(device)
    out = model(input_ids=torch.tensor([tokens], device=device), position_ids=positions, use_cache=True,
                attention_mask=masks, **cache_kwarg(model, view))
    tree_logp = torch.log_softmax(out.logits[0].float(), dim=-1)
    at, picks, owner = [], [], []
    for j, c in enumerate(candidates):
        for k in range(1, len(c)):
            at.append(node[tuple(c[:k])])
            picks.append(c[k])
            owner.append(j)
    scores = tree_logp[torch.tensor(at, device=device), torch.tensor(picks, device=device)]
    sums = torch.zeros(len(candidates), device=device, dtype=scores.dtype).index_add_(
        0, torch.tensor(owner, device=device), scores)
    return [t + s for t, s in zip(totals, sums.tolist())]


@torch.inference_mode()
def run(model, tokenizer, convs, targets, settings, stop_ids, generator, schemas, pad_id, gathered=None):
    """Generate one reply for each row (`targets[row]`: its whole context's ids); returns RowResults. `gathered()` is
    called once the rows' caches are in the turn's buffer (the engine frees their own copies then)."""
    device = model_device(model)
    rows = len(convs)
    plan = kv_store.layout(targets, [kv_store.usable(c, t, settings.reuse_cache) for c, t in zip(convs, targets)])
    width, chunk = plan.width, plan.chunk
    # Past the turn's columns, room for the largest tree a choice feeds (tree_logprobs), never a copy.
    scratch = max((c.scratch_columns for c in schemas or () if c is not None), default=0)
    compiling = decode_step.compiling(model, settings)
    bucket, capacity = decode_step.shape(rows, width + chunk + settings.max_new_tokens + scratch, compiling)

    input_ids = torch.full((rows, chunk), pad_id, dtype=torch.long)
    mask = torch.zeros((rows, width + chunk), dtype=torch.long)
    positions = torch.zeros((rows, chunk), dtype=torch.long)
    for row, (t, r) in enumerate(zip(targets, plan.reuse)):
        new = t[r:]
        input_ids[row, chunk - len(new):] = torch.tensor(new)
        mask[row, width + chunk - len(t):] = 1
        positions[row, chunk - len(new):] = torch.arange(r, len(t))
    cache = kv_store.batch_cache(convs, plan, capacity, device, bucket)
    if gathered is not None:
        gathered()
    mask, input_ids, positions = mask.to(device), input_ids.to(device), positions.to(device)
    # The new chunk in pieces: each writes its keys/values after the ones before it (BufferLayer), so the pieces
    # see what one call would; only the last needs logits.
    for begin in range(0, chunk, memory.PREFILL_CHUNK):
        end = min(chunk, begin + memory.PREFILL_CHUNK)
        out = model(input_ids=input_ids[:, begin:end], attention_mask=mask[:, :width + end],
                    position_ids=positions[:, begin:end], use_cache=True, logits_to_keep=1,
                    **cache_kwarg(model, cache))
    first_logits = out.logits[:, -1, :]
    del out, mask, input_ids, positions
    cache.layer_class_to_replicate = None  # every layer exists now; a compiled step then sees the same cache type

    first = width + chunk  # the column of the first generated token
    limits = [settings.max_new_tokens if reply_cap is None or (schemas and schemas[r] is not None)
              else max(1, min(settings.max_new_tokens, reply_cap(t))) for r, t in enumerate(targets)]
    state = decode_step.start(rows, bucket, [plan.start(r, len(t)) for r, t in enumerate(targets)], first, capacity,
                              [len(t) for t in targets], decode_step.layer_windows(model), first_logits.dtype, device,
                              settings.max_new_tokens, list(stop_ids), pad_id, limits)
    for layer in cache.layers:
        layer.decode(state.column)
    # A row under a schema has its tokens picked on the host (constrained_row.SchemaRow); else they stay on the device.
    stepper = decode_step.Stepper(model, cache_kwarg(model, cache), state, settings, generator, rows,
                                  pick_on_device=not any(c is not None for c in schemas or ()))
    driven = [None] * rows
    if schemas:
        masks = schema_program.masks(tokenizer, first_logits.shape[-1], stop_ids, device)
        for row, compiled in enumerate(schemas):
            if compiled is not None:
                start = plan.start(row, len(targets[row]))  # the row's first column in the cache, for good
                score = (lambda row, start: lambda candidates, logits: tree_logprobs(
                    model, cache, row, start, candidates, logits, first + stepper.fed))(row, start)
                driven[row] = SchemaRow(compiled, settings.max_new_tokens - 1, masks, settings, generator, score)
    began = time.perf_counter()
    with decode_step.decoding(model):
        if stepper.pick_on_device:
            generated = stepper.run(first_logits)
        else:
            generated = _host_driven(stepper, first_logits, driven, rows, settings, stop_ids, generator, limits)
    stepper.stats.seconds += time.perf_counter() - began
    stepper.close()  # its CUDA graph's memory and the step's tensors go before the copies below are made
    del state

    # The last sampled token was never run through the model, so the cache holds the context and ids[:-1].
    lengths = [len(t) + max(0, len(ids) - 1) for t, ids in zip(targets, generated)]
    kept = kv_store.copy_out(cache, plan, targets, lengths) if settings.reuse_cache else [None] * rows
    return [RowResult(ids, r, kv, d.result if d is not None else None)
            for ids, r, kv, d in zip(generated, plan.reuse, kept, driven)]


def _host_driven(stepper, logits, driven, rows, settings, stop_ids, generator, limits):
    """The decode loop of a batch with rows under a schema: the host picks every row's token each step (a schema
    row's from its program, the others by sampling), then the step runs on the device."""
    free_rows = any(d is None for d in driven)
    generated = [[] for _ in range(rows)]
    live = [True] * rows
    stops = set(stop_ids)
    for step in range(settings.max_new_tokens):
        # The one device-to-host copy of the step for free rows; the bookkeeping below is plain Python.
        picked = next_tokens(logits[:rows], settings, generator).tolist() if free_rows else [None] * rows
        for row in range(rows):
            if live[row]:
                if driven[row] is not None:
                    token = driven[row].next_token(logits[row])
                    picked[row] = stop_ids[0] if token is None else token
                generated[row].append(picked[row])
                live[row] = picked[row] not in stops and len(generated[row]) < limits[row]
        if not any(live) or step == settings.max_new_tokens - 1:
            break
        # A finished row is fed a masked pad so the batch keeps its shape; its stop token is never encoded.
        logits = stepper.step_fed([t if on else None for t, on in zip(picked, live)])
    stepper.count(generated)
    return generated
