"""The reference the engine is tested against: greedy decoding the plainest way.

One conversation at a time, no batch, no padding, no cache: every token comes from a full forward pass
over the whole sequence so far. Slow on purpose; nothing here is shared with the engine's batch layout,
its KV store or its decode loop, so a test that finds the engine's tokens equal to these finds the
engine exact. Only the chat template (what the context is) and the schema program (what a structured
reply may be) are shared, since they define the task rather than how it is computed.
"""
import torch

from debate.engine import chat, schema_program
from debate.engine.constrained_row import SchemaRow


def _logprobs(model, ids):
    """Log-probabilities of the next token after every prefix of `ids`, one full forward pass."""
    device = next(model.parameters()).device
    return torch.log_softmax(model(input_ids=torch.tensor([ids], device=device)).logits[0].float(), dim=-1)


def _score(model, ids, candidates, first_logits):
    """Each candidate's summed log-probability after `ids`, its later tokens by a fresh full pass each."""
    first = torch.log_softmax(first_logits.float(), dim=-1)
    totals = []
    for c in candidates:
        total = float(first[c[0]])
        if len(c) > 1:
            logp = _logprobs(model, ids + c[:-1])
            total += sum(float(logp[len(ids) - 1 + j, t]) for j, t in enumerate(c[1:], start=1))
        totals.append(total)
    return totals


@torch.inference_mode()
def generate(model, tokenizer, convs, user_texts, settings, stop_ids=None, schemas=None):
    """engine.generate's contract, greedy only: the same replies, conversation fields and token counts
    (every context token counts as encoded; no cache is kept)."""
    if settings.temperature > 0:
        raise ValueError("the reference path decodes greedily only")
    stop_ids = stop_ids if stop_ids is not None else chat.stop_token_ids(model, tokenizer)
    stops = set(stop_ids)
    schemas = list(schemas) if schemas else [None] * len(convs)
    replies = []
    for conv, text, compiled in zip(convs, user_texts, schemas):
        conv.messages.append({"role": "user", "content": text})
        context = chat.context_ids(tokenizer, conv)
        ids, out = list(context), []
        row = None
        for step in range(settings.max_new_tokens):
            logits = _logprobs(model, ids)[-1]
            if compiled is not None and row is None:
                masks = schema_program.masks(tokenizer, logits.shape[-1], stop_ids, logits.device)
                row = SchemaRow(compiled, settings.max_new_tokens - 1, masks, settings, None,
                                lambda candidates, first, ids=ids: _score(model, list(ids), candidates, first))
            if row is not None:
                token = row.next_token(logits)
                token = stop_ids[0] if token is None else token
            else:
                token = int(logits.argmax())
            out.append(token)
            if token in stops:
                break
            ids.append(token)
        content = out[:-1] if out and out[-1] in stops else out
        conv.drop_cache()
        conv.generated.append(content)
        conv.structured = row.result if row is not None else None
        reply = tokenizer.decode(content, skip_special_tokens=True)
        conv.messages.append({"role": "assistant", "content": reply})
        conv.prompt_tokens += len(context)
        conv.encoded_tokens += len(context)
        conv.completion_tokens += len(out)
        replies.append(reply)
    return replies
