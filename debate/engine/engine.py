"""Batched generation over many agent conversations, each keeping its KV cache between its turns.

`generate(...)` is the one entry the protocols call. It joins four parts with one job each:
- debate.engine.chat: what the model sees (the chat template around the generated ids, tokenised once a piece);
- debate.engine.kv_store: a turn's buffer, and each conversation's cache moved in and out of it;
- debate.engine.kv_pool: every conversation's cache counted against the run's memory budget;
- debate.engine.generator: the prefill and decode of one batch, sampling on the device.
and owns admission: before a model call it makes room within the budget (batch_bytes, the plan of
debate.engine.memory, plus the caches held): it drops caches of conversations outside the call (kv_pool), and
runs fewer rows at once. A batch that runs out of memory anyway (a fragmentation the plan cannot see) frees the
other caches and runs again smaller, once its own tensors are released; nothing is lost, and a log line says so.
A row that cannot run at all (its context would pass the model's window, or it alone needs more than the budget)
is left out and named in a ContextOverflow once the others have run: its claim ends, the run goes on.

Cached and uncached runs feed the model the same token sequence, so under greedy decoding they produce
the same tokens; debate.engine.reference is the plain path the tests hold the engine to.
"""
import logging
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, cast

import torch

from debate.engine import decode_step, generator as gen, kv_pool, kv_store, memory, schema_program
from debate.engine.chat import context_ids, encode_text, render, stop_token_ids
from debate.engine.errors import ContextOverflow

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

@dataclass
class Settings:
    max_new_tokens: int = 512
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0
    reuse_cache: bool = True
    structured: bool = True  # decode JSON answers under their prompt's schema (debate.engine.schema_program)
    # The longest context a conversation may reach, its turn's new tokens included (None: the model's window,
    # max_position_embeddings); a turn that would pass it ends its claim (ContextOverflow).
    max_context: Optional[int] = None
    # Decode steps through torch.compile (debate.engine.decode_step), replayed as CUDA graphs on CUDA.
    compile: bool = False


@dataclass
class Conversation:
    """One agent's side of a debate: its messages and the cache of what it has already encoded."""

    system: str
    messages: List[Dict[str, str]] = field(default_factory=list)  # [{"role": "user"|"assistant", "content": str}]
    # token ids of each assistant message, verbatim (None: recalled)
    generated: List[Optional[List[int]]] = field(default_factory=list)
    cached_ids: List[int] = field(default_factory=list)  # the tokens whose keys/values `kv` holds
    # per layer (keys, values) of those tokens, (kv_heads, len(cached_ids), head_dim) each, the conversation's own
    # tensors, counted by `pool` (debate.engine.kv_pool), which may drop them
    kv: Optional[kv_pool.KV] = field(default=None, repr=False)
    pool: Optional[kv_pool.Pool] = field(default=None, repr=False, compare=False)
    evicted_tokens: int = field(default=0, repr=False, compare=False)  # dropped by the pool, not yet re-encoded
    birth: Optional[int] = field(default=None, repr=False, compare=False)  # when it first stored a cache (kv_pool)
    prompt_tokens: int = 0  # context length summed over turns (what an API would bill)
    encoded_tokens: int = 0  # prompt tokens actually run through the model
    completion_tokens: int = 0
    # the last reply's schema result (fields, choice probabilities), or None
    structured: Optional[Dict[str, Any]] = None
    pieces: List[Any] = field(default_factory=list, repr=False)  # template pieces tokenised so far (debate.engine.chat)

    @property
    def cache(self) -> Optional[List[Tuple[torch.Tensor, torch.Tensor]]]:
        """Per layer (keys, values) of shape (1, kv_heads, len(cached_ids), head_dim), or None."""
        return [(k[None], v[None]) for k, v in self.kv] if self.kv is not None else None

    def drop_cache(self) -> None:
        if self.pool is not None:
            self.pool.release(self)
        self.kv, self.cached_ids = None, []

    def recall(self, prompt: str, reply: str) -> None:
        """Add an exchange this conversation did not generate, with `reply` as the agent's own earlier turn
        (an explanation written elsewhere, a fixed answer); its ids are the reply's text tokenised, on first need."""
        self.messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]
        self.generated.append(None)


def _dtype_bytes(model: torch.nn.Module) -> int:
    return next(model.parameters()).element_size() if next(model.parameters()).is_floating_point() else 2


def turn_cache_bytes(model: torch.nn.Module, tokenizer: "PreTrainedTokenizerBase", convs: Sequence[Conversation],
                     prompts: Sequence[str], settings: Settings) -> int:
    """About the bytes these conversations' caches will hold after a turn with `prompts`, before it runs: each
    row's chat so far and its new prompt rendered by the template and tokenised as one text (the context the turn
    feeds, but for how generated replies split into tokens), plus the new tokens, at the model's cache bytes a
    token. The scheduler's estimate of a claim before any claim has run."""
    tokens = sum(len(encode_text(tokenizer, render(tokenizer, c.system, c.messages + [{"role": "user", "content": p}],
                                                   add_generation_prompt=True))) + settings.max_new_tokens
                 for c, p in zip(convs, prompts))
    return tokens * memory.kv_bytes_per_token(memory.shape(model.config), _dtype_bytes(model))


