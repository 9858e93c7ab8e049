"""Comparing two runs' greedy tokens honestly: equal, or different only where the reference logits hold a near-tie.

Two paths that compute the same model (the engine batched by the step against the plain reference, a cached turn
against an uncached one, batch 8 against batch 1) sum their products in different orders: the rows beside a row in a
matrix product, a cache read back or recomputed, and the CPU's instruction set (torch's ATen kernels and
bitsandbytes' NF4 kernels differ between AVX2 and AVX-512, as cuBLAS's do between GPUs) each move a logit by a few
float32 roundings. Where the two best logits are closer than that, either path may pick either token, and from there
on the two continuations are different texts. What can be promised on any machine is therefore:

    the tokens are equal, or at the first step where they differ the reference model's two best logits after the
    shared prefix are within a tolerance of each other (TIE_TOLERANCE for a float32 model; for NF4 weights the
    tolerance the test measures on its own conversations, `measured_tolerance`) and the two tokens are exactly those
    two; and at most one pair of a comparison parts at such a near-tie.

`first_difference` checks one reply; `match_conversations` walks engine.Conversation pairs turn by turn and stops a
conversation at its first near-tie (what follows a different token is a different continuation, so nothing after
it is compared). Every near-tie is returned and warned about, naming the conversation, the turn and the step, so a
passing run still says where it leaned on the tolerance. A real bug (a wrong cache column, a row reading another's
keys, a dropped token) moves logits by far more than rounding: the reference's top two are then far apart, or the
engine's token is not among them, or it parts more than one conversation, and the comparison fails
(tests/test_token_match.py shows it).

The reference logits come from the plain path of debate/engine/reference.py: one full forward pass of the model over
the whole prefix, one conversation, no batch, no padding, no cache.
"""
import dataclasses
import types
import warnings
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import torch

from debate.engine import chat, generator as gen

# How close the reference's two best logits must be for a different token to count as rounding, not a bug, in a
# float32 model.
#
# Measured with bench/bench_kernel_ties.py (2026-12-07, AMD EPYC with AVX-512, torch 2.13 CPU, one thread;
# docs/BENCHMARKS.md, "Issue 52"): at every greedy step of 12 debate-like turns (~150 steps a model), the next token's
# logits computed six ways (a prefix alone in one forward pass, the same prefix as one row of a padded batch of 8, its
# last token as one step over a KV cache; each under torch's AVX2 and AVX-512 kernels) changed by at most 1.3e-5
# (tiny Llama, logits within +-7) and 2.3e-6 (tiny Gemma 3), and the gap between the two best tokens by at most
# 8.6e-6. Two paths can pick different tokens only where the reference's gap is below the larger of their two
# changes, so the tolerance is the largest gap change measured with ~100x headroom for other CPUs and GPUs (1e-3,
# still a thousandth of the logits' range). On these models 0 to 1 step in ~150 has a top-two gap within 1e-3.
TIE_TOLERANCE = 1e-3

# NF4 has no fixed tolerance: how far its rounding moves a logit depends on the CPU and on the inputs. bitsandbytes'
# CPU kernel (on a CPU with AVX512-BF16) rounds each product's inputs to bf16, so two float32 values that differ in
# their last bits can land a whole bf16 step apart (0.016 for a value near 3): measured here (2026-12-07, bitsandbytes
# 0.50.2), a prefix as one row of a padded batch of three against alone moved an attention output by 0.016 and a
# logit by 0.076, at one step of 72. A comparison in NF4 therefore measures the rounding on its own conversations
# (`rounding`) and allows ROUNDING_MARGIN times that, never less than TIE_TOLERANCE: the engine's steps (its own
# attention, several rows a step) round otherwise again, by about as much. On tests/test_4bit.py's debates (9
# conversations, 21 turns of up to 100 tokens) the measured change was 0.023, so ties up to 0.046. A wrong cache
# column is still caught (tests/test_token_match.py): where it parts a reply at a gap the tolerance takes for a tie,
# it parts other replies too, and a comparison allows one tie at most.
ROUNDING_MARGIN = 2


