"""A model's page ledger (debate/engine/kv_pool.py) checked whole: what the tests of shared pages assert after each
turn, and what a real run must leave at its end (`at_run_end`)."""
import contextlib

from debate.engine import kv_pool


def check(mem):
    """Every page of the arena is exactly one of held, cached (published and held by none) or free; each held page is
    listed by every cache holding it, those caches are the memory's live ones and list no page it does not count; the
    index and its reverse agree, on held or cached pages only. (held, cached, free) pages."""
    arena = set(range(mem.store.first_page, mem.store.pages))
    held, cached, free = set(mem.holders), set(mem.cached), set(mem.free_pages)
    assert len(free) == len(mem.free_pages), "a page is free twice"
    assert not (held & cached or held & free or cached & free), "a page is counted twice"
    assert held | cached | free == arena, f"pages lost: {sorted(arena - held - cached - free)}"
    live = {id(entry): entry for _, entry in mem.entries.values() if entry.pages is not None}
    for page, holding in mem.holders.items():
        assert holding, f"page {page} is held by nobody"
        for key, entry in holding.items():
            assert live.get(key) is entry and page in entry.pages, f"page {page} held by a cache that lists it not"
    for entry in live.values():
        assert all(id(entry) in mem.holders.get(page, {}) for page in entry.pages), "a cache lists a page not held"
    assert len(mem.index) == len(mem.key_of) and all(mem.index[key] == page for page, key in mem.key_of.items())
    assert set(mem.key_of) <= held | cached and cached <= set(mem.key_of), "an index entry on a free page"
    return len(held), len(cached), len(free)


@contextlib.contextmanager
def at_run_end(by_the_method=False):
    """While open, every run's end (the runner's memory line, kv_pool.summary, before the run lets its memory go)
    checks each memory's ledger; yields the list of what each end found: one (held, cached, free) per memory. With
    `by_the_method`, a cache given back only when its conversation was freed (the Memory's weak reference, a safety
    net) is noted as well, in the list's `collected`: a method that does not drop its caches holds their pages until
    its conversations go, while its other claims may need them."""
    ends = Ends()
    summary, gone = kv_pool.summary, kv_pool.Memory._gone

    def checked(pools, *args, **kwargs):
        pools = list(pools)
        try:
            ends.append([check(mem) for pool in pools for mem in pool.memories.values()])
        except AssertionError as err:  # told by the test, not raised inside the run
            ends.append([f"the ledger does not add up: {err}"])
        return summary(pools, *args, **kwargs)

    def noted(mem, key, ref):
        entry = mem.entries.get(key, (None, None))[1]
        if entry is not None and entry.pages is not None:
            ends.collected += 1
        gone(mem, key, ref)

    kv_pool.summary = checked
    if by_the_method:
        kv_pool.Memory._gone = noted  # a Memory's weak references made from now on call it
    try:
        yield ends
    finally:
        kv_pool.summary, kv_pool.Memory._gone = summary, gone


class Ends(list):
    collected = 0  # caches given back by their conversation's end, not by a drop (at_run_end's `by_the_method`)


def no_page_held(ends):
    """Each run ended with no page held by a cache, and its memories' pages all accounted for (`check`); every cache
    was dropped by the method where `at_run_end` watched for that."""
    assert ends and all(ends), "no run's end was seen, or one had no memory"
    assert all(isinstance(found, tuple) and found[0] == 0 for end in ends for found in end), ends
    assert ends.collected == 0, f"{ends.collected} caches were given back only when their conversation was freed"
