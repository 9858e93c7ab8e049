"""Generation over many agent conversations, each keeping its KV cache between its turns.

A turn of some conversations is a `Call`: `begin` adds each conversation's user message and makes one row a
conversation (debate.engine.decode_batch.Row: its context's ids, settings, schema, adapter) in the model's persistent
decode batch; `advance` steps every batch with rows to run; `end` gives the replies once every row of the call is
done, and writes each conversation's assistant message, token counts and structured result. `generate` is the three
in a row, for a caller that waits (a fixed batch of claims, training's Corrector, the tests); the scheduler
(debate.engine.scheduler) interleaves many claims' calls instead, so a claim's next turn joins the batch at the step
after its last one ended.

The parts: debate.engine.chat (what the model sees: the chat template around the generated ids, tokenised once a
piece), debate.engine.decode_batch (the batch: rows join, step, leave), debate.engine.kv_pool (the memory authority:
the budget, slots, pages, what is dropped), debate.engine.kv_store (the tensors), debate.engine.decode_step (a step,
compiled where asked), debate.engine.generator (a row's prefill and a choice's tree pass).

A row that cannot run (its context would pass the model's window or --max-context, it alone needs more than the
memory budget, or it ran out of memory twice) fails alone: `end` raises ContextOverflow naming it once the others are
done; its conversation is left as it was, its claim ends, the run goes on.

Cached and uncached runs feed the model the same token sequence, so under greedy decoding they produce
the same tokens; debate.engine.reference is the plain path the tests hold the engine to.
"""
import itertools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, cast

import torch

from debate.engine import decode_batch, kv_pool, memory, row_adapters, sampling, schema_program
from debate.engine.chat import context_ids, encode_text, render, stop_token_ids
from debate.engine.errors import ContextOverflow

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

_orders = itertools.count()


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
    # Prompt tokens a decode step carries beside its decode rows at most (debate.engine.decode_batch: a joining row's
    # prompt is fed inside the steps, a long one over several; docs/BENCHMARKS.md measures the default).
    prefill_tokens: int = 512


@dataclass
class Conversation:
    """One agent's side of a debate: its messages and the cache of what it has already encoded."""

    system: str
    messages: List[Dict[str, str]] = field(default_factory=list)  # [{"role": "user"|"assistant", "content": str}]
    # token ids of each assistant message, verbatim (None: recalled)
    generated: List[Optional[List[int]]] = field(default_factory=list)
    # its cache between turns: pages of its model's arena and the ids they hold (debate.engine.kv_pool.Entry, owned
    # by the memory authority, which may drop it), or None
    kv: Optional[kv_pool.Entry] = field(default=None, repr=False, compare=False)
    prompt_tokens: int = 0  # context length summed over turns (what an API would bill)
    encoded_tokens: int = 0  # prompt tokens actually run through the model
    completion_tokens: int = 0
    # the last reply's schema result (fields, choice probabilities), or None
    structured: Optional[Dict[str, Any]] = None
    pieces: List[Any] = field(default_factory=list, repr=False)  # template pieces tokenised so far (debate.engine.chat)

    @property
    def cached_ids(self) -> List[int]:
        """The ids whose keys and values its cache holds now (none once dropped)."""
        return list(self.kv.ids) if self.kv is not None and self.kv.pages is not None else []

    def drop_cache(self) -> None:
        """Give its cache's memory back (a claim that is done with this conversation)."""
        mem = self.kv.memory() if self.kv is not None else None
        if mem is not None:
            mem.release(self)
        self.kv = None

    def recall(self, prompt: str, reply: str) -> None:
        """Add an exchange this conversation did not generate, with `reply` as the agent's own earlier turn
        (an explanation written elsewhere, a fixed answer); its ids are the reply's text tokenised, on first need."""
        self.messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]
        self.generated.append(None)


def turn_cache_bytes(model: torch.nn.Module, tokenizer: "PreTrainedTokenizerBase", convs: Sequence[Conversation],
                     prompts: Sequence[str], settings: Settings) -> int:
    """About the bytes these conversations' caches will hold after a turn with `prompts`, before it runs: each
    row's chat so far and its new prompt rendered by the template and tokenised as one text (the context the turn
    feeds, but for how generated replies split into tokens), plus the new tokens, at the model's cache bytes a
    token. The scheduler's estimate of a claim before any claim has run."""
    tokens = sum(len(encode_text(tokenizer, render(tokenizer, c.system, c.messages + [{"role": "user", "content": p}],
                                                   add_generation_prompt=True))) + settings.max_new_tokens
                 for c, p in zip(convs, prompts))
    size = torch.tensor([], dtype=kv_pool.dtype_of(model)).element_size()
    return tokens * memory.kv_bytes_per_token(memory.shape(model.config), size)


def window(model: torch.nn.Module, settings: Settings) -> Optional[int]:
    """The longest context a conversation may reach: the user's cap, else the model's max_position_embeddings."""
    config: Any = model.config
    if hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    limits = [n for n in (getattr(config, "max_position_embeddings", None), settings.max_context)
              if isinstance(n, int) and n > 0]
    return min(limits) if limits else None


@dataclass(eq=False)
class Call:
    """One turn of some conversations: their rows in the model's batch, and the rows that could not run."""

    model: torch.nn.Module
    tokenizer: Any
    convs: List[Conversation]
    targets: List[List[int]]
    rows: List[Optional[decode_batch.Row]]
    failed: Dict[int, str]
    order: int

    @property
    def done(self) -> bool:
        return all(r is None or r.done for r in self.rows)


