"""A scripted stand-in for the engine, so protocol tests control every reply and see every call.

`install(monkeypatch, reply)` replaces `debate.engine.engine.generate` (and the scheduler's begin/advance/end, a
turn answered when it is queued); `reply(model, conv, prompt)` gives each
row's answer, where `model` is whatever the agent carries (tests use names). Every call is logged as
`Call(model, prompts, systems, generator, schemas)` (schemas: the declared schema each row was asked
under, or None; scripted replies are read by the tolerant parser, as free replies are). Each row also checks that the
text reaching the model has no
doubled braces: a prompt file read raw instead of rendered would show its JSON example as {{ }}.

An answer may be a `Decoded`: its text, with the fields and choice probabilities that structured decoding
would have given (the conversation's `structured`).
"""
from dataclasses import dataclass
from types import SimpleNamespace

from debate.data import answer_schemas
from debate.data.labels import LABELS
from debate.engine import engine, schema_program


@dataclass
class Decoded:
    text: str
    fields: dict
    probs: dict


@dataclass
class Call:
    model: object
    prompts: list
    systems: list
    generator: object
    schemas: list = None


def agents(roles, models=None):
    """Fake role models; `models` maps a role to the model name it runs on (default: its own name)."""
    models = models or {}
    return {role: SimpleNamespace(model=models.get(role, role), tokenizer=None, adapter=None,
                                  path=models.get(role, role)) for role in roles}


def install(monkeypatch, reply):
    calls = []

    def fake_generate(model, tokenizer, convs, prompts, settings, generator=None, schemas=None):
        replies = []
        for row, (conv, prompt) in enumerate(zip(convs, prompts)):
            assert "{{" not in prompt and "{{" not in conv.system, "a prompt reached the model unrendered"
            conv.messages.append({"role": "user", "content": prompt})
            text = reply(model, conv, prompt)
            conv.structured = None
            if isinstance(text, Decoded):
                conv.structured = {"schema": schemas[row].name if schemas else None, "reasoning": "",
                                   "fields": text.fields, "probs": text.probs, "offsets": {}}
                text = text.text
            conv.messages.append({"role": "assistant", "content": text})
            conv.prompt_tokens += 10
            conv.encoded_tokens += 7
            conv.completion_tokens += 5
            replies.append(text)
        calls.append(Call(model, list(prompts), [c.system for c in convs], generator, schemas))
        return replies

    def fake_begin(model, tokenizer, convs, prompts, settings, generator=None, schemas=None, adapter="current"):
        # The scheduler's entry (a claim's turn queued in its model's batch): answered at once, one logged call a turn.
        return SimpleNamespace(done=True, replies=fake_generate(model, tokenizer, convs, prompts, settings, generator,
                                                                schemas))

    monkeypatch.setattr(engine, "generate", fake_generate)
    monkeypatch.setattr(engine, "begin", fake_begin)
    monkeypatch.setattr(engine, "advance", lambda: None)
    monkeypatch.setattr(engine, "end", lambda call: call.replies)
    monkeypatch.setattr(engine, "cancel", lambda call: None)
    # No tokenizer here: the declared schema stands in for the compiled one (and proves the name exists).
    monkeypatch.setattr(schema_program, "compile_for",
                        lambda name, tokenizer, labels=LABELS:
                        answer_schemas.resolve(answer_schemas.load(name), labels))
    return calls
