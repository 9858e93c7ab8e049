"""Batched generation over many agent conversations, each keeping its KV cache between its turns.

A conversation's token history only grows: template text, then the agent's generated ids verbatim, then
more template text. Keeping generated ids verbatim (instead of re-tokenising their decoded text) is what
makes the history stable, so the cache of every earlier turn stays valid and only the new tokens of a
turn are encoded. Cached and uncached runs feed the model the same token sequence, so under greedy
decoding they produce the same tokens.

Batch layout: every row is left-padded and contiguous, `[pad][cached tokens][new tokens][generated]`.
When rows have new chunks of different lengths, a row re-encodes a few of its last cached tokens
instead of leaving a gap in the middle; gaps would change what a sliding-window layer sees.
"""
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from debate import schema as schemas_mod

# Stands in for each assistant message when the chat template is rendered, so the text around the
# generated ids can be tokenised on its own. No whitespace, so templates that trim content keep it.
_SENTINEL = "\u2063debatecv-turn-{}\u2063"


@dataclass
class Settings:
    max_new_tokens: int = 512
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0
    reuse_cache: bool = True
    structured: bool = True  # decode JSON answers under their prompt's schema (debate.schema)


@dataclass
class Conversation:
    """One agent's side of a debate: its messages and the cache of what it has already encoded."""

    system: str
    messages: list = field(default_factory=list)  # [{"role": "user"|"assistant", "content": str}]
    generated: list = field(default_factory=list)  # token ids of each assistant message, verbatim
    cached_ids: list = field(default_factory=list)  # the tokens whose keys/values are in `cache`
    cache: list = None  # per layer (keys, values), shape (1, kv_heads, len(cached_ids), head_dim)
    prompt_tokens: int = 0  # context length summed over turns (what an API would bill)
    encoded_tokens: int = 0  # prompt tokens actually run through the model
    completion_tokens: int = 0
    structured: dict = None  # the last reply's schema result (fields, choice probabilities), or None

    def drop_cache(self):
        self.cache, self.cached_ids = None, []


def _render(tokenizer, system, messages, add_generation_prompt):
    chat = [{"role": "system", "content": system}] + messages if system else list(messages)
    try:
        return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=add_generation_prompt)
    except Exception:
        # Some templates refuse a system role; fold it into the first user message instead.
        if not system:
            raise
        first = dict(messages[0], content=system + "\n\n" + messages[0]["content"])
        return tokenizer.apply_chat_template(
            [first] + messages[1:], tokenize=False, add_generation_prompt=add_generation_prompt
        )