def begin(model: torch.nn.Module, tokenizer: "PreTrainedTokenizerBase", convs: Sequence[Conversation],
          user_texts: Sequence[str], settings: Settings, stop_ids: Optional[Sequence[int]] = None,
          generator: Optional[torch.Generator] = None, schemas: Optional[Sequence[Any]] = None,
          adapter: Any = "current") -> Call:
    """Add one user message to each conversation and queue its row in the model's batch; the Call.
    `schemas`: one debate.engine.schema_program.Compiled or None per row. `adapter`: the LoRA adapter the rows use
    (None: the base alone); by default the one the model's forwards use now (debate.engine.models.adapter_scope)."""
    schemas = list(schemas) if schemas and any(schemas) else [None] * len(convs)
    for compiled in schemas:
        if compiled is not None:
            schema_program.check_budget(compiled, settings.max_new_tokens)
    stop_ids = tuple(stop_ids if stop_ids is not None else stop_token_ids(model, tokenizer))
    # A sampled row's random stream: the seed of the stream the protocol passes (its run's, or a voter's own), else
    # the settings' seed; each reply then draws from a stream of its own (sampling.reply_key).
    seed = generator.initial_seed() if generator is not None else settings.seed
    if adapter == "current":
        adapter = row_adapters.current(model)
    # Any id will do for padding: a stopped row's fed token is masked out.
    pad_id = next((i for i in (tokenizer.pad_token_id, *stop_ids) if i is not None), 0)
    for conv, text in zip(convs, user_texts):
        conv.messages.append({"role": "user", "content": text})
    targets = [context_ids(tokenizer, c) for c in convs]
    limit = window(model, settings)
    what = "the --max-context cap" if limit == settings.max_context else "the model's window (max_position_embeddings)"
    failed: Dict[int, str] = {}
    rows: List[Optional[decode_batch.Row]] = []
    seen: Dict[Tuple[int, ...], int] = {}  # identical rows of this call so far, by their context
    for i, (conv, t, compiled) in enumerate(zip(convs, targets, schemas)):
        if limit is not None and len(t) + settings.max_new_tokens > limit:
            failed[i] = (f"its context of {len(t)} tokens and {settings.max_new_tokens} new ones would pass "
                         f"{what} of {limit} tokens")
            rows.append(None)
            continue
        occurrence = seen[tuple(t)] = seen.get(tuple(t), -1) + 1
        key = sampling.reply_key(seed, (settings.temperature, settings.top_p, adapter, compiled is not None), t,
                                 occurrence)
        rows.append(decode_batch.Row(conv, t, settings, stop_ids, key, compiled, adapter, pad_id, tokenizer))
    call = Call(model, tokenizer, list(convs), targets, rows, failed, next(_orders))
    running = [r for r in rows if r is not None]
    if running:
        decode_batch.batch_for(model, running).submit(running)
    return call


def advance() -> None:
    """One step of every batch with rows waiting or running."""
    for batch in decode_batch.busy_batches():
        batch.advance()


def cancel(call: Call) -> None:
    """Give a call up before it ends: its rows out of the batch, its conversations as they were."""
    rows = [r for r in call.rows if r is not None]
    batch = decode_batch.existing(call.model)
    if rows and batch is not None:
        batch.cancel(rows)
    for conv in call.convs:
        conv.messages.pop()


def end(call: Call) -> List[str]:
    """The replies of a call whose rows are done; each conversation gets its assistant message, token counts and
    cache. A row that could not run leaves its conversation as it was and is named in a ContextOverflow raised once
    the others are written."""
    failed = dict(call.failed)
    replies: List[Optional[str]] = []
    for i, (conv, t, row) in enumerate(zip(call.convs, call.targets, call.rows)):
        if row is not None and row.error is not None:
            failed[i] = row.error
        if i in failed or row is None or row.result is None:
            conv.messages.pop()  # a failed row: its conversation as it was
            replies.append(None)
            continue
        result = row.result
        ids = result.ids
        content = ids[:-1] if ids and ids[-1] in row.stop_ids else ids
        conv.generated.append(content)
        conv.structured = result.structured
        reply = cast(str, call.tokenizer.decode(content, skip_special_tokens=True))  # one sequence: one text
        conv.messages.append({"role": "assistant", "content": reply})
        conv.prompt_tokens += len(t)
        conv.encoded_tokens += len(t) - result.reused
        conv.completion_tokens += len(ids)
        replies.append(reply)
    if failed:
        raise ContextOverflow(failed, replies)
    return cast(List[str], replies)


def generate(model: torch.nn.Module, tokenizer: "PreTrainedTokenizerBase", convs: Sequence[Conversation],
             user_texts: Sequence[str], settings: Settings, stop_ids: Optional[Sequence[int]] = None,
             generator: Optional[torch.Generator] = None, schemas: Optional[Sequence[Any]] = None) -> List[str]:
    """One reply for each conversation: its user message added, its rows run in the model's batch until all are
    done (rows never affect each other's tokens). Returns the reply texts; each conversation gets its assistant
    message, token counts and cache; with `schemas`, a row's conversation holds its schema's result in
    `structured` (None for a free reply)."""
    if not convs:
        return []
    call = begin(model, tokenizer, convs, user_texts, settings, stop_ids, generator, schemas)
    try:
        while not call.done:
            advance()
    except BaseException:
        cancel(call)  # leave the conversations as they were: the turn can be asked for again
        raise
    return end(call)
