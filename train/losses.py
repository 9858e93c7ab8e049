"""Batches and the two objectives: masked next-token loss (D-SFT) and the DPO preference loss (D-DPO).

Shapes: B rows in a batch, T its width in tokens (the longest row), V the vocabulary; a DPO batch holds P
pairs as B = 2P rows, every chosen row first, then the rejected rows in the same order. Labels are the
input ids on target tokens and IGNORE (-100) elsewhere; sequence log-probabilities are sums over the
target tokens only. tests/test_trl_oracle.py checks them and the DPO loss against trl's.
"""
from typing import Any, Dict, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

from train.examples import IGNORE


def collate(sequences: Sequence[Dict[str, Any]], pad_id: int,
            device: Union[str, torch.device]) -> Dict[str, Any]:
    """Left-pad {"input_ids", "labels"} rows into tensors.

    Returns {"input_ids", "attention_mask", "position_ids", "labels"}, each (B, T) long, and "keep": the int
    number of last positions whose logits are needed (the longest target + 1, at most T).

    Left padding puts every target at the end of its row, so logits are only computed for the last
    `keep` positions (the longest target): with a 128k vocabulary the full logits of a 4k-token row
    would cost more memory than the rest of the step.
    """
    width = max(len(s["input_ids"]) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    labels = torch.full((len(sequences), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    keep = 1
    for row, s in enumerate(sequences):
        n = len(s["input_ids"])
        ids[row, width - n:] = torch.tensor(s["input_ids"])
        labels[row, width - n:] = torch.tensor(s["labels"])
        mask[row, width - n:] = 1
        first = next(i for i, label in enumerate(s["labels"]) if label != IGNORE)
        keep = max(keep, n - first + 1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "position_ids": positions.to(device),
            "labels": labels.to(device), "keep": min(keep, width)}


def sequence_logps(model: Any, batch: Dict[str, Any]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(sum of target-token log-probabilities per row, target tokens per row), both (B,).

    The model's logits come as (B, keep, V); position j predicts the label at j + 1, so the last one
    predicts nothing. Float32 sums, whatever the model computes in.
    """
    keep = batch["keep"]
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   position_ids=batch["position_ids"], logits_to_keep=keep, use_cache=False).logits
    # logits[:, j] predicts the token after position (width - keep + j); the last one predicts nothing.
    targets = batch["labels"][:, -keep + 1:] if keep > 1 else batch["labels"][:, :0]
    logits = logits[:, :-1].float()
    mask = targets != IGNORE
    logps = torch.log_softmax(logits, dim=-1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (logps * mask).sum(-1), mask.sum(-1)


def sft_loss(model: Any, batch: Dict[str, Any]) -> Tuple[torch.Tensor, Dict[str, float], int]:
    """Mean negative log-likelihood of the target tokens of the batch; (loss, metrics, tokens).

    loss: a scalar, every target token of the batch weighing the same (not every row).
    """
    logps, counts = sequence_logps(model, batch)
    tokens = counts.sum()
    loss = -logps.sum() / tokens.clamp(min=1)
    return loss, {"loss": loss.item()}, int(tokens)


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The DPO loss (Rafailov et al. 2023) and the implicit rewards beta * (policy - reference).

    Each argument is (P,): a pair's sequence log-probability of its chosen or rejected reply under the
    policy or the reference. Returns (loss: scalar, the mean over pairs of -log sigmoid(chosen reward -
    rejected reward); chosen rewards (P,); rejected rewards (P,)), the rewards detached.
    """
    chosen_rewards = beta * (policy_chosen - ref_chosen)
    rejected_rewards = beta * (policy_rejected - ref_rejected)
    loss = -F.logsigmoid(chosen_rewards - rejected_rewards).mean()
    return loss, chosen_rewards.detach(), rejected_rewards.detach()


def dpo_step_loss(model: Any, batch: Dict[str, Any], beta: float) -> Tuple[torch.Tensor, Dict[str, float], int]:
    """Chosen and rejected of every pair in one concatenated forward pass; (loss, metrics, tokens).

    `batch` is collate()'s over 2P rows (chosen rows, then rejected) plus "ref": (P, 2), the reference
    model's sequence log-probabilities of each pair's chosen (column 0) and rejected (column 1) reply.
    """
    logps, counts = sequence_logps(model, batch)
    n = logps.shape[0] // 2
    loss, chosen, rejected = dpo_loss(logps[:n], logps[n:], batch["ref"][:, 0], batch["ref"][:, 1], beta)
    return loss, {
        "loss": loss.item(),
        "reward_accuracy": (chosen > rejected).float().mean().item(),
        "reward_margin": (chosen - rejected).mean().item(),
        "chosen_reward": chosen.mean().item(),
        "rejected_reward": rejected.mean().item(),
    }, int(counts.sum())