def encode_text(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def context_ids(tokenizer, conv):
    """The token ids the model sees for `conv`'s next turn: template text with generated ids spliced in."""
    shown = [
        dict(m, content=_SENTINEL.format(i)) if m["role"] == "assistant" else m
        for i, m in enumerate(conv.messages)
    ]
    text = _render(tokenizer, conv.system, shown, add_generation_prompt=True)
    ids, k = [], 0
    for i, m in enumerate(conv.messages):
        if m["role"] != "assistant":
            continue
        before, sep, text = text.partition(_SENTINEL.format(i))
        if not sep:
            raise ValueError("the chat template dropped an assistant message; cannot build the context")
        ids += encode_text(tokenizer, before) + conv.generated[k]
        k += 1
    return ids + encode_text(tokenizer, text)


def turn_end_ids(tokenizer):
    """The ids the chat template puts right after an assistant message's content, up to and including
    its end-of-turn marker (Llama 3: <|eot_id|>, Gemma: <end_of_turn>); what a trained reply must end with."""
    probe = _render(tokenizer, "", [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], False)
    tail = encode_text(tokenizer, probe.rsplit("y", 1)[-1])
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    for i, token in enumerate(tail):
        if token in special:
            return tail[: i + 1]
    # A plain-text template has no marker: the reply ends with EOS, which generation stops at.
    return [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else tail


def stop_token_ids(model, tokenizer):
    """Ids that end a turn: the tokenizer's and generation config's EOS plus the template's end of turn."""
    stops = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        eos = getattr(source, "eos_token_id", None)
        stops.update(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    # The first special token after an assistant message in the template is its end-of-turn marker.
    probe = _render(tokenizer, "", [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], False)
    tail = encode_text(tokenizer, probe.rsplit("y", 1)[-1])
    if tail and tail[0] in set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {})):
        stops.add(tail[0])
    return sorted(stops)


def _common_prefix(a, b):
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _next_tokens(logits, settings, generator):
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


def _model_device(model):
    return next(model.parameters()).device


def _batch_cache(convs, reuse, width, device):
    """Left-pad each row's cached keys/values to `width`; an empty cache when nothing is reused."""
    if width == 0:
        return DynamicCache()
    layers = []
    template = next(c.cache for c, r in zip(convs, reuse) if r)
    for layer, (k0, v0) in enumerate(template):
        shape = (len(convs), k0.shape[1], width, k0.shape[3])
        keys, values = k0.new_zeros(shape), v0.new_zeros(shape)
        for row, (conv, r) in enumerate(zip(convs, reuse)):
            if r:
                keys[row, :, width - r:] = conv.cache[layer][0][0, :, :r]
                values[row, :, width - r:] = conv.cache[layer][1][0, :, :r]
        layers.append((keys.to(device), values.to(device)))
    # No config: every layer keeps all its tokens, so any row can be sliced back out afterwards.
    return DynamicCache(ddp_cache_data=layers)


def _choice_logprobs(model, cache, row, start, candidates, first_logits, pad_id):
    """Each candidate id list's summed log-probability after `row`'s context, whose keys/values fill
    `cache` from column `start` on. The first tokens are scored from `first_logits` (the row's logits
    now); the rest in one side pass over copies of the row's cache, which leaves the batch untouched."""
    logp = torch.log_softmax(first_logits.float(), dim=-1)
    totals = [float(logp[c[0]]) for c in candidates]
    width = max(len(c) for c in candidates) - 1
    if width == 0:
        return totals
    k, device = len(candidates), first_logits.device
    layers = [(layer.keys[row:row + 1, :, start:].expand(k, -1, -1, -1).contiguous(),
               layer.values[row:row + 1, :, start:].expand(k, -1, -1, -1).contiguous()) for layer in cache.layers]
    past = layers[0][0].shape[2]
    ids = torch.full((k, width), pad_id, dtype=torch.long)
    mask = torch.ones((k, past + width), dtype=torch.long)
    for j, c in enumerate(candidates):
        ids[j, :len(c) - 1] = torch.tensor(c[:-1], dtype=torch.long)
        mask[j, past + len(c) - 1:] = 0  # right padding: only positions after a candidate's end see it
    positions = torch.arange(past, past + width)[None].expand(k, -1)
    out = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                past_key_values=DynamicCache(ddp_cache_data=layers), use_cache=True)
    logp = torch.log_softmax(out.logits.float(), dim=-1)
    for j, c in enumerate(candidates):
        if len(c) > 1:  # a one-token candidate is scored by its first token alone
            picks = logp[j, torch.arange(len(c) - 1, device=device), torch.tensor(c[1:], dtype=torch.long,
                                                                                   device=device)]
            totals[j] += float(picks.sum())
    return totals


class _SchemaRow:
    """Drives one row's schema program (debate.schema.program) step by step: forced ids one per step,
    masked free text, whole-value choices scored by `score(candidates, logits) -> totals`."""

    def __init__(self, compiled, limit, masks, settings, generator, score):
        self.program = schemas_mod.program(compiled, limit)
        self.masks, self.settings, self.generator, self.score = masks, settings, generator, score
        self.queue, self.text, self.cap, self.mode, self.result = [], [], 0, None, None
        self._send(None)

    def _send(self, value):
        try:
            self.op = self.program.send(value)
        except StopIteration as done:
            self.op, self.result = None, done.value
            return
        if self.op[0] == "force":
            self.queue = list(self.op[1])
        elif self.op[0] == "text":
            _, self.cap, self.mode = self.op
            self.text = []

    def _choose(self, candidates, logits):
        totals = torch.tensor(self.score(candidates, logits))
        probs = torch.softmax(totals, dim=0)
        if self.settings.temperature <= 0:
            index = int(totals.argmax())
        else:
            tempered = torch.softmax(totals / self.settings.temperature, dim=0).to(logits.device)
            index = int(torch.multinomial(tempered, 1, generator=self.generator))
        return index, [round(float(p), 6) for p in probs]

    def next_token(self, logits):
        """The id this row feeds now, given its logits; None once the object is complete."""
        while self.op is not None:
            kind = self.op[0]
            if kind == "force":
                if not self.queue:
                    self._send(None)
                    continue
                token = self.queue.pop(0)
                if not self.queue:
                    self._send(None)  # the next op starts at the next step, from that step's logits
                return token
            if kind == "choose":
                self._send(self._choose(self.op[1], logits))
                continue
            if self.cap <= 0:
                self._send(self.text)
                continue
            banned, closing = self.masks[self.mode]
            token = int(_next_tokens(logits.masked_fill(banned, float("-inf"))[None], self.settings,
                                     self.generator)[0])
            if closing[token]:
                self._send(self.text)  # the closing token itself is not fed: the schema writes the close
                continue
            self.text.append(token)
            self.cap -= 1
            return token
        return None


