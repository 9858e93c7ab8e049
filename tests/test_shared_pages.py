"""Pages shared by prefix (debate/engine/kv_pool.py): a full page is keyed by its ids, the page before it and the
adapter that made it; a context that starts like another takes that one's pages instead of encoding them, whether
they were written at an earlier turn or by a row that joined a moment before in the same step; pages nobody holds
stay indexed until their room is needed; a page or a conversation's cache is read only by rows of the adapter and the
model that wrote it; the tokens are those of the plain path."""
import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from debate.engine import chat, engine, kv_pool, kv_store, models, reference
from tests import page_ledger
from tests.tiny_models import build_random_lora, build_tiny_llama, cpu_budget

# Four pages and more of the same system prompt, then each conversation its own question.
SYSTEM = "You judge claims against the evidence. Evidence: " + "the report says the figures were revised. " * 30
PAGE = kv_store.PAGE


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="module")
def tiny(path):
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def roles(path, tmp_path_factory):
    """One base model as two roles: the base alone (a Debater's) and with a random LoRA adapter (a Moderator's)."""
    adapter = build_random_lora(path, tmp_path_factory.mktemp("lora"))
    loaded = models.load_roles({"debater": path, "moderator": path}, {"moderator": str(adapter)}, use_4bit=False)
    return loaded["debater"], loaded["moderator"]


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """Another model of the same shapes and tokenizer (other weights)."""
    return AutoModelForCausalLM.from_pretrained(build_tiny_llama(tmp_path_factory.mktemp("other"), seed=1)).eval()


def context(tok, prompt):
    return chat.context_ids(tok, engine.Conversation(SYSTEM, [{"role": "user", "content": prompt}]))


def turn(role, conv, prompt, generate=engine.generate, tokens=8):
    """One turn of `conv` spoken as `role` (its adapter in effect, as the methods speak); the context tokens it took
    from caches instead of encoding them."""
    before = conv.prompt_tokens - conv.encoded_tokens
    with models.adapter_scope(role):
        generate(role.model, role.tokenizer, [conv], [prompt], engine.Settings(max_new_tokens=tokens))
    return conv.prompt_tokens - conv.encoded_tokens - before


