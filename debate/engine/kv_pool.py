"""The memory authority: the run's budget on each device and everything decided within it, in one place.

The budget (`decide`) is the bytes a run's caches and model calls may take on a device, decided once after the
weights are loaded (not from the memory free at each call, which shrinks as caches pile up):
- `--memory-gb N`: N GiB, on any device;
- CUDA: `fraction` (--gpu-memory-fraction, 0.9) of the card's total capacity, less what PyTorch has allocated
  then (the weights) and what the process does not hold as tensors (the CUDA context, other processes);
- a CPU: fraction x CPU_MARGIN of the RAM the process can still take then (debate.engine.ram): past the RAM
  no error can be caught (the kernel kills the process), and glibc keeps some freed memory;
- fraction 0: no budget (for measurement only): sized as if the whole free memory were one.

Each model gets its share of its device's budget as one `Memory`, made on its first turn and kept for the run: a
reserve for the decode batch's transients (debate.engine.memory.kv_plan), and the rest as one store of keys and
values allocated once (debate.engine.kv_store), seen from its start as the decode place (slots where turns decode)
and past it as pages (where conversations' caches wait). The Memory decides:
- places: the slots' number and width (`place_geometry`); a row takes the lowest free slot, so the rows a step runs
  stay packed at the front; a row wider than a slot waits, first in line, until the place is empty, and the place
  is then seen anew, wider, its end moved over the pages nearest it (`reshape`);
- caches: a conversation's cache is copied into its slot when its turn starts (its pages go back at once) and out
  to pages when it ends (`store_cache`), with the adapter that made it: a turn under another adapter (or of another
  model) encodes its context again (`usable`); with no free pages the caches of other waiting conversations are
  dropped, newest conversation first, and re-encoded at their next turn: slower, never different.
- pages shared by prefix, across conversations and claims (vLLM's automatic prefix caching, SGLang's
  RadixAttention): a full page is keyed by its ids, the key of the page before it and the LoRA adapter that made it
  (`page_keys`); the index maps a key to the page that holds it. A turn's row takes the longest run of its context's
  pages the index has, its own or another conversation's (`load`), and feeds only the rest; its prompt's full pages
  are published as soon as its prefill has written them (`publish`), so rows joining after it, in the same step
  too, take them. A page is held by the caches that list it (`holders`), reference-counted; a published page nobody
  holds stays in the index, least recently used first, until its room is needed (`cached`). A partial last page
  stays private. Newest first is vLLM's order for
  preempting requests: the claims that started last give way to those about to finish, and a debate's turns come
  round in a cycle, where dropping the least recently used cache would drop the one needed next;
- claims: `admits_claim` tells the scheduler whether the arenas have room for one more claim's caches.

A conversation's cache is one `Entry` (its pages and the ids they hold), which the conversation holds and the Memory
lists weakly: a conversation freed without dropping its cache gives its pages back with it.
"""
import bisect
import collections
import contextlib
import functools
import gc
import hashlib
import itertools
import logging
import struct
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch

from debate.engine import kv_store, memory, ram

log = logging.getLogger(__name__)

GIB = 2 ** 30
DEFAULT_FRACTION = 0.9
# On a CPU only this share of the fraction is spent: past the RAM there is no out-of-memory error to recover
# from, and what glibc's heap keeps after a step is not in the plan (tests/test_memory_plan.py measures with it off).
CPU_MARGIN = 0.5
COLUMN_BUCKET = memory.COLUMN_BUCKET  # a slot's width is a multiple of this

_births = itertools.count()  # the order conversations first stored a cache in: the newest is dropped first


