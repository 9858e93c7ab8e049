"""Every conversation's KV cache between its turns, counted against one memory budget per device.

The budget (`decide`) is the bytes a run's caches and model calls may take on the model's device, decided once
after the weights are loaded (not from the memory free at each call, which shrinks as caches pile up):
- `--memory-gb N`: N GiB, on any device;
- CUDA: `fraction` (--gpu-memory-fraction, 0.9) of the card's total capacity, less what PyTorch has allocated
  then (the weights) and what the process does not hold as tensors (the CUDA context, other processes);
- a CPU: fraction x CPU_MARGIN of the RAM the process can still take then (debate.engine.ram): past the RAM
  no error can be caught (the kernel kills the process), and glibc keeps some freed memory;
- fraction 0: no budget (for measurement only).

The pool (`Pool`) counts the bytes every conversation's cache holds: the conversation keeps only its own tokens'
keys and values (kv_store.copy_out), stored here (`store`) and forgotten when the conversation drops it or is
freed. Before a model call the engine asks it to make room for the call (`make_room`): it drops the caches of
conversations outside the call, newest conversation first, until the caches held and the call fit the budget. A
dropped conversation is re-encoded at its next turn: slower, never different. Newest first is vLLM's order for
preempting requests: the claims that started last give way to the ones about to finish, and a debate's turns
come round in a cycle, where dropping the least recently used cache would drop the one needed next.

One pool per device, kept for the process (`pool_for`); a run sets its budget and reads its summary
(`configure`, `summary`).
"""
import contextlib
import functools
import gc
import itertools
import logging
import weakref
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

import torch

from debate.engine import ram

log = logging.getLogger(__name__)

GIB = 2 ** 30
DEFAULT_FRACTION = 0.9
# On a CPU only this share of the fraction is spent: past the RAM there is no out-of-memory error to recover
# from, and what glibc's heap keeps after a step is not in the plan (tests/test_memory_plan.py measures with it off).
CPU_MARGIN = 0.5