@dataclasses.dataclass
class Tie:
    """Where two replies part at a near-tie: `where` (the caller's name for the reply), the step (0-based, the
    reply's token index), the two tokens (None: that side stopped there) and the reference's top-two gap."""

    where: str
    step: int
    tokens: tuple
    gap: float

    def __str__(self) -> str:
        return (f"{self.where}: tokens differ from step {self.step} on ({self.tokens[0]} vs {self.tokens[1]}), a "
                f"near-tie of the reference logits (top-two gap {self.gap:.2e}); not compared after it")


@torch.inference_mode()
def next_logits(model: torch.nn.Module, ids: Sequence[int]) -> torch.Tensor:
    """The logits of the token after `ids`: one full forward pass, as debate/engine/reference.py decodes."""
    device = next(model.parameters()).device
    return model(input_ids=torch.tensor([list(ids)], device=device)).logits[0, -1].float()


def first_difference(logits_of: Callable[[List[int]], torch.Tensor], context: Sequence[int], got: Sequence[int],
                     want: Sequence[int], stops: Iterable[int] = (), where: str = "",
                     tolerance: float = TIE_TOLERANCE) -> Optional[Tie]:
    """None if `got` == `want` (two replies after `context`); else the Tie at their first different step, or an
    AssertionError naming it where the reference is no near-tie there. A reply shorter than the other stopped
    there: its token was a stop token (which replies do not keep), any of `stops`."""
    got, want = list(got), list(want)
    if got == want:
        return None
    step = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    pair = tuple(seq[step] if step < len(seq) else None for seq in (got, want))
    logits = logits_of(list(context) + want[:step])
    top = torch.topk(logits, 2)
    gap = float(top.values[0] - top.values[1])
    best = [int(t) for t in top.indices]
    stops = set(stops)

    def is_(token, t):  # a None side (that reply stopped) is any stop token
        return token == t or (token is None and t in stops)

    # The two tokens are the reference's two best, in either order.
    exact = (is_(pair[0], best[0]) and is_(pair[1], best[1])) or (is_(pair[0], best[1]) and is_(pair[1], best[0]))
    assert exact and gap <= tolerance, (
        f"{where}: tokens differ from step {step} (got {pair[0]}, want {pair[1]}; None: stopped) and the reference "
        f"logits there are no near-tie: top two {best} at {top.values.tolist()}, gap {gap:.3g} (a tie is <= "
        f"{tolerance}, both tokens among the top two). got {got[max(0, step - 3):step + 4]} want "
        f"{want[max(0, step - 3):step + 4]} around it")
    return Tie(where, step, pair, gap)


def measured_tolerance(model: torch.nn.Module, tokenizer: Any, convs: Sequence[Any]) -> float:
    """The tolerance of a near-tie for a comparison of these conversations (the reference's side) in a model whose
    rounding has no fixed bound (NF4): ROUNDING_MARGIN x `rounding` on them, never less than TIE_TOLERANCE."""
    return max(TIE_TOLERANCE, ROUNDING_MARGIN * rounding(model, tokenizer, convs))


@torch.inference_mode()
def rounding(model: torch.nn.Module, tokenizer: Any, convs: Sequence[Any]) -> float:
    """How far rounding alone moves the reference's top-two gap on these conversations' own inputs: every turn of
    `convs` computed the reference's way (context and reply in one forward pass) and the decode step's way (the
    context in one pass, then the reply one token a step over its KV cache). Returns the largest change, at any
    step of any turn, of the gap between the two tokens the reference ranks best. Both ways are the model's own
    forward, not the engine's: a bug in the engine must not widen the tolerance that is to catch it."""
    device = next(model.parameters()).device
    worst = 0.0
    for conv in convs:
        for turn, reply in enumerate(conv.generated):
            context = turn_context(tokenizer, conv, turn)
            if context is None or reply is None:
                continue
            ids = context + list(reply)
            whole = model(input_ids=torch.tensor([ids], device=device)).logits[0, len(context) - 1:].float()
            first = model(input_ids=torch.tensor([context], device=device), use_cache=True)
            stepped, cache = [first.logits[0, -1].float()], first.past_key_values
            for token in reply:
                out = model(input_ids=torch.tensor([[token]], device=device), use_cache=True,
                            **gen.cache_kwarg(model, cache))
                stepped.append(out.logits[0, -1].float())
                cache = out.past_key_values
            top = torch.topk(whole, 2, dim=-1).indices
            gaps = [way.gather(1, top[:, :1]) - way.gather(1, top[:, 1:]) for way in (whole, torch.stack(stepped))]
            worst = max(worst, float((gaps[0] - gaps[1]).abs().max()))
    return worst


