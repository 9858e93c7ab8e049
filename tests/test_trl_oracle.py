"""trl as an independent oracle: our masked sequence log-probabilities and DPO loss (train/losses.py) equal
trl's on the same tokens. trl is in the `test` extra only; the toolkit trains with its own loop."""
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.tiny_models import build_tiny_llama
from train import losses
from train.examples import IGNORE

try:
    import datasets
    import trl
    from trl.trainer.utils import add_fused_lm_head
except ImportError as err:
    if os.environ.get("CI"):  # CI installs the test extra: a missing oracle there is a failure, not a skip
        raise
    pytest.skip(f"trl is not installed ({err}); pip install -e '.[test]'", allow_module_level=True)

PAIRS = [("Claim: the minister said it. Verdict:", " Supported.", " Refuted, the evidence says otherwise."),
         ("Question: who said it? Answer:", " the minister, in a speech on the news", " nobody"),
         ("The claim is", " cherry-picking.", " not enough evidence to verify")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(policy path, a reference path with other weights, tokenizer)."""
    policy = build_tiny_llama(tmp_path_factory.mktemp("policy"), seed=0)
    reference = build_tiny_llama(tmp_path_factory.mktemp("reference"), seed=1)
    return str(policy), str(reference), AutoTokenizer.from_pretrained(policy)


def _load(path):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model


def _sequence(prompt_ids, target_ids):
    return {"input_ids": prompt_ids + target_ids, "labels": [IGNORE] * len(prompt_ids) + target_ids}


def test_masked_sequence_logps_equal_trls_on_the_same_tensors(tiny):
    policy, _, tok = tiny
    model = _load(policy)
    sequences = [_sequence(tok(p)["input_ids"], tok(c, add_special_tokens=False)["input_ids"]) for p, c, _ in PAIRS]
    batch = losses.collate(sequences, tok.pad_token_id, "cpu")  # left-padded, targets of different lengths
    with torch.no_grad():
        ours, counts = losses.sequence_logps(model, batch)
        # trl's fused head: per-token log-probabilities of the labels that are not -100, 0 elsewhere.
        add_fused_lm_head(model)
        theirs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"], labels=batch["labels"], fused_lm_head=True).log_probs
    assert counts.tolist() == [len(tok(c, add_special_tokens=False)["input_ids"]) for _, c, _ in PAIRS]
    assert ours.shape == (len(PAIRS),) and bool((ours < 0).all())
    torch.testing.assert_close(ours, theirs.sum(-1), rtol=1e-5, atol=1e-5)


# trl's DPOConfig sets its own default gradient_checkpointing=True, the name transformers deprecated for
# activation_checkpointing: trl's argument, not ours, so only that warning and only here is let through.
@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
# trl's own DPOTrainer reads the deprecated `is_gradient_checkpointing` when it turns checkpointing off for its
# reference pass (trl/models/utils.py): trl's call, not ours, let through in this oracle test only.
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_dpo_loss_equals_trls_dpo_trainer(tiny, tmp_path):
    policy_path, reference_path, tok = tiny
    policy, reference = _load(policy_path), _load(reference_path)
    beta = 0.1
    data = datasets.Dataset.from_dict({"prompt": [p for p, _, _ in PAIRS], "chosen": [c for _, c, _ in PAIRS],
                                       "rejected": [r for _, _, r in PAIRS]})
    args = trl.DPOConfig(output_dir=str(tmp_path), beta=beta, loss_type=["sigmoid"], report_to="none",
                         use_cpu=True, per_device_train_batch_size=len(PAIRS), max_length=None)
    trainer = trl.DPOTrainer(model=policy, ref_model=reference, args=args, train_dataset=data,
                             processing_class=tok)
    rows = [trainer.train_dataset[i] for i in range(len(PAIRS))]
    with torch.no_grad():
        theirs = trainer.compute_loss(trainer.model, trainer.data_collator(rows))

    # The same tokens as trl tokenized them (it adds the end-of-turn token to each reply), through our code:
    # chosen rows first, then rejected, the reference's log-probabilities precomputed as in D-DPO.
    sequences = ([_sequence(r["prompt_ids"], r["chosen_ids"]) for r in rows]
                 + [_sequence(r["prompt_ids"], r["rejected_ids"]) for r in rows])
    batch = losses.collate(sequences, tok.pad_token_id, "cpu")
    with torch.no_grad():
        ref, _ = losses.sequence_logps(reference, batch)
        batch["ref"] = torch.stack([ref[:len(rows)], ref[len(rows):]], dim=1)
        ours, metrics, _ = losses.dpo_step_loss(policy, batch, beta)
    # Different weights: the implicit rewards are not zero, so the loss is not simply log 2.
    assert abs(metrics["reward_margin"]) > 1e-3
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    logged = trainer._metrics["train"] if trainer.model.training else trainer._metrics["eval"]
    assert metrics["chosen_reward"] == pytest.approx(logged["rewards/chosen"][-1], abs=1e-5)
    assert metrics["rejected_reward"] == pytest.approx(logged["rewards/rejected"][-1], abs=1e-5)
