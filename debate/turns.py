"""What every protocol shares: one batched turn of an agent, random streams, token counts, the record.

A protocol (DebateCV, the baselines, the courtroom, MADR) is a plain function over conversations; these
few helpers keep them from each writing the same bookkeeping again.
"""
import torch

from debate import engine
from debate.models import adapter_scope

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


# Called as on_turn(n) after every batched turn, n = the conversations that spoke; the run's progress
# bar sets it (debate/progress.py), so no protocol has to report its own turns.
on_turn = None


def speak(agent, convs, prompts, settings, generator=None):
    """One batched turn of `agent` (a models.RoleModel) in each conversation; returns the replies."""
    if not convs:
        return []
    with adapter_scope(agent):
        replies = engine.generate(agent.model, agent.tokenizer, list(convs), list(prompts), settings,
                                  generator=generator if settings.temperature > 0 else None)
    if on_turn is not None:
        on_turn(len(replies))
    return replies


def token_counts(convs):
    """Prompt, encoded and completion tokens summed over conversations."""
    return {key: sum(getattr(c, key) for c in convs) for key in TOKEN_KEYS}


def record(claim, outcome, turns, convs, reply=None, **extra):
    """A finished claim as the run writes it: its prediction line and its transcript line.

    `outcome` is a parsing.parse_moderator result (verdict, justification, status) of the deciding
    `reply`. A reply that was read but names none of the four labels is recorded as "no_verdict", never
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
            **extra,
            **token_counts(convs),
            "gold_label": claim.get("label"),
        },
        "transcript": {"claim_id": claim["claim_id"], "claim": claim["claim"], "turns": turns},
    }
