"""Batched generation over many agent conversations, each keeping its KV cache between its turns.

`generate(...)` is the one entry the protocols call. It joins three parts with one job each:
- debate.engine.chat: what the model sees (the chat template around the generated ids, tokenised once a piece);
- debate.engine.kv_store: each conversation's cache (what is still valid, the batch layout, the buffers, release);
- debate.engine.generator: the prefill and decode of one batch, sampling on the device.
and owns the memory budget: work that would not fit is split into smaller batches before it runs, and a
batch that runs out of memory anyway is split and run again; nothing is lost, and a log line says so. On
CUDA the budget is a share of the GPU memory free, on a CPU of the RAM available (debate.engine.ram): there
no error can be caught, the kernel kills the process, so the split before the batch is all there is.

Cached and uncached runs feed the model the same token sequence, so under greedy decoding they produce
the same tokens; debate.engine.reference is the plain path the tests hold the engine to.
"""
import logging
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, cast

import torch

from debate.engine import generator as gen, kv_store, memory, ram, schema_program
from debate.engine.chat import context_ids, stop_token_ids

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

DEFAULT_GPU_MEMORY_FRACTION = 0.9
# On a CPU only this share of the fraction is spent: past the RAM there is no out-of-memory error to split on,
# and what glibc's heap keeps after a step is not in the plan (tests/test_memory_plan.py measures with it off).
CPU_MARGIN = 0.5


@dataclass
class Settings:
    max_new_tokens: int = 512
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0
    reuse_cache: bool = True
    structured: bool = True  # decode JSON answers under their prompt's schema (debate.engine.schema_program)
    # Share of the memory free before a batch that its cache and activations may take: of the GPU's on CUDA,
    # of the RAM available on a CPU (the flag keeps its first name, --gpu-memory-fraction). 0: no budget.
    gpu_memory_fraction: float = DEFAULT_GPU_MEMORY_FRACTION
    memory_budget: Optional[int] = None  # bytes; overrides the fraction (None: the fraction's)


@dataclass
class Conversation:
    """One agent's side of a debate: its messages and the cache of what it has already encoded."""

    system: str
    messages: List[Dict[str, str]] = field(default_factory=list)  # [{"role": "user"|"assistant", "content": str}]
    # token ids of each assistant message, verbatim (None: recalled)
    generated: List[Optional[List[int]]] = field(default_factory=list)
    cached_ids: List[int] = field(default_factory=list)  # the tokens whose keys/values the slot holds
    slot: Optional[kv_store.Slot] = None  # where those keys/values live (debate.engine.kv_store)
    prompt_tokens: int = 0  # context length summed over turns (what an API would bill)
    encoded_tokens: int = 0  # prompt tokens actually run through the model
    completion_tokens: int = 0
    # the last reply's schema result (fields, choice probabilities), or None
    structured: Optional[Dict[str, Any]] = None
    pieces: List[Any] = field(default_factory=list, repr=False)  # template pieces tokenised so far (debate.engine.chat)

    @property
    def cache(self) -> Optional[List[Tuple[torch.Tensor, torch.Tensor]]]:
        """Per layer (keys, values) of shape (1, kv_heads, len(cached_ids), head_dim), or None."""
        return self.slot.views() if self.slot is not None else None

    def drop_cache(self) -> None:
        self.slot, self.cached_ids = None, []

    def recall(self, prompt: str, reply: str) -> None:
        """Add an exchange this conversation did not generate, with `reply` as the agent's own earlier turn
        (an explanation written elsewhere, a fixed answer); its ids are the reply's text tokenised, on first need."""
        self.messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]
        self.generated.append(None)


def _dtype_bytes(model: torch.nn.Module) -> int:
    return next(model.parameters()).element_size() if next(model.parameters()).is_floating_point() else 2


