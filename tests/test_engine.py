"""The engine's promises: cache reuse and batching never change greedy tokens; reuse encodes less."""
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from debate import engine
from debate.testing import build_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_llama(tmp_path_factory.mktemp("tiny"), seed=0)
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


# Different lengths on purpose: rows of a batch must be padded and must not disturb each other.
SYSTEMS = [f"Debate claim {i}. Evidence: " + "the report says so. " * (i * 5 % 11) for i in range(8)]


def debate_like(model, tok, reuse, batch_size, turns=3, max_new_tokens=12):
    settings = engine.Settings(max_new_tokens=max_new_tokens, reuse_cache=reuse)
    convs = [engine.Conversation(system=s) for s in SYSTEMS]
    for turn in range(turns):
        for start in range(0, len(convs), batch_size):
            rows = range(start, min(len(convs), start + batch_size))
            engine.generate(model, tok, [convs[i] for i in rows],
                            [f"Round {turn}: answer claim {i}." + " Really?" * (i % 3) for i in rows], settings)
    return convs


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
    ids = engine.context_ids(tok, conv)
    gen = conv.generated[0]
    assert any(ids[i:i + len(gen)] == gen for i in range(len(ids)))
    # The cache covers a prefix of the new context: nothing already encoded is invalidated.
    assert ids[: len(conv.cached_ids)] == conv.cached_ids
    assert conv.cache[0][0].shape[2] == len(conv.cached_ids)


def test_generation_stops_at_end_of_turn_and_counts_tokens(tiny):
    model, tok = tiny
    stops = engine.stop_token_ids(model, tok)
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
