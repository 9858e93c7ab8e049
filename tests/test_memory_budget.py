"""One memory budget for a run (debate/engine/kv_pool.py): each model's KV memory allocated once within it (a decode
place of slots and an arena of pages, debate/engine/kv_store.py); a conversation keeps only its own tokens' keys and
values, in pages the memory authority counts; with too few pages the newest waiting caches are dropped and re-encoded
at their next turn (the same tokens); claims are admitted while the arena has room; a row that cannot run ends its
claim alone, with a note; out of memory is retried once."""
import gc
import json
import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import run_debate
from debate.engine import chat, engine, errors, kv_pool, kv_store, memory, ram
from tests.tiny_models import averitec_dir, build_wide_llama, cpu_budget, missing


@pytest.fixture(scope="module")
def wide_path(tmp_path_factory):
    return str(build_wide_llama(tmp_path_factory.mktemp("wide"), seed=0))


@pytest.fixture(scope="module")
def wide(wide_path):
    return AutoModelForCausalLM.from_pretrained(wide_path).eval(), AutoTokenizer.from_pretrained(wide_path)


SYSTEMS = [f"Debate claim {i}. Evidence: " + "the report says so. " * (3 + i * 7 % 13) for i in range(6)]


def debate(model, tok, budget=None, turns=3, max_new_tokens=8, batch_size=6, plan=None, monkeypatch=None):
    """Six conversations, `turns` turns each, in calls of `batch_size` rows, under `budget` bytes (None: none) or a
    given split of the model's memory (`plan`, kv_pool's); the conversations and the pool's counts."""
    if plan is not None:
        monkeypatch.setattr(kv_pool.memory, "kv_plan", lambda *a, **k: dict(plan))
    with cpu_budget(budget) as pool:
        gc.collect()
        convs = [engine.Conversation(system=s) for s in SYSTEMS]
        settings = engine.Settings(max_new_tokens=max_new_tokens)
        for turn in range(turns):
            for start in range(0, len(convs), batch_size):
                rows = range(start, min(len(convs), start + batch_size))
                engine.generate(model, tok, [convs[i] for i in rows],
                                [f"Round {turn}: answer claim {i}." + " Really?" * (i % 3) for i in rows], settings)
                mem = pool.memories[model]
                assert mem.held() == kv_pool.held_by(convs)  # what it counts is what they hold
        stats = dict(dropped=pool.dropped, reencoded=pool.reencoded, held=mem.held())
        for conv in convs:
            conv.drop_cache()  # the next run starts with an empty arena
    if plan is not None:
        monkeypatch.undo()
    return convs, stats


