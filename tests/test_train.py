"""D-SFT and D-DPO on a tiny random-weight Llama: what is trained on, that it learns, that resuming is exact."""
import json
import math

import pytest
import torch
from accelerate import Accelerator

from debate.data.labels import REFUTED, SUPPORTED
from debate.data.parsing import KEYS, parse_moderator
from debate.engine import chat, engine
from debate.methods import debatecv
from tests import syndec_task
from train import examples, loop, lora, losses, stages
from train.settings import TrainSettings

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tokenizer(tiny):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny)


def lora_params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


# --- what the Moderator is trained on -------------------------------------------------------------

def test_sft_example_is_the_moderators_conversation_with_loss_on_the_target_only(tokenizer):
    record = syndec_task.record(7, SUPPORTED)
    example, how = examples.sft_example(tokenizer, record, 4096)
    assert how == "kept"
    ids, labels = example["input_ids"], example["labels"]
    n_context = labels.index(next(label for label in labels if label != examples.IGNORE))

    # The context is exactly what the engine fed the Moderator at its final turn.
    earlier = [t for t in record["debate"] if t["role"] == "moderator"][:-1]
    conv = engine.Conversation(system=debatecv.moderator_system(record["claim"], record["evidence"]))
    for t in earlier:
        conv.messages += [{"role": "user", "content": t["prompt"]}, {"role": "assistant", "content": t["response"]}]
        conv.generated.append(chat.encode_text(tokenizer, t["response"]))
    conv.messages.append({"role": "user", "content": record["debate"][-1]["prompt"]})
    assert ids[:n_context] == chat.context_ids(tokenizer, conv)

    # Token by token: every context position is masked, every target position is its own token.
    for position, (token, label) in enumerate(zip(ids, labels)):
        assert label == (examples.IGNORE if position < n_context else token)
    target = tokenizer.decode(ids[n_context:])
    assert target.endswith("<|eot_id|>")  # the reply ends the turn, so generation learns to stop
    assert json.loads(target.removesuffix("<|eot_id|>")) == {
        "Justification for Verdict": syndec_task.JUSTIFICATION, "Verdict": SUPPORTED}


def test_targets_are_clean_json_and_a_pair_differs_only_in_verdict_and_justification():
    record = syndec_task.record(1, SUPPORTED, predicted=REFUTED, corrected="Because the source says so.")
    # A debate ended in a round: the six round keys, with "No".
    record["debate"] = record["debate"][:3]
    record["debate"][2]["response"] = ("Sure! ```json\n" + json.dumps({
        "Primary Insight": "p", "Evidence Gaps": "g", "Justification for Proceeding": "done",
        "Proceeding Necessity": "No", "Justification for Verdict": "wrong", "Verdict": "refuted"}) + "\n```")
    chosen, rejected = (json.loads(t) for t in examples.dpo_pair(record))
    assert list(chosen) == list(KEYS) and list(rejected) == list(KEYS)
    assert chosen["Verdict"] == SUPPORTED and chosen["Justification for Verdict"] == "Because the source says so."
    assert rejected["Verdict"] == REFUTED and rejected["Justification for Verdict"] == "wrong"
    assert {k: v for k, v in chosen.items() if k not in ("Verdict", "Justification for Verdict")} == \
           {k: v for k, v in rejected.items() if k not in ("Verdict", "Justification for Verdict")}
    # An unreadable reply is the rejected one as it was.
    record["debate"][2]["response"] = "  I cannot decide.  "
    assert examples.dpo_pair(record)[1] == "I cannot decide."
    # D-SFT of a wrong record (--sft-include-corrected) learns the chosen reply.
    assert examples.sft_target(record) == examples.dpo_pair(record)[0]


