"""The courtroom (PROClaim) under the run's memory budget and context cap (issue 44): on Check-COVID with a tiny random
Llama, a budget too small to keep every cache drops some and changes no record but the tokens encoded again, and a
cap the debate's contexts pass ends each claim with a note instead of the run.

Both runs search each claim's own golden sentences (--claim-evidence-only): the dataset's corpus of abstracts gives
prompts of 25,000 and more of the tiny tokenizer's tokens (1.4 characters a token), minutes on a CPU. Every role
decodes greedily (--temperature 0 sets each courtroom role's), so the two runs can be compared token for token."""
import json

from transformers import AutoConfig

import run_debate
from debate.engine import kv_pool, kv_store, memory
from debate.pipeline import records
from tests.tiny_models import missing, shared_dir

LABELS = ("SUPPORT", "REFUTE", "NOTENOUGHINFO")


def courtroom(model, out, *extra):
    data = shared_dir("check-covid")
    if not data.is_dir():
        missing(f"no shared check-covid data at {data}", shared_data=True)
    # Two rounds, so the critic's conversation keeps its cache from one round to the next; turns as short as the
    # courtroom's JSON answers allow; no witness (a random court may grant one, a longer run).
    run_debate.main(["--method", "courtroom", "--dataset", "check-covid", "--split", "test", "--evidence", "golden",
                     "--data-dir", str(data), "--model", model, "--limit", "2", "--max-rounds", "2",
                     "--max-new-tokens", "160", "--temperature", "0", "--no-witness", "--claim-evidence-only",
                     "--output-dir", str(out), *extra])
    return {name: sorted(read(out / name), key=lambda r: r["claim_id"])
            for name in (records.PREDICTIONS, records.TRANSCRIPTS)}


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def decided_or_noted(prediction):
    if prediction["parse_status"] == "context_overflow":
        return prediction["label"] is None and prediction["note"].startswith("not verified: ")
    return prediction["label"] in LABELS


def test_a_budget_that_drops_caches_writes_every_claim_as_the_unlimited_run_does(tiny, tmp_path, caplog, monkeypatch):
    pool = kv_pool.pool_for("cpu")
    free = courtroom(tiny, tmp_path / "free", "--gpu-memory-fraction", "0")
    needed, free_dropped = pool.peak_held, pool.dropped
    # An arena of 60% of the pages the unlimited run's waiting caches held at most (the budget's split set so: the
    # tiny model's caches are a few MiB, less than the reserve a budget keeps for any model's transients).
    token_bytes = memory.kv_bytes_per_token(memory.shape(AutoConfig.from_pretrained(tiny)), 4)
    pages = int(0.6 * needed / (kv_store.PAGE * token_bytes))
    monkeypatch.setattr(kv_pool, "place_geometry", lambda widths, wanted, tokens: (8, 8192))
    monkeypatch.setattr(kv_pool.memory, "kv_plan", lambda *a, **k: {"reserve": 0, "tokens": 8 * 8192 + pages * 64})
    budget_gb = 1.0
    caplog.clear()
    with caplog.at_level("INFO", logger="debate.pipeline.runner"):
        small = courtroom(tiny, tmp_path / "small", "--memory-gb", str(budget_gb))
    assert free_dropped == 0
    assert pool.dropped > 0 and pool.reencoded > 0  # caches had to go, and were encoded again at their next turn
    assert pool.peak_held < needed  # the arena held less than the unlimited run's caches
    [line] = {r.message for r in caplog.records if r.message.startswith("memory: ")}
    budget = kv_pool.size(int(budget_gb * kv_pool.GIB))
    assert f"of a {budget} budget" in line and "caches dropped to stay within it" in line

    preds, small_preds = free[records.PREDICTIONS], small[records.PREDICTIONS]
    assert len(preds) == len(small_preds) == 2  # both claims written in each run
    assert all(decided_or_noted(p) for p in preds + small_preds)
    assert any(p["label"] for p in preds)  # a verdict to compare, not only notes

    def same(p):  # everything but the tokens encoded: the dropped caches' tokens are encoded again
        return {k: v for k, v in p.items() if k != "encoded_tokens"}

    assert [same(p) for p in small_preds] == [same(p) for p in preds]
    assert sum(p["encoded_tokens"] for p in small_preds) > sum(p["encoded_tokens"] for p in preds)
    assert small[records.TRANSCRIPTS] == free[records.TRANSCRIPTS]


def test_a_courtroom_whose_contexts_pass_max_context_writes_both_claims_with_notes(tiny, tmp_path):
    # 3000 tokens: every turn fits until the critic's second round, whose conversation holds both rounds (3,000 and
    # more), while caches are held; the judges' case record (some 4,100) would pass it too.
    written = courtroom(tiny, tmp_path / "capped", "--max-context", "3000", "--memory-gb", "1")
    preds = written[records.PREDICTIONS]
    assert len(preds) == 2
    for prediction, transcript in zip(preds, written[records.TRANSCRIPTS]):
        assert prediction["parse_status"] == "context_overflow" and prediction["label"] is None
        assert "the --max-context cap of 3000 tokens" in prediction["note"]
        assert transcript["claim_id"] == prediction["claim_id"] and transcript["note"] == prediction["note"]
