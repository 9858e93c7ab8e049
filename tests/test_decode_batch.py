"""The persistent decode batch (debate/engine/decode_batch.py): rows join at the step after a slot frees and leave at
the step they stop; a step runs only the rows in use; schema rows, sampled rows, greedy rows and rows of a LoRA role
share a step, each getting the tokens it gets alone; the place and the arena keep their memory for the run; a row
wider than a slot waits for the place to empty and the place is seen as wider slots."""
import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from debate.engine import (
    chat,
    constrained_row,
    decode_batch,
    engine,
    kv_pool,
    models,
    reference,
    schema_program,
    step_stats,
)
from tests.tiny_models import build_random_lora, build_tiny_gemma, build_tiny_llama, cpu_budget


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="module")
def tiny(path):
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


SYSTEMS = [f"Debate claim {i}. Evidence: " + "the report says so. " * (1 + i * 3 % 7) for i in range(4)]


def alone(model, tok, system, prompt, tokens, generate=reference.generate, **settings):
    conv = engine.Conversation(system=system)
    generate(model, tok, [conv], [prompt], engine.Settings(max_new_tokens=tokens, **settings))
    return conv.generated[0]


def batch_forwards(model, run):
    """run() with a hook noting every step's forward of the batch: (decode rows, prompt tokens), the decode rows'
    tokens first in the step's sequence, then the joining rows' prompt pieces (attention.Packed.rows)."""
    forwards = []

    def note(module, args, kwargs):
        packed = kwargs.get("packed")
        if packed is not None:
            forwards.append((packed.rows, kwargs["input_ids"].shape[1] - packed.rows))

    hook = model.register_forward_pre_hook(note, with_kwargs=True)
    try:
        out = run()
    finally:
        hook.remove()
    return out, forwards


def decode_rows(model, run):
    """run() with a hook counting the decode rows of every forward that carries any (decode steps and mixed ones)."""
    out, forwards = batch_forwards(model, run)
    return out, [rows for rows, _ in forwards if rows]


@pytest.fixture
def caps(monkeypatch):
    """Each reply's length set by its context (decode_batch.reply_cap, what bench_gpu.py --turn-lengths sets)."""
    lengths = {}
    monkeypatch.setattr(decode_batch, "reply_cap", lambda ids: lengths.get(len(ids), 100))
    return lengths


def test_a_row_joins_at_the_step_after_a_slot_frees_and_a_step_runs_only_the_rows_in_use(tiny, caps, monkeypatch):
    model, tok = tiny
    convs = [engine.Conversation(system=s) for s in SYSTEMS[:3]]
    prompt = "Open the debate."
    lengths = [3, 8, 5]  # ids of each reply: a stops first, c takes its slot, b ends last
    for conv, n in zip(convs, lengths):
        caps[len(chat.context_ids(tok, engine.Conversation(conv.system, [{"role": "user", "content": prompt}])))] = n
    assert len(caps) == 3
    want = [alone(model, tok, s, prompt, 12)[:n] for s, n in zip(SYSTEMS, lengths)]
    # Two slots of 256 columns, so the third row waits for one.
    monkeypatch.setattr(kv_pool, "place_geometry", lambda widths, wanted, tokens: (2, 256))
    with cpu_budget(None):
        before = step_stats.stats_for(model).tokens, step_stats.stats_for(model).row_steps
        _, rows = batch_forwards(model, lambda: engine.generate(model, tok, convs, [prompt] * 3,
                                                                engine.Settings(max_new_tokens=12)))
    assert [c.generated[0] for c in convs] == want
    # (decode rows, prompt tokens) of each forward. 1: a's and b's prompts in one forward (nothing decodes yet), their
    # first ids picked from it; a picks its last id at step 3, which the host reads once step 4 is launched (the
    # lookahead: a runs step 4 masked); c joins then and its prompt rides in step 5 beside b, which does not wait for
    # it (before, a prompt ran in a forward of its own: 11 forwards, here 10); c decodes from step 6, b leaves after its
    # last id (step 8) is read, and c runs alone in its slot until its own last one (step 9) is read.
    prompts = [len(chat.context_ids(tok, engine.Conversation(s, [{"role": "user", "content": prompt}])))
               for s in SYSTEMS[:3]]
    assert rows == [(0, prompts[0] + prompts[1])] + [(2, 0)] * 3 + [(2, prompts[2])] + [(2, 0)] * 4 + [(1, 0)]
    stats = step_stats.stats_for(model)
    assert (stats.tokens - before[0], stats.row_steps - before[1]) == (sum(lengths) - 3, 17)


