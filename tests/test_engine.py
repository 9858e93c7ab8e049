"""The engine's promises: cache reuse and batching never change greedy tokens; reuse encodes less."""
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from debate.engine import chat, engine, kv_store, ram, reference, schema_program
from tests.tiny_models import build_tiny_gemma, build_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_llama(tmp_path_factory.mktemp("tiny"), seed=0)
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """Gemma 3's shape: sliding-window layers (window 16) beside a full-attention one, Gemma's turn format."""
    path = build_tiny_gemma(tmp_path_factory.mktemp("gemma"), seed=0)
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.fixture(params=["llama", "gemma"])
def family(request):
    return request.getfixturevalue("tiny" if request.param == "llama" else request.param)


# Different lengths on purpose: rows of a batch must be padded and must not disturb each other.
SYSTEMS = [f"Debate claim {i}. Evidence: " + "the report says so. " * (i * 5 % 11) for i in range(8)]


def debate_like(model, tok, reuse, batch_size, turns=3, max_new_tokens=12, generate=engine.generate,
                schema_name=None, systems=SYSTEMS, **extra):
    settings = engine.Settings(max_new_tokens=max_new_tokens, reuse_cache=reuse, **extra)
    compiled = schema_program.compile_for(schema_name, tok) if schema_name else None
    convs = [engine.Conversation(system=s) for s in systems]
    for turn in range(turns):
        for start in range(0, len(convs), batch_size):
            rows = range(start, min(len(convs), start + batch_size))
            generate(model, tok, [convs[i] for i in rows],
                     [f"Round {turn}: answer claim {i}." + " Really?" * (i % 3) for i in rows], settings,
                     schemas=[compiled] * len(rows) if compiled else None)
    return convs


def test_greedy_tokens_equal_the_reference_path_for_llama_and_gemma(family):
    """The reference decodes each conversation alone with full forward passes and no cache; the engine's
    batches (left padding, cached prefixes, rows re-encoding part of their cache) must give its tokens."""
    model, tok = family
    kwargs = dict(max_new_tokens=6, systems=SYSTEMS[:4])
    want = debate_like(model, tok, False, 1, generate=reference.generate, **kwargs)
    tokens = [t for c in want for turn in c.generated for t in turn]
    assert len(set(tokens)) > 10  # the model does not just repeat one token: the comparison means something
    # The contexts outgrow Gemma's 16-token window several times over: its sliding layers really slide.
    assert want[-1].prompt_tokens / 3 > 4 * 16
    for reuse in (True, False):
        for batch_size in (1, 3, 4):
            got = debate_like(model, tok, reuse, batch_size, **kwargs)
            assert [c.generated for c in got] == [c.generated for c in want], (reuse, batch_size)
            assert [c.messages for c in got] == [c.messages for c in want]
            assert [c.prompt_tokens for c in got] == [c.prompt_tokens for c in want]
            assert [c.completion_tokens for c in got] == [c.completion_tokens for c in want]


