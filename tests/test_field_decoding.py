"""How structured fields are decoded (issue 37): choices scored as whole candidates in one tree-shaped pass over
the row's cache in place, numbers generated token by token inside their value trie; and the per-tokenizer
caches that must not keep a tokenizer alive."""
import gc
import json
import random
import weakref

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from debate.data import answer_schemas
from debate.engine import chat, constrained_row, decode_batch, engine, generator, kv_store, schema_program
from debate.engine.constrained_row import SchemaRow
from tests.tiny_models import build_tiny_gemma, build_tiny_llama, build_tiny_tokenizer


@pytest.fixture(scope="module")
def soft_llama(tmp_path_factory):
    """Small weights: probabilities spread out, so a wrong score would show."""
    path = build_tiny_llama(tmp_path_factory.mktemp("soft"), seed=3, initializer_range=0.005)
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def soft_gemma(tmp_path_factory):
    """Gemma 3's mix of sliding-window (16 tokens) and full-attention layers."""
    path = build_tiny_gemma(tmp_path_factory.mktemp("gemma"), seed=3, initializer_range=0.02)
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.fixture(params=["soft_llama", "soft_gemma"])
def family(request):
    return request.getfixturevalue(request.param)


def scores_schema(tmp_path, monkeypatch, scored=False, name="scores"):
    monkeypatch.setattr(answer_schemas, "PROMPT_DIR", tmp_path)
    (tmp_path / f"{name}.schema.json").write_text(json.dumps({"fields": [
        {"key": "Logic", "type": "number", "min": 0, "max": 1, "step": 0.01, "scored": scored},
        {"key": "Rating", "type": "number", "min": 0, "max": 10, "step": 1}]}))


# ---------------------------------------------------------------- today's scorer, kept here as the oracle


def copied_cache_logprobs(model, cache, candidates, first_logits, pad_id, chunk_size=16):
    """The scorer before issue 37, verbatim in substance: every candidate in side passes of 16 over copies
    of the row's keys/values (`expand(...).contiguous()`), right-padded, 2-D mask."""
    logp = torch.log_softmax(first_logits.float(), dim=-1)
    totals = [float(logp[c[0]]) for c in candidates]
    longer = [j for j, c in enumerate(candidates) if len(c) > 1]
    device = first_logits.device
    for at in range(0, len(longer), chunk_size):
        chunk = [candidates[j] for j in longer[at:at + chunk_size]]
        k, width = len(chunk), max(len(c) for c in chunk) - 1
        layers = [(layer.keys.expand(k, -1, -1, -1).contiguous(), layer.values.expand(k, -1, -1, -1).contiguous())
                  for layer in cache.layers]
        past = layers[0][0].shape[2]
        ids = torch.full((k, width), pad_id, dtype=torch.long)
        mask = torch.ones((k, past + width), dtype=torch.long)
        for j, c in enumerate(chunk):
            ids[j, :len(c) - 1] = torch.tensor(c[:-1], dtype=torch.long)
            mask[j, past + len(c) - 1:] = 0
        positions = torch.arange(past, past + width)[None].expand(k, -1)
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                    use_cache=True, **generator.cache_kwarg(model, DynamicCache(ddp_cache_data=layers)))
        chunk_logp = torch.log_softmax(out.logits.float(), dim=-1)
        for j, c in enumerate(chunk):
            picks = chunk_logp[j, torch.arange(len(c) - 1, device=device),
                               torch.tensor(c[1:], dtype=torch.long, device=device)]
            totals[longer[at + j]] += float(picks.sum())
    return totals