KV = List[Tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each (kv_heads, tokens, head_dim)

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


class Pool:
    """The caches of every conversation on one device, their bytes, and what was dropped to stay in budget."""

    def __init__(self, budget: Optional[int], source: str) -> None:
        self.budget, self.source = budget, source
        self.held = 0  # bytes of every stored cache now
        self._entries: Dict[int, Tuple[Any, int, int]] = {}  # id(conv) -> (weak reference, bytes, birth)
        self.reset_stats()

    def reset_stats(self) -> None:
        self.peak_held = self.held  # the most bytes the caches held at once
        self.peak_counted = self.held  # the most bytes caches and one model call's need came to, at a call
        self.dropped = 0  # caches dropped to make room
        self.reencoded = 0  # tokens encoded again for them
        self.calls = 0

    def bytes_of(self, conv: Any) -> int:
        entry = self._entries.get(id(conv))
        return entry[1] if entry is not None and entry[0]() is conv else 0

    def store(self, conv: Any, kv: Optional[KV], cached_ids: List[int]) -> None:
        """`conv`'s cache from now on: `kv` (its own tensors), the keys and values of `cached_ids`; None: none."""
        self.release(conv)
        conv.kv, conv.cached_ids, conv.pool = kv, (cached_ids if kv is not None else []), self
        if kv is None:
            return
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        key = id(conv)
        if conv.birth is None:
            conv.birth = next(_births)
        birth = conv.birth
        # The entry goes when the conversation is freed (a claim that ends without dropping its caches).
        self._entries[key] = (weakref.ref(conv, functools.partial(self._gone, key)), size, birth)
        self.held += size
        self.peak_held = max(self.peak_held, self.held)

    def release(self, conv: Any) -> None:
        """Forget `conv`'s cache (the conversation keeps it only if someone else stored it)."""
        entry = self._entries.get(id(conv))
        if entry is not None and entry[0]() is conv:
            self._forget(id(conv))
        conv.kv, conv.cached_ids = None, []

    def _gone(self, key: int, _ref: Any) -> None:
        self._forget(key)

    def _forget(self, key: int) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.held -= entry[1]

    def fits(self, need: int) -> bool:
        return self.budget is None or self.held + need <= self.budget

    def make_room(self, need: int, keep: Iterable[Any] = ()) -> bool:
        """Drop caches of conversations not in `keep`, newest first, until the caches held and `need` more bytes
        fit the budget; whether they do."""
        if self.fits(need):
            return True
        gc.collect()  # conversations in reference cycles that nothing reaches any more: their caches count until then
        if self.fits(need):
            return True
        kept = {id(c) for c in keep}
        for key, (ref, _, _) in sorted(self._entries.items(), key=lambda item: -item[1][2]):
            if self.fits(need):
                break
            conv = ref()
            if conv is not None and key not in kept:
                self.evict(conv)
        return self.fits(need)

    def evict(self, conv: Any) -> None:
        """Drop `conv`'s cache to make room; its next turn encodes it again (note_reencoded counts that)."""
        conv.evicted_tokens += len(conv.cached_ids)
        self.release(conv)
        self.dropped += 1

    def note_call(self, need: int) -> None:
        """A model call of `need` bytes starts now, over the caches held."""
        self.calls += 1
        self.peak_counted = max(self.peak_counted, self.held + need)

    def note_reencoded(self, conv: Any, tokens: int) -> None:
        """`conv`, dropped earlier, encodes `tokens` of what it had cached again."""
        if conv.evicted_tokens:
            self.reencoded += min(conv.evicted_tokens, tokens)
            conv.evicted_tokens = 0


_pools: Dict[str, Pool] = {}


def pool_for(device: Any) -> Pool:
    """The pool of `device`; on first use with the default budget of what is allocated then."""
    key = str(torch.device(device))
    if key not in _pools:
        _pools[key] = Pool(*decide(device))
    return _pools[key]


def configure(device: Any, budget: Optional[int], source: str) -> Pool:
    """Set `device`'s budget for a run and start its counts afresh; the pool."""
    pool = pool_for(device)
    pool.budget, pool.source = budget, source
    pool.reset_stats()
    return pool


def has_room(extra: int) -> bool:
    """Whether every pool with a budget has room for `extra` more bytes of caches."""
    return all(p.fits(extra) for p in _pools.values())


def held_by(convs: Iterable[Any]) -> int:
    """The bytes `convs`' caches hold, in whichever pools."""
    return sum(c.pool.bytes_of(c) for c in convs if getattr(c, "pool", None) is not None)


def size(nbytes: float) -> str:
    """Bytes in words: GiB to two decimals from 1 GiB, MiB below (a small budget stays readable)."""
    return f"{nbytes / GIB:.2f} GiB" if nbytes >= GIB else f"{nbytes / 2 ** 20:.1f} MiB"


def describe(pool: Pool) -> str:
    return "no budget" if pool.budget is None else size(pool.budget)


def start_run(models: Iterable[torch.nn.Module], fraction: float = DEFAULT_FRACTION,
              memory_gb: Optional[float] = None) -> List[Pool]:
    """Decide the budget of every device `models` run on (call it once they are all loaded), say it, and start the
    pools' counts afresh; the pools."""
    pools = []
    for device in _devices(models):
        name = str(device)
        budget, source = decide(device, fraction, memory_gb)
        if budget is not None and budget <= 0:
            log.warning("memory budget on %s: nothing left for caches and model calls (%s); every turn runs alone "
                        "and may end its claim; lower the weights' precision or set --memory-gb", name, source)
        pools.append(configure(device, budget, source))
        log.info(f"memory budget on {name}: {describe(pools[-1])} ({source})")
    return pools


def summary(pools: Iterable[Pool], in_flight: Optional[int] = None) -> str:
    """The run's memory in one line: the caches' peak, the peak counted with a model call, claims in flight at most,
    caches dropped and the tokens re-encoded for them."""
    pools = list(pools)
    peak = max((p.peak_held for p in pools), default=0)
    counted = max((p.peak_counted for p in pools), default=0)
    budgets = [p.budget for p in pools if p.budget is not None]
    dropped, reencoded = sum(p.dropped for p in pools), sum(p.reencoded for p in pools)
    return (f"memory: caches held {size(peak)} at most, {size(counted)} with a model call's needs, "
            f"of {'a ' + size(max(budgets)) if budgets else 'an unlimited'} budget"
            + (f"; {in_flight} claims in flight at most" if in_flight is not None else "")
            + (f"; {dropped} caches dropped to stay within it, {reencoded} tokens re-encoded for them" if dropped
               else "; no cache dropped"))


def _devices(models: Iterable[torch.nn.Module]) -> List[torch.device]:
    """The devices `models` run on (each model's first parameter's), each once."""
    return list({str(d): d for d in (next(m.parameters()).device for m in models)}.values())


def pools_of(models: Iterable[torch.nn.Module]) -> List[Pool]:
    """The pools of the devices `models` run on, each once."""
    return [pool_for(device) for device in _devices(models)]


@contextlib.contextmanager
def kept_budgets() -> Iterator[None]:
    """Every pool's budget as it was on entry, again on exit: a run's budget (start_run) is its own, not the next
    caller's in the same process."""
    before = {key: (p.budget, p.source) for key, p in _pools.items()}
    try:
        yield
    finally:
        for key, pool in list(_pools.items()):
            if key in before:
                pool.budget, pool.source = before[key]
            else:
                pool.budget, pool.source = decide(key)
