"""One step's forward of a model's persistent batch: every token the step carries, in one sequence.

A step carries one token of each decoding row and up to --prefill-tokens prompt tokens of the rows joining
(debate.engine.decode_batch). They go into the model as one packed sequence (`Inputs`): each token with its slot and
its position, written in place at its own (slot, column) of the place (kv_store.StepLayer), and attending to its own
slot as debate.engine.attention says (one call over every token). The logits come back for the tokens the step picks
from (`keep`: the decode rows', and each prompt's last token's once it is whole).

The same function serves every step, eager or compiled (debate.engine.compiled_step): compiled, a step's sizes are
rounded up to buckets (`bucket_rows`, `bucket_tokens`, `bucket_width`; its columns are the slots' whole width), so a
handful of shapes serve a run, and its inputs live in one set of buffers a bucket (a CUDA graph replays them); a
bucket's padding tokens repeat its last real token (the same keys and values written at the same place, a logit never
read).
"""
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from debate.engine import attention, memory

COLUMN_BUCKET = memory.COLUMN_BUCKET  # a compiled step's columns are rounded up to a multiple of this


def bucket_rows(rows: int, most: int) -> int:
    """A compiled step's slots: powers of two to 8, then multiples of 8 (vLLM's capture sizes), at most `most` (the
    place's slots), at least two (PyTorch compiles a size of 1 as a graph of its own)."""
    n = 2
    while n < rows and n < 8:
        n *= 2
    if rows > n:
        n = -(-rows // 8) * 8
    return max(min(n, most), rows)


def bucket_tokens(tokens: int) -> int:
    """A compiled step's tokens: as the rows below 64 (a decode step's), then multiples of 64."""
    return bucket_rows(tokens, tokens + 8) if tokens <= 64 else -(-tokens // 64) * 64


def bucket_width(width: int) -> int:
    """A compiled step's grid width (the most tokens a slot has): 1 for a decode step, else a power of two from 16."""
    if width <= 1:
        return 1
    n = 16
    while n < width:
        n *= 2
    return n


@dataclass
class Inputs:
    """A step's inputs on the model's device. `tokens`, `positions`: the packed sequence; `keep`: the places in it
    whose logits the step returns; `packed`: what the attention reads (debate.engine.attention.Packed); `columns`: an
    arange as long as the step's columns; `cache`: the model's cache keyword over the place's first slots and
    columns; `mixed`: whether any token is a prompt's."""

    tokens: torch.Tensor
    positions: torch.Tensor
    keep: torch.Tensor
    packed: attention.Packed
    columns: torch.Tensor
    cache: Dict[str, Any]
    mixed: bool

    @property
    def bucket(self) -> Tuple[int, int, int, int, int]:
        """(tokens, slots, width, columns, logits kept): the shapes a compiled step and its CUDA graph are of."""
        return (self.tokens.shape[0], self.packed.start.shape[0], self.packed.width.shape[0], self.columns.shape[0],
                self.keep.shape[0])


def forward(model: torch.nn.Module, cache: Dict[str, Any], tokens: torch.Tensor, positions: torch.Tensor,
            keep: torch.Tensor, packed: attention.Packed, columns: torch.Tensor, windows: Dict[str, Optional[int]],
            groups: int, dtype: torch.dtype, kernel: str) -> torch.Tensor:
    """A step's logits at `keep` (kept x vocabulary): the function a step compiles and a CUDA graph captures.
    `kernel`: "flex" (every token's blocks of columns alone, compiled only: flex run eagerly is a slow reference),
    "masked" (the grid under an additive mask over every column: the compiled fallback, for one-token-wide grids),
    "eager" (slot by slot, as the host lists them in `packed.host`)."""
    built: Any
    if kernel == "flex":
        built = attention.block_masks(packed, columns.shape[0], windows, groups)
    elif kernel == "masked":
        built = attention.grid_masks(packed, columns, windows, groups, dtype)
    else:  # a placeholder, never read: transformers makes no mask of its own when given a 4-D one
        built = {kind: torch.zeros((1, 1, 1, 1), dtype=dtype, device=tokens.device) for kind in windows}
    out = model(input_ids=tokens[None], position_ids=positions[None], use_cache=True, logits_to_keep=keep,
                attention_mask=built if len(built) > 1 else next(iter(built.values())), packed=packed, **cache)
    return out.logits[0]


def _configs(model: torch.nn.Module) -> List[Any]:
    config: Any = model.config
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return [config] if text is config else [config, text]


def use_step_attention(model: torch.nn.Module) -> None:
    """The model's sdpa attention as debate.engine.attention's from now on (set once: it is sdpa's for every forward
    that carries no step metadata, so nothing else the model runs changes). Other implementations stay."""
    for config in _configs(model):
        if config._attn_implementation == "sdpa":
            config._attn_implementation = attention.STEP_ATTENTION


def groups_of(model: torch.nn.Module) -> int:
    """Query heads a key head serves (grouped-query attention), from the model's config: a number, not a size the
    compiled step would see change."""
    config = _configs(model)[-1]
    heads = config.num_attention_heads
    return heads // (getattr(config, "num_key_value_heads", None) or heads)


def layer_windows(model: torch.nn.Module) -> Dict[str, Optional[int]]:
    """{attention type: its sliding window or None} of the model's layers (one entry where all are alike)."""
    config = _configs(model)[-1]
    window = getattr(config, "sliding_window", None)
    types = set(getattr(config, "layer_types", None) or ["sliding_attention" if window else "full_attention"])
    unknown = types - {"full_attention", "sliding_attention"}
    if unknown:
        raise NotImplementedError(f"decoding: layers of type {', '.join(sorted(unknown))} are not supported")
    return {t: (window if t == "sliding_attention" else None) for t in sorted(types)}