class Slots:
    """Rows prefilled into slots of a decode place as the engine's batch does (generator.prefill): each row's context
    from column 0 of its own slot, `extra_columns` free past the longest; `layers` the slots' keys/values."""

    def __init__(self, model, tok, systems, extra_columns):
        self.targets = [chat.context_ids(tok, engine.Conversation(system=s, messages=[{"role": "user",
                                                                                         "content": "Judge."}]))
                        for s in systems]
        columns = max(len(t) for t in self.targets) + extra_columns
        dtype = next(model.parameters()).dtype
        columns = -(-columns // kv_store.PAGE) * kv_store.PAGE
        self.place = kv_store.Store(kv_store.layer_shapes(model, dtype), len(systems) * columns, len(systems), columns)
        self.place.ready(columns)
        self.last = [generator.prefill(model, self.place.slot_cache(row, 0), t, 0)
                     for row, t in enumerate(self.targets)]

    def cache(self, row):
        return self.place.slot_cache(row, len(self.targets[row]))

    def layers(self):
        return [(k.clone(), v.clone()) for k, v in self.place.layers]


@torch.inference_mode()
def test_tree_scoring_gives_the_copied_cache_scorers_probabilities_without_touching_the_batch(family):
    model, tok = family
    # Contexts of different lengths (left padding) and longer than Gemma's 16-token window several times.
    systems = [f"Claim {i}. Evidence: " + "the minister said it in a speech. " * (2 + 3 * i) for i in range(3)]
    fields = schema_program.compile_for("ragcot", tok).spec.fields
    verdict = schema_program.compile_for("ragcot", tok).candidates[[f.key for f in fields].index("Verdict")]
    reflection = schema_program.compile_for("counsel_reflection", tok)
    hundred = reflection.candidates[0]  # 0.00 .. 1.00 with its closing token: 101 candidates
    go_on_close = [reflection.list_go_on, reflection.list_close]
    assert len(hundred) == 101 and max(len(c) for c in verdict) > 2
    slots = Slots(model, tok, systems, 400)
    before = slots.layers()
    rows_seen = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: rows_seen.append(kw["input_ids"].shape[0]),
                                           with_kwargs=True)
    try:
        for row in range(3):
            for candidates in (verdict, hundred, go_on_close):
                rows_seen.clear()
                got = generator.tree_logprobs(model, slots.cache(row), candidates, slots.last[row])
                assert rows_seen == [1]  # one pass, of this row alone
                want = copied_cache_logprobs(model, slots.cache(row), candidates, slots.last[row], 0)
                assert got == pytest.approx(want, abs=1e-4)
                assert torch.softmax(torch.tensor(got), 0).tolist() == pytest.approx(
                    torch.softmax(torch.tensor(want), 0).tolist(), abs=1e-4)
    finally:
        hook.remove()
    # Spread out (a wrong score would show; labels of different lengths are not, under a random model) and no
    # cache written where the turn reads: every row's columns so far are as they were, the turn's length too.
    probs = torch.softmax(torch.tensor(generator.tree_logprobs(model, slots.cache(1), hundred, slots.last[1])), 0)
    assert float(probs.max()) < 0.5
    for (keys, values), (k, v) in zip(slots.place.layers, before):
        for row, t in enumerate(slots.targets):
            assert torch.equal(keys[row, :, :len(t)], k[row, :, :len(t)])
            assert torch.equal(values[row, :, :len(t)], v[row, :, :len(t)])


# ---------------------------------------------------------------- generated numbers


def test_a_number_trie_holds_exactly_the_schemas_tokenisation_of_each_value(tmp_path, monkeypatch):
    tok = build_tiny_tokenizer()
    scores_schema(tmp_path, monkeypatch)
    c = schema_program.compile_for("scores", tok)
    for i in (0, 1):
        spelled = {}

        def walk(node, path):
            for token, child in node.items():
                if isinstance(child, int):
                    spelled[child] = path + [token]
                else:
                    walk(child, path + [token])

        walk(c.tries[i], [])
        assert [spelled[j] for j in range(len(c.candidates[i]))] == c.candidates[i]
    assert c.scratch_columns == 0  # nothing in this schema is scored as a choice
    with pytest.raises(ValueError, match="field 'X'.*runs past"):
        schema_program.trie([[5, 9], [5, 9, 7]], "field 'X'")