def test_long_debates_lose_oldest_rounds_then_evidence_and_never_the_target(tokenizer):
    record = syndec_task.record(3, REFUTED)
    mod = record["debate"][2]
    record["debate"][3:3] = [dict(mod, round=2, prompt=mod["prompt"].replace("Round 1", "Round 2"))]
    record["evidence"] = [{"question": f"Question {k}?", "answer": "An answer " * 20, "url": ""} for k in range(4)]
    full, how = examples.sft_example(tokenizer, record, 100_000)
    assert how == "kept"
    n_target = sum(label != examples.IGNORE for label in full["labels"])

    one_round_less, how = examples.sft_example(tokenizer, record, len(full["input_ids"]) - 1)
    assert how == "dropped_rounds"
    text = tokenizer.decode(one_round_less["input_ids"])
    round_over = "Round {} of the fact-checking debate is over"
    assert round_over.format(1) not in text and round_over.format(2) in text  # the oldest round goes first
    no_rounds, how = examples.sft_example(tokenizer, record, len(one_round_less["input_ids"]) - 1)
    text = tokenizer.decode(no_rounds["input_ids"])
    assert how == "dropped_rounds" and round_over.format(2) not in text and "Question 3?" in text

    fewer_items, how = examples.sft_example(tokenizer, record, len(no_rounds["input_ids"]) - 1)
    assert how == "dropped_evidence"
    text = tokenizer.decode(fewer_items["input_ids"])
    assert "Question 0?" in text and "Question 3?" not in text  # items go from the end of the list

    for example in (one_round_less, no_rounds, fewer_items):
        assert example["labels"][-n_target:] == full["labels"][-n_target:]  # the target is never cut
    assert examples.sft_example(tokenizer, record, n_target + 5) == (None, "skipped_too_long")


def test_sequence_logps_of_a_left_padded_batch_equal_each_row_alone(tiny, tokenizer):
    model = lora.load_trainable(tiny, r=4, alpha=8, dropout=0.0, gradient_checkpointing=False)[0].eval()
    rows = [examples.sft_example(tokenizer, r, 4096)[0] for r in syndec_task.records(2)]
    rows[1] = {k: v[-300:] for k, v in rows[1].items()}  # rows of different lengths: one gets padded
    batch = losses.collate(rows, tokenizer.pad_token_id, CPU)
    with torch.no_grad():
        logps, counts = losses.sequence_logps(model, batch)
        for k, row in enumerate(rows):
            ids = torch.tensor([row["input_ids"]])
            full = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
            targets = torch.tensor(row["labels"][1:])
            keep = targets != examples.IGNORE
            expected = full[keep].gather(-1, targets[keep].unsqueeze(-1)).sum()
            assert counts[k] == keep.sum()
            assert logps[k].item() == pytest.approx(expected.item(), rel=1e-4)


def test_dpo_loss_and_rewards_by_hand():
    pc, pr = torch.tensor([-10.0, -4.0]), torch.tensor([-12.0, -3.0])
    rc, rr = torch.tensor([-11.0, -4.0]), torch.tensor([-11.0, -4.0])
    loss, chosen, rejected = losses.dpo_loss(pc, pr, rc, rr, beta=0.5)
    # pair 1: 0.5*((-10+11) - (-12+11)) = 1; pair 2: 0.5*(0 - 1) = -0.5
    expected = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(0.5))) / 2
    assert loss.item() == pytest.approx(expected)
    assert chosen.tolist() == [0.5, 0.0] and rejected.tolist() == [-0.5, 0.5]


def test_learning_rate_warms_up_then_decays():
    factors = [loop.lr_factor(s, 10, 2, "cosine") for s in range(10)]
    assert factors[:2] == [0.5, 1.0] and factors[2] == 1.0
    assert all(a >= b for a, b in zip(factors[2:], factors[3:])) and factors[-1] < 0.05
    assert [loop.lr_factor(s, 4, 0, "linear") for s in range(4)] == [1.0, 0.75, 0.5, 0.25]
    assert loop.lr_factor(9, 10, 2, "constant") == 1.0


