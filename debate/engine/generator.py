"""The model calls of one row outside the decode steps: the prefill of a turn's new tokens into its slot, and a
choice's candidates scored as a prefix tree in one pass over the slot in place. Both take a one-slot cache of the
decode place (debate.engine.kv_store) and change nothing but the columns they write.
"""
import inspect
from functools import lru_cache
from typing import Any, Dict, List, Sequence, Union

import torch

from debate.engine import decode_step, kv_store, memory, schema_program


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


@lru_cache(maxsize=None)
def _cache_name_of(model_class: Any) -> str:
    # transformers 5.x renamed the forward's `past_key_values` to `cache`; the old name still works there but
    # warns on every call and goes in 5.40. The name is read off the installed version's own signature.
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def cache_kwarg(model: torch.nn.Module, cache: Any) -> Dict[str, Any]:
    """{name: cache} for the model's forward under the installed transformers (a PEFT wrapper: its base's)."""
    base: Any = getattr(model, "get_base_model", lambda: model)()
    return {_cache_name_of(base.__class__): cache}


def _layer_masks(model: torch.nn.Module, seen: torch.Tensor, distance: torch.Tensor, dtype: torch.dtype,
                 device: torch.device) -> Union[torch.Tensor, Dict[str, torch.Tensor]]:
    """The additive attention mask(s) of a side pass: `seen[q, k]` says whether token q may attend to column k,
    `distance[q, k]` is q's position minus k's. One 4-D tensor where every layer sees alike, else {layer
    type: tensor} (sliding-window beside full-attention layers, as Gemma 3 has; transformers takes either
    as given and builds no mask of its own)."""
    def additive(allowed: torch.Tensor) -> torch.Tensor:
        return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[None, None].to(
            device)

    # A sliding-window layer sees a key less than `window` positions back (transformers' own rule).
    masks = {t: additive(seen if window is None else seen & (distance < window))
             for t, window in decode_step.layer_windows(model).items()}
    return masks.popitem()[1] if len(masks) == 1 else masks


def tree_logprobs(model: torch.nn.Module, cache: Any, candidates: Sequence[Sequence[int]], first_logits: torch.Tensor,
                  start: int = 0) -> List[float]:
    """Each candidate id list's summed log-probability after a row's context, whose keys/values fill the columns
    from `start` to the filled end of `cache` (one row's: kv_store.Store.slot_cache, whose `filled` is where the row's
    context ends; a slot's context starts at column 0).

    The first tokens are scored from `first_logits` (the row's logits now); the rest in one side pass that
    feeds the candidates' distinct prefixes as a tree (schema_program.prefix_tree): each fed token attends to the
    row's context and to its own ancestors, at the position it would have in its candidate. The pass runs
    on the row alone, over views of its slot: the tree's keys/values go to the columns past the row's end,
    which no one reads and the next decode step overwrites; no cache is copied, no other row is touched.
    """
    device = first_logits.device
    # Every total is read back at once, in float64 as Python adds them: one read a choice.
    totals = torch.log_softmax(first_logits.float(), dim=-1)[torch.tensor([c[0] for c in candidates], device=device)]
    tokens, parents, depths, node = schema_program.prefix_tree(candidates)
    if not tokens:
        return totals.tolist()
    n = len(tokens)
    layers = cache.layers
    filled = layers[0].filled
    if filled + n > layers[0].capacity:
        raise RuntimeError(f"choice scoring needs {n} free cache columns past column {filled}, the slot has "
                           f"{layers[0].capacity - filled}")  # a row's width counts them: a bug if it happens
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
                attention_mask=masks, **cache_kwarg(model, cache))
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
    return (totals.double() + sums.double()).tolist()


@torch.inference_mode()
def prefill(model: torch.nn.Module, cache: Any, ids: Sequence[int], filled: int) -> torch.Tensor:
    """Feed `ids` after the `filled` columns `cache` (one slot's, kv_store.Store.slot_cache) already holds, in pieces
    of memory.PREFILL_CHUNK tokens, each writing its keys and values after the ones before it, so the pieces see what
    one call would and no piece's transient grows with the context beyond its mask; the last token's logits (vocab,)."""
    device = model_device(model)
    out: Any = None
    for begin in range(0, len(ids), memory.PREFILL_CHUNK):
        end = min(len(ids), begin + memory.PREFILL_CHUNK)
        piece = kv_store.to_device([list(ids[begin:end])], device)
        out = model(input_ids=piece, attention_mask=torch.ones((1, filled + end), dtype=torch.long, device=device),
                    position_ids=torch.arange(filled + begin, filled + end, device=device)[None], use_cache=True,
                    logits_to_keep=1, **cache_kwarg(model, cache))
    return out.logits[0, -1, :]