def drive(compiled, logits_for, settings, generator_=None, limit=120):
    """Run one row's schema program on logits from `logits_for(fed ids)`: (fed ids, result)."""
    masks = schema_program.masks(compiled.tokenizer, logits_for([]).shape[-1], [compiled.tokenizer.eos_token_id], "cpu")
    row = SchemaRow(compiled, limit, masks, settings, generator_,
                    lambda candidates, logits: [random.random() for _ in candidates])
    fed = []
    while True:
        token = row.next_token(logits_for(fed))
        if token is None:
            return fed, row.result
        fed.append(token)


def test_generated_numbers_only_ever_take_allowed_values_under_random_logits_and_temperatures(tmp_path, monkeypatch):
    tok = build_tiny_tokenizer()
    scores_schema(tmp_path, monkeypatch)
    compiled = schema_program.compile_for("scores", tok)
    spec = compiled.spec
    rng, seen = random.Random(0), set()
    gen = torch.Generator().manual_seed(0)
    for trial in range(150):
        temperature = rng.choice([0.0, 0.3, 1.0, 2.5])
        settings = engine.Settings(temperature=temperature, top_p=rng.choice([1.0, 0.9, 0.5]))
        scale = rng.choice([0.5, 3.0, 20.0])
        fed, result = drive(compiled, lambda ids: torch.randn(len(tok), generator=gen) * scale, settings, gen)
        obj = json.loads(tok.decode(fed))
        assert obj == result["fields"]
        for i, f in enumerate(spec.fields):
            assert obj[f.key] in [json.loads(v) for v in f.values]
            # The ids fed are the schema's own spelling of the value.
            at = result["offsets"][f.key]
            value = f.values[[json.loads(v) for v in f.values].index(obj[f.key])]
            assert fed[at:at + len(compiled.values[i][f.values.index(value)])] == compiled.values[i][
                f.values.index(value)]
        assert result["probs"] == {}  # a generated number has no distribution to report
        seen.add(obj["Logic"])
    assert len(seen) > 20  # sampling does explore the values: the test means something


def test_a_greedy_number_is_the_argmax_path_through_its_allowed_tokens(soft_llama, tmp_path, monkeypatch):
    model, tok = soft_llama
    scores_schema(tmp_path, monkeypatch)
    compiled = schema_program.compile_for("scores", tok)
    conv = engine.Conversation(system="You score an argument.")
    context = chat.context_ids(tok, engine.Conversation(system=conv.system, messages=[
        {"role": "user", "content": "Score it."}]))
    engine.generate(model, tok, [conv], ["Score it."], engine.Settings(max_new_tokens=60), schemas=[compiled])
    ids = list(context) + compiled.prefix[0]
    with torch.no_grad():
        for i, f in enumerate(compiled.spec.fields):
            if i:
                ids += compiled.prefix[i][1:]  # the first is the closing token, picked below
            path = []
            while True:  # among the candidates still possible, the most probable next token
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
                options = sorted({c[len(path)] for c in compiled.candidates[i] if c[:len(path)] == path})
                token = max(options, key=lambda t: float(logits[t]))
                path.append(token)
                if path in compiled.candidates[i]:
                    break
                ids.append(token)
            ids.append(path[-1])
            value = f.values[compiled.candidates[i].index(path)]
            assert conv.structured["fields"][f.key] == json.loads(value), f.key
    assert conv.generated[-1] == (ids + compiled.end[1:])[len(context):]


def host_waits(compiled, structured):
    """The times a row of this reply must wait for the host, from the schema and the reply alone: its first plan;
    each generated number's digits and its closing id (each picked from the logits before it); each free text's end
    (a list item's or a field's)."""
    waits = 1
    for i, f in enumerate(compiled.spec.fields):
        value = structured["fields"][f.key]
        if schema_program.generated(f):
            index = [json.loads(v) for v in f.values].index(value)
            waits += len(compiled.values[i][index]) + 1
        elif f.kind == "list":
            waits += len(value)
        elif f.kind == "text":
            waits += 1
    return waits