def test_each_process_takes_an_equal_disjoint_share_of_each_epoch():
    cfg = loop.TrainConfig(micro_batch=2, grad_accum=1, seed=3)
    shares = [sum(loop.micro_batches(11, 0, cfg, rank, 2), []) for rank in range(2)]
    assert len(shares[0]) == len(shares[1]) == 5 and not set(shares[0]) & set(shares[1])
    assert loop.micro_batches(11, 0, cfg) == loop.micro_batches(11, 0, cfg)
    assert loop.micro_batches(11, 0, cfg) != loop.micro_batches(11, 1, cfg)  # a new order each epoch


# --- it learns ------------------------------------------------------------------------------------

def greedy_verdicts(model, tokenizer, rows):
    model.eval()
    verdicts = []
    for row in rows:
        ids, _ = examples.fit_context(tokenizer, row, 4096)
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=40, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        verdicts.append(parse_moderator(tokenizer.decode(out[0, len(ids):], skip_special_tokens=True))["verdict"])
    return verdicts


def accuracy(verdicts, rows):
    return sum(v == r["gold_label"] for v, r in zip(verdicts, rows)) / len(rows)


def test_dsft_learns_to_read_the_verdict_from_the_debate(tiny, tmp_path):
    train_rows, held_out = syndec_task.records(32), syndec_task.records(16, start=32)
    torch.manual_seed(0)
    model, tokenizer, loaded = lora.load_trainable(tiny, r=16, alpha=32, dropout=0.0, gradient_checkpointing=False)
    before = accuracy(greedy_verdicts(model, tokenizer, held_out), held_out)
    data, counts = examples.build(tokenizer, train_rows, examples.sft_example, 4096)
    cfg = loop.TrainConfig(lr=2e-2, epochs=8, micro_batch=4, grad_accum=1, warmup_ratio=0.1, save_every=1000)
    summary = loop.train(model, data, losses.sft_loss, lambda b: losses.collate(b, tokenizer.pad_token_id, CPU),
                         cfg, tmp_path, loaded, Accelerator())
    after = accuracy(greedy_verdicts(model, tokenizer, held_out), held_out)
    assert before <= 0.5 and after >= 0.9, (before, after)
    assert summary["finished"] and summary["steps"] == 64 and counts == {"kept": 32}
    log = [json.loads(line) for line in (tmp_path / loop.METRICS).read_text().splitlines()]
    assert [m["step"] for m in log] == list(range(1, 65))
    assert log[-1]["loss"] < log[0]["loss"] / 10 and all(m["tokens"] > m["target_tokens"] > 0 for m in log)


def preference(model, tokenizer, pairs):
    """On held-out pairs: (reward accuracy: share whose implicit reward beta-free margin
    (log pi - log ref)(chosen) - (log pi - log ref)(rejected) is positive, as DPO reports it;
    plain accuracy: share where chosen is more likely than rejected; mean margin). Reference = adapter off."""
    model.eval()
    wins, plain, margins = 0, 0, []
    with torch.no_grad():
        for pair in pairs:
            batch = losses.collate([pair["chosen"], pair["rejected"]], tokenizer.pad_token_id, CPU)
            logps, _ = losses.sequence_logps(model, batch)
            with model.disable_adapter():
                ref, _ = losses.sequence_logps(model, batch)
            margin = ((logps[0] - ref[0]) - (logps[1] - ref[1])).item()
            wins += margin > 0
            plain += bool(logps[0] > logps[1])
            margins.append(margin)
    return wins / len(pairs), plain / len(pairs), sum(margins) / len(margins)


def train_args(out, model, **overrides):
    args = dict(out=str(out), model=model, syndec=None, sft_adapter=None, init_adapter=None, use_4bit=False,
                gradient_checkpointing=True, lora_r=8, lora_alpha=16, lora_dropout=0.0, lr=5e-3, epochs=4,
                micro_batch=4, grad_accum=1, warmup_ratio=0.0, schedule="cosine", save_every=1000, seed=0,
                max_length=4096, beta=0.5, resume=False, sft_include_corrected=False)
    args.update(overrides)
    return TrainSettings(**args)


