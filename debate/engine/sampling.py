"""Picking the next token from logits, on the logits' device: greedy, or temperature and top-p sampling."""
import torch


def next_tokens(logits, settings, generator):
    """One id per row of `logits` (rows x vocab), as a tensor on the logits' device."""
    if settings.temperature <= 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / settings.temperature, dim=-1)
    if settings.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest set whose mass reaches top_p (the first token always stays).
        drop = sorted_probs.cumsum(dim=-1) - sorted_probs > settings.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
