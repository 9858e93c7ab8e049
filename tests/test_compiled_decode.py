"""The compiled decode step (debate/engine/decode_step.py, --compile): on a CPU through inductor, the same greedy
tokens and label probabilities as the eager step on the tiny Llama, the tiny Gemma (sliding-window layers) and NF4
weights, with a LoRA adapter too (NF4 up to one near-tie, tests/token_match.py); no graph break; a few graphs for the
buckets a run touches, never one a step; the decode steps' model forwards leave Python. Each model compiles once for
the module (CI time)."""
import contextlib
import inspect
import json
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import run_debate
from debate.engine import attention, compiled_step, engine, models, schema_program, step_stats
from tests import token_match
from tests.tiny_models import build_random_lora, build_tiny_gemma, build_tiny_llama

SYSTEMS = [f"Debate claim {i}. Evidence: " + "the report says so. " * (i * 5 % 11) for i in range(5)]
ROWS = (5, 4, 3, 1)  # a turn's rows shrink as claims end, and rows leave the batch as they stop: buckets 2 to 5


def conversations(model, tok, compile_steps, schema=None, scope=None):
    """Four turns over shrinking batches: the conversations."""
    convs = [engine.Conversation(system=s) for s in SYSTEMS]
    tokens = (schema.fixed_cost + 16) if schema else 10
    settings = engine.Settings(max_new_tokens=tokens, compile=compile_steps)
    for turn, rows in enumerate(ROWS):
        with scope() if scope else contextlib.nullcontext():
            engine.generate(model, tok, convs[:rows], [f"Round {turn}: answer claim {i}." for i in range(rows)],
                            settings, schemas=[schema] * rows if schema else None)
    return convs


def debate(model, tok, compile_steps, schema=None, scope=None):
    """Every conversation's ids and structured results."""
    convs = conversations(model, tok, compile_steps, schema, scope)
    return [c.generated for c in convs], [c.structured for c in convs]


def step_forwards(model_class, run):
    """(run(), how many Python-level calls of `model_class`'s forward ran a step of the batch meanwhile: those given a
    step's packed metadata, decode rows and prompt pieces alike; a compiled graph never enters it). Also
    bench/bench_python_forwards.py's counter."""
    code = inspect.unwrap(model_class.forward).__code__
    count = [0]

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is code and (frame.f_locals.get("kwargs") or {}).get("packed") is not None:
            count[0] += 1

    sys.setprofile(profile)
    try:
        out = run()
    finally:
        sys.setprofile(None)
    return out, count[0]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = build_tiny_llama(tmp_path_factory.mktemp("llama"), seed=0)
    return path, AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def test_compiled_steps_give_the_eager_tokens_in_one_graph_and_leave_python(llama):
    _, model, tok = llama
    eager, eager_forwards = step_forwards(type(model), lambda: debate(model, tok, False))
    compiled, compiled_forwards = step_forwards(type(model), lambda: debate(model, tok, True))
    assert compiled == eager
    stats = step_stats.stats_of(model)
    assert stats.failed is None and stats.steps > 30
    # the first step with prompt tokens and the first decode step matched the eager ones' logits (the self-check)
    assert stats.checked == ["flex attention (prompt tokens)", "flex attention"]
    # Every bucket (tokens, slots, columns in several multiples of 256) shares a dynamic graph: one for decode steps
    # (a grid one token wide), one for steps with prompt tokens; each a second for buckets whose columns span the
    # slots' whole width (their keys are contiguous, and the graph guards on that).
    assert stats.graphs <= 4
    # ...with duck shapes off while the step compiles and runs, not for the process (other models keep the default)
    assert torch.fx.experimental._config.use_duck_shape
    assert eager_forwards > 30 and compiled_forwards <= eager_forwards / 10
    again, _ = step_forwards(type(model), lambda: debate(model, tok, True))
    assert again == eager and step_stats.stats_of(model).graphs == stats.graphs  # nothing recompiled


def test_structured_replies_and_their_label_probabilities_are_the_eager_ones(llama):
    """Rows under a schema: the host picks each token, the step still runs compiled, and a choice's tree pass reads
    the compiled steps' cache."""
    _, model, tok = llama
    schema = schema_program.compile_for("moderator_round", tok)
    eager = debate(model, tok, False, schema)
    compiled = debate(model, tok, True, schema)
    assert compiled[0] == eager[0]
    for got, want in zip(compiled[1], eager[1]):
        assert got["fields"] == want["fields"]
        for key, probs in want["probs"].items():
            assert got["probs"][key] == pytest.approx(probs, abs=1e-5)


def test_sliding_window_layers_compile_and_slide_as_eagerly(tmp_path):
    path = build_tiny_gemma(tmp_path / "gemma", seed=0)
    model, tok = AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    eager = debate(model, tok, False)
    assert debate(model, tok, True) == eager
    assert step_stats.stats_of(model).failed is None