def test_ddpo_prefers_the_corrected_reply_on_held_out_pairs(tiny, tmp_path):
    from train import syndec

    torch.manual_seed(0)
    # The starting adapter (here an untrained one: the base model) is also DPO's reference.
    start, tokenizer, loaded = lora.load_trainable(tiny, r=8, alpha=16, dropout=0.0, gradient_checkpointing=False)
    lora.save_adapter(start, tmp_path / "start", loaded)
    syndec.write(tmp_path / "pairs.jsonl", syndec_task.records(32, wrong=True))
    held_out_rows = syndec_task.records(16, start=32, wrong=True)
    held_out = examples.build(tokenizer, held_out_rows, examples.dpo_example, 4096)[0]
    acc_before, plain_before, margin_before = preference(start, tokenizer, held_out)

    args = train_args(tmp_path / "run", tiny, syndec=str(tmp_path / "pairs.jsonl"), sft_adapter=str(tmp_path / "start"))
    summary = stages.dpo(args)
    trained = lora.load_trainable(tiny, adapter=str(tmp_path / "run/dpo/adapter"), gradient_checkpointing=False)[0]
    acc_after, plain_after, margin_after = preference(trained, tokenizer, held_out)
    assert acc_before == 0.0 and margin_before == pytest.approx(0.0, abs=1e-4)  # policy = reference at the start
    assert acc_after >= 0.9 and margin_after > 1.0, (acc_after, margin_after)
    assert plain_after >= plain_before
    log = [json.loads(line) for line in (tmp_path / "run/dpo" / loop.METRICS).read_text().splitlines()]
    assert {"reward_accuracy", "reward_margin", "chosen_reward", "rejected_reward", "lr"} <= set(log[0])
    assert log[-1]["reward_margin"] > log[0]["reward_margin"] and log[-1]["reward_accuracy"] == 1.0
    assert summary["finished"] and (tmp_path / "run/dpo/reference.pt").exists()


def test_resume_from_a_checkpoint_gives_the_same_weights_as_no_stop(tiny, tmp_path):
    rows = syndec_task.records(12)

    def run(out, stop_after=None, resume=False):
        torch.manual_seed(0)  # LoRA init and dropout draws
        model, tokenizer, loaded = lora.load_trainable(tiny, r=4, alpha=8, dropout=0.1, gradient_checkpointing=True)
        data = examples.build(tokenizer, rows, examples.sft_example, 4096)[0]
        cfg = loop.TrainConfig(lr=5e-3, epochs=2, micro_batch=2, grad_accum=2, warmup_ratio=0.2, save_every=2)
        summary = loop.train(model, data, losses.sft_loss, lambda b: losses.collate(b, tokenizer.pad_token_id, CPU),
                             cfg, out, loaded, Accelerator(), resume=resume, stop_after=stop_after)
        return model, summary

    whole, summary = run(tmp_path / "whole")
    assert summary["steps"] == 6
    _, stopped = run(tmp_path / "crash", stop_after=3)  # dies after step 3; the last checkpoint is step 2
    assert not stopped["finished"] and loop.latest_checkpoint(tmp_path / "crash").name == "step-000002"
    with pytest.raises(loop.TrainError, match="--resume"):
        run(tmp_path / "crash")
    resumed, summary = run(tmp_path / "crash", resume=True)
    assert summary["finished"]
    expected, got = lora_params(whole), lora_params(resumed)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name
    log = [json.loads(line)["step"] for line in (tmp_path / "crash" / loop.METRICS).read_text().splitlines()]
    assert log == [1, 2, 3, 4, 5, 6]  # step 3 of the dead run was dropped and redone
    whole_log = (tmp_path / "whole" / loop.METRICS).read_text().splitlines()
    assert [json.loads(row)["loss"] for row in whole_log] == \
           [json.loads(row)["loss"] for row in (tmp_path / "crash" / loop.METRICS).read_text().splitlines()]