def decide(device: Any, fraction: float = DEFAULT_FRACTION, memory_gb: Optional[float] = None
           ) -> Tuple[Optional[int], str]:
    """(budget in bytes or None, where it came from in words) for `device`, from what is allocated now: call it
    once every model of the run is loaded."""
    device = torch.device(device)
    if memory_gb is not None:
        return int(memory_gb * GIB), f"--memory-gb {memory_gb:g}"
    if not fraction:
        return None, "--gpu-memory-fraction 0"
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        reserved, allocated = torch.cuda.memory_reserved(device), torch.cuda.memory_allocated(device)
        outside = max(0, total - free - reserved)  # the CUDA context, cuBLAS' workspace, other processes
        budget = int(fraction * total) - allocated - outside
        return max(0, budget), (f"{fraction:g} of the {torch.cuda.get_device_name(device)}'s {total / GIB:.1f} GiB, "
                                f"less {allocated / GIB:.1f} GiB of weights and {outside / GIB:.1f} GiB outside "
                                "PyTorch's tensors (CUDA context, other processes)")
    if device.type == "cpu":
        available = ram.available()
        if available is None:
            return None, "the RAM available is unknown here; --memory-gb sets one"
        return int(available * fraction * CPU_MARGIN), (f"{fraction:g} x {CPU_MARGIN:g} of the {available / GIB:.1f} "
                                                        "GiB of RAM available after loading the weights")
    return None, f"none known on {device.type}; --memory-gb sets one"