def test_schema_rows_sampled_rows_and_greedy_rows_share_a_step_each_with_its_own_tokens(tiny, monkeypatch):
    """A Moderator's JSON row runs on the device as far as its program allows (forced ids, masked free text), the host
    planning only where the program needs it; a sampled row draws from its own random stream, so beside other rows it
    draws what it draws alone."""
    model, tok = tiny
    compiled = schema_program.compile_for("moderator_round", tok)
    tokens = compiled.fixed_cost + 12
    conv = engine.Conversation(system=SYSTEMS[0])
    reference.generate(model, tok, [conv], ["Judge the round."], engine.Settings(max_new_tokens=tokens),
                       schemas=[compiled])
    want_schema = conv.generated[0]
    want_greedy = alone(model, tok, SYSTEMS[1], "Argue.", tokens)
    sampled = dict(temperature=1.0, top_p=0.9)
    want_sampled = alone(model, tok, SYSTEMS[2], "Argue.", tokens, engine.generate, seed=7, **sampled)

    plans = []
    real = constrained_row.SchemaDriver.plan
    monkeypatch.setattr(constrained_row.SchemaDriver, "plan",
                        lambda self, logits, ids: plans.append(1) or real(self, logits, ids))
    convs = [engine.Conversation(system=s) for s in SYSTEMS[:3]]

    def together():
        calls = [engine.begin(model, tok, convs[:1], ["Judge the round."], engine.Settings(max_new_tokens=tokens),
                              schemas=[compiled]),
                 engine.begin(model, tok, convs[1:2], ["Argue."], engine.Settings(max_new_tokens=tokens)),
                 engine.begin(model, tok, convs[2:], ["Argue."], engine.Settings(max_new_tokens=tokens, seed=7,
                                                                                  **sampled))]
        while not all(c.done for c in calls):
            engine.advance()
        return [engine.end(c) for c in calls]

    with cpu_budget(None):
        _, rows = decode_rows(model, together)
    assert [c.generated[0] for c in convs] == [want_schema, want_greedy, want_sampled]
    assert convs[0].structured is not None and convs[0].structured["fields"]
    assert rows[0] == 3  # one step for all three kinds
    # The host planned at the start and at each of the program's turns (the label's choice, the ends of texts): a few
    # times in the reply's ids, the device picking the rest.
    assert 2 <= len(plans) <= len(want_schema) // 4


def test_rows_of_a_lora_role_and_of_the_base_share_a_step_with_each_roles_tokens(path, tmp_path):
    adapter = build_random_lora(path, tmp_path / "adapter")
    roles = models.load_roles({"debater": path, "moderator": path}, {"moderator": str(adapter)}, use_4bit=False)
    debater, moderator = roles["debater"], roles["moderator"]
    assert debater.model is moderator.model  # one base, two roles
    want = {}
    for role in (debater, moderator):
        with models.adapter_scope(role):
            want[role.adapter] = alone(role.model, role.tokenizer, SYSTEMS[0], "Speak.", 10)
    assert want[None] != want[moderator.adapter]  # the adapter changes the tokens: the comparison means something
    convs = [engine.Conversation(system=SYSTEMS[0]) for _ in range(4)]

    def together():
        calls = [engine.begin(role.model, role.tokenizer, [conv], ["Speak."], engine.Settings(max_new_tokens=10),
                              adapter=role.adapter) for role, conv in zip((debater, moderator) * 2, convs)]
        while not all(c.done for c in calls):
            engine.advance()
        return [engine.end(c) for c in calls]

    with cpu_budget(None):
        _, rows = decode_rows(debater.model, together)
    assert [c.generated[0] for c in convs] == [want[None], want[moderator.adapter]] * 2
    assert rows[0] == 4
    scalings = [layer.scaling for layer in decode_batch.row_adapters.lora_layers(debater.model)]
    assert all(isinstance(v, float) for s in scalings for v in s.values())  # the model as the roles left it


