"""4-bit NF4 on a CPU through the project's own loader (`--4bit`): loading, every method, D-SFT and D-DPO
over an NF4 base (QLoRA), each compared with the full-precision run of the same tiny model.

No skip: bitsandbytes is a regular dependency and its CPU NF4 kernels (0.46 and later) run these in
seconds, so a machine where it is missing or cannot quantise fails here, in CI too.

Tolerances, measured on TINY_SMOOTH (hidden 64, 2 layers, weights N(0, 0.02)), 2 x 40 random tokens,
bitsandbytes 0.50.2, torch 2.13 CPU: the largest |NF4 - float32| logit difference was 0.086 (logits
within +-0.7), correlation 0.9956, 90% of argmax tokens equal. NF4 keeps 16 levels per block of 64 weights
scaled by the block's largest magnitude, so each weight moves by up to ~1/14 of that maximum: a few per
cent of a logit's size after two layers is what that rounding costs, and no more. The bounds below
(0.3, correlation 0.98) leave ~3x headroom for other CPUs and kernels. Against float32 weights that hold
exactly the NF4-rounded values the gap was 0.0024 (the kernels' own float error), so < 0.01 pins the whole
difference to weight rounding. The default tiny model (N(0, 0.2), peaked logits for greedy debates) is far
more sensitive (max 4.8): its debates are compared by structure, not by token.
"""
import json
from pathlib import Path

import bitsandbytes as bnb  # a plain import: missing, this file fails in CI instead of skipping
import pytest
import torch

import run_debate
import train_moderator
from debate.data.labels import LABELS
from debate.engine import engine, models, schema_program
from debate.methods import debatecv
from debate.pipeline import records
from tests import syndec_task, token_match
from tests.tiny_models import build_tiny_llama
from train import examples, loop, lora, losses, stages, syndec

LOGIT_TOLERANCE = 0.3  # NF4 vs float32, measured 0.086 (module docstring)
ROUNDING_TOLERANCE = 0.01  # NF4 vs float32 holding the NF4-rounded weights, measured 0.0024
KERNEL_TOLERANCE = 0.01  # the same NF4 model through bitsandbytes' two CPU kernels (train/lora.py), measured 0.0023
DECODER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def smooth(tmp_path_factory):
    return str(build_tiny_llama(tmp_path_factory.mktemp("smooth"), seed=0, initializer_range=0.02))


def tokens(n=40, rows=2, seed=0):
    return torch.randint(5, 300, (rows, n), generator=torch.Generator().manual_seed(seed))


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


# --- loading -----------------------------------------------------------------------------------------------

def test_4bit_on_a_cpu_loads_nf4_layers_and_says_so(smooth):
    nf4 = models.load_model(smooth, use_4bit=True)
    assert nf4.quantized and nf4.dtype == torch.float32 and nf4.device == "cpu"
    layers = dict(nf4.model.named_modules())
    quantized = [n for n, m in layers.items() if isinstance(m, bnb.nn.Linear4bit)]
    # Every decoder projection is NF4 (double-quantised scales); the LM head stays full precision (transformers').
    assert len(quantized) == 2 * len(DECODER_LINEARS) and all(n.split(".")[-1] in DECODER_LINEARS for n in quantized)
    state = layers[quantized[0]].weight.quant_state
    assert state.quant_type == "nf4" and state.nested
    assert not isinstance(layers["lm_head"], bnb.nn.Linear4bit)
    assert models.precision(True) == {"device": "cpu", "dtype": "float32", "quantized": True, "precision": "nf4"}
    # The default stays float32 on a CPU (NF4 is slower there); --no-4bit never quantises.
    assert models.precision()["precision"] == models.precision(False)["precision"] == "float32"
    assert not models.load_model(smooth).quantized
    roles = models.load_roles({"moderator": smooth}, use_4bit=True)
    assert models.model_info(roles)["moderator"]["precision"] == "nf4"