def common_pages(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n // PAGE


def test_page_keys_name_a_pages_whole_prefix_and_its_adapter():
    ids = list(range(3 * PAGE))
    keys = kv_pool.page_keys(ids, None, 3)
    assert len(set(keys)) == 3
    assert kv_pool.page_keys(ids, "moderator", 3)[0] != keys[0]  # an adapter's keys and values are not the base's
    other = [7] + ids[1:]  # the same second and third pages after another first one
    assert kv_pool.page_keys(other, None, 3)[1:] != keys[1:]
    assert kv_pool.page_keys(ids[:2 * PAGE], None, 2) == keys[:2]


def test_a_context_that_starts_like_another_takes_its_pages_and_gets_the_plain_paths_tokens(tiny):
    model, tok = tiny
    prompts = ["Is the claim supported?", "Argue that the claim is false."]
    shared = common_pages(context(tok, prompts[0]), context(tok, prompts[1]))
    assert shared >= 4
    want = []
    for prompt in prompts:
        conv = engine.Conversation(SYSTEM)
        reference.generate(model, tok, [conv], [prompt], engine.Settings(max_new_tokens=10))
        want.append(conv.generated[0])
    with cpu_budget(None) as pool:
        convs = [engine.Conversation(SYSTEM) for _ in prompts]
        for conv, prompt in zip(convs, prompts):  # one after the other, as a claim's two Debaters speak
            engine.generate(model, tok, [conv], [prompt], engine.Settings(max_new_tokens=10))
        assert [c.generated[0] for c in convs] == want
        assert convs[0].encoded_tokens == convs[0].prompt_tokens  # nothing to take at first
        assert convs[1].prompt_tokens - convs[1].encoded_tokens == shared * PAGE
        assert pool.shared == shared * PAGE
        mem = pool.memories[model]
        assert mem.shared_pages() == shared and mem.held() < kv_pool.held_by(convs)  # one copy of the shared pages
        for conv in convs:
            conv.drop_cache()
        assert mem.held() == 0 and len(mem.cached) >= shared  # nobody holds them; still indexed


@pytest.mark.parametrize("budget", [512, 64])
def test_rows_joining_in_one_step_take_the_pages_the_first_ones_prefill_published(tiny, budget):
    """Three seats joining together: the first encodes the shared pages, the others wait while it writes them (its
    prompt over several steps at a budget of 64 prompt tokens a step) and take them once published."""
    model, tok = tiny
    prompts = ["Judge seat 1: your verdict?", "Judge seat 2: your verdict?", "Judge seat 3: your verdict?"]
    shared = min(common_pages(context(tok, prompts[0]), context(tok, p)) for p in prompts[1:])
    assert shared >= 4
    with cpu_budget(None) as pool:
        convs = [engine.Conversation(SYSTEM) for _ in prompts]
        engine.generate(model, tok, convs, prompts, engine.Settings(max_new_tokens=6, prefill_tokens=budget))
        assert [c.prompt_tokens - c.encoded_tokens for c in convs] == [0, shared * PAGE, shared * PAGE]
        assert pool.shared == 2 * shared * PAGE
        for conv in convs:
            conv.drop_cache()
    for conv, prompt in zip(convs, prompts):
        alone = engine.Conversation(SYSTEM)
        reference.generate(model, tok, [alone], [prompt], engine.Settings(max_new_tokens=6))
        assert conv.generated[0] == alone.generated[0]


def test_pages_nobody_holds_give_way_when_a_cache_needs_their_room(tiny, monkeypatch):
    """A memory of 16 pages past a one-slot place: each conversation's cache takes 13 or 14 pages of its own (its
    system prompt differs from the first token), so the second one's needs the room of the first one's, which it gave
    back (a dropped cache, its pages indexed but unheld): the least recently used go, and the index forgets them."""
    model, tok = tiny
    prompts = [f"Case {i}. " + "why? " * (3 * i) for i in range(3)]
    width = max(len(context(tok, p)) for p in prompts) + 24
    columns = -(-width // 256) * 256
    monkeypatch.setattr(kv_pool.memory, "kv_plan", lambda *a, **k: {"reserve": 0, "tokens": columns + 16 * PAGE})
    monkeypatch.setattr(kv_pool, "place_geometry", lambda widths, wanted, tokens: (1, columns))
    with cpu_budget(None) as pool:
        convs, firsts = [], []
        for prompt in prompts:
            conv = engine.Conversation(prompt + SYSTEM)  # a system prompt of its own from its first page
            engine.generate(model, tok, [conv], [prompt], engine.Settings(max_new_tokens=8))
            convs.append(conv)
            mem = pool.memories[model]
            firsts.append(kv_pool.page_keys(conv.cached_ids, None, 1)[0])
            assert conv.kv.pages is not None  # its cache kept: the unheld pages made room
            page_ledger.check(mem)
            conv.drop_cache()
            assert firsts[-1] in mem.index  # unheld, still indexed
        assert pool.dropped == 0 and firsts[0] not in mem.index  # the first one's pages gave way


def test_a_conversations_cache_serves_only_the_adapter_that_wrote_it(roles):
    """One conversation object spoken by a LoRA Moderator and by the base in turn (as a conversation continued after
    its adapter changed): its cache is read again by the adapter that wrote it, never by another, which encodes the
    context anew; every reply is the plain path's (issue 58)."""
    debater, moderator = roles
    speakers, prompts = [moderator, moderator, debater, moderator], [f"Turn {i}." for i in range(4)]
    want = engine.Conversation(SYSTEM)
    for role, prompt in zip(speakers, prompts):
        turn(role, want, prompt, reference.generate)
    conv = engine.Conversation(SYSTEM)
    reused, cached = [], []
    with cpu_budget(None) as pool:
        for role, prompt in zip(speakers, prompts):
            reused.append(turn(role, conv, prompt))
            cached.append(len(conv.cached_ids))
            page_ledger.check(pool.memories[debater.model])
        conv.drop_cache()
    assert conv.generated == want.generated
    assert reused[:3] == [0, cached[0], 0]  # its own cache under the same adapter, none under another
    # The Moderator again: the pages its first turns published (whole pages), not the base's cache of turn 2.
    assert 0 < reused[3] <= cached[1] and reused[3] % PAGE == 0


def test_pages_are_never_shared_across_adapters_whichever_writes_first(roles):
    """The 808-token system prompt (12 full pages) in rows of the base and of a LoRA role: a row takes only the pages
    its own adapter wrote, whether the other wrote them first, after, or in the same step; each gets the plain path's
    tokens. Issue 60: with the adapter dropped where the batch hands it to the memory, the LoRA row was served 768
    tokens of the base's pages and its reply changed."""
    debater, moderator = roles
    prompts = ["Speak.", "Again."]
    want = {}
    for role in roles:
        conv = engine.Conversation(SYSTEM)
        for prompt in prompts:
            turn(role, conv, prompt, reference.generate)
        want[role.adapter] = conv.generated
    assert want[None] != want[moderator.adapter]  # the adapter changes the tokens: the comparison means something
    pages = (len(context(debater.tokenizer, prompts[0])) - 1) // PAGE
    assert pages >= 12
    for first, second in ((debater, moderator), (moderator, debater)):
        convs = [engine.Conversation(SYSTEM) for _ in range(3)]
        with cpu_budget(None) as pool:
            assert turn(first, convs[0], prompts[0]) == 0
            assert turn(second, convs[1], prompts[0]) == 0  # none of the other adapter's pages
            assert turn(second, convs[2], prompts[0]) == pages * PAGE  # its own adapter's pages do serve
            for role, conv in ((first, convs[0]), (second, convs[1])):
                own = len(conv.cached_ids)
                assert turn(role, conv, prompts[1]) == own  # its own cache, whole
            page_ledger.check(pool.memories[debater.model])
            for conv in convs:
                conv.drop_cache()
        assert convs[0].generated == want[first.adapter] and convs[1].generated == want[second.adapter]
        assert convs[2].generated[0] == want[second.adapter][0]

    # Both at once: two rows joining in one step, the prompts of both in its forward (neither waits for the
    # other's pages, which it could not take).
    convs = [engine.Conversation(SYSTEM) for _ in roles]
    forwards = []
    hook = debater.model.register_forward_pre_hook(
        lambda module, args, kwargs: forwards.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    try:
        with cpu_budget(None):
            calls = [engine.begin(role.model, role.tokenizer, [conv], prompts[:1],
                                  engine.Settings(max_new_tokens=8, prefill_tokens=4096), adapter=role.adapter)
                     for role, conv in zip(roles, convs)]
            while not all(call.done for call in calls):
                engine.advance()
            for call in calls:
                engine.end(call)
            for conv in convs:
                conv.drop_cache()
    finally:
        hook.remove()
    assert forwards[0] == sum(c.prompt_tokens for c in convs) and all(c.encoded_tokens == c.prompt_tokens
                                                                      for c in convs)
    assert [c.generated[0] for c in convs] == [want[role.adapter][0] for role in roles]


def test_pages_and_caches_are_never_shared_across_models(tiny, other):
    """Two models of one shape on one device: each has its own Memory (its own index), so neither reads a page the
    other wrote, and a conversation moved to the other model encodes its context again; the plain path's tokens."""
    model, tok = tiny
    plan = [(model, "Turn 0."), (other, "Turn 1."), (model, "Turn 2.")]
    want = engine.Conversation(SYSTEM)
    for m, prompt in plan:
        reference.generate(m, tok, [want], [prompt], engine.Settings(max_new_tokens=8))
    want_other = engine.Conversation(SYSTEM)
    reference.generate(other, tok, [want_other], ["Turn 0."], engine.Settings(max_new_tokens=8))
    assert want_other.generated[0] != want.generated[0]  # other weights, other tokens
    moved, fresh = engine.Conversation(SYSTEM), engine.Conversation(SYSTEM)

    def reused(m, conv, prompt):
        before = conv.prompt_tokens - conv.encoded_tokens
        engine.generate(m, tok, [conv], [prompt], engine.Settings(max_new_tokens=8))
        return conv.prompt_tokens - conv.encoded_tokens - before

    with cpu_budget(None) as pool:
        assert reused(model, moved, "Turn 0.") == 0
        first = len(moved.cached_ids)
        assert reused(other, fresh, "Turn 0.") == 0  # the same context: none of the first model's pages
        # Moved to the other model: the pages that model wrote for `fresh` (the system prompt's), not its own cache,
        # which the first model wrote and which holds more.
        taken = reused(other, moved, "Turn 1.")
        assert taken == len(fresh.cached_ids) // PAGE * PAGE < first
        assert 0 < reused(model, moved, "Turn 2.") <= first  # the first model's own pages again
        assert pool.memories[model] is not pool.memories[other]
        for mem in pool.memories.values():
            page_ledger.check(mem)
        moved.drop_cache()
        fresh.drop_cache()
    assert moved.generated == want.generated and fresh.generated == want_other.generated


# -- shared prefixes under tight budgets ------------------------------------------------------------------------------

def arena(monkeypatch, pages, columns=1024, rows=1):
    """The next Memory made (kv_pool's plan and geometry replaced): `rows` slots of `columns` columns, then `pages`
    pages; a row wider than a slot sees the place anew as one slot of layout["wide"] columns. The layout, which a test
    sets before the Memory is made (its pages) or before a wide row comes (its columns)."""
    layout = {"pages": pages, "wide": None}
    monkeypatch.setattr(kv_pool.memory, "kv_plan",
                        lambda *a, **k: {"reserve": 0, "tokens": rows * columns + layout["pages"] * PAGE})
    monkeypatch.setattr(kv_pool, "place_geometry", lambda widths, wanted, tokens:
                        (rows, columns) if max(widths) <= columns else (1, layout["wide"]))
    return layout


def turns(model, tok, plan, settings=engine.Settings(max_new_tokens=8), generate=engine.generate, mem=None):
    """Each (conversation, prompt) of `plan` spoken in turn; the context tokens each took from caches. With `mem`,
    its page ledger checked after every turn."""
    reused = []
    for conv, prompt in plan:
        before = conv.prompt_tokens - conv.encoded_tokens
        generate(model, tok, [conv], [prompt], settings)
        reused.append(conv.prompt_tokens - conv.encoded_tokens - before)
        if mem is not None:
            page_ledger.check(mem())
    return reused


def plain(model, tok, systems, plan, settings=engine.Settings(max_new_tokens=8)):
    """The plain path's replies of conversations of `systems` spoken as `plan` says ((index, prompt) pairs)."""
    convs = [engine.Conversation(s) for s in systems]
    turns(model, tok, [(convs[i], prompt) for i, prompt in plan], settings, reference.generate)
    return [c.generated for c in convs]


def test_a_cache_dropped_for_room_leaves_the_pages_another_cache_holds(tiny, monkeypatch):
    """Two conversations share the system prompt's 12 pages; a third one's cache needs the room of the second one's
    own pages, one page more than is free: the second (the newest) is dropped, and the pages it shared stay held by
    the first, whose next turn reads them. Every reply is the plain path's; the pages add up after every turn."""
    model, tok = tiny
    systems = [SYSTEM, SYSTEM, "Case 3. " + SYSTEM]  # the third shares no page: its first one differs
    prompts = ["Is the claim supported?", "Argue that the claim is false." + " Why?" * 30, "Is the claim supported?"]
    layout = arena(monkeypatch, pages=200)
    with cpu_budget(None) as pool:  # room for all: the pages each cache takes
        convs = [engine.Conversation(s) for s in systems]
        turns(model, tok, zip(convs, prompts))
        shared, sizes = pool.memories[model].shared_pages(), [len(c.kv.pages) for c in convs]
        for conv in convs:
            conv.drop_cache()
    assert shared >= 12 and sizes[1] - shared >= 2
    layout["pages"] = sizes[0] + (sizes[1] - shared) + sizes[2] - 1
    convs = [engine.Conversation(s) for s in systems]
    with cpu_budget(None) as pool:
        def mem():
            return pool.memories[model]

        turns(model, tok, zip(convs[:2], prompts), mem=mem)
        both = [page for page, holding in mem().holders.items() if len(holding) == 2]
        first = list(convs[0].kv.pages)
        assert len(both) == shared and pool.dropped == 0
        turns(model, tok, [(convs[2], prompts[2])], mem=mem)
        assert convs[1].kv.pages is None and convs[2].kv.pages is not None and pool.dropped == 1
        assert convs[0].kv.pages == first and all(list(mem().holders[p]) == [id(convs[0].kv)] for p in both)
        cached = len(convs[0].cached_ids)
        reused = turns(model, tok, [(convs[0], "Again."), (convs[1], "Again.")], mem=mem)
        assert reused[0] == cached  # the first one's cache, the shared pages in it, read back whole
        for conv in convs:
            conv.drop_cache()
        assert page_ledger.check(mem())[0] == 0
    want = plain(model, tok, systems, [(0, prompts[0]), (1, prompts[1]), (2, prompts[2]), (0, "Again."),
                                       (1, "Again.")])
    assert [c.generated for c in convs] == want


def test_a_place_that_grows_moves_the_pages_two_caches_hold_and_both_read_them_after(tiny, monkeypatch):
    """Two conversations share the system prompt's pages, which lie where a wider place will need them (a third,
    larger cache took the last pages first, and gave them back): a row wider than a slot moves every page in the way
    once, the shared ones included, past the place's new end, and both conversations, and a new one starting like
    them, read them there. Every reply is the plain path's; the pages add up after every turn."""
    model, tok = tiny
    systems = ["Case d. " + SYSTEM + " The minutes were read." * 10, SYSTEM, SYSTEM, SYSTEM]
    prompts = ["Go.", "Is the claim supported?", "Argue that the claim is false.", "Is the claim supported?"]
    layout = arena(monkeypatch, pages=200)
    with cpu_budget(None) as pool:  # room for all: the pages each cache takes
        convs = [engine.Conversation(s) for s in systems[:3]]
        turns(model, tok, zip(convs, prompts))
        shared, sizes = pool.memories[model].shared_pages(), [len(c.kv.pages) for c in convs]
        for conv in convs:
            conv.drop_cache()
    assert shared >= 12 and sizes[0] >= sizes[1] + sizes[2] - shared  # room where the first one's pages were
    layout["pages"] = sum(sizes) - shared + 2  # and two pages nearest the place free
    long = engine.Conversation("A long record. " * 100)
    width = len(chat.context_ids(tok, engine.Conversation(long.system, [{"role": "user", "content": "Go."}]))) + 8
    convs = [engine.Conversation(s) for s in systems]
    with cpu_budget(None) as pool:
        def mem():
            return pool.memories[model]

        turns(model, tok, zip(convs[:3], prompts), mem=mem)
        layout["wide"] = min(convs[0].kv.pages) * PAGE  # the place's new end: the largest cache's first page
        convs[0].drop_cache()
        both = sorted(page for page, holding in mem().holders.items() if len(holding) == 2)
        assert 1024 < width <= layout["wide"] and len(both) == shared and max(both) < layout["wide"] // PAGE
        in_the_way = len(mem().holders)
        turns(model, tok, [(long, "Go.")], engine.Settings(max_new_tokens=8, reuse_cache=False), mem=mem)
        assert pool.reshapes == 1 and pool.moved == in_the_way and pool.dropped == 0
        moved = sorted(page for page, holding in mem().holders.items() if len(holding) == 2)
        assert len(moved) == shared and min(moved) >= layout["wide"] // PAGE
        cached = [len(c.cached_ids) for c in convs[1:3]]
        reused = turns(model, tok, [(convs[1], "Again."), (convs[2], "Again."), (convs[3], prompts[3])], mem=mem)
        assert reused[:2] == cached and reused[2] >= shared * PAGE  # the moved pages serve, through the index too
        for conv in convs:
            conv.drop_cache()
    want = plain(model, tok, systems, [(1, prompts[1]), (2, prompts[2]), (1, "Again."), (2, "Again."),
                                       (3, prompts[3])])
    assert [c.generated for c in convs[1:]] == want[1:]


def test_a_prompt_published_with_no_free_page_while_other_rows_wait_drops_nothing(tiny, monkeypatch):
    """Waiting caches fill every page but three; three judge seats read one case file in a place of two slots (the
    third waits in line): the first writes the file's pages while the second waits for them, and publishes three,
    the last free ones, then none; once its prompt is in, the second takes those three and encodes the rest.
    Publishing drops no cache and takes no held page; the caches make room when they are stored, as ever. Every reply
    is the plain path's; the pages add up after every turn."""
    model, tok = tiny
    bystanders = [f"Bystander {i}. " + "the minutes were read. " * 20 for i in range(4)]
    seats = [f"Judge seat {i}: your verdict?" for i in range(1, 4)]
    layout = arena(monkeypatch, pages=200, rows=2)
    with cpu_budget(None) as pool:  # room for all: the pages the waiting caches take
        convs = [engine.Conversation(s) for s in bystanders]
        turns(model, tok, [(conv, "Go.") for conv in convs])
        need = sum(len(c.kv.pages) for c in convs)
        assert pool.memories[model].shared_pages() == 0
        for conv in convs:
            conv.drop_cache()
    layout["pages"] = need + 3
    publish, publishes = kv_pool.Memory.publish, []

    def watched(mem, slot, ids, adapter):
        missing = sum(key not in mem.index for key in kv_pool.page_keys(ids, adapter, len(ids) // PAGE))
        free, queued = len(mem.free_pages), len(mem.batch.queue)
        waiting = sum(not row.loaded for row in mem.batch.joining.values())

        def seen():
            return mem.pool.dropped, {page: set(holding) for page, holding in mem.holders.items()}

        before = seen()
        publish(mem, slot, ids, adapter)
        assert seen() == before, "publishing dropped a cache or took a held page"
        publishes.append((free, missing, queued + waiting))

    monkeypatch.setattr(kv_pool.Memory, "publish", watched)
    others = [engine.Conversation(s) for s in bystanders]
    judges = [engine.Conversation(SYSTEM) for _ in seats]
    with cpu_budget(None) as pool:
        def mem():
            return pool.memories[model]

        turns(model, tok, [(conv, "Go.") for conv in others], mem=mem)
        assert len(mem().free_pages) == 3 and not mem().cached
        engine.generate(model, tok, judges, seats, engine.Settings(max_new_tokens=8, prefill_tokens=64))
        page_ledger.check(mem())
        starved = [(missing, waiting) for free, missing, waiting in publishes if free == 0 and missing]
        assert starved and all(waiting for _, waiting in starved[:3])  # no free page, pages to publish, rows waiting
        assert pool.dropped > 0  # the seats' caches made their room when they were stored
        assert [c.prompt_tokens - c.encoded_tokens for c in judges][:2] == [0, 3 * PAGE]
        for conv in others + judges:
            conv.drop_cache()
        assert page_ledger.check(mem())[0] == 0
    assert [c.generated for c in others] == plain(model, tok, bystanders, [(i, "Go.") for i in range(4)])
    for conv, seat in zip(judges, seats):
        assert conv.generated == plain(model, tok, [SYSTEM], [(0, seat)])[0]