def batch_bytes(model: torch.nn.Module, targets: Sequence[Sequence[int]], usables: Sequence[int], settings: Settings,
                schemas: Optional[Sequence[Any]] = None) -> int:
    """Estimated memory of one model call over these rows (debate.engine.memory.batch_bytes): the turn's KV buffer,
    a prefill piece's activations, the decode step's, with `schemas` (one Compiled or None per row) structured
    decoding's extras and one choice's scoring pass at the largest trie among them, and the rows' caches copied
    out at the end (with cache reuse), less the rows' own caches, which are freed once gathered into the buffer."""
    plan = kv_store.layout(targets, usables)
    structured = [c for c in schemas or () if c is not None]
    # The largest prefix tree a choice feeds in one pass (schema_program.Compiled.scratch_columns); the generator keeps
    # that many cache columns free past the turn's end for it, so they count as new tokens in the KV buffer too.
    trie = max((c.scratch_columns for c in structured), default=0)
    fused = memory.attention_is_fused(getattr(model.config, "_attn_implementation", None))
    kept = sum(len(t) + settings.max_new_tokens - u for t, u in zip(targets, usables)) if settings.reuse_cache else 0
    columns = plan.width + plan.chunk + settings.max_new_tokens + trie
    buffer = decode_step.shape(len(targets), columns, decode_step.compiling(model, settings))
    return memory.batch_bytes(memory.shape(model.config), _dtype_bytes(model), len(targets), plan.width, plan.chunk,
                              settings.max_new_tokens + trie, len(structured), trie, fused, kept, buffer)


def window(model: torch.nn.Module, settings: Settings) -> Optional[int]:
    """The longest context a conversation may reach: the user's cap, else the model's max_position_embeddings."""
    config: Any = model.config
    if hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    limits = [n for n in (getattr(config, "max_position_embeddings", None), settings.max_context)
              if isinstance(n, int) and n > 0]
    return min(limits) if limits else None


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


# The models whose batches have been split and said so as a warning: keyed weakly, so the set holds no model
# alive and a model loaded later (another run in the same process) is warned about again.
_split_said: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()


def _say_split(model: torch.nn.Module, pool: kv_pool.Pool, rows: int, parts: List[int]) -> None:
    """Said once per loaded model where the user sees it (a warning reaches stderr with no logging set up); every
    later split, which a long run may make on every turn, only at DEBUG (INFO is what a run prints)."""
    level = logging.DEBUG if model in _split_said else logging.WARNING
    _split_said.add(model)
    log.log(level, "memory budget %s: %d conversations run as %d batches (of %s)%s", kv_pool.describe(pool), rows,
            len(parts), ", ".join(str(p) for p in parts),
            "" if level == logging.DEBUG else "; later splits are logged at DEBUG level")