def test_nf4_logits_are_float32_logits_up_to_weight_rounding(smooth):
    import bitsandbytes.functional as bnb_functional

    nf4 = models.load_model(smooth, use_4bit=True).model
    full = models.load_model(smooth, use_4bit=False).model
    # The same float32 model holding the dequantised NF4 weights, read before the first forward pass (the CPU
    # kernels repack the weights on first use).
    rounded = models.load_model(smooth, use_4bit=False).model
    nf4_layers = dict(nf4.named_modules())
    with torch.no_grad():
        for name, layer in rounded.named_modules():
            if isinstance(nf4_layers.get(name), bnb.nn.Linear4bit):
                weight = nf4_layers[name].weight
                layer.weight.copy_(bnb_functional.dequantize_4bit(weight.data, weight.quant_state))
    ids = tokens()
    a, b = logits(nf4, ids), logits(full, ids)
    assert a.shape == b.shape
    diff = (a - b).abs().max().item()
    assert 1e-3 < diff < LOGIT_TOLERANCE  # close, and never identical by accident: NF4 really ran
    assert torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1] > 0.98
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.75  # measured 0.90
    # ... and gives the NF4 logits: nothing but the rounding of the weights differs.
    assert (logits(rounded, ids) - a).abs().max() < ROUNDING_TOLERANCE