@torch.inference_mode()
def generate(model, tokenizer, convs, user_texts, settings, stop_ids=None, generator=None, schemas=None):
    """Add one user message to each conversation and generate every reply in one batch.

    Returns the reply texts; each conversation gets its assistant message, token counts and cache.
    `schemas` (one debate.schema.Compiled or None per row) decodes those rows under their schema; the
    row's conversation then holds the schema's result in `structured` (None for a free reply).
    """
    if not convs:
        return []
    schemas = list(schemas) if schemas and any(schemas) else None
    for compiled in schemas or ():
        if compiled is not None:
            schemas_mod.check_budget(compiled, settings.max_new_tokens)
    stop_ids = stop_ids if stop_ids is not None else stop_token_ids(model, tokenizer)
    device = _model_device(model)
    if generator is None and settings.temperature > 0:
        generator = torch.Generator(device=device).manual_seed(settings.seed)
    # Any id will do for padding: padded positions are masked out.
    pad_id = next((i for i in (tokenizer.pad_token_id, *stop_ids) if i is not None), 0)

    for conv, text in zip(convs, user_texts):
        conv.messages.append({"role": "user", "content": text})
    targets = [context_ids(tokenizer, c) for c in convs]

    # How much of each row's cache is still valid; at least one token must be fed to get logits.
    usable = [
        min(_common_prefix(c.cached_ids, t), len(t) - 1) if settings.reuse_cache and c.cache else 0
        for c, t in zip(convs, targets)
    ]
    chunk = max(len(t) - u for t, u in zip(targets, usable))
    reuse = [max(0, len(t) - chunk) for t in targets]  # <= usable: rows with short deltas re-encode a bit
    width = max(reuse)
    rows = len(convs)

    input_ids = torch.full((rows, chunk), pad_id, dtype=torch.long)
    mask = torch.zeros((rows, width + chunk), dtype=torch.long)
    positions = torch.zeros((rows, chunk), dtype=torch.long)
    for row, (t, r) in enumerate(zip(targets, reuse)):
        new = t[r:]
        input_ids[row, chunk - len(new):] = torch.tensor(new)
        mask[row, width + chunk - len(t):] = 1
        positions[row, chunk - len(new):] = torch.arange(r, len(t))
    cache = _batch_cache(convs, reuse, width, device)
    input_ids, mask, positions = input_ids.to(device), mask.to(device), positions.to(device)

    out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                past_key_values=cache, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    generated = [[] for _ in convs]
    live = [True] * rows
    stops = set(stop_ids)
    driven = [None] * rows
    if schemas:
        masks = schemas_mod.masks(tokenizer, out.logits.shape[-1], stop_ids, device)
        for row, compiled in enumerate(schemas):
            if compiled is not None:
                start = width + chunk - len(targets[row])  # the row's first column in the cache, for good
                score = (lambda row, start: lambda candidates, logits: _choice_logprobs(
                    model, cache, row, start, candidates, logits, pad_id))(row, start)
                driven[row] = _SchemaRow(compiled, settings.max_new_tokens - 1, masks, settings, generator, score)
    free_rows = any(d is None for d in driven)
    for step in range(settings.max_new_tokens):
        logits = out.logits[:, -1, :]
        # The one device-to-host copy of the step for free rows; the bookkeeping below is plain Python.
        picked = _next_tokens(logits, settings, generator).tolist() if free_rows else [None] * rows
        for row in range(rows):
            if live[row]:
                if driven[row] is not None:
                    token = driven[row].next_token(logits[row])
                    picked[row] = stop_ids[0] if token is None else token
                generated[row].append(picked[row])
                live[row] = picked[row] not in stops
        if not any(live) or step == settings.max_new_tokens - 1:
            break
        # A finished row is fed a masked pad so the batch keeps its shape; its stop token is never encoded.
        feed = torch.tensor([[t if on else pad_id] for t, on in zip(picked, live)], device=device)
        mask = torch.cat([mask, torch.tensor(live, device=device, dtype=mask.dtype)[:, None]], dim=1)
        positions = torch.tensor([[len(t) + step] for t in targets], device=device)
        out = model(input_ids=feed, attention_mask=mask, position_ids=positions, past_key_values=cache,
                    use_cache=True)
        cache = out.past_key_values

    replies = []
    for row, (conv, t, r) in enumerate(zip(convs, targets, reuse)):
        ids = generated[row]
        content = ids[:-1] if ids and ids[-1] in stop_ids else ids
        fed = t + ids[:-1]  # the last sampled token was never run through the model
        start = width + chunk - len(t)
        conv.cache = [
            (layer.keys[row:row + 1, :, start:start + len(fed)].clone(),
             layer.values[row:row + 1, :, start:start + len(fed)].clone())
            for layer in cache.layers
        ] if settings.reuse_cache else None
        conv.cached_ids = fed if settings.reuse_cache else []
        conv.generated.append(content)
        conv.structured = driven[row].result if driven[row] is not None else None
        reply = tokenizer.decode(content, skip_special_tokens=True)
        conv.messages.append({"role": "assistant", "content": reply})
        conv.prompt_tokens += len(t)
        conv.encoded_tokens += len(t) - r
        conv.completion_tokens += len(ids)
        replies.append(reply)
    return replies
