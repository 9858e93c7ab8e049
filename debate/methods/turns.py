"""What every protocol shares: one batched turn of an agent, random streams, token counts, the record.

A protocol (DebateCV, the baselines, the courtroom, MADR) is a plain function over conversations; these
few helpers keep them from each writing the same bookkeeping again.
"""
import itertools
import math

import torch

from debate.data.labels import AVERITEC
from debate.engine import engine, scheduler, schema_program
from debate.engine.errors import ContextOverflow
from debate.engine.models import adapter_scope

TOKEN_KEYS = ("prompt_tokens", "encoded_tokens", "completion_tokens")


class Streams:
    """One random stream per seed for a whole run, so sampled draws go on across batches.

    `streams(seed)` gives the same torch.Generator every time it is asked for that seed.
    """

    def __init__(self, device="cpu"):
        self.device, self._by_seed = device, {}

    def __call__(self, seed):
        if seed not in self._by_seed:
            self._by_seed[seed] = torch.Generator(device=self.device).manual_seed(seed)
        return self._by_seed[seed]


def device_of(agents):
    """The device the agents' models run on (the first agent's; all roles share one placement)."""
    return next(next(iter(agents.values())).model.parameters()).device


def stream(agents, streams, seed, settings):
    """The random stream of `seed` (from `streams`, else a fresh one on the agents' device); None when greedy."""
    if settings.temperature <= 0:
        return None
    return (streams or Streams(device_of(agents)))(seed)


# Called as on_round(claim_ids, round_no, max_rounds) when claims begin a round (round_no "final": the verdict turn
# after the last round); the progress bar shows each claim's round. None: nobody listens.
on_round = None


def round_begins(claims, round_no, max_rounds):
    """Tell the run's bar (`on_round`) that `claims` begin round `round_no` of `max_rounds`."""
    listening = on_round
    if listening is not None and claims:
        listening([c["claim_id"] for c in claims], round_no, max_rounds)


# Called as on_turn(n, tokens) after every batched turn, n = the conversations that spoke, tokens = what they generated;
# the run's progress bar sets it (debate/pipeline/progress.py), so no protocol has to report its own turns.
on_turn = None


def speak(agent, convs, prompts, settings, generator=None, schema_name=None, labels=AVERITEC):
    """One batched turn of `agent` (a models.RoleModel) in each conversation; returns the replies.

    `schema_name`: the prompt whose JSON answer is asked for; with `settings.structured` the replies are
    decoded under its schema and each conversation's `structured` holds the fields and probabilities. A
    verdict in the schema is chosen among `labels` (a LabelSet, the dataset's).
    """
    if not convs:
        return []
    compiled = (schema_program.compile_for(schema_name, agent.tokenizer, labels.labels)
                if schema_name and settings.structured else None)
    generator = generator if settings.temperature > 0 else None
    listening = on_turn  # the bar that hears this turn: set when the run draws one
    before = sum(c.completion_tokens for c in convs) if listening is not None else 0
    # A claim run by the scheduler (continuous batching) waits here while its turn joins a shared model call.
    replies = scheduler.submit(agent, convs, prompts, settings, generator, compiled)
    if replies is None:
        with adapter_scope(agent):
            try:
                replies = engine.generate(agent.model, agent.tokenizer, list(convs), list(prompts), settings,
                                          generator=generator, schemas=[compiled] * len(convs) if compiled else None)
            except ContextOverflow as err:
                err.conversations = err.conversations or list(convs)  # what the claim's record can keep
                raise
    if listening is not None:
        listening(len(replies), sum(c.completion_tokens for c in convs) - before)
    return replies


def structured_note(conv):
    """What a transcript turn records of a reply decoded under a schema: status, schema and the choices'
    probabilities; nothing for a free reply."""
    if conv.structured is None:
        return {}
    return {"parse_status": "structured", "schema": conv.structured["schema"], "probs": conv.structured["probs"]}


def check_schemas(agents, names, settings, labels=AVERITEC):
    """Refuse, before any claim runs, a --max-new-tokens too small for a JSON answer the run will ask for."""
    if not settings.structured:
        return
    for agent in {id(a.tokenizer): a for a in agents.values()}.values():
        for name in names:
            schema_program.check_budget(schema_program.compile_for(name, agent.tokenizer, labels.labels),
                                        settings.max_new_tokens)


def outcome_probs(dists, rule, labels=AVERITEC.labels):
    """P(rule(votes) == label) for each label when vote i is drawn from dists[i] ({value: p}) independently;
    None when any distribution is missing. Normalised over the labels the rule can give."""
    if not dists or any(d is None for d in dists):
        return None
    out = dict.fromkeys(labels, 0.0)
    for combo in itertools.product(*(d.items() for d in dists)):
        label = rule([v for v, _ in combo])
        if label in out:
            out[label] += math.prod(p for _, p in combo)
    total = sum(out.values())
    return {k: round(v / total, 6) for k, v in out.items()} if total > 0 else None


def token_counts(convs):
    """Prompt, encoded and completion tokens summed over conversations."""
    return {key: sum(getattr(c, key) for c in convs) for key in TOKEN_KEYS}


def record(claim, outcome, turns, convs, reply=None, **extra):
    """A finished claim as the run writes it: its prediction line and its transcript line.

    `outcome` is a parsing.parse_moderator result (verdict, justification, status) of the deciding
    `reply`. A reply that was read but names none of the dataset's labels is recorded as "no_verdict", never
    as a default class. A reply with no readable fields at all keeps its whole text as the justification:
    it is what the system said, and what a reader (or the justification METEOR) gets to see.
    """
    status = outcome["status"]
    justification = outcome["justification"]
    if not justification and status in ("unparsed", "label_in_text") and reply:
        justification = reply.strip()
    if outcome["verdict"] is None and status != "unparsed":
        status = "no_verdict"
    return {
        "prediction": {
            "claim_id": claim["claim_id"],
            "label": outcome["verdict"],
            "justification": justification,
            "parse_status": status,
            "label_probs": outcome.get("label_probs"),
            **extra,
            **token_counts(convs),
            "gold_label": claim.get("label"),
        },
        "transcript": {"claim_id": claim["claim_id"], "claim": claim["claim"], "turns": turns},
    }