def test_4bit_where_bitsandbytes_cannot_quantise_is_one_clear_line(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(models, "_bitsandbytes_problem", lambda device: "bitsandbytes 0.42 cannot quantise to NF4 "
                        "on cpu (RuntimeError: no CPU kernel)")
    with pytest.raises(SystemExit) as exit:
        run_debate.main(["--split", "demo", "--model", tiny, "--4bit", "--output-dir", str(tmp_path / "run")])
    assert exit.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("error: --4bit: bitsandbytes 0.42 cannot quantise to NF4 on cpu (RuntimeError: no CPU "
                       "kernel); upgrade bitsandbytes (0.50.2 quantises on CPU and CUDA) or pass --no-4bit")
    assert not (tmp_path / "run" / records.PREDICTIONS).exists()
    # Without --4bit a CPU run never needs bitsandbytes.
    assert models.precision(None)["precision"] == "float32"


def test_the_flags_choose_and_the_default_follows_the_device():
    parse = lambda *flags: run_debate.cli.parse_run_args(["--split", "demo", *flags]).models.use_4bit  # noqa: E731
    assert (parse(), parse("--4bit"), parse("--no-4bit")) == (None, True, False)
    train = lambda *flags: train_moderator.parse_args(["--model", "m", *flags]).use_4bit  # noqa: E731
    assert (train(), train("--4bit"), train("--no-4bit")) == (None, True, False)


# --- every method on a 4-bit model -------------------------------------------------------------------------

def read(out, name):
    return [json.loads(line) for line in (Path(out) / name).read_text().splitlines()]


def debate(model, out, *extra):
    # Greedy, structured (verdicts and label probabilities from the schema; 100 tokens: the Moderator's JSON keys
    # alone take 94 of this tokenizer's), 3 claims at batch 2: the third joins while the others are in progress
    # (continuous batching), with the KV cache kept between turns (the default) or not (--no-cache-reuse).
    # Each claim's conversations are kept, {(claim id, role): engine.Conversation}, for their tokens.
    convs, start = {}, debatecv.start_debate

    def kept(claim, *args, **kwargs):
        debate = start(claim, *args, **kwargs)
        convs.update({(claim["claim_id"], role): conv for role, conv in debate.convs.items()})
        return debate

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(debatecv, "start_debate", kept)
        run_debate.main(["--split", "demo", "--evidence", "golden", "--model", model, "--max-new-tokens", "100",
                         "--max-rounds", "2", "--batch-size", "2", "--limit", "3", "--temperature", "0",
                         "--output-dir", str(out), *extra])
    config = json.loads((out / records.CONFIG).read_text())
    return read(out, records.PREDICTIONS), read(out, records.TRANSCRIPTS), config, convs


@pytest.fixture(scope="module")
def debates(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("debates")
    # A scripted Moderator decision: the tiny model's Moderator ends every debate after round 1, so nothing would
    # be reused; here it always goes on, so every claim debates both rounds and then gets the final prompt. Its
    # replies and tokens are still the model's own.
    read_reply = debatecv._read

    def going_on(debate, reply):
        parsed = read_reply(debate, reply)
        return {**parsed, "proceed": True} if debate.turns[-1]["round"] != "final" else parsed

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(debatecv, "_read", going_on)
        return {name: debate(tiny, root / name, *flags) for name, flags in
                (("nf4", ["--4bit"]), ("fp32", ["--no-4bit"]), ("nf4-plain", ["--4bit", "--no-cache-reuse",
                                                                               "--no-continuous"]))}


def test_debatecv_in_nf4_records_its_precision_and_the_outputs_of_float32(debates):
    (preds, transcripts, config, _), (preds32, transcripts32, config32, _) = debates["nf4"], debates["fp32"]
    assert config["use_4bit"] is True and config["precision"] == "nf4"
    assert {m["precision"] for m in config["models"].values()} == {"nf4"} and set(config["models"]) == {
        "affirmative", "negative", "moderator"}
    assert config32["use_4bit"] is False and config32["precision"] == "float32"
    # The same structure of outputs: claims, fields, a verdict chosen from the labels with its probabilities.
    assert [p["claim_id"] for p in preds] == [p["claim_id"] for p in preds32] and len(preds) == 3
    for p, q in zip(preds, preds32):
        assert set(p) == set(q)
        for row in (p, q):
            assert row["label"] in LABELS and set(row["label_probs"]) == set(LABELS)
            assert abs(sum(row["label_probs"].values()) - 1) < 1e-4
            assert max(row["label_probs"], key=row["label_probs"].get) == row["label"]
    assert [len(t["turns"]) for t in transcripts] and all(len(t["turns"]) >= 3 for t in transcripts)
    # Different weights: the replies or the probabilities differ somewhere (the default tiny model flips tokens
    # under NF4 rounding, see the module docstring), so the NF4 run cannot be the float32 one by accident.
    said = lambda ts: [[turn["response"] for turn in t["turns"]] for t in ts]  # noqa: E731
    assert said(transcripts) != said(transcripts32) or [p["label_probs"] for p in preds] != [
        p["label_probs"] for p in preds32]


def test_nf4_debates_reuse_the_kv_cache_and_batch_continuously_without_changing_a_token(debates, tiny):
    """The same tokens as the plain run (no cache kept, fixed batches), up to one of NF4's near-ties: the two runs
    put other rows beside a row and attend otherwise, and bitsandbytes' CPU kernels round a product's inputs to bf16,
    so a last-bit difference can move a logit by hundredths (by the instruction set too: on an AVX-512 CPU the AVX2
    and AVX-512 kernels flip different near-ties). The tolerance is that rounding measured on these turns
    (token_match.measured_tolerance). A claim whose tokens part at a near-tie of the reference logits is compared up
    to that step (tests/token_match) and not after it; every other claim is compared whole."""
    (preds, transcripts, _, convs), (plain_preds, plain_transcripts, plain_config, plain_convs) = (
        debates["nf4"], debates["nf4-plain"])
    assert plain_config["reuse_cache"] is False and plain_config["continuous"] is False
    keys = sorted(plain_convs)
    assert sorted(convs) == keys and len(keys) == 9
    nf4 = models.load_model(tiny, use_4bit=True)
    want = [plain_convs[k] for k in keys]
    # The near-ties' tolerance: NF4's rounding measured on these very turns (tests/token_match.py), with its margin.
    tolerance = token_match.measured_tolerance(nf4.model, nf4.tokenizer, want)
    ties = token_match.match_conversations(
        nf4.model, nf4.tokenizer, [convs[k] for k in keys], want,
        names=[f"claim {claim} {role}" for claim, role in keys], groups=[claim for claim, _ in keys],
        tolerance=tolerance)  # one tie at most
    parted = {keys[i][0] for i in ties}
    assert len(parted) < len(preds)  # at least one claim compared whole
    said = lambda ts: {t["claim_id"]: [turn["response"] for turn in t["turns"]] for t in ts  # noqa: E731
                       if t["claim_id"] not in parted}
    same = lambda ps, key: [p[key] for p in ps if p["claim_id"] not in parted]  # noqa: E731
    assert said(transcripts) == said(plain_transcripts)
    assert same(preds, "label") == same(plain_preds, "label")
    # Two rounds and the final prompt: later turns found their conversation cached and encoded only what is new.
    assert all(p["rounds"] == 2 for p in preds + plain_preds)
    assert all(p["encoded_tokens"] < p["prompt_tokens"] for p in preds)
    assert all(p["encoded_tokens"] == p["prompt_tokens"] for p in plain_preds)
    assert same(preds, "completion_tokens") == same(plain_preds, "completion_tokens")


def test_courtroom_and_madr_run_on_nf4_agents(tiny, tmp_path):
    base = ["--split", "demo", "--evidence", "golden", "--model", tiny, "--max-new-tokens", "5", "--max-rounds", "1",
            "--no-structured", "--batch-size", "2", "--limit", "2", "--temperature", "0", "--4bit"]
    court = tmp_path / "court"
    run_debate.main([*base, "--method", "courtroom", "--output-dir", str(court)])
    config = json.loads((court / records.CONFIG).read_text())
    assert {"court", "critic", "witness", "plaintiff", "defense", "judge_1"} <= set(config["models"])
    assert {m["precision"] for m in config["models"].values()} == {"nf4"}
    for p in read(court, records.PREDICTIONS):
        # 5 free tokens of a random model: a verdict or none, recorded as unparsed, never a guessed class.
        assert p["label"] in (*LABELS, None) and len(p["votes"]) == 3 and p["panel"] and p["tokens"]["total"] > 0

    madr = tmp_path / "madr"
    run_debate.main([*base, "--refine", "madr", "--madr-iterations", "1", "--output-dir", str(madr)])
    config = json.loads((madr / records.CONFIG).read_text())
    assert {"madr_judge", "madr_refiner"} <= set(config["models"])
    assert {m["precision"] for m in config["models"].values()} == {"nf4"}
    for p in read(madr, records.PREDICTIONS):
        assert "justification_unrefined" in p and p["madr"]["stop_reason"] in ("agreement", "max_iterations")


# --- QLoRA: D-SFT and D-DPO over an NF4 base ---------------------------------------------------------------

def pairs(tokenizer, n=2):
    rows = syndec_task.records(n, wrong=True)
    return examples.build(tokenizer, rows, examples.dpo_example, 1024)[0]


def test_qlora_base_frozen_in_nf4_adapter_in_float32_and_a_reload_gives_the_same_logits(smooth, tmp_path):
    model, tokenizer, loaded = lora.load_trainable(smooth, r=8, alpha=16, use_4bit=True)
    assert loaded.quantized and model.get_base_model().is_activation_checkpointing  # the 5.x name
    quantized = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(quantized) == 2 * len(DECODER_LINEARS)
    assert all(not p.requires_grad for m in quantized for p in m.base_layer.parameters()) if hasattr(
        quantized[0], "base_layer") else all(not m.weight.requires_grad for m in quantized)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n and p.dtype == torch.float32 for n, p in trainable.items())

    # A few D-SFT steps: the loss goes down through the NF4 base and the checkpointed layers.
    data = examples.build(tokenizer, syndec_task.records(2), examples.sft_example, 1024)[0]
    batch = losses.collate(data, tokenizer.pad_token_id, "cpu")
    optimizer = torch.optim.AdamW(trainable.values(), lr=5e-3)
    model.train()
    seen = []
    for _ in range(6):
        loss, _, _ = losses.sft_loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        seen.append(loss.item())
    assert seen[-1] < seen[0]

    model.eval()
    ids = tokens(seed=1)
    before = logits(model, ids)
    lora.save_adapter(model, tmp_path / "adapter", loaded)
    again = models.load_roles({"moderator": smooth}, {"moderator": str(tmp_path / "adapter")}, use_4bit=True)
    with models.adapter_scope(again["moderator"]) as reloaded:
        after = logits(reloaded, ids)
    assert again["moderator"].loaded.quantized
    # The same NF4 weights and adapter; only the CPU kernel differs: a model being trained keeps the layout that
    # backpropagates (train/lora.py), a loaded one gets bitsandbytes' repacked inference kernel. Measured 0.0023.
    assert (after - before).abs().max() < KERNEL_TOLERANCE
    full = models.load_roles({"moderator": smooth}, {"moderator": str(tmp_path / "adapter")}, use_4bit=False)
    with models.adapter_scope(full["moderator"]) as reloaded:
        in_float32 = logits(reloaded, ids)
    assert 1e-3 < (in_float32 - before).abs().max() < LOGIT_TOLERANCE


def test_dpo_reference_logps_come_from_the_same_nf4_base(smooth, tmp_path):
    from accelerate import Accelerator

    from tests.tiny_models import build_random_lora

    adapter = build_random_lora(smooth, str(tmp_path / "sft"))
    model, tokenizer, _ = lora.load_trainable(smooth, adapter=adapter, use_4bit=True)
    data = pairs(tokenizer)
    pad = tokenizer.pad_token_id
    ref = stages.reference_logps(model, data, pad, Accelerator(cpu=True))
    assert ref.shape == (len(data), 2) and torch.isfinite(ref).all()

    def logps(role_model, disabled=False):
        batch = losses.collate([e["chosen"] for e in data] + [e["rejected"] for e in data], pad, "cpu")
        with torch.no_grad():
            if disabled:
                with role_model.disable_adapter():
                    out = losses.sequence_logps(role_model, batch)[0]
            else:
                with models.adapter_scope(role_model) as m:
                    out = losses.sequence_logps(m, batch)[0]
        return out.double().view(2, -1).T

    # The reference is the D-SFT model on the 4-bit base itself: a fresh NF4 load with the adapter agrees.
    fresh = models.load_roles({"moderator": smooth}, {"moderator": adapter}, use_4bit=True)["moderator"]
    assert (logps(fresh) - ref).abs().max() < KERNEL_TOLERANCE * 10  # sums over ~200 tokens; measured 0.0038
    # With the adapter switched off, the same 4-bit model is the plain NF4 base (no second copy is needed).
    base = models.load_roles({"moderator": smooth}, use_4bit=True)["moderator"]
    model.eval()
    assert (logps(model, disabled=True) - logps(base)).abs().max() < KERNEL_TOLERANCE * 10
    assert (logps(model, disabled=True) - ref).abs().max() > 0.1  # the adapter matters
    # Float32 gives close log-probabilities, not the same ones: sums over ~30 target tokens, each off by
    # about the logit tolerance at most.
    full = models.load_roles({"moderator": smooth}, {"moderator": adapter}, use_4bit=False)["moderator"]
    gap = (logps(full) - ref).abs().max().item()
    assert 1e-3 < gap < LOGIT_TOLERANCE * max(len(e["chosen"]["labels"]) for e in data)


def test_train_moderator_dpo_with_4bit_trains_and_saves_an_adapter(smooth, tmp_path):
    from tests.tiny_models import build_random_lora

    out = tmp_path / "syndec"
    p = stages.paths(out)
    out.mkdir()
    rows = syndec_task.records(2) + syndec_task.records(2, start=2, wrong=True)
    syndec.write(p["syndec"], rows)
    syndec.write(p["corrected"], rows)
    p["corrections"].write_text("")
    build_random_lora(smooth, str(p["sft"] / "adapter"))
    train_moderator.main(["--stage", "dpo", "--model", smooth, "--out", str(out), "--4bit", "--epochs", "2",
                          "--grad-accum", "1", "--lr", "5e-3", "--max-length", "1024", "--warmup-ratio", "0"])
    adapter = out / "dpo" / "adapter"
    assert (adapter / "adapter_model.safetensors").is_file()
    config = json.loads((out / "train_config.json").read_text())
    assert config["use_4bit"] is True and config["precision"] == "nf4"
    assert config["models"]["dpo"]["moderator"]["precision"] == "nf4"
    metrics = [json.loads(line) for line in (out / "dpo" / "metrics.jsonl").read_text().splitlines()]
    # The reference pass runs in eval mode first; bitsandbytes' CPU repack would then leave every step without a
    # gradient (grad_norm 0, the loss ln 2 for ever) unless training keeps the layout (train/lora.py).
    assert len(metrics) == 4 and all(m["grad_norm"] > 0 for m in metrics)
    assert metrics[0]["loss"] == pytest.approx(0.693147, abs=1e-5)  # the policy starts as its reference
    assert any(abs(m["loss"] - metrics[0]["loss"]) > 1e-4 for m in metrics[1:])
    reloaded = models.load_roles({"moderator": smooth}, {"moderator": str(adapter)}, use_4bit=True)["moderator"]
    assert reloaded.loaded.quantized


# --- the GPU's settings on a CPU: bf16 compute under NF4, the training step under bf16 autocast -----------------

BF16_LOGIT_TOLERANCE = 0.08  # NF4 with bf16 compute vs float32 compute: measured 0.026
BF16_LOSS_TOLERANCE = 1e-3  # the same two training steps' losses, bf16 autocast vs float32: measured 2.7e-5
PROBS_TOLERANCE = 0.02  # a verdict's label probabilities, NF4 vs float32 weights: measured 0.0065


def test_nf4_with_bf16_compute_gives_the_float32_compute_logits_to_bf16_rounding(smooth):
    bf16 = models.load_model(smooth, use_4bit=True, dtype=torch.bfloat16)
    fp32 = models.load_model(smooth, use_4bit=True)
    assert bf16.quantized and bf16.dtype == torch.bfloat16
    ids = tokens()
    a, b = logits(bf16.model, ids), logits(fp32.model, ids)
    # bf16 keeps 8 significant bits: each product and sum rounds by up to 2^-9 of its size, and the logits
    # (within +-0.7) move by a few hundredths after two layers (measured 0.026); the bound is ~3x that.
    diff = (a - b).abs().max().item()
    assert 0 < diff < BF16_LOGIT_TOLERANCE, diff


def _train_sft(model_dir, out, dtype):
    """Two D-SFT steps through train.loop.train (its own autocast), NF4 base at `dtype` compute; (metrics, the
    dtypes a decoder layer's MLP produced)."""
    from accelerate import Accelerator

    torch.manual_seed(0)
    model, tokenizer, loaded = lora.load_trainable(model_dir, r=8, alpha=16, use_4bit=True, dtype=dtype)
    data = examples.build(tokenizer, syndec_task.records(2), examples.sft_example, 1024)[0]
    produced = set()
    hook = model.get_base_model().model.layers[0].mlp.register_forward_hook(
        lambda module, args, output: produced.add(output.dtype))
    cfg = loop.TrainConfig(lr=5e-3, epochs=1, micro_batch=1, grad_accum=1, warmup_ratio=0, save_every=1000)
    loop.train(model, data, losses.sft_loss, lambda rows: losses.collate(rows, tokenizer.pad_token_id, "cpu"), cfg,
               out, loaded, Accelerator(cpu=True))
    hook.remove()
    return [json.loads(line) for line in (out / loop.METRICS).read_text().splitlines()], produced


def test_the_training_step_under_bf16_autocast_matches_float32(smooth, tmp_path):
    bf16, bf16_dtypes = _train_sft(smooth, tmp_path / "bf16", torch.bfloat16)
    fp32, fp32_dtypes = _train_sft(smooth, tmp_path / "fp32", None)
    # The loop's autocast ran the bf16 model in bf16 (the GPU's path), the float32 one in float32.
    assert bf16_dtypes == {torch.bfloat16} and fp32_dtypes == {torch.float32}
    assert len(bf16) == len(fp32) == 2 and all(m["grad_norm"] > 0 for m in bf16)
    # A loss is the mean of the target tokens' losses; bf16's per-logit errors (above) are of either sign and
    # average out over the tokens (measured 2.7e-5 at both steps). 1e-3 leaves room for other CPUs' kernels
    # and is still far below what a step on other weights, or one that lost its gradient, would show.
    gaps = [abs(a["loss"] - b["loss"]) for a, b in zip(bf16, fp32)]
    assert 0 < max(gaps) < BF16_LOSS_TOLERANCE, gaps


def test_nf4_label_probabilities_are_the_float32_ones_as_numbers(smooth, monkeypatch):
    from debate.data import answer_schemas as declared

    # A verdict with nothing before it: both models score the labels after the very same tokens. One-letter
    # labels (one token each, plus the closing quote): AVeriTeC's own run to 10+ tokens on this tokenizer, and
    # summed over those a random model's probabilities round to 1 and 0 in both precisions alike.
    labels = ("A", "B", "C", "D")
    spec = declared.Spec(name="verdict_only_4bit_test", fields=(declared.Field("Verdict", "choice", values=labels),))
    monkeypatch.setattr(declared, "load", lambda name: spec)
    probs = {}
    for name, use_4bit in (("nf4", True), ("fp32", False)):
        loaded = models.load_model(smooth, use_4bit=use_4bit)
        compiled = schema_program.compile_for(spec.name, loaded.tokenizer)
        conv = engine.Conversation(system="You are the Moderator.")
        engine.generate(loaded.model, loaded.tokenizer, [conv], ["Is the claim supported?"],
                        engine.Settings(max_new_tokens=40), schemas=[compiled])
        probs[name] = conv.structured["probs"]["Verdict"]
    assert set(probs["nf4"]) == set(labels)
    # Probabilities of whole labels (a few tokens each) from logits NF4 moves by < 0.3 (measured < 0.09): at
    # the smooth model's near-uniform probabilities a change of p(1 - p) x the summed logit gaps, a few hundredths.
    gaps = [abs(probs["nf4"][k] - probs["fp32"][k]) for k in labels]
    assert 0 < max(gaps) < PROBS_TOLERANCE, (probs, gaps)


def test_bitsandbytes_cannot_reach_the_hub_kernel_even_with_kernels_installed(tmp_path):
    # A stand-in `kernels` package that records being imported: bitsandbytes' CPU backend would import it and
    # fetch a kernel from the hub (debate/engine/offline.py). After our import it is never reached.
    import subprocess
    import sys

    fake = tmp_path / "site" / "kernels"
    fake.mkdir(parents=True)
    marker = tmp_path / "imported"
    (fake / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                      "def get_kernel(*a, **k):\n    raise RuntimeError('hub')\n")
    script = ("import logging, sys\n"
              "import debate.engine.models\n"
              "import bitsandbytes\n"
              "try:\n    from kernels import get_kernel\nexcept ImportError:\n    print('blocked')\n"
              "print(logging.getLogger('bitsandbytes.backends.cpu.ops').getEffectiveLevel())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": f"{tmp_path / 'site'}:{Path.cwd()}"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["blocked", str(__import__("logging").ERROR)] and not marker.exists()
    assert "kernels-community" not in done.stderr