@torch.inference_mode()
def test_a_reflections_scores_cost_their_digits_and_no_call_runs_more_rows_than_the_batch(soft_llama, monkeypatch):
    model, tok = soft_llama
    monkeypatch.setattr(decode_batch, "LOOKAHEAD", True)  # the CUDA path, whose steps are counted below
    compiled = schema_program.compile_for("counsel_reflection", tok)
    calls, plans = [], []
    # (rows, tokens) of every forward: a step's (its decode rows, its packed tokens), a side pass's (its input ids)
    hook = model.register_forward_pre_hook(
        lambda m, a, kw: calls.append((kw["packed"].rows, kw["input_ids"].shape[1], True) if kw.get("packed")
                                      else (*kw["input_ids"].shape, False)), with_kwargs=True)
    convs = [engine.Conversation(system=f"Claim {i}. " + "The report says so. " * (3 * i)) for i in range(2)]
    real = constrained_row.SchemaDriver.plan
    monkeypatch.setattr(constrained_row.SchemaDriver, "plan",
                        lambda self, logits, ids: plans.append(1) or real(self, logits, ids))
    try:
        engine.generate(model, tok, convs, ["Reflect on your arguments."] * 2,
                        engine.Settings(max_new_tokens=compiled.fixed_cost + 30), schemas=[compiled] * 2)
    finally:
        hook.remove()
    for conv in convs:
        for key in ("Logic", "Novelty", "Rebuttal"):
            assert 0 <= conv.structured["fields"][key] <= 1 and key not in conv.structured["probs"]
    assert all(rows <= 2 for rows, _, _ in calls)
    # What the replies need is worked out from the schema and the replies, not from the run: the host plans
    # exactly where a row must wait for it (numbers add their few digits, not 101 candidates each) ...
    waits = [host_waits(compiled, c.structured) for c in convs]
    assert len(plans) == sum(waits)
    prefill, rest = calls[0], calls[1:]  # both rows' prompts in one forward, as the two join together
    assert prefill[2] and prefill[0] == 0 and prefill[1] > 2 * compiled.scratch_columns
    # ... a list's go-on/close choice is one pass of one row, a few tokens wide, once an item but the last allowed
    side = [(rows, width) for rows, width, step in rest if not step]
    flaws = next(f for f in compiled.spec.fields if f.kind == "list")
    assert len(side) == sum(min(len(c.structured["fields"][flaws.key]), flaws.max_items - 1) for c in convs)
    assert all(rows == 1 and width <= compiled.scratch_columns for rows, width in side)
    # ... and the two rows run side by side, each for a step a token after its first, an idle step each time the
    # host plans for it (its first plan, at the start, costs none) and, with the lookahead, a step past its stop.
    steps = max((c.completion_tokens - 1) + (w - 1) + 1 for c, w in zip(convs, waits))
    assert len(rest) - len(side) == steps


def test_a_scored_number_keeps_its_probabilities_and_a_generated_one_none(soft_llama, tmp_path, monkeypatch):
    model, tok = soft_llama
    scores_schema(tmp_path, monkeypatch, scored=True, name="scored")
    compiled = schema_program.compile_for("scored", tok)
    conv = engine.Conversation(system="You score an argument.")
    engine.generate(model, tok, [conv], ["Score it."], engine.Settings(max_new_tokens=60), schemas=[compiled])
    probs = conv.structured["probs"]
    assert list(probs) == ["Logic"] and sum(probs["Logic"].values()) == pytest.approx(1, abs=1e-4)
    assert conv.structured["fields"]["Logic"] == json.loads(max(probs["Logic"], key=probs["Logic"].get))


# ---------------------------------------------------------------- the per-tokenizer caches


def test_a_dropped_tokenizer_is_freed_with_its_compiled_schemas_and_masks():
    tok = build_tiny_tokenizer()
    compiled = schema_program.compile_for("counsel_reflection", tok)
    masks = schema_program.masks(tok, len(tok), [tok.eos_token_id], "cpu")
    assert schema_program.masks(tok, len(tok), [tok.eos_token_id], "cpu") is masks  # cached while it lives
    assert schema_program.compile_for("counsel_reflection", tok) is compiled and compiled.tokenizer is tok
    alive = weakref.ref(tok)
    del tok
    gc.collect()
    assert alive() is None and compiled.tokenizer is None
