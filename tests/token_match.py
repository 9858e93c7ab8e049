"""Comparing two runs' greedy tokens honestly: equal, or different only where the reference logits hold a near-tie.

Two paths that compute the same model (the engine batched by the step against the plain reference, a cached turn
against an uncached one, batch 8 against batch 1) sum their products in different orders: the rows beside a row in a
matrix product, a cache read back or recomputed, and the CPU's instruction set (torch's ATen kernels and
bitsandbytes' NF4 kernels differ between AVX2 and AVX-512, as cuBLAS's do between GPUs) each move a logit by a few
float32 roundings. Where the two best logits are closer than that, either path may pick either token, and from there
on the two continuations are different texts. What can be promised on any machine is therefore:

    the tokens are equal, or at the first step where they differ the reference model's two best logits after the
    shared prefix are within a tolerance of each other (TIE_TOLERANCE for a float32 model, NF4_TIE_TOLERANCE for
    NF4 weights; measured below) and the two tokens are exactly those two.

`first_difference` checks one reply; `match_conversations` walks engine.Conversation pairs turn by turn and stops a
conversation at its first near-tie (what follows a different token is a different continuation, so nothing after
it is compared). Every near-tie is returned and warned about, naming the conversation, the turn and the step, so a
passing run still says where it leaned on the tolerance. A real bug (a wrong cache column, a row reading another's
keys, a dropped token) moves logits by far more than rounding: the reference's top two are then far apart, or the
engine's token is not among them, and the comparison fails (tests/test_token_match.py shows it).

The reference logits come from the plain path of debate/engine/reference.py: one full forward pass of the model over
the whole prefix, one conversation, no batch, no padding, no cache.
"""
import dataclasses
import types
import warnings
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import torch

from debate.engine import chat

# How close the reference's two best logits must be for a different token to count as rounding, not a bug: a float32
# model's, and an NF4 model's (bitsandbytes' CPU kernels dequantise by another path for one row than for many).
#
# Measured with bench/bench_kernel_ties.py (2026-12-07, AMD EPYC with AVX-512, torch 2.13 CPU, bitsandbytes 0.50.2,
# one thread; docs/BENCHMARKS.md, "Issue 52"): at every greedy step of 12 debate-like turns (~150 steps a model), the
# next token's logits computed six ways (a prefix alone in one forward pass, the same prefix as one row of a padded
# batch of 8, its last token as one step over a KV cache; each under torch's AVX2 and AVX-512 kernels) changed by at
# most 1.3e-5 (tiny Llama, logits within +-7) and 2.3e-6 (tiny Gemma 3), and the gap between the two best tokens by
# at most 8.6e-6; on the tiny Llama in NF4 by at most 0.033 and its top-two gap by at most 0.017 (one row against
# several: bitsandbytes' one-row kernel rounds otherwise). Two paths can pick different tokens only where the
# reference's gap is below the larger of their two changes, so the tolerances are the largest gap change measured
# with headroom for other CPUs and GPUs: ~100x for float32 (1e-3, still a thousandth of the logits' range), ~3x for
# NF4 (0.05). On these models 0 to 1 step in ~150 has a top-two gap within 1e-3, and 1 in 11 within 0.05 in NF4.
# A real bug moves logits by more: replies decoded with one context column wrong part from the reference's where its
# top-two gap is 0.017 to 0.59 (tests/test_token_match.py), so float32's tolerance catches each such reply and NF4's
# the conversations beside the one or two it would take for near-ties.
TIE_TOLERANCE = 1e-3
NF4_TIE_TOLERANCE = 0.05


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
                        max_ties: Optional[int] = None) -> Dict[int, Tie]:
    """Assert that each `got[i]` replied as `want[i]` (engine.Conversation pairs; `want` the reference), turn by turn,
    up to near-ties; return {i: its Tie} for the conversations that parted at one (nothing after it is compared, so
    callers compare other fields only for the rest).

    A turn is compared only after the same context: equal for every turn before the first tie, which is asserted.
    `groups` (one key a pair, e.g. the claim) ties conversations whose prompts feed each other: once a group has a
    near-tie, a later prompt of another of its conversations may differ (it quotes the other reply) and that
    conversation is not compared from there; a group without a tie must have the same contexts throughout.
    At most `max_ties` pairs may part (default: half of them, so a comparison can never pass by being empty).
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
    limit = len(want) // 2 if max_ties is None else max_ties
    assert len(ties) <= limit, "more near-ties than a rounding difference explains:\n" + "\n".join(
        str(t) for t in ties.values())
    return ties