def test_the_place_and_the_arena_keep_their_memory_and_caches_wait_in_pages(tiny):
    model, tok = tiny
    with cpu_budget(None) as pool:
        convs = [engine.Conversation(system=s) for s in SYSTEMS]
        engine.generate(model, tok, convs, ["Turn 0."] * 4, engine.Settings(max_new_tokens=6))
        mem = pool.memories[model]
        addresses = [t.data_ptr() for pair in mem.store.flat for t in pair]
        for turn in range(1, 4):
            engine.generate(model, tok, convs, [f"Turn {turn}."] * 4, engine.Settings(max_new_tokens=6))
            assert pool.memories[model] is mem
            assert [t.data_ptr() for pair in mem.store.flat for t in pair] == addresses
        pages = sum(len(c.kv.pages) for c in convs)
        assert mem.held() == pages * 64 * mem.token_bytes == kv_pool.held_by(convs)
        assert all(len(c.kv.pages) == -(-len(c.cached_ids) // 64) for c in convs)
        convs[0].drop_cache()
        assert mem.held() == kv_pool.held_by(convs[1:])


def test_a_row_wider_than_a_slot_waits_for_the_place_to_empty_and_the_slots_are_widened(tiny, monkeypatch):
    model, tok = tiny
    short = [engine.Conversation(system=s) for s in SYSTEMS[:3]]
    long = engine.Conversation(system="A long record. " * 40)
    prompts = ["Go."] * 4
    width = len(chat.context_ids(tok, engine.Conversation(long.system, [{"role": "user", "content": "Go."}]))) + 6
    assert 256 < width <= 768
    want = [alone(model, tok, c.system, "Go.", 6) for c in short + [long]]
    # A memory of 1,024 + 64 x 64 tokens, its place first seen as 4 slots of 256: the long row fits a slot only when
    # the place is seen anew, as wide as it needs, once the short rows have left.
    monkeypatch.setattr(kv_pool.memory, "kv_plan", lambda *a, **k: {"reserve": 0, "tokens": 1024 + 64 * 64})
    first = [True]

    def geometry(widths, wanted, tokens):
        if first.pop() if first else False:
            return 4, 256
        wide = -(-max(widths) // 256) * 256
        return 1024 // wide, wide

    monkeypatch.setattr(kv_pool, "place_geometry", geometry)
    with cpu_budget(None) as pool:
        pool.rows = 4
        _, rows = decode_rows(model, lambda: engine.generate(model, tok, short + [long], prompts,
                                                             engine.Settings(max_new_tokens=6)))
        store = pool.memories[model].store
        assert pool.reshapes == 1 and store.columns >= width and store.rows == 1024 // store.columns
    assert [c.generated[0] for c in short + [long]] == want
    # the short rows first, together (their last ids picked at step 5, read once step 6 is launched), then the long
    # one alone (its last at step 5 of its own, read at step 6)
    assert rows == [3] * 6 + [1] * 6


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """Gemma 3's shape: sliding-window layers (window 16) beside a full-attention one."""
    path = build_tiny_gemma(tmp_path_factory.mktemp("gemma"), seed=0)
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("family", ["tiny", "gemma"])
def test_a_long_prompt_rides_beside_decoding_rows_over_several_steps_and_no_row_waits(family, request):
    """A joining row's prompt is fed inside the decode steps, at most Settings.prefill_tokens a step: a row that
    decodes feeds a token at every step while a longer prompt is spread over several, and each row gets the tokens it
    gets alone (Gemma 3's sliding layers: pieces that cross its 16-token window)."""
    model, tok = request.getfixturevalue(family)
    systems = ["Claim.", "Debate claim 9. Evidence: " + "the report says so, and the data agree. " * 12]
    prompts = ["Open.", "Argue the claim at length."]
    budget = 48
    want = [alone(model, tok, s, p, 10) for s, p in zip(systems, prompts)]
    contexts = [len(chat.context_ids(tok, engine.Conversation(s, [{"role": "user", "content": p}])))
                for s, p in zip(systems, prompts)]
    assert contexts[0] < budget < 3 * budget < contexts[1]  # the short prompt fits a step, the long one takes several
    convs = [engine.Conversation(system=s) for s in systems]
    # The model's stats gather over this module's tests: this run's counts are what they gained over it.
    before = step_stats.stats_for(model).as_record()
    with cpu_budget(None):
        _, forwards = batch_forwards(model, lambda: engine.generate(
            model, tok, convs, prompts, engine.Settings(max_new_tokens=10, prefill_tokens=budget)))
    assert [c.generated[0] for c in convs] == want
    assert sum(tokens for _, tokens in forwards) == sum(contexts)
    assert all(tokens <= budget for _, tokens in forwards)
    # The first forward carries the short prompt whole and the long one's first piece; from then on the short row
    # decodes at every step, beside the long prompt's pieces, until that prompt is fed and both decode.
    feeding = [i for i, (_, tokens) in enumerate(forwards) if tokens]
    assert forwards[0] == (0, budget) and len(feeding) == -(-sum(contexts) // budget)
    assert all(forwards[i][0] >= 1 for i in feeding[1:])
    assert feeding == list(range(len(feeding)))  # no step without a piece while a prompt is left: none idles
    after = step_stats.stats_for(model).as_record()
    counts = ("mixed_forwards", "mixed_decode_rows", "prefill_only_forwards", "prefill_tokens")
    gained = {k: after[k] - before[k] for k in counts}
    # the stats count what the hook saw: the first forward alone, every later piece beside decoding rows
    assert gained == {"mixed_forwards": len(feeding) - 1, "mixed_decode_rows": sum(forwards[i][0] for i in feeding[1:]),
                      "prefill_only_forwards": 1, "prefill_tokens": sum(contexts)}


def test_with_lookahead_rows_leave_a_step_later_with_the_same_tokens(tiny, caps, monkeypatch):
    """On CUDA the host launches a step before it reads which rows the step before stopped (decode_batch.LOOKAHEAD):
    a stopped row runs one more step, masked, and leaves then; its tokens, its cache and every other row's are as
    without it."""
    model, tok = tiny
    prompts = [f"Round {i}." for i in range(4)]
    for i, system in enumerate(SYSTEMS):
        caps[len(chat.context_ids(tok, engine.Conversation(system, [{"role": "user", "content": prompts[i]}])))] = \
            2 + 3 * i

    def debate(lookahead):
        monkeypatch.setattr(decode_batch, "LOOKAHEAD", lookahead)
        convs = [engine.Conversation(system=s) for s in SYSTEMS]
        with cpu_budget(None):
            _, rows = decode_rows(model, lambda: [engine.generate(model, tok, convs, prompts,
                                                                  engine.Settings(max_new_tokens=12))
                                                  for _ in range(2)])
        return convs, rows

    plain, plain_rows = debate(False)
    ahead, ahead_rows = debate(True)
    assert [c.generated for c in ahead] == [c.generated for c in plain]
    assert [c.cached_ids for c in ahead] == [c.cached_ids for c in plain]
    assert len(ahead_rows) > len(plain_rows) and sum(ahead_rows) > sum(plain_rows)


def test_a_place_that_grows_moves_the_pages_in_its_way_and_their_caches_still_serve(tiny, monkeypatch):
    """Short conversations' caches wait in pages, taken from the last page down; a wide row then needs a wider place,
    which grows over pages they hold: those are moved past its new end and the next turns read them back, the same
    tokens as the reference."""
    model, tok = tiny
    short = [engine.Conversation(system=s) for s in SYSTEMS]
    long = engine.Conversation(system="A long record. " * 40)
    # 256 + 14 x 64 tokens: the place first one slot of 256, pages 4 to 17 past it; then one slot of 768 (pages 12 on).
    monkeypatch.setattr(kv_pool.memory, "kv_plan", lambda *a, **k: {"reserve": 0, "tokens": 256 + 14 * 64})
    monkeypatch.setattr(kv_pool, "place_geometry",
                        lambda widths, wanted, tokens: (1, 256) if max(widths) <= 256 else (1, 768))
    settings = engine.Settings(max_new_tokens=6)
    with cpu_budget(None) as pool:
        engine.generate(model, tok, short, ["Turn 0."] * 4, settings)
        waiting = [c for c in short if c.cached_ids]  # the pages may not hold all four
        assert len(waiting) >= 3 and min(p for c in waiting for p in c.kv.pages) < 12  # pages the place will need
        for conv in waiting[:2]:  # their pages, the last ones, are free: room to move the others' past the new end
            conv.drop_cache()
        moved, dropped = pool.moved, pool.dropped
        engine.generate(model, tok, [long], ["Go."], engine.Settings(max_new_tokens=6, reuse_cache=False))
        assert pool.reshapes == 1 and pool.moved > moved and pool.dropped == dropped
        assert all(min(c.kv.pages) >= 12 for c in waiting[2:])
        for conv in waiting[2:]:
            engine.generate(model, tok, [conv], ["Turn 1."], settings)
    moved_convs = waiting[2:]
    want = [engine.Conversation(system=c.system) for c in moved_convs]
    for turn in range(2):
        reference.generate(model, tok, want, [f"Turn {turn}."] * len(want), settings)
    assert [c.generated for c in moved_convs] == [c.generated for c in want]
    # The moved caches served the second turns: only their new tokens were encoded.
    assert all(c.encoded_tokens < c.prompt_tokens for c in moved_convs)