def test_a_conversation_keeps_only_its_own_tokens_in_pages_and_gives_them_back(wide):
    model, tok = wide
    with cpu_budget(None) as pool:
        convs = [engine.Conversation(system=s) for s in SYSTEMS[:3]]
        settings = engine.Settings(max_new_tokens=6)
        for turn in range(2):
            engine.generate(model, tok, convs, [f"Turn {turn}." + " More." * (5 * i) for i in range(3)], settings)
        mem = pool.memories[model]
        for conv in convs:
            assert conv.cached_ids == chat.context_ids(tok, conv)[:len(conv.cached_ids)]
            assert len(conv.kv.pages) == -(-len(conv.cached_ids) // kv_store.PAGE)  # its own tokens' pages, no more
        assert mem.held() == sum(len(c.kv.pages) for c in convs) * kv_store.PAGE * mem.token_bytes
        convs[0].drop_cache()
        assert mem.held() == kv_pool.held_by(convs[1:]) > 0
        del convs, conv  # the loop variable held the last one too
        gc.collect()
        assert mem.held() == 0  # a conversation freed without dropping its cache gives its pages back with it


def test_a_first_turns_estimated_caches_are_close_to_what_the_turn_leaves(wide):
    """The scheduler admits the first claims by engine.turn_cache_bytes, counted before the turn runs: within a
    tenth of the bytes of the tokens the turn leaves cached (the chat template's few tokens are all it leaves out)."""
    model, tok = wide
    with cpu_budget(None) as pool:
        convs = [engine.Conversation(system=s) for s in SYSTEMS]
        prompts = [f"Open the debate on claim {i}." + " Why?" * i for i in range(len(convs))]
        settings = engine.Settings(max_new_tokens=8)
        estimate = engine.turn_cache_bytes(model, tok, convs, prompts, settings)
        engine.generate(model, tok, convs, prompts, settings)
        held = sum(len(c.cached_ids) for c in convs) * pool.memories[model].token_bytes
        assert 0.9 * held <= estimate <= 1.1 * held, (estimate, held)
        for conv in convs:
            conv.drop_cache()


def test_an_arena_too_small_for_every_cache_drops_the_newest_and_changes_no_token(wide, monkeypatch):
    """Pages for about two of the six conversations: at each turn's end the newest waiting caches give way, and are
    encoded again at their next turn, the same tokens."""
    model, tok = wide
    whole, free = debate(model, tok)
    assert free["dropped"] == 0
    monkeypatch.setattr(kv_pool, "place_geometry", lambda widths, wanted, tokens: (6, 512))
    tight, stats = debate(model, tok, plan={"reserve": 0, "tokens": 6 * 512 + 12 * 64}, monkeypatch=monkeypatch)
    assert [c.generated for c in tight] == [c.generated for c in whole]
    assert [c.prompt_tokens for c in tight] == [c.prompt_tokens for c in whole]
    assert stats["dropped"] >= len(SYSTEMS) and stats["reencoded"] > 0
    encoded = sum(c.encoded_tokens for c in tight) - sum(c.encoded_tokens for c in whole)
    assert 0 < encoded <= stats["reencoded"] + len(SYSTEMS) * 3


def test_a_models_memory_is_planned_within_its_budget(wide):
    """Place, arena and reserve of the model's Memory come to its budget at most, and use most of it."""
    model, tok = wide
    for budget in (64 * 2 ** 20, 256 * 2 ** 20, 2 * 2 ** 30):
        with cpu_budget(budget) as pool:
            engine.generate(model, tok, [engine.Conversation(system=SYSTEMS[0])], ["Go."],
                            engine.Settings(max_new_tokens=8))
            mem = pool.memories[model]
            taken = mem.nbytes() + mem.plan["reserve"]
            assert 0.9 * budget <= taken <= budget, (budget, taken)
            assert mem.store.pages > mem.store.first_page and mem.store.rows >= 1


def test_a_context_past_the_window_fails_its_row_alone_and_leaves_its_conversation_as_it_was(wide):
    model, tok = wide
    convs = [engine.Conversation(system="short"), engine.Conversation(system="long " * 300)]
    settings = engine.Settings(max_new_tokens=8, max_context=200)
    with cpu_budget(None):
        with pytest.raises(errors.ContextOverflow) as err:
            engine.generate(model, tok, convs, ["go", "go"], settings)
    assert list(err.value.failed) == [1] and "the --max-context cap of 200 tokens" in err.value.failed[1]
    assert isinstance(err.value.replies[0], str) and err.value.replies[1] is None
    assert len(convs[0].messages) == 2 and convs[1].messages == [] and convs[1].kv is None
    assert engine.window(model, engine.Settings()) == model.config.max_position_embeddings


def test_the_budget_is_decided_once_from_the_device_and_memory_gb_overrides_it(monkeypatch):
    monkeypatch.setattr(ram, "available", lambda: 10 * kv_pool.GIB)
    budget, source = kv_pool.decide("cpu", 0.8)
    assert budget == int(10 * kv_pool.GIB * 0.8 * kv_pool.CPU_MARGIN) and "10.0 GiB of RAM" in source
    assert kv_pool.decide("cpu", 0.8, memory_gb=1.5) == (int(1.5 * kv_pool.GIB), "--memory-gb 1.5")
    assert kv_pool.decide("cpu", 0)[0] is None
    monkeypatch.setattr(ram, "available", lambda: None)
    assert kv_pool.decide("cpu", 0.8)[0] is None


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_32_claims_at_batch_32_under_a_small_budget_give_the_unlimited_runs_predictions(wide_path, tmp_path, caplog):
    """The issue's run, CPU-sized: DebateCV on 32 AVeriTeC dev claims at batch 32 under a budget that holds a
    fraction of their caches; fewer claims in flight there, admitted by what fits from the first wave on."""
    data = averitec_dir()
    if not (data / "dev.json").is_file():
        missing(f"AVeriTeC dev not found in {data}", shared_data=True)
    runs = {}
    for name, extra in (("free", ["--gpu-memory-fraction", "0"]), ("small", ["--memory-gb", "0.25"])):
        out = tmp_path / name
        with caplog.at_level("INFO"):
            run_debate.main(["--split", "dev", "--data-dir", str(data), "--evidence", "golden", "--model", wide_path,
                             "--limit", "32", "--batch-size", "32", "--max-new-tokens", "6", "--max-rounds", "1",
                             "--no-structured", "--temperature", "0", "--output-dir", str(out), *extra])
        line = [r.message for r in caplog.records if r.message.startswith("memory: ")][-1]
        taken = re.search(r"keys, values and reserve ([\d.]+) (MiB|GiB)", line)
        runs[name] = dict(preds=sorted(read(out / "predictions.jsonl"), key=lambda p: str(p["claim_id"])),
                          taken=float(taken.group(1)) * (2 ** 20 if taken.group(2) == "MiB" else kv_pool.GIB),
                          budget=0.25 * kv_pool.GIB, line=line)
        caplog.clear()
    free, small = runs["free"], runs["small"]
    assert len(free["preds"]) == len(small["preds"]) == 32
    keys = ("claim_id", "label", "justification", "prompt_tokens", "completion_tokens")
    assert [{k: p[k] for k in keys} for p in small["preds"]] == [{k: p[k] for k in keys} for p in free["preds"]]
    # The unlimited run's memory is sized from the free RAM; the small one's keys, values and reserve within 0.25 GiB.
    assert free["taken"] > 8 * small["budget"] and small["taken"] <= small["budget"]
    assert "no cache dropped" in free["line"]
    # The waiting caches, a part of the budget, the place's rows and the reserve being the rest.
    held = re.search(r"caches held ([\d.]+) (MiB|GiB) at most", small["line"]).groups()
    assert held[1] == "MiB" and float(held[0]) < 256
    in_flight = {name: int(re.search(r"(\d+) claims in flight at most", run["line"]).group(1))
                 for name, run in runs.items()}
    # Every claim at once with no limit; under the budget the first wave too is admitted by its first turns'
    # estimated caches (scheduler._admits, kv_pool.admits_claim).
    assert in_flight["free"] == 32 and 1 <= in_flight["small"] < 32, in_flight


def test_a_claim_whose_context_passes_the_cap_is_written_with_a_note_and_the_others_are_verified(wide_path, tmp_path):
    out = tmp_path / "capped"
    run_debate.main(["--split", "demo", "--model", wide_path, "--max-new-tokens", "6", "--max-rounds", "2",
                     "--no-structured", "--temperature", "0", "--batch-size", "3", "--max-context", "2880",
                     "--output-dir", str(out)])
    preds = read(out / "predictions.jsonl")
    assert len(preds) == 8  # the demo's claims, every one written
    capped = [p for p in preds if p["parse_status"] == "context_overflow"]
    assert 0 < len(capped) < 8  # they differ in length: the cap ends some, not all (5 of 8 here)
    assert all(p["label"] is None and "the --max-context cap of 2880 tokens" in p["note"] for p in capped)
    # What was done before the cap stays in the record: the tokens counted and the conversations' messages.
    assert all(p["prompt_tokens"] > 0 and p["completion_tokens"] > 0 for p in capped)
    transcripts = {t["claim_id"]: t for t in read(out / "transcripts.jsonl")}
    for p in capped:
        conversations = transcripts[p["claim_id"]]["conversations"]
        assert len(conversations) == 3 and all(c["messages"] for c in conversations)


def pieces_of(kwargs):
    """The prompt pieces a step's forward carries, [(slot, first column, end column)], or None: the tokens after the
    decode rows' in its sequence (attention.Packed, as an eager step's host lists them)."""
    packed = kwargs.get("packed")
    if packed is None or packed.host is None:
        return None
    out = []
    for slot, places, positions in packed.host:
        columns = [c for at, c in zip(places, positions) if at >= packed.rows]
        if columns:
            out.append((slot, min(columns), max(columns) + 1))
    return out or None


def test_a_prefill_out_of_memory_twice_fails_its_row_alone_and_leaves_its_conversation_as_it_was(wide, monkeypatch,
                                                                                                     caplog):
    """Out of memory once is retried with the same tokens; twice in a row's prefill, that row fails alone
    (ContextOverflow names it) and the other rows of the call run."""
    model, tok = wide
    forward = model.forward
    whole, _ = debate(model, tok, turns=2, batch_size=1)
    # The forward to fail is the first of the second turn's first call (the first conversation's, batch_size 1):
    # its prefill of the turn's new tokens, found by the call it is in, not by counting the forwards of a run.
    generate, calls, forwards = engine.generate, [], []

    def counted_call(model, tok, convs, prompts, *args, **kw):
        conv, turn = convs[0], [{"role": "user", "content": prompts[0]}]
        context = chat.context_ids(tok, engine.Conversation(conv.system, conv.messages + turn, list(conv.generated)))
        calls.append(dict(conv=conv, cached=len(conv.cached_ids), context=len(context)))
        return generate(model, tok, convs, prompts, *args, **kw)

    def once(*args, **kw):  # the doomed forward runs out of memory, once
        forwards.append(dict(call=len(calls), ids=kw["input_ids"].clone(), pieces=pieces_of(kw)))
        if len(calls) == len(SYSTEMS) + 1 and [f["call"] for f in forwards].count(len(calls)) == 1:
            raise torch.OutOfMemoryError("simulated")
        return forward(*args, **kw)

    monkeypatch.setattr(engine, "generate", counted_call)
    monkeypatch.setattr(model, "forward", once)
    with caplog.at_level("WARNING", logger="debate.engine.decode_batch"):
        retried, _ = debate(model, tok, turns=2, batch_size=1)
    monkeypatch.setattr(engine, "generate", generate)
    doomed = calls[len(SYSTEMS)]
    assert doomed["conv"] is retried[0] and 0 < doomed["cached"] < doomed["context"]  # the second turn's, cache reused
    failed, again, after = [f for f in forwards if f["call"] == len(SYSTEMS) + 1][:3]
    # The failed forward was that prefill: the turn's new tokens alone; the retry fed the same tokens, once.
    assert failed["pieces"] is not None and [(first, end) for _, first, end in failed["pieces"]] == [
        (doomed["cached"], doomed["context"])]
    assert torch.equal(again["ids"], failed["ids"]) and again["pieces"] == failed["pieces"]
    assert after["pieces"] is None and after["ids"].shape == (1, 1)  # then the row decodes
    assert caplog.text.count("out of memory in a model call; retrying it once") == 1
    assert [c.generated for c in retried] == [c.generated for c in whole]

    convs = [engine.Conversation(system="s"), engine.Conversation(system=SYSTEMS[5])]
    doomed = len(chat.context_ids(tok, engine.Conversation(SYSTEMS[5], [{"role": "user", "content": "go"}])))

    def prefill_fails(*args, **kw):  # every forward that carries the second row's prompt (its prefill inside a step)
        if any(end - first == doomed for _, first, end in pieces_of(kw) or []):
            raise torch.OutOfMemoryError("simulated")
        return forward(*args, **kw)

    monkeypatch.setattr(model, "forward", prefill_fails)
    with cpu_budget(None), pytest.raises(errors.ContextOverflow) as err:
        engine.generate(model, tok, convs, ["go", "go"], engine.Settings(max_new_tokens=4))
    assert list(err.value.failed) == [1] and "ran out of memory in its prefill twice" in err.value.failed[1]
    assert isinstance(err.value.replies[0], str) and convs[1].messages == [] and convs[1].kv is None


def test_the_reserve_is_sized_to_the_rows_not_the_window_and_grows_for_a_wider_row(wide):
    """A Memory's reserve is planned for the widest slot its rows may take (twice the widest row, rounded up), not
    for the model's 32k window, so its keys and values get the rest of the budget; a later row wider than that grows
    the reserve when the place is seen anew for it, the store giving up its last pages, still within the budget; the
    conversations whose caches waited in pages meanwhile get the tokens of a run without a budget."""
    model, tok = wide
    budget = 256 * 2 ** 20
    settings = engine.Settings(max_new_tokens=8)

    def turns(pool=None):
        short = [engine.Conversation(system=s) for s in SYSTEMS[:3]]
        engine.generate(model, tok, short, ["Go."] * 3, settings)
        seen = None
        if pool is not None:
            mem = pool.memories[model]
            seen = dict(mem.plan), mem.store.tokens, mem
        long = engine.Conversation(system="long " * 700)
        engine.generate(model, tok, [long], ["Go."], settings)
        engine.generate(model, tok, short, ["Again."] * 3, settings)
        return [c.generated for c in short + [long]], seen

    with cpu_budget(None):
        want, _ = turns()
    with cpu_budget(budget) as pool:
        got, (first, tokens, mem) = turns(pool)
    assert got == want
    window = memory.kv_plan(mem.shape, mem.size, budget, mem.rows_planned, 32768 + 8, 8, mem.fused, 0)
    assert first["width"] <= 2 * memory.COLUMN_BUCKET  # the short rows' widest slot, not 32k columns
    assert first["reserve"] < window["reserve"] / 4 and tokens > window["tokens"]
    wide_row = len(chat.context_ids(tok, engine.Conversation("long " * 700, [{"role": "user", "content": "Go."}])))
    assert mem.plan["width"] >= wide_row + 8 > first["width"] and mem.plan["reserve"] > first["reserve"]
    assert mem.store.tokens < tokens and mem.nbytes() + mem.plan["reserve"] <= budget