def test_the_ram_available_is_the_least_of_the_kernels_estimate_and_every_cgroup_limit_above(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16000000 kB\nMemFree:  1000 kB\nMemAvailable:    8000000 kB\n")
    gib = 1 << 30

    def cgroup(path, **files):
        path.mkdir(parents=True, exist_ok=True)
        for name, value in files.items():
            (path / name.replace("_", ".", 1)).write_text(f"{value}\n")

    # cgroup v2: a job limited to 4 GiB using 3 GiB, of which 0.5 GiB is file cache the kernel can drop.
    v2 = tmp_path / "v2"
    cgroup(v2 / "job" / "step", memory_max="max", memory_current=gib, memory_stat="anon 1\ninactive_file 0")
    cgroup(v2 / "job", memory_max=4 * gib, memory_current=3 * gib, memory_stat=f"inactive_file {gib // 2}")
    (tmp_path / "self-v2").write_text("0::/job/step\n")
    assert ram.available(meminfo, tmp_path / "self-v2", v2) == 4 * gib - (3 * gib - gib // 2)
    # cgroup v1 (its own memory hierarchy), no limit set: the kernel's MemAvailable stands.
    v1 = tmp_path / "v1"
    cgroup(v1 / "memory" / "task", memory_limit_in_bytes=9223372036854771712, memory_usage_in_bytes=gib)
    (tmp_path / "self-v1").write_text("5:cpu,cpuacct:/task\n4:memory:/task\n")
    assert ram.available(meminfo, tmp_path / "self-v1", v1) == 8000000 * 1024
    # A limit tighter than MemAvailable wins.
    cgroup(v1 / "memory", memory_limit_in_bytes=2 * gib, memory_usage_in_bytes=gib)
    assert ram.available(meminfo, tmp_path / "self-v1", v1) == gib
    assert ram.available() is None or ram.available() > 0  # this machine's own answer


def test_an_out_of_memory_error_is_retried_once_with_the_same_tokens(tiny, monkeypatch, caplog):
    model, tok = tiny
    kwargs = dict(turns=2, max_new_tokens=6, systems=SYSTEMS[:4])
    whole = debate_like(model, tok, True, 4, **kwargs)
    forward, calls = model.forward, []

    def flaky(*args, **kw):  # the sixth model call (four prefills, then the second step) runs out of memory, once
        calls.append(1)
        if len(calls) == 6:
            raise torch.OutOfMemoryError("simulated")
        return forward(*args, **kw)

    monkeypatch.setattr(model, "forward", flaky)
    with caplog.at_level("WARNING", logger="debate.engine.decode_batch"):
        retried = debate_like(model, tok, True, 4, **kwargs)
    assert "out of memory in a model call; retrying it once" in caplog.text
    assert [c.generated for c in retried] == [c.generated for c in whole]
    assert [c.messages for c in retried] == [c.messages for c in whole]
    assert [c.completion_tokens for c in retried] == [c.completion_tokens for c in whole]


@pytest.mark.parametrize("name", ["moderator_round", "counsel_reflection"])
def test_greedy_structured_replies_equal_the_reference_path_for_llama_and_gemma(family, name):
    """Under a schema too: forced keys, masked free text, whole-value choices (a verdict, a list's go-on or
    close) scored by the engine in one tree pass over its batch cache and by the reference with fresh full
    passes, numbers generated inside their value trie (a reflection's three 0.00-1.00 scores)."""
    model, tok = family
    limit = schema_program.compile_for(name, tok).fixed_cost + 16
    kwargs = dict(turns=1, max_new_tokens=limit, schema_name=name, systems=SYSTEMS[:4])
    want = debate_like(model, tok, False, 1, generate=reference.generate, **kwargs)
    for reuse, batch_size in ((True, 4), (False, 3)):
        got = debate_like(model, tok, reuse, batch_size, **kwargs)
        assert [c.generated for c in got] == [c.generated for c in want], (reuse, batch_size)
        for g, w in zip(got, want):
            assert g.structured["fields"] == w.structured["fields"]
            for key, probs in w.structured["probs"].items():
                assert g.structured["probs"][key] == pytest.approx(probs, abs=1e-4)


def test_greedy_tokens_identical_with_and_without_cache_reuse_and_across_batch_sizes(tiny):
    model, tok = tiny
    runs = {(reuse, bs): debate_like(model, tok, reuse, bs) for reuse in (True, False) for bs in (1, 8)}
    reference = [c.generated for c in runs[(False, 1)]]
    assert all(len(turn) > 0 for conv in reference for turn in conv)
    for key, convs in runs.items():
        assert [c.generated for c in convs] == reference, key


def test_cache_reuse_encodes_only_new_tokens(tiny):
    model, tok = tiny
    cached = debate_like(model, tok, True, 1)
    uncached = debate_like(model, tok, False, 1)
    for c, u in zip(cached, uncached):
        assert c.prompt_tokens == u.prompt_tokens  # same contexts were seen
        assert u.encoded_tokens == u.prompt_tokens
        assert c.encoded_tokens < u.encoded_tokens / 1.5

    # Turn by turn: after the first turn, a turn encodes its user message, the template's turn markers
    # (about 19 tokens with the tiny vocabulary, which spells "assistant" in six pieces) and the last
    # generated token, which was sampled but never run through the model.
    conv = engine.Conversation(system=SYSTEMS[5])
    settings = engine.Settings(max_new_tokens=12)
    for turn in range(4):
        text = f"Round {turn}: the opponent says the report is wrong."
        before = conv.encoded_tokens
        engine.generate(model, tok, [conv], [text], settings)
        if turn:
            assert conv.encoded_tokens - before <= len(tok(text, add_special_tokens=False)["input_ids"]) + 20


def test_context_ids_keep_generated_tokens_verbatim(tiny):
    model, tok = tiny
    conv = engine.Conversation(system="sys")
    engine.generate(model, tok, [conv], ["hello"], engine.Settings(max_new_tokens=8))
    conv.messages.append({"role": "user", "content": "next"})
    ids = chat.context_ids(tok, conv)
    gen = conv.generated[0]
    assert any(ids[i:i + len(gen)] == gen for i in range(len(ids)))
    # The cache covers a prefix of the new context: nothing already encoded is invalidated.
    assert ids[: len(conv.cached_ids)] == conv.cached_ids
    assert len(conv.kv.pages) == -(-len(conv.cached_ids) // kv_store.PAGE)  # its pages hold those tokens, no more


def test_generation_stops_at_end_of_turn_and_counts_tokens(tiny):
    model, tok = tiny
    stops = chat.stop_token_ids(model, tok)
    assert tok.convert_tokens_to_ids("<|eot_id|>") in stops
    conv = engine.Conversation(system="s")
    # Force the end-of-turn token to be the only choice: the turn must end after one token.
    eot = tok.convert_tokens_to_ids("<|eot_id|>")

    def only_eot(module, inputs, logits):
        forced = torch.full_like(logits, -1e4)
        forced[..., eot] = 0.0
        return forced

    hook = model.lm_head.register_forward_hook(only_eot)
    try:
        replies = engine.generate(model, tok, [conv], ["hi"], engine.Settings(max_new_tokens=5), stop_ids=stops)
    finally:
        hook.remove()
    assert replies == [""] and conv.generated == [[]] and conv.completion_tokens == 1


def test_sampling_is_reproducible_with_a_seed_and_differs_from_greedy(tiny):
    model, tok = tiny
    def sample(seed):
        conv = engine.Conversation(system="s")
        settings = engine.Settings(max_new_tokens=16, temperature=1.0, top_p=0.9, seed=seed)
        engine.generate(model, tok, [conv], ["hi"], settings)
        return conv.generated[0]
    assert sample(1) == sample(1)
    assert sample(1) != sample(2)