def batch_bytes(model: torch.nn.Module, targets: Sequence[Sequence[int]], usables: Sequence[int], settings: Settings,
                schemas: Optional[Sequence[Any]] = None) -> int:
    """Estimated memory of one batch of these rows (debate.engine.memory.batch_bytes): the turn's KV buffer, the
    prefill's activations, the decode step's, and with `schemas` (one Compiled or None per row) structured
    decoding's extras and one choice's scoring pass at the largest trie among them."""
    plan = kv_store.layout(targets, usables)
    structured = [c for c in schemas or () if c is not None]
    # The largest prefix tree a choice feeds in one pass (schema_program.Compiled.scratch_columns); the generator keeps
    # that many cache columns free past the turn's end for it, so they count as new tokens in the KV buffer too.
    trie = max((c.scratch_columns for c in structured), default=0)
    fused = memory.attention_is_fused(getattr(model.config, "_attn_implementation", None))
    return memory.batch_bytes(memory.shape(model.config), _dtype_bytes(model), len(targets), plan.width, plan.chunk,
                              settings.max_new_tokens + trie, len(structured), trie, fused)


def memory_budget(model: torch.nn.Module, settings: Settings) -> Optional[int]:
    """Bytes a batch may take: Settings.memory_budget, else the fraction of the memory free now: on CUDA the
    GPU's (what the allocator holds unused counts as free), on a CPU the RAM the process can still take
    (debate.engine.ram); None means no budget."""
    if settings.memory_budget is not None:
        return settings.memory_budget
    device = gen.model_device(model)
    if not settings.gpu_memory_fraction or device.type not in ("cuda", "cpu"):
        return None
    if device.type == "cpu":
        free = ram.available()
        return None if free is None else int(free * settings.gpu_memory_fraction * CPU_MARGIN)
    free, _ = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(free * settings.gpu_memory_fraction)


# A row may re-encode this many cached tokens (or as many as it feeds anew) to share a batch: cheaper than
# the second decode pass a separate batch would cost.
SHARED_CHUNK = 256


def chunk_groups(targets: Sequence[Sequence[int]], usables: Sequence[int]) -> List[List[int]]:
    """Rows (indices) in groups of similar new-chunk length, each group one batch.

    A batch feeds every row as many tokens as its longest new chunk (kv_store.layout: a row with a short
    chunk re-encodes cached tokens rather than leave a gap), so a conversation going on by a hundred tokens
    beside one starting with thousands would re-encode thousands. Continuous batching mixes exactly such
    rows. Sorted by chunk, longest first, a row joins the group before it when it would re-encode no more
    than max(its own chunk, SHARED_CHUNK) tokens there, and starts a new group otherwise."""
    chunks = [len(t) - u for t, u in zip(targets, usables)]
    groups: List[List[int]] = []
    for row in sorted(range(len(targets)), key=lambda r: -chunks[r]):
        if groups and chunks[groups[-1][0]] - chunks[row] <= max(chunks[row], SHARED_CHUNK):
            groups[-1].append(row)
        else:
            groups.append([row])
    return [sorted(g) for g in groups]


def plan_batches(model: torch.nn.Module, targets: Sequence[Sequence[int]], usables: Sequence[int], settings: Settings,
                 schemas: Optional[Sequence[Any]] = None) -> List[List[int]]:
    """The batches the rows run in: groups of similar new-chunk length (chunk_groups), each split in halves
    until its estimate (batch_bytes, with the rows' `schemas`) fits the memory budget."""
    budget = memory_budget(model, settings)

    def split(rows):
        if budget is None or len(rows) == 1 or batch_bytes(
                model, [targets[i] for i in rows], [usables[i] for i in rows], settings,
                [schemas[i] for i in rows] if schemas else None) <= budget:
            return [rows]
        half = len(rows) // 2
        return split(rows[:half]) + split(rows[half:])

    groups = chunk_groups(targets, usables)
    parts = [part for group in groups for part in split(group)]
    if len(parts) > len(groups):
        # Said once per loaded model where the user sees it (a warning reaches stderr with no logging set up);
        # every later split, which a long run may make on every turn, only at DEBUG (INFO is what a run prints).
        level = logging.DEBUG if model in _split_said else logging.WARNING
        _split_said.add(model)
        assert budget is not None  # only a budget splits a group
        where = "of RAM" if gen.model_device(model).type == "cpu" else "of GPU memory"
        log.log(level, "memory budget %.2f GB %s: %d conversations run as %d batches (of %s)%s", budget / 2**30,
                where, len(targets), len(parts), ", ".join(str(len(p)) for p in parts),
                "" if level == logging.DEBUG else "; later splits are logged at DEBUG level")
    return parts


