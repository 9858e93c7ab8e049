"""Pages shared by prefix (debate/engine/kv_pool.py): a full page is keyed by its ids, the page before it and the
adapter that made it; a context that starts like another takes that one's pages instead of encoding them, whether
they were written at an earlier turn or by a row that joined a moment before in the same step; pages nobody holds
stay indexed until their room is needed; the tokens are those of the plain path."""
import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from debate.engine import chat, engine, kv_pool, kv_store, reference
from tests.tiny_models import build_tiny_llama, cpu_budget

# Four pages and more of the same system prompt, then each conversation its own question.
SYSTEM = "You judge claims against the evidence. Evidence: " + "the report says the figures were revised. " * 30
PAGE = kv_store.PAGE


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_llama(tmp_path_factory.mktemp("tiny"), seed=0)
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def context(tok, prompt):
    return chat.context_ids(tok, engine.Conversation(SYSTEM, [{"role": "user", "content": prompt}]))


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
            assert mem.held() + len(mem.cached) * PAGE * mem.token_bytes + len(mem.free_pages) * PAGE * \
                mem.token_bytes == (mem.store.pages - mem.store.first_page) * PAGE * mem.token_bytes
            assert set(mem.index.values()) == set(mem.key_of) and not set(mem.cached) & set(mem.holders)
            conv.drop_cache()
            assert firsts[-1] in mem.index  # unheld, still indexed
        assert pool.dropped == 0 and firsts[0] not in mem.index  # the first one's pages gave way