def test_nf4_weights_with_a_lora_adapter_compile_and_give_the_eager_tokens(llama, tmp_path):
    """The eager tokens up to one of NF4's near-ties (tests/token_match.py): bitsandbytes' CPU kernel rounds a
    product's inputs to bf16 on a CPU with AVX512-BF16, so the compiled step's other order of sums can move a logit
    by hundredths. Seen: on an Intel Xeon with AVX512-BF16 (2026-12-07), after other test files had run in the same
    process, one reply of five parted at its seventh token, here and at the commit before alike."""
    path = llama[0]
    adapter = build_random_lora(path, tmp_path / "adapter")
    agent = models.load_roles({"moderator": path}, {"moderator": str(adapter)}, use_4bit=True)["moderator"]
    assert agent.loaded.quantized
    scope = lambda: models.adapter_scope(agent)  # noqa: E731
    eager = conversations(agent.model, agent.tokenizer, False, scope=scope)
    compiled = conversations(agent.model, agent.tokenizer, True, scope=scope)
    with scope(), torch.inference_mode():  # the reference logits under the adapter, as the runs had it
        tolerance = token_match.measured_tolerance(agent.model, agent.tokenizer, eager)
        ties = token_match.match_conversations(agent.model, agent.tokenizer, compiled, eager, tolerance=tolerance)
    assert len(ties) <= 1  # the other conversations compared whole
    stats = step_stats.stats_of(agent.model)
    assert stats.failed is None and stats.graphs >= 1


def test_a_step_that_cannot_compile_says_so_once_and_runs_eagerly(llama, monkeypatch, caplog):
    _, model, tok = llama
    want = debate(model, tok, False)
    fresh = AutoModelForCausalLM.from_pretrained(llama[0]).eval()  # a model of its own: its compile state is new

    def broken(*args, **kwargs):
        raise torch._dynamo.exc.Unsupported("simulated graph break")

    compiled_step.compiled(fresh)
    monkeypatch.setitem(compiled_step._compiled, fresh, broken)
    with caplog.at_level("WARNING", logger="debate.engine.compiled_step"):
        got = debate(fresh, tok, True)
    assert got == want
    # flex, then the masked attention, each said once (the model's later steps run eagerly, without trying again)
    assert caplog.text.count("with flex attention failed (Unsupported: simulated graph break)") == 1
    assert caplog.text.count("with masked attention failed (Unsupported: simulated graph break); it runs eagerly") == 1
    assert step_stats.stats_of(fresh).as_record()["compiled"] is False


def test_a_run_with_compile_records_it_and_writes_the_eager_runs_predictions(llama, tmp_path):
    path = llama[0]
    outs = {}
    for flag in ("--compile", "--no-compile"):
        outs[flag] = tmp_path / flag
        run_debate.main(["--split", "demo", "--model", str(path), "--limit", "2", "--max-new-tokens", "8",
                         "--max-rounds", "1", "--no-structured", "--temperature", "0", "--output-dir",
                         str(outs[flag]), flag])
    read = lambda out: [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]  # noqa
    assert read(outs["--compile"]) == read(outs["--no-compile"])
    decode = json.loads((outs["--compile"] / "config.json").read_text())["models"]["moderator"]["decode"]
    assert decode["compiled"] is True and decode["graphs"] >= 1 and decode["compiled_steps"] > 0
    eager = json.loads((outs["--no-compile"] / "config.json").read_text())["models"]["moderator"]["decode"]
    assert eager["compiled"] is False and eager["eager_steps"] > 0
    # Occupancy, per role: the tokens the decode steps produced over the rows they ran (eagerly, no bucket's padding).
    tokens, rows = eager["decode_tokens"], eager["decode_row_steps"]
    assert tokens > 0 and eager["occupancy"] == round(tokens / rows, 4)
    assert 0.5 < eager["occupancy"] <= 1 and decode["occupancy"] <= eager["occupancy"]


def test_a_steps_queries_grouped_by_key_head_attend_as_with_repeated_keys():
    """The step's attention reads each key head once (a key head's query heads side by side in the grid): the same
    output as sdpa over keys and values repeated to every query head, each row over the columns it sees."""
    from transformers.integrations.sdpa_attention import repeat_kv

    torch.manual_seed(0)
    rows, heads, kv_heads, columns, dim = 3, 8, 2, 40, 16
    query = torch.randn(1, heads, rows, dim)  # one token a row, the rows' tokens in one sequence
    key, value = torch.randn(rows, kv_heads, columns, dim), torch.randn(rows, kv_heads, columns, dim)
    start = torch.tensor([5, 39, 17])
    slots = torch.arange(rows)
    packed = attention.Packed(slots, torch.zeros(rows, dtype=torch.long), start, torch.ones(rows, dtype=torch.long),
                              torch.empty(1))
    mask = attention.grid_masks(packed, torch.arange(columns), {"full_attention": None}, heads // kv_heads,
                                torch.float32)["full_attention"]
    got = attention.packed_masked(query, key, value, mask, packed, dim ** -0.5)
    assert got.shape == (1, rows, heads, dim)
    for row in range(rows):
        seen = attention.sees(start[row], torch.arange(columns), None)
        want = torch.nn.functional.scaled_dot_product_attention(
            query[:, :, row:row + 1], repeat_kv(key[row:row + 1], 4), repeat_kv(value[row:row + 1], 4),
            attn_mask=seen[None], scale=dim ** -0.5)
        assert torch.allclose(got[0, row], want[0, :, 0], atol=1e-6)
