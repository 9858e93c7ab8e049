"""Prefill and decode for one batch of rows: the model calls of a turn, nothing else.

Reads the conversations (their contexts and cache slots) but changes none of them: it returns each
row's ids and new cache slot, so a batch that fails (out of memory) can be split and run again as if it
had never started. Sampling happens on the model's device; the one device-to-host copy of a step brings
the picked ids back for the stop checks and the schema rows.
"""
import inspect
from dataclasses import dataclass
from functools import lru_cache

import torch
from transformers import DynamicCache

from debate.engine import kv_store, schema as schemas_mod
from debate.engine.sampling import next_tokens
from debate.engine.structured import SchemaRow


@dataclass
class RowResult:
    ids: list  # every sampled id, the stop token included when the turn ended on one
    reused: int  # context tokens taken from the cache (not encoded)
    slot: object  # kv_store.Slot of the context plus the fed ids, or None without reuse
    structured: dict = None  # the schema result, or None for a free reply


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


# Candidates scored per side pass: each needs its own copy of the row's cache, so a long choice (a 0-1
# score in steps of 0.01 has 101 values) is scored in chunks to keep that copy small.
CHOICE_CHUNK = 16


def choice_logprobs(model, cache, row, start, candidates, first_logits, pad_id):
    """Each candidate id list's summed log-probability after `row`'s context, whose keys/values fill
    `cache` from column `start` on. The first tokens are scored from `first_logits` (the row's logits
    now); the rest in side passes over copies of the row's cache (CHOICE_CHUNK candidates each), which
    leave the batch untouched."""
    logp = torch.log_softmax(first_logits.float(), dim=-1)
    totals = [float(logp[c[0]]) for c in candidates]
    longer = [j for j, c in enumerate(candidates) if len(c) > 1]  # a one-token candidate: its first token
    device = first_logits.device
    for at in range(0, len(longer), CHOICE_CHUNK):
        chunk = [candidates[j] for j in longer[at:at + CHOICE_CHUNK]]
        k, width = len(chunk), max(len(c) for c in chunk) - 1
        layers = [(layer.keys[row:row + 1, :, start:].expand(k, -1, -1, -1).contiguous(),
                   layer.values[row:row + 1, :, start:].expand(k, -1, -1, -1).contiguous())
                  for layer in cache.layers]
        past = layers[0][0].shape[2]
        ids = torch.full((k, width), pad_id, dtype=torch.long)
        mask = torch.ones((k, past + width), dtype=torch.long)
        for j, c in enumerate(chunk):
            ids[j, :len(c) - 1] = torch.tensor(c[:-1], dtype=torch.long)
            mask[j, past + len(c) - 1:] = 0  # right padding: only positions after a candidate's end see it
        positions = torch.arange(past, past + width)[None].expand(k, -1)
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                    use_cache=True, **cache_kwarg(model, DynamicCache(ddp_cache_data=layers)))
        chunk_logp = torch.log_softmax(out.logits.float(), dim=-1)
        for j, c in enumerate(chunk):
            picks = chunk_logp[j, torch.arange(len(c) - 1, device=device),
                               torch.tensor(c[1:], dtype=torch.long, device=device)]
            totals[longer[at + j]] += float(picks.sum())
    return totals


@torch.inference_mode()
def run(model, tokenizer, convs, targets, settings, stop_ids, generator, schemas, pad_id):
    """Generate one reply for each row (`targets[row]`: its whole context's ids); returns RowResults."""
    device = model_device(model)
    rows = len(convs)
    plan = kv_store.layout(targets, [kv_store.usable(c, t, settings.reuse_cache) for c, t in zip(convs, targets)])
    width, chunk = plan.width, plan.chunk
    capacity = width + chunk + settings.max_new_tokens

    input_ids = torch.full((rows, chunk), pad_id, dtype=torch.long)
    mask = torch.zeros((rows, capacity), dtype=torch.long)  # the whole turn's mask, filled column by column
    positions = torch.zeros((rows, chunk), dtype=torch.long)
    for row, (t, r) in enumerate(zip(targets, plan.reuse)):
        new = t[r:]
        input_ids[row, chunk - len(new):] = torch.tensor(new)
        mask[row, width + chunk - len(t):width + chunk] = 1
        positions[row, chunk - len(new):] = torch.arange(r, len(t))
    cache = kv_store.batch_cache(convs, plan, capacity, device)
    mask = mask.to(device)
    out = model(input_ids=input_ids.to(device), attention_mask=mask[:, :width + chunk],
                position_ids=positions.to(device), use_cache=True, logits_to_keep=1, **cache_kwarg(model, cache))

    driven = [None] * rows
    if schemas:
        masks = schemas_mod.masks(tokenizer, out.logits.shape[-1], stop_ids, device)
        for row, compiled in enumerate(schemas):
            if compiled is not None:
                start = plan.start(row, len(targets[row]))  # the row's first column in the cache, for good
                score = (lambda row, start: lambda candidates, logits: choice_logprobs(
                    model, cache, row, start, candidates, logits, pad_id))(row, start)
                driven[row] = SchemaRow(compiled, settings.max_new_tokens - 1, masks, settings, generator, score)
    free_rows = any(d is None for d in driven)
    generated = [[] for _ in range(rows)]
    live = [True] * rows
    stops = set(stop_ids)
    next_position = torch.tensor([[len(t)] for t in targets], device=device)
    for step in range(settings.max_new_tokens):
        logits = out.logits[:, -1, :]
        # The one device-to-host copy of the step for free rows; the bookkeeping below is plain Python.
        picked = next_tokens(logits, settings, generator).tolist() if free_rows else [None] * rows
        for row in range(rows):
            if live[row]:
                if driven[row] is not None:
                    token = driven[row].next_token(logits[row])
                    picked[row] = stop_ids[0] if token is None else token
                generated[row].append(picked[row])
                live[row] = picked[row] not in stops
        if not any(live) or step == settings.max_new_tokens - 1:
            break
        # A finished row is fed a masked pad so the batch keeps its shape; its stop token is never encoded.
        column = width + chunk + step
        feed = torch.tensor([[t if on else pad_id] for t, on in zip(picked, live)], device=device)
        mask[:, column] = torch.tensor(live, device=device, dtype=mask.dtype)
        out = model(input_ids=feed, attention_mask=mask[:, :column + 1], position_ids=next_position + step,
                    use_cache=True, **cache_kwarg(model, cache))

    # The last sampled token was never run through the model, so the cache holds the context and ids[:-1].
    lengths = [len(t) + max(0, len(ids) - 1) for t, ids in zip(targets, generated)]
    slots = kv_store.slots(cache, plan, targets, lengths) if settings.reuse_cache else [None] * rows
    return [RowResult(ids, r, slot, d.result if d is not None else None)
            for ids, r, slot, d in zip(generated, plan.reuse, slots, driven)]