class _Turn:
    """One generate call's rows and what admission needs of them; `run_rows` runs a batch and stores its caches."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, convs: Sequence[Conversation], targets: List[List[int]],
                 settings: Settings, stop_ids: Sequence[int], generator: Optional[torch.Generator],
                 schemas: Optional[List[Any]], pad_id: int) -> None:
        self.model, self.tokenizer, self.convs, self.targets = model, tokenizer, convs, targets
        self.settings, self.stop_ids, self.generator, self.schemas, self.pad_id = (settings, stop_ids, generator,
                                                                                   schemas, pad_id)
        self.pool = kv_pool.pool_for(gen.model_device(model))
        self.results: List[Any] = [None] * len(convs)
        self.failed: Dict[int, str] = {}
        self.batches: List[int] = []

    def usables(self, rows: Sequence[int]) -> List[int]:
        # Read at the call: admission may have dropped a cache since the turn began.
        return [kv_store.usable(self.convs[r], self.targets[r], self.settings.reuse_cache) for r in rows]

    def need(self, rows: Sequence[int]) -> int:
        return batch_bytes(self.model, [self.targets[r] for r in rows], self.usables(rows), self.settings,
                           [self.schemas[r] for r in rows] if self.schemas else None)

    def admit(self, rows: List[int]) -> None:
        """Run `rows` within the budget: as one batch when the caches of conversations outside this generate call
        can make room for it, else as halves; a single row may drop every other cache, then its own."""
        call = [self.convs[r] for r in range(len(self.convs))]
        if self.pool.make_room(self.need(rows), keep=call):
            return self.run_rows(rows)
        if len(rows) > 1:
            half = len(rows) // 2
            self.admit(rows[:half])
            self.admit(rows[half:])
            return
        row, conv = rows[0], self.convs[rows[0]]
        if self.pool.make_room(self.need(rows), keep=[conv]):
            return self.run_rows(rows)
        if conv.kv is not None:
            self.pool.evict(conv)  # its prefill then re-encodes it, in pieces; the cache it held no longer counts
            if self.pool.make_room(self.need(rows), keep=[conv]):
                return self.run_rows(rows)
        self.failed[row] = (f"one conversation of {len(self.targets[row])} context tokens needs "
                            f"{kv_pool.size(self.need(rows))}, more than the memory budget of "
                            f"{kv_pool.describe(self.pool)} ({self.pool.source})")

    def run_rows(self, rows: List[int], last_try: bool = False) -> None:
        """One batch; on out of memory, once its tensors are released: every other cache dropped, then halves, then
        the single row once more, without its own cache; a row that still runs out is left out (failed)."""
        self.pool.note_call(self.need(rows))
        convs = [self.convs[r] for r in rows]
        for row, conv in zip(rows, convs):
            if conv.kv is None:  # a cache dropped to make room is encoded again now (kv_pool counts it)
                self.pool.note_reencoded(conv, len(self.targets[row]) - 1)
        released: Dict[int, Tuple[Conversation, int]] = {}

        def gathered() -> None:
            # The rows' caches are in the turn's buffer now: their own copies go, so the copies made at the turn's
            # end never sit beside them (batch_bytes counts on it).
            for conv in convs:
                if conv.kv is not None:
                    released[id(conv)] = conv, len(conv.cached_ids)
                    self.pool.release(conv)

        out_of_memory = False
        try:
            results = gen.run(self.model, self.tokenizer, convs, [self.targets[r] for r in rows], self.settings,
                              self.stop_ids, self.generator, [self.schemas[r] for r in rows] if self.schemas else None,
                              self.pad_id, gathered)
        except torch.OutOfMemoryError:
            # Retried below, outside this block: here the traceback still holds the failed attempt's buffers.
            out_of_memory = True
        if not out_of_memory:
            self.batches.append(len(rows))
            for row, conv, result in zip(rows, convs, results):
                self.results[row] = result
                # The new cache replaces the old at once, so the pool counts what is really held; the result lets go
                # of it, or a cache the pool drops for a later batch of this call would stay in memory uncounted.
                self.pool.store(conv, result.kv, self.targets[row] + result.ids[:-1])
                result.kv = None
            return
        for conv, tokens in released.values():  # released at the gather: encoded again in the retry
            conv.evicted_tokens += tokens
            self.pool.dropped += 1
        self.pool.make_room(1 << 62, keep=convs)  # every cache outside this batch goes
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if len(rows) > 1:
            half = len(rows) // 2
            log.warning("out of memory in a batch of %d conversations; retrying it as batches of %d and %d",
                        len(rows), half, len(rows) - half)
            self.run_rows(rows[:half])
            self.run_rows(rows[half:])
        elif not last_try:
            log.warning("out of memory in a batch of 1 conversation; retrying it with every cache dropped")
            if convs[0].kv is not None:
                self.pool.evict(convs[0])
            self.run_rows(rows, last_try=True)
        else:
            self.failed[rows[0]] = (f"one conversation of {len(self.targets[rows[0]])} context tokens ran out of "
                                    "memory with every other cache dropped")


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
    turn = _Turn(model, tokenizer, convs, targets, settings, stop_ids, generator, schemas, pad_id)
    limit = window(model, settings)
    what = "the --max-context cap" if limit == settings.max_context else "the model's window (max_position_embeddings)"
    for row, t in enumerate(targets):
        if limit is not None and len(t) + settings.max_new_tokens > limit:
            turn.failed[row] = (f"its context of {len(t)} tokens and {settings.max_new_tokens} new ones would pass "
                                f"{what} of {limit} tokens")
    try:
        rows = [r for r in range(len(convs)) if r not in turn.failed]
        groups = chunk_groups([targets[r] for r in rows], turn.usables(rows))
        for group in groups:
            turn.admit([rows[i] for i in group])
    except BaseException:
        for conv in convs:  # leave the conversations as they were: the turn can be asked for again
            conv.messages.pop()
        raise
    if len(turn.batches) > len(groups):
        _say_split(model, turn.pool, len(rows), turn.batches)

    replies: List[Optional[str]] = []
    for row, (conv, t, result) in enumerate(zip(convs, targets, turn.results)):
        if result is None:
            conv.messages.pop()  # a failed row: its conversation as it was
            replies.append(None)
            continue
        ids = result.ids
        content = ids[:-1] if ids and ids[-1] in stop_ids else ids
        conv.generated.append(content)
        conv.structured = result.structured
        reply = cast(str, tokenizer.decode(content, skip_special_tokens=True))  # one sequence: one text
        conv.messages.append({"role": "assistant", "content": reply})
        conv.prompt_tokens += len(t)
        conv.encoded_tokens += len(t) - result.reused
        conv.completion_tokens += len(ids)
        replies.append(reply)
    if turn.failed:
        raise ContextOverflow(turn.failed, replies)
    return cast(List[str], replies)