def turn_context(tokenizer: Any, conv: Any, turn: int) -> Optional[List[int]]:
    """The ids `conv` saw before its `turn`-th reply (chat.context_ids over the messages up to that turn's prompt),
    or None if it has no such reply."""
    replies = [i for i, m in enumerate(conv.messages) if m["role"] == "assistant"]
    if turn >= len(replies) or turn >= len(conv.generated):
        return None
    before = types.SimpleNamespace(system=conv.system, messages=conv.messages[:replies[turn]],
                                   generated=list(conv.generated[:turn]), pieces=None)
    return chat.context_ids(tokenizer, before)


def match_conversations(model: torch.nn.Module, tokenizer: Any, got: Sequence[Any], want: Sequence[Any],
                        stops: Optional[Iterable[int]] = None, names: Optional[Sequence[str]] = None,
                        groups: Optional[Sequence[Any]] = None, tolerance: float = TIE_TOLERANCE,
                        max_ties: int = 1) -> Dict[int, Tie]:
    """Assert that each `got[i]` replied as `want[i]` (engine.Conversation pairs; `want` the reference), turn by turn,
    up to near-ties; return {i: its Tie} for the conversations that parted at one (nothing after it is compared, so
    callers compare other fields only for the rest).

    A turn is compared only after the same context: equal for every turn before the first tie, which is asserted.
    `groups` (one key a pair, e.g. the claim) ties conversations whose prompts feed each other: once a group has a
    near-tie, a later prompt of another of its conversations may differ (it quotes the other reply) and that
    conversation is not compared from there; a group without a tie must have the same contexts throughout.
    At most `max_ties` pairs may part (default one: rounding flips a near-tie now and then, a bug wherever it moves a
    logit past one, so a bug that hides one reply behind a near-tie still parts the others).
    """
    assert len(got) == len(want), (len(got), len(want))
    stops = chat.stop_token_ids(model, tokenizer) if stops is None else list(stops)
    names = list(names) if names is not None else [f"conversation {i}" for i in range(len(want))]
    groups = list(groups) if groups is not None else list(range(len(want)))
    cache: Dict[tuple, torch.Tensor] = {}

    def logits_of(ids):
        key = tuple(ids)
        if key not in cache:
            cache[key] = next_logits(model, ids)
        return cache[key]

    ties: Dict[int, Tie] = {}
    tied_groups = set()
    turns = max((len(c.generated) for c in list(got) + list(want)), default=0)
    # Turn by turn across all pairs, so that a tie in one turn frees its group's later prompts.
    open_pairs = set(range(len(want)))
    for turn in range(turns):
        for i in sorted(open_pairs):
            g, w = got[i], want[i]
            cw, cg = turn_context(tokenizer, w, turn), turn_context(tokenizer, g, turn)
            if cw is None and cg is None:
                open_pairs.discard(i)
                continue
            if cw != cg:
                assert groups[i] in tied_groups, (
                    f"{names[i]}, turn {turn}: the contexts differ (lengths {None if cg is None else len(cg)} and "
                    f"{None if cw is None else len(cw)}) with no near-tie before it in its group {groups[i]!r}")
                open_pairs.discard(i)
                continue
            tie = first_difference(logits_of, cw, g.generated[turn] or [], w.generated[turn] or [], stops,
                                   f"{names[i]}, turn {turn}", tolerance)
            if tie is not None:
                ties[i] = tie
                tied_groups.add(groups[i])
                open_pairs.discard(i)
                warnings.warn(str(tie), stacklevel=2)
    assert len(ties) <= max_ties, "more near-ties than a rounding difference explains:\n" + "\n".join(
        str(t) for t in ties.values())
    return ties