def _free_memory(device: torch.device) -> int:
    """What a budget of None is sized from: the device's free memory (RAM on a CPU), 8 GiB where unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0] * DEFAULT_FRACTION)
    return int((ram.available() or 8 * GIB) * CPU_MARGIN)


@dataclass(eq=False)
class Entry:
    """A conversation's cache: the ids whose keys and values it holds, in `pages` of its Memory's arena (None once
    dropped: `dropped` tokens then wait to be encoded again), computed with `adapter` (a LoRA role's, None for the
    base): only a row of that adapter may read them."""

    memory: Any  # weakref.ref to the Memory
    ids: List[int]
    pages: Optional[List[int]]
    birth: int
    adapter: Any
    dropped: int = 0


def _window(model: torch.nn.Module) -> Optional[int]:
    config: Any = model.config
    if hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    n = getattr(config, "max_position_embeddings", None)
    return n if isinstance(n, int) and n > 0 else None


def dtype_of(model: torch.nn.Module) -> torch.dtype:
    """The dtype a model's keys and values are computed in: its first floating parameter's (NF4 weights are uint8;
    their compute dtype is the norms' and embeddings')."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def place_geometry(widths: Sequence[int], wanted: int, tokens: int) -> Optional[Tuple[int, int]]:
    """(slots, columns) of a decode place for rows of `widths` waiting, `wanted` rows at once, in a memory of `tokens`
    tokens; None when the widest row does not fit the whole memory. The columns: the widest row's, rounded up to
    COLUMN_BUCKET, twice that where memory.PLACE_SHARE of it holds `wanted` such slots (contexts grow turn by turn:
    room for them saves seeing the place anew). The slots: `wanted`, as many as PLACE_SHARE of the memory holds, one
    at least (a lone row may take nearly all of it, the waiting caches' pages moved or dropped)."""
    widest = -(-max(widths) // COLUMN_BUCKET) * COLUMN_BUCKET
    if widest > tokens:
        return None
    share = int(tokens * memory.PLACE_SHARE)
    roomy = min(2 * widest, share // max(wanted, 1)) // COLUMN_BUCKET * COLUMN_BUCKET
    columns = max(widest, roomy)
    rows = max(1, min(wanted, share // columns))
    return rows, columns


class Memory:
    """One model's KV memory within its share of the budget: the store (place and pages), and what holds which."""

    def __init__(self, pool: "Pool", model: torch.nn.Module, share: Optional[int], rows: int, widths: Sequence[int],
                 new_tokens: int, trie: int, longest: Optional[int] = None,
                 piece: int = memory.PREFILL_CHUNK) -> None:
        self.pool = pool
        dtype = dtype_of(model)
        self.shape = memory.shape(model.config)
        self.size = torch.tensor([], dtype=dtype).element_size()
        self.token_bytes = memory.kv_bytes_per_token(self.shape, self.size)
        self.budget = share if share is not None else _free_memory(next(model.parameters()).device)
        # The reserve is sized to the widest slot the place may take for these rows (place_geometry's columns: twice
        # the widest row at most), not to the model's window: on Llama-3.1-8B the window's reserve held 3.46 GiB of a
        # 12 GiB budget where a debate's rows needed 0.45 GiB. A later row wider than that grows the reserve when
        # the place is seen anew for it, the store giving up its last pages (`reshape`). Never past the longest
        # context the settings allow (`longest`: --max-context, else the model's window, with a turn's new tokens).
        window = _window(model)
        self.longest = min(x for x in (longest, window and window + new_tokens + trie, 1 << 62) if x)
        self.fused = memory.attention_is_fused(getattr(model.config, "_attn_implementation", None))
        self.new_tokens, self.trie, self.rows_planned, self.piece = new_tokens, trie, rows, piece
        self.plan = self._plan(self._reserve_width(max(widths)))
        self.wanted_rows = rows
        tokens = self.plan["tokens"] // kv_store.PAGE * kv_store.PAGE
        rows, columns = place_geometry(widths, rows, tokens) or (1, 0)
        self.store = kv_store.Store(kv_store.layer_shapes(model, dtype), tokens, rows, columns)
        self.free_slots = list(range(rows))
        self.free_pages = list(range(self.store.first_page, self.store.pages))  # ascending: the highest goes first
        self.holders: Dict[int, Dict[int, Entry]] = {}  # page -> {id(entry): entry} of the caches holding it
        self.index: Dict[bytes, int] = {}  # a full page's key (page_keys) -> the page holding it
        self.key_of: Dict[int, bytes] = {}  # a published page -> its key
        self.cached: "collections.OrderedDict[int, None]" = collections.OrderedDict()  # published, held by none: LRU
        self.entries: Dict[int, Tuple[Any, Entry]] = {}  # id(conv) -> (weak reference to it, its entry)
        self.batch: Any = None  # the model's decode batch over this memory (debate.engine.decode_batch)
        pool.note_memory(self)

    # -- the reserve -----------------------------------------------------------------------------------------------

    def _reserve_width(self, widest: int) -> int:
        """The columns the reserve is sized for, rows up to `widest` columns waiting: the widest slot place_geometry
        may give them (twice the widest, rounded up), within the longest context allowed and the budget."""
        return max(widest, min(memory.reserve_columns(widest, self.longest), self.budget // max(self.token_bytes, 1)))

    def _plan(self, width: int) -> Dict[str, int]:
        plan = memory.kv_plan(self.shape, self.size, self.budget, self.rows_planned, width, self.new_tokens,
                              self.fused, self.trie, self.piece)
        plan["width"] = width
        return plan

    # -- the place -------------------------------------------------------------------------------------------------

    def fits(self, width: int) -> bool:
        """Whether a row of `width` columns can ever run here (the whole memory as its slot, the reserve grown for
        it where it must be)."""
        tokens = self.store.tokens
        if width > self.plan["width"]:
            tokens = min(tokens, self._plan(self._reserve_width(width))["tokens"] // kv_store.PAGE * kv_store.PAGE)
        return place_geometry([width], 1, tokens) is not None

    def take_slot(self, width: int) -> Optional[int]:
        """The lowest free slot for a row of `width` columns, or None (every slot taken, or the slots too narrow)."""
        if width > self.store.columns or not self.free_slots:
            return None
        slot = min(self.free_slots)
        self.free_slots.remove(slot)
        return slot

    def give_slot(self, slot: int) -> None:
        self.free_slots.append(slot)

    def empty(self) -> bool:
        return len(self.free_slots) == self.store.rows

    def reshape(self, widths: Sequence[int]) -> bool:
        """With no row in the place and rows of `widths` waiting: where the first of them is wider than a slot, or
        more of them could run at once than there are slots, the place seen anew (place_geometry), its end moved:
        caches in the pages it grows over are moved to free pages past it, or dropped (newest first) where too few
        are free; whether it changed."""
        assert self.empty()
        wanted = max(self.wanted_rows, len(widths))
        tokens, plan = self.store.tokens, self.plan
        if widths[0] > self.store.columns and widths[0] > plan["width"]:
            # The reserve grows for the wider rows; the store gives up pages for it (its last ones).
            plan = self._plan(self._reserve_width(widths[0]))
            tokens = min(tokens, plan["tokens"] // kv_store.PAGE * kv_store.PAGE)
        geometry = place_geometry(widths, wanted, tokens)
        if geometry is None:
            return False  # no place holds it: the row fails when it joins
        rows, columns = geometry
        if widths[0] <= self.store.columns and rows <= self.store.rows:
            return False
        first, last = -(-rows * columns // kv_store.PAGE), tokens // kv_store.PAGE
        self._forget_cached()  # a place seen anew is rare: the pages nobody holds are not worth moving

        def outside(page: int) -> bool:
            return page < first or page >= last

        def room() -> Tuple[List[int], List[int]]:
            return ([p for p in self.free_pages if not outside(p)], sorted(p for p in self.holders if outside(p)))

        free_above, in_the_way = room()
        for ref, entry in sorted(self.entries.values(), key=lambda item: -item[1].birth):
            if len(free_above) >= len(in_the_way):
                break
            other = ref()
            if other is not None and entry.pages and any(outside(p) for p in entry.pages):
                self.evict(other)
                self._forget_cached()
                free_above, in_the_way = room()
        self.pool.moved += len(in_the_way)
        for page in in_the_way:  # each cache's pages out of the new place's way and the store's end, moved within
            target = free_above.pop()
            self.store.move_page(page, target)
            holding = self.holders[target] = self.holders.pop(page)
            for entry in holding.values():
                assert entry.pages is not None
                entry.pages[entry.pages.index(page)] = target
            if page in self.key_of:
                key = self.key_of[target] = self.key_of.pop(page)
                self.index[key] = target
        log.debug("decode place: %d slots of %d columns (was %d of %d)", rows, columns, self.store.rows,
                  self.store.columns)
        if tokens < self.store.tokens:
            log.debug("reserve grown to %s for rows of %d columns; keys and values %d tokens (were %d)",
                      size(plan["reserve"]), plan["width"], tokens, self.store.tokens)
            self.store.shrink(tokens, sorted(self.holders))
        self.plan = plan
        self.store.view(rows, columns)
        self.free_slots = list(range(rows))
        self.free_pages = [p for p in range(first, self.store.pages) if p not in self.holders]
        self.pool.reshapes += 1
        return True

    # -- caches ----------------------------------------------------------------------------------------------------

    def usable(self, conv: Any, target: Sequence[int], adapter: Any) -> int:
        """How many of `target`'s first tokens the conversation's pages hold for a row of `adapter` (one token at
        least is left to feed): none where another adapter wrote them (a LoRA Moderator and the base in one
        conversation object, or a conversation continued under another adapter), or another model's Memory."""
        entry = getattr(conv, "kv", None)
        if entry is None or entry.pages is None or entry.memory() is not self or entry.adapter != adapter:
            return 0
        n = 0
        ids = entry.ids
        limit = min(len(ids), len(target) - 1)
        while n < limit and ids[n] == target[n]:
            n += 1
        return n

    def load(self, conv: Any, target: Sequence[int], slot: int, reuse: bool, adapter: Any) -> int:
        """The longest cached prefix of `target` into `slot`: the conversation's own cache, or the pages the index
        has for the context's first pages (any conversation's, made with `adapter`), whichever holds more; the
        conversation's own pages given back; how many tokens that was. A cache dropped earlier is counted as
        re-encoded now, less what the index held of it (not where another adapter made it: it could not serve)."""
        entry = getattr(conv, "kv", None)
        own = self.usable(conv, target, adapter) if reuse else 0
        shared = self._indexed(target, adapter) if reuse else []
        usable = max(own, len(shared) * kv_store.PAGE)
        if shared and len(shared) * kv_store.PAGE >= own:
            self.store.copy_in(slot, shared)
            for page in shared:
                if page in self.cached:
                    self.cached.move_to_end(page)  # the most recently used
            self.pool.shared += max(0, usable - own)
        elif own and entry is not None and entry.pages is not None:
            self.store.copy_in(slot, entry.pages[:-(-own // kv_store.PAGE)])
        if entry is not None and entry.dropped and entry.adapter == adapter:
            self.pool.reencoded += max(0, min(entry.dropped, len(target) - 1) - usable)
            entry.dropped = 0
        self.release(conv)
        return usable

    def _indexed(self, target: Sequence[int], adapter: Any) -> List[int]:
        """The pages the index holds for `target`'s first full pages, in order up to the first it lacks (one token
        at least is left to feed)."""
        pages = []
        for key in page_keys(target, adapter, (len(target) - 1) // kv_store.PAGE):
            page = self.index.get(key)
            if page is None:
                break
            pages.append(page)
        return pages

    def publish(self, slot: int, ids: Sequence[int], adapter: Any) -> None:
        """Slot `slot`'s first full pages, the keys and values of `ids` just written there, into the index where it
        lacks them, in free pages only (never dropping anything for them): rows that join after, in the same step
        too, take them instead of encoding them again."""
        pairs = []
        for at, key in enumerate(page_keys(ids, adapter, len(ids) // kv_store.PAGE)):
            if key in self.index:
                continue
            if not self.free_pages:
                break
            page = self.free_pages.pop()
            self.index[key], self.key_of[page] = page, key
            self.cached[page] = None
            pairs.append((at, page))
        if pairs:
            self.store.copy_out(slot, [p for _, p in pairs], [at for at, _ in pairs])

    def store_cache(self, conv: Any, slot: int, ids: List[int], adapter: Any) -> None:
        """Slot `slot`'s first len(ids) columns, the keys and values of `ids` made with `adapter`, as the conversation's
        cache (for rows of that adapter only): its full
        pages the index has are held, not copied; the others copied out to free pages and published, the partial
        last one kept private. Other waiting caches are dropped (newest first) where the free pages are too few; none
        is kept where even that is."""
        prior = getattr(conv, "kv", None)
        birth = prior.birth if isinstance(prior, Entry) else next(_births)
        self.release(conv)
        full = len(ids) // kv_store.PAGE
        keys = page_keys(ids, adapter, full)
        found = [self.index.get(key) for key in keys]
        entry = Entry(weakref.ref(self), list(ids), [], birth, adapter)
        for page in found:  # held first, so that making room cannot take them
            if page is not None:
                self._hold(page, entry)
        need = found.count(None) + (1 if len(ids) > full * kv_store.PAGE else 0)
        if need > self._room() and need <= self.store.pages - self.store.first_page:
            gc.collect()  # conversations in reference cycles nothing reaches any more: their pages count until then
            for ref, _ in sorted(self.entries.values(), key=lambda item: -item[1].birth):
                if need <= self._room():
                    break
                other = ref()
                if other is not None and other is not conv:
                    self.evict(other)
        if need > self._room():  # not even alone: its next turn encodes it again
            for page in found:
                if page is not None:
                    self._unhold(page, entry)
            conv.kv = Entry(weakref.ref(self), [], None, birth, adapter, dropped=len(ids))
            self.pool.dropped += 1
            return
        pages, copied, at = [], [], []
        for i in range(full + (1 if len(ids) > full * kv_store.PAGE else 0)):
            page = found[i] if i < full else None
            if page is None:
                page = self._take()
                if i < full:
                    self.index[keys[i]], self.key_of[page] = page, keys[i]
                self._hold(page, entry)
                copied.append(page)
                at.append(i)
            pages.append(page)
        if copied:
            self.store.copy_out(slot, copied, at)
        entry.pages = pages
        conv.kv = entry
        key = id(conv)
        self.entries[key] = (weakref.ref(conv, functools.partial(self._gone, key)), entry)
        self.pool.note_held()

    # -- pages: held, cached, free ----------------------------------------------------------------------------------

    def _room(self) -> int:
        """Pages a cache can take now: the free ones and the published ones nobody holds."""
        return len(self.free_pages) + len(self.cached)

    def _take(self) -> int:
        """A page for new keys and values: a free one (the highest first), else the least recently used cached one,
        its key forgotten."""
        if self.free_pages:
            return self.free_pages.pop()
        page, _ = self.cached.popitem(last=False)
        del self.index[self.key_of.pop(page)]
        return page

    def _hold(self, page: int, entry: Entry) -> None:
        self.holders.setdefault(page, {})[id(entry)] = entry
        self.cached.pop(page, None)

    def _unhold(self, page: int, entry: Entry) -> None:
        holding = self.holders.get(page, {})
        holding.pop(id(entry), None)
        if holding:
            return
        self.holders.pop(page, None)
        if page in self.key_of:
            self.cached[page] = None  # published: kept for the next context that starts with it
        else:
            bisect.insort(self.free_pages, page)

    def _forget_cached(self) -> None:
        """Every published page nobody holds back to the free pages, its key forgotten."""
        for page in self.cached:
            del self.index[self.key_of.pop(page)]
            bisect.insort(self.free_pages, page)
        self.cached.clear()

    def _give_pages(self, entry: Entry) -> None:
        assert entry.pages is not None
        for page in entry.pages:
            self._unhold(page, entry)
        entry.pages = None

    def release(self, conv: Any) -> None:
        """Give the conversation's pages back (it holds no cache from now on, until it stores one)."""
        entry = self.entries.pop(id(conv), (None, None))[1]
        if entry is not None and entry.pages is not None:
            self._give_pages(entry)
            entry.ids = []

    def evict(self, conv: Any) -> None:
        """Drop a waiting conversation's cache to make room; its next turn encodes it again."""
        entry = conv.kv
        tokens = len(entry.ids)
        self.release(conv)
        entry.dropped += tokens
        self.pool.dropped += 1

    def _gone(self, key: int, _ref: Any) -> None:
        entry = self.entries.pop(key, (None, None))[1]
        if entry is not None and entry.pages is not None and bisect is not None:  # None: the interpreter's exit
            self._give_pages(entry)

    def held(self) -> int:
        """Bytes of the pages that hold caches."""
        return len(self.holders) * kv_store.PAGE * self.token_bytes

    def shared_pages(self) -> int:
        """Pages more than one cache holds now."""
        return sum(len(h) > 1 for h in self.holders.values())

    def free_bytes(self) -> int:
        return self._room() * kv_store.PAGE * self.token_bytes

    def nbytes(self) -> int:
        return self.store.nbytes()


class Pool:
    """A device's budget, its models' Memories, and what the run held, dropped and re-encoded there."""

    def __init__(self, budget: Optional[int], source: str) -> None:
        self.budget, self.source = budget, source
        self.memories: "weakref.WeakKeyDictionary[torch.nn.Module, Memory]" = weakref.WeakKeyDictionary()
        self.models = 1  # the models the budget is shared by (start_run)
        self.rows = 0  # the run's rows at once (--batch-size; 0: as a model's first turn asks)
        self.reset_stats()

    def reset_stats(self) -> None:
        self.peak_held = sum(m.held() for m in self.memories.values())  # the most bytes the pages held at once
        self.dropped = 0  # caches dropped to make room
        self.reencoded = 0  # tokens encoded again for them
        self.reshapes = 0  # times a place was seen as other slots
        self.moved = 0  # pages moved out of a growing place's way
        self.shared = 0  # context tokens taken from pages another conversation wrote (not encoded)
        self.peak_shared = 0  # the most pages held by more than one cache at once

    def note_memory(self, mem: Memory) -> None:
        log.debug("memory of a model: %s of keys and values (%d slots of %d columns, %d pages past them), %s reserved",
                  size(mem.store.nbytes()), mem.store.rows, mem.store.columns, mem.store.pages - mem.store.first_page,
                  size(mem.plan["reserve"]))

    def note_held(self) -> None:
        self.peak_held = max(self.peak_held, sum(m.held() for m in self.memories.values()))
        self.peak_shared = max(self.peak_shared, sum(m.shared_pages() for m in self.memories.values()))

    def share(self) -> Optional[int]:
        return None if self.budget is None else self.budget // max(1, self.models)

    def memory_of(self, model: torch.nn.Module, widths: Sequence[int], new_tokens: int, trie: int,
                  longest: Optional[int] = None, piece: int = memory.PREFILL_CHUNK) -> Memory:
        """The model's Memory, made on first use for the run's rows at once (where it said; else as many as its first
        rows, of `widths` columns; `longest`: the widest a row may be by the run's settings, None: the model's
        window)."""
        mem = self.memories.get(model)
        if mem is None:
            mem = Memory(self, model, self.share(), max(len(widths), self.rows), widths, new_tokens, trie, longest,
                         piece)
            self.memories[model] = mem
        return mem

    def release(self) -> None:
        """Let every Memory go, its tensors and its batch with it: a new budget, or the run's end (a GPU's memory
        back for what follows: training after synthesis)."""
        for mem in self.memories.values():
            mem.batch = None  # the batch holds its memory: without this they would wait for the cycle collector
        self.memories = weakref.WeakKeyDictionary()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


_pools: Dict[str, Pool] = {}


def pool_for(device: Any) -> Pool:
    """The pool of `device`; on first use with the default budget of what is allocated then."""
    key = str(torch.device(device))
    if key not in _pools:
        _pools[key] = Pool(*decide(device))
    return _pools[key]


def configure(device: Any, budget: Optional[int], source: str, models: int = 1, rows: int = 0) -> Pool:
    """Set `device`'s budget for a run (shared by `models` models, `rows` rows at once), its Memories made afresh
    on their next use, and start its counts afresh; the pool."""
    pool = pool_for(device)
    pool.budget, pool.source, pool.models, pool.rows = budget, source, max(1, models), rows
    pool.release()
    pool.reset_stats()
    return pool


def memories() -> List[Memory]:
    """Every Memory of every device, as made so far."""
    return [m for p in _pools.values() for m in p.memories.values()]


def has_room(extra: int) -> bool:
    """Whether every Memory has `extra` more bytes of free pages (or none is made yet)."""
    return all(m.free_bytes() >= extra for p in _pools.values() for m in p.memories.values())


def admits_claim(per_claim: int, fresh: int, in_flight: int) -> bool:
    """Whether one more claim may start: fewer claims are in flight than a decode place has slots (a claim has one
    turn at a time; one more would only wait, its caches taking pages from those that run), and the pages have room
    for a claim's caches (`per_claim` bytes) for it and for each of the `fresh` claims in flight that hold none yet
    (started since their first turn began, or all their caches dropped), which the pages cannot show yet."""
    slots = max((m.store.rows for m in memories()), default=None)
    return (slots is None or in_flight < slots) and has_room((fresh + 1) * per_claim)


def page_keys(ids: Sequence[int], adapter: Any, pages: int) -> List[bytes]:
    """The keys of `ids`' first `pages` full pages made with `adapter` (a LoRA role's, None for the base): each a
    hash of the key before it, the adapter and its PAGE ids, so a key names a page's whole prefix (vLLM's chained
    block hash)."""
    keys, key = [], b""
    for i in range(pages):
        digest = hashlib.blake2b(key, digest_size=16)
        digest.update(repr(adapter).encode())
        digest.update(struct.pack(f"<{kv_store.PAGE}q", *ids[i * kv_store.PAGE:(i + 1) * kv_store.PAGE]))
        key = digest.digest()
        keys.append(key)
    return keys


def held_by(convs: Iterable[Any]) -> int:
    """The bytes `convs`' caches hold, in whichever Memories."""
    total = 0
    for conv in convs:
        entry = getattr(conv, "kv", None)
        if isinstance(entry, Entry) and entry.pages is not None and (mem := entry.memory()) is not None:
            total += len(entry.pages) * kv_store.PAGE * mem.token_bytes
    return total


def size(nbytes: float) -> str:
    """Bytes in words: GiB to two decimals from 1 GiB, MiB below (a small budget stays readable)."""
    return f"{nbytes / GIB:.2f} GiB" if nbytes >= GIB else f"{nbytes / 2 ** 20:.1f} MiB"


def describe(pool: Pool) -> str:
    return "no budget" if pool.budget is None else size(pool.budget)


def start_run(models: Iterable[torch.nn.Module], fraction: float = DEFAULT_FRACTION,
              memory_gb: Optional[float] = None, rows: int = 0) -> List[Pool]:
    """Decide the budget of every device `models` run on (call it once they are all loaded), shared by the models
    there, `rows` rows at once (the run's --batch-size); say it, and start the pools afresh; the pools."""
    models = list(models)
    pools = []
    for device in _devices(models):
        name = str(device)
        here = [m for m in models if str(next(m.parameters()).device) == name]
        budget, source = decide(device, fraction, memory_gb)
        if budget is not None and budget <= 0:
            log.warning("memory budget on %s: nothing left for caches and model calls (%s); a turn may not run and "
                        "end its claim; lower the weights' precision or set --memory-gb", name, source)
        pools.append(configure(device, budget, source, len(here), rows))
        log.info(f"memory budget on {name}: {describe(pools[-1])} ({source})")
    return pools


def summary(pools: Iterable[Pool], in_flight: Optional[int] = None) -> str:
    """The run's memory in one line: what its places and arenas took, the caches' peak, claims in flight at most,
    caches dropped and the tokens re-encoded for them."""
    pools = list(pools)
    mems = [m for p in pools for m in p.memories.values()]
    peak = max((p.peak_held for p in pools), default=0)
    budgets = [p.budget for p in pools if p.budget is not None]
    taken = sum(m.nbytes() + m.plan["reserve"] for m in mems)
    rows = ", ".join(f"{m.store.rows} slots of {m.store.columns} columns" for m in mems) or "no model call"
    dropped, reencoded = sum(p.dropped for p in pools), sum(p.reencoded for p in pools)
    return (f"memory: decode place {rows}; keys, values and reserve {size(taken)} of "
            f"{'a ' + size(max(budgets)) if budgets else 'an unlimited'} budget; caches held {size(peak)} at most"
            + (f"; {in_flight} claims in flight at most" if in_flight is not None else "")
            + (f"; {dropped} caches dropped to stay within it, {reencoded} tokens re-encoded for them" if dropped
               else "; no cache dropped")
            + (f"; {sum(p.shared for p in pools):,} prompt tokens taken from pages other conversations wrote, "
               f"{max(p.peak_shared for p in pools)} pages shared at most" if any(p.shared for p in pools) else ""))


def _devices(models: Iterable[torch.nn.Module]) -> List[torch.device]:
    """The devices `models` run on (each model's first parameter's), each once."""
    return list({str(d): d for d in (next(m.parameters()).device for m in models)}.values())


def pools_of(models: Iterable[torch.nn.Module]) -> List[Pool]:
    """The pools of the devices `models` run on, each once."""
    return [pool_for(device) for device in _devices(models)]


@contextlib.contextmanager
def kept_budgets() -> Iterator[None]:
    """Every pool's budget as it was on entry, again on exit, and the Memories made within let go: a run's budget
    (start_run) and its memory are its own, not the next caller's in the same process (training after synthesis)."""
    before = {key: (p.budget, p.source, p.models, p.rows) for key, p in _pools.items()}
    try:
        yield
    finally:
        for key, pool in list(_pools.items()):
            pool.release()
            if key in before:
                pool.budget, pool.source, pool.models, pool.rows = before[key]
            else:
                pool.budget, pool.source = decide(key)
                pool.models, pool.rows = 1, 0