# The models whose batches have been split and said so as a warning: keyed weakly, so the set holds no model
# alive and a model loaded later (another run in the same process) is warned about again.
_split_said: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()


def _run_splitting(run: Callable[[List[int]], Sequence[Any]], rows: List[int], results: List[Any]) -> None:
    """Run `rows`; on out-of-memory split them in two and run each half (recursively), so no row is lost."""
    try:
        for row, result in zip(rows, run(rows)):
            results[row] = result
    except torch.OutOfMemoryError:
        if len(rows) == 1:
            raise
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        half = len(rows) // 2
        log.warning("out of memory in a batch of %d conversations; retrying it as batches of %d and %d",
                    len(rows), half, len(rows) - half)
        _run_splitting(run, rows[:half], results)
        _run_splitting(run, rows[half:], results)


def generate(model: torch.nn.Module, tokenizer: "PreTrainedTokenizerBase", convs: Sequence[Conversation],
             user_texts: Sequence[str], settings: Settings, stop_ids: Optional[Sequence[int]] = None,
             generator: Optional[torch.Generator] = None, schemas: Optional[Sequence[Any]] = None) -> List[str]:
    """Add one user message to each conversation and generate every reply in one batch (or several, when
    the memory budget asks for it; rows never affect each other's tokens).

    Returns the reply texts; each conversation gets its assistant message, token counts and cache.
    `schemas` (one debate.engine.schema_program.Compiled or None per row) decodes those rows under their schema; the
    row's conversation then holds the schema's result in `structured` (None for a free reply).
    """
    if not convs:
        return []
    schemas = list(schemas) if schemas and any(schemas) else None
    for compiled in schemas or ():
        if compiled is not None:
            schema_program.check_budget(compiled, settings.max_new_tokens)
    stop_ids = stop_ids if stop_ids is not None else stop_token_ids(model, tokenizer)
    if generator is None and settings.temperature > 0:
        generator = torch.Generator(device=gen.model_device(model)).manual_seed(settings.seed)
    # Any id will do for padding: padded positions are masked out.
    pad_id = next((i for i in (tokenizer.pad_token_id, *stop_ids) if i is not None), 0)

    for conv, text in zip(convs, user_texts):
        conv.messages.append({"role": "user", "content": text})
    targets = [context_ids(tokenizer, c) for c in convs]
    usables = [kv_store.usable(c, t, settings.reuse_cache) for c, t in zip(convs, targets)]

    def run(rows):
        return gen.run(model, tokenizer, [convs[i] for i in rows], [targets[i] for i in rows], settings,
                       stop_ids, generator, [schemas[i] for i in rows] if schemas else None, pad_id)

    results: List[Any] = [None] * len(convs)
    try:
        for rows in plan_batches(model, targets, usables, settings, schemas):
            _run_splitting(run, rows, results)
    except BaseException:
        for conv in convs:  # leave the conversations as they were: the turn can be asked for again
            conv.messages.pop()
        raise

    replies = []
    for conv, t, result in zip(convs, targets, results):
        ids = result.ids
        content = ids[:-1] if ids and ids[-1] in stop_ids else ids
        conv.slot = result.slot
        conv.cached_ids = t + ids[:-1] if result.slot is not None else []
        conv.generated.append(content)
        conv.structured = result.structured
        reply = cast(str, tokenizer.decode(content, skip_special_tokens=True))  # one sequence: one text
        conv.messages.append({"role": "assistant", "content": reply})
        conv.prompt_tokens += len(t)
        conv.encoded_tokens += len(t) - result.reused
        conv.completion_tokens += len(ids)
        replies.append(reply)
    return replies
