"""What the model sees of a conversation: the chat template rendered around the generated ids.

A conversation's token history only grows: template text, then the agent's generated ids verbatim, then
more template text. Keeping generated ids verbatim (instead of re-tokenising their decoded text) is what
makes the history stable, so the cache of every earlier turn stays valid and only the new tokens of a
turn are encoded.

Rendering is cheap (the compiled template is cached by transformers); tokenising the long system text
again every turn is not. Each conversation therefore keeps the ids of the template pieces it has already
tokenised, keyed by their exact text, and the probes that find a template's end-of-turn marker run once
per tokenizer and template.
"""
import weakref

# Stands in for each assistant message when the chat template is rendered, so the text around the
# generated ids can be tokenised on its own. No whitespace, so templates that trim content keep it.
_SENTINEL = "\u2063debatecv-turn-{}\u2063"


def render(tokenizer, system, messages, add_generation_prompt):
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


def _encode_piece(tokenizer, conv, index, text):
    """The ids of the `index`-th template piece of `conv`, tokenised once while its text stays the same."""
    memo = getattr(conv, "pieces", None)
    if memo is None:
        return encode_text(tokenizer, text)
    key = (id(tokenizer), text)
    if index < len(memo) and memo[index][0] == key:
        return memo[index][1]
    ids = encode_text(tokenizer, text)
    del memo[index:]
    memo.append((key, ids))
    return ids


def context_ids(tokenizer, conv):
    """The token ids the model sees for `conv`'s next turn: template text with generated ids spliced in."""
    shown = [
        dict(m, content=_SENTINEL.format(i)) if m["role"] == "assistant" else m
        for i, m in enumerate(conv.messages)
    ]
    text = render(tokenizer, conv.system, shown, add_generation_prompt=True)
    ids, k = [], 0
    for i, m in enumerate(conv.messages):
        if m["role"] != "assistant":
            continue
        before, sep, text = text.partition(_SENTINEL.format(i))
        if not sep:
            raise ValueError("the chat template dropped an assistant message; cannot build the context")
        if conv.generated[k] is None:  # a recalled turn (engine.Conversation.recall): its text, tokenised once
            conv.generated[k] = encode_text(tokenizer, m["content"])
        ids += _encode_piece(tokenizer, conv, k, before) + conv.generated[k]
        k += 1
    return ids + _encode_piece(tokenizer, conv, k, text)


# tokenizer -> (its chat template, the ids the template puts right after an assistant message's content)
_TAILS = weakref.WeakKeyDictionary()


def _turn_tail(tokenizer):
    """The ids after an assistant message's content in a rendered chat, found once per template."""
    template = getattr(tokenizer, "chat_template", None)
    known = _TAILS.get(tokenizer)
    if known is not None and known[0] == template:
        return known[1]
    probe = render(tokenizer, "", [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], False)
    tail = encode_text(tokenizer, probe.rsplit("y", 1)[-1])
    _TAILS[tokenizer] = (template, tail)
    return tail


def _special_ids(tokenizer):
    return set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))


def turn_end_ids(tokenizer):
    """The ids the chat template puts right after an assistant message's content, up to and including
    its end-of-turn marker (Llama 3: <|eot_id|>, Gemma: <end_of_turn>); what a trained reply must end with."""
    tail = _turn_tail(tokenizer)
    special = _special_ids(tokenizer)
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
    tail = _turn_tail(tokenizer)
    if tail and tail[0] in _special_ids(tokenizer):
        stops.add(tail[0])
    return sorted(stops)
