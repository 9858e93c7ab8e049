"""Picking the next token from logits: greedy, or temperature and top-p sampling from a row's own random stream.

A sampled reply draws from a stream of its own, keyed by the run's seed and the reply's identity (`reply_key`:
what it continues, its settings, and which of identical rows it is), never from a stream shared with the rows beside
it. Draw n of a row is a pure function of (its key, n, the token id): a counter-based hash (splitmix64's finaliser,
as Philox and JAX's threefry are counter-based). A token is then picked by the Gumbel-max race: the argmax over the
row's nucleus of s_i + g_i, with s_i = logit_i / temperature and g_i = -log(-log u_i) the Gumbel noise of its
uniform u_i, which draws token i with probability softmax(s)_i over the nucleus. So a row's tokens depend on its
logits alone: not on which rows run beside it, in what order, at what batch size, or how many steps the host lags
behind the device; a resumed run or another --batch-size draws the same tokens from the same logits.

What is exact (tests/test_sampling.py checks each against the distribution it states):
- A uniform is (BITS bits of the hash + 1/2) / 2**BITS, strictly inside (0, 1) and a float32 exactly (with 24 bits
  the largest would round to 1.0, its noise to +inf, and a token of probability 0 would score NaN and win argmax).
  So every g_i is finite: a token whose logit is -inf (a schema's banned ids) or outside the nucleus scores -inf and
  never wins while any token may.
- The race works on logits, never on probabilities: no probability underflows to 0 and wins by a 0/0. Its one
  approximation is the draws' resolution: g lies in [G_LOW, G_HIGH], so a token whose s is more than SPREAD (19.4)
  below its row's best, probability under 4e-9 of the best's, is never drawn.
- The nucleus (top_p < 1) is the tokens whose probability is at least its threshold: the smallest set of the most
  probable tokens whose mass reaches top_p, closed under ties (tokens of equal probability are in or out together,
  whatever their order), the most probable token always in. The race then runs over it alone.

What it costs (docs/BENCHMARKS.md, issue 58). On a CPU, where the host reads the device for free, only the tokens
that can win are hashed (`SPREAD` below the row's best at most: a few hundred of a trained model's 128k) and the
nucleus' threshold is found among the row's top k by probability, k grown until it holds the boundary: a few passes
over the vocabulary and no sort. On a GPU, where a read back would stall the device, every token is hashed (one
pass when compiled, a few dozen cheap ones eagerly) and the threshold comes from a sort; both paths pick the same
token (a test).
"""
import hashlib
import math
import struct
from typing import Dict, List, Optional, Sequence, Tuple

import torch

_MASK64 = (1 << 64) - 1
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_GOLDEN = 0x9E3779B97F4A7C15

BITS = 23  # of the hash that make a uniform: (bits + 1/2) / 2**23 is a float32 strictly inside (0, 1)
_SCALE = 1.0 / (1 << BITS)
# The Gumbel noise's range over those uniforms: g = -log(-log u) grows with u, from u = 2**-24 to 1 - 2**-24.
G_LOW = -math.log(-math.log(0.5 * _SCALE))  # -2.81
G_HIGH = -math.log(-math.log1p(-0.5 * _SCALE))  # 16.64
# A token whose scaled logit is below its row's best by more than this cannot win the race (module doc); the margin
# covers float32's rounding of the noise (a few units in the last place).
SPREAD = G_HIGH - G_LOW + 1e-3
# The pruned race (a CPU's) lists the tokens within SPREAD of their row's best; where more than one in this many are,
# the dense race runs instead (measured: listing and sorting every token of a flat distribution costs 2-3x the dense
# race, docs/BENCHMARKS.md issue 58). The same ids either way.
PRUNED_SHARE = 8


def _signed(value: int) -> int:
    """A 64-bit pattern as the int64 torch stores."""
    value &= _MASK64
    return value - (1 << 64) if value >> 63 else value


def reply_key(seed: int, parts: Sequence[object], context: Sequence[int], occurrence: int) -> int:
    """The random stream of one reply: the run's seed, its settings and role (`parts`), the ids it continues and
    which of identical rows in one call it is (`occurrence`: HyDE's n articles of one claim ask the same thing)."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(repr((seed, tuple(parts), occurrence)).encode())
    digest.update(struct.pack(f"<{len(context)}q", *context))
    return _signed(int.from_bytes(digest.digest(), "little"))


# -- the draws -------------------------------------------------------------------------------------------------------

def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 patterns (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    # splitmix64's finaliser; int64 products wrap modulo 2**64 on every torch device
    x = (x ^ _shr(x, 30)) * _signed(_M1)
    x = (x ^ _shr(x, 27)) * _signed(_M2)
    return x ^ _shr(x, 31)


def _py_mix(x: int) -> int:
    """`_mix` on Python integers: the hash's definition, which tests hold the tensor version to."""
    x = ((x ^ (x >> 30)) * _M1) & _MASK64
    x = ((x ^ (x >> 27)) * _M2) & _MASK64
    return x ^ (x >> 31)


def row_bases(keys: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Each row's base for its draw `counts[r]` of stream `keys[r]`: one hash a row."""
    return _mix(keys * _signed(_GOLDEN) + counts * _signed(_M1))


_TOKEN_SALTS: Dict[Tuple[int, str], torch.Tensor] = {}


def token_salts(vocab: int, device: torch.device) -> torch.Tensor:
    """Every token id's salt (id * M2 + GOLDEN), made once a vocabulary and device: two passes fewer a step."""
    key = (vocab, str(device))
    salts = _TOKEN_SALTS.get(key)
    if salts is None:
        salts = torch.arange(vocab, device=device, dtype=torch.long) * _signed(_M2) + _signed(_GOLDEN)
        _TOKEN_SALTS[key] = salts
    return salts


def unit(bits: torch.Tensor) -> torch.Tensor:
    """BITS-bit patterns (int64, 0 .. 2**BITS - 1) as float32 uniforms (bits + 1/2) / 2**BITS: exact, and strictly
    inside (0, 1) (the largest is 1 - 2**-24, a float32)."""
    return bits.to(torch.float32).add_(0.5).mul_(_SCALE)


def _bits(bases: torch.Tensor, salts: torch.Tensor) -> torch.Tensor:
    return _shr(_mix(bases ^ salts), 64 - BITS)  # the hash's top BITS bits


def uniforms(keys: torch.Tensor, counts: torch.Tensor, vocab: int) -> torch.Tensor:
    """(rows, vocab) float32 uniforms strictly inside (0, 1): draw `counts[r]` of row `r`'s stream, one a token id."""
    return unit(_bits(row_bases(keys, counts)[:, None], token_salts(vocab, keys.device)[None]))


def host_uniforms(key: int, count: int, ids: Sequence[int]) -> List[float]:
    """`uniforms` of one row at these ids, computed on Python integers (the definition the tensors are tested
    against): exact rationals (bits + 1/2) / 2**BITS."""
    base = _py_mix((key * _GOLDEN + count * _M1) & _MASK64)
    return [((_py_mix(base ^ ((i * _M2 + _GOLDEN) & _MASK64)) >> (64 - BITS)) + 0.5) * _SCALE for i in ids]


def gumbel(bases: torch.Tensor, salts: torch.Tensor) -> torch.Tensor:
    """Gumbel noise -log(-log u) of the uniforms of (`bases` ^ `salts`, broadcast): finite, in [G_LOW, G_HIGH]."""
    return unit(_bits(bases, salts)).log_().neg_().log_().neg_()


# -- the nucleus -----------------------------------------------------------------------------------------------------

def _kept(ordered: torch.Tensor, best: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """From each row's largest scaled logits in descending order (-inf past a row's own), its best and the mass its
    nucleus must reach (of the weights exp(s - best)): how many of them the nucleus keeps before ties (a prefix: each
    while the mass before it is below `mass`; the first always)."""
    weights = (ordered - best[:, None]).exp()
    before = weights.cumsum(dim=-1) - weights  # the mass of the values before each
    return (before < mass[:, None]).sum(dim=-1).clamp(min=1)


def _mass(s: torch.Tensor, best: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The mass each row's nucleus must reach, of its weights exp(s - best) over the whole vocabulary."""
    return (s - best[:, None]).exp_().sum(dim=-1) * top_p.clamp(max=1.0)


def nucleus_floor(s: torch.Tensor, best: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Each row's nucleus threshold over its scaled logits `s` (rows x vocab; `best` each row's largest), by a sort of
    the row: the nucleus is the tokens whose s is at least it (-inf where top_p >= 1: every token). Thresholds on s,
    not on probabilities: tokens of equal logits are in or out together, and a probability rounded apart from its
    logit moves nothing."""
    ordered = s.sort(dim=-1, descending=True).values
    floor = ordered.gather(-1, (_kept(ordered, best, _mass(s, best, top_p)) - 1)[:, None])[:, 0]
    return torch.where(top_p < 1.0, floor, torch.full_like(floor, float("-inf")))


def _candidates_in_nucleus(s: torch.Tensor, best: torch.Tensor, top_p: torch.Tensor, rows: torch.Tensor,
                           scaled: torch.Tensor) -> torch.Tensor:
    """Whether each of the race's candidates (`rows`, their scaled logits `scaled`: every token within SPREAD of its
    row's best, so every token above a candidate is one too) is in its row's nucleus: the candidates sorted by row
    and logit, their running mass against `_mass` of the whole row. The same decision as `nucleus_floor`'s: the
    candidates in order are the sort's first values of the row, and their running sums the same. No sort of the
    vocabulary, only of the candidates."""
    by_logit = scaled.sort(descending=True, stable=True).indices
    order = by_logit[rows[by_logit].sort(stable=True).indices]  # by row, then by logit, descending
    in_row = torch.bincount(rows, minlength=best.shape[0])
    first = torch.cumsum(in_row, dim=0) - in_row
    place = torch.arange(rows.shape[0], device=rows.device) - first[rows[order]]
    ordered = torch.full((best.shape[0], max(1, int(in_row.max()))), float("-inf"), device=s.device)
    ordered[rows[order], place] = scaled[order]
    kept = _kept(ordered, best, _mass(s, best, top_p))
    floor = ordered.gather(-1, (kept - 1)[:, None])[:, 0]
    floor = torch.where((top_p < 1.0) & (kept < in_row), floor, torch.full_like(floor, float("-inf")))
    return scaled >= floor[rows]


# -- the pick --------------------------------------------------------------------------------------------------------

def _scaled(logits: torch.Tensor, temperature: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(logits / temperature in float32, each row's largest of them: a positive divisor keeps the order, so that is
    its largest logit divided)."""
    divisor = temperature.clamp(min=1e-6).to(torch.float32)
    return logits.float() / divisor[:, None], logits.max(dim=-1).values.float() / divisor

def pick(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, keys: torch.Tensor,
         counts: torch.Tensor, sampled: bool = True, nucleus: bool = True,
         prune: Optional[bool] = None) -> torch.Tensor:
    """One id a row, on the logits' device: argmax where the row's temperature is 0, else the race over its nucleus
    with draw `counts[r]` of stream `keys[r]` (module doc). The host says what it knows, so nothing is read back on a
    GPU: `sampled=False` (no row samples) is argmax alone, `nucleus=False` (no row's top_p < 1) skips the nucleus.
    `prune` hashes only the tokens that can win and finds the nucleus without a sort; by default on a CPU where few
    tokens are within reach (PRUNED_SHARE), True or False forces one race or the other. The same ids either way."""
    if not sampled:
        return logits.argmax(dim=-1)
    chosen = prune is not None
    prune = logits.device.type == "cpu" if prune is None else prune
    top, greedy = logits.max(dim=-1)
    divisor = temperature.clamp(min=1e-6).to(torch.float32)
    best = top.float() / divisor  # each row's largest scaled logit: a positive divisor keeps the order
    sampling = temperature > 0
    vocab = logits.shape[-1]
    p = torch.where(sampling, top_p, torch.ones_like(top_p))  # a greedy row's nucleus: every token
    bases = row_bases(keys, counts)
    if prune:
        # Only tokens within SPREAD of the row's best can win, and 4 units in the last place more, so that no token
        # left out could tie the winner after rounding; a greedy row lists none. The logits are compared first,
        # against the bound times the divisor with a slack far wider than the division's rounding (a token too many
        # costs nothing), then each candidate's s exactly as the dense race computes it.
        bound = best - SPREAD - best.abs() * 2.0 ** -21
        bound = torch.where(sampling, bound, torch.full_like(bound, float("inf")))
        loose = bound * divisor
        near = logits >= (loose - loose.abs() * 2.0 ** -18)[:, None]
        # Where most tokens are within reach (a flat distribution), the dense race costs less than listing them.
        prune = chosen or int(near.sum()) * PRUNED_SHARE <= near.numel()
    s = logits.float() / divisor[:, None] if nucleus or not prune else None
    if s is not None and not prune:
        score = s + gumbel(bases[:, None], token_salts(vocab, s.device)[None])
        if nucleus:
            score.masked_fill_(s < nucleus_floor(s, best, p)[:, None], float("-inf"))
        return torch.where(sampling, score.argmax(dim=-1), greedy)
    rows, ids = near.nonzero(as_tuple=True)
    scaled = logits[rows, ids].float() / divisor[rows]
    inside = scaled >= bound[rows]
    rows, ids, scaled = rows[inside], ids[inside], scaled[inside]
    score = scaled + gumbel(bases[rows], token_salts(vocab, logits.device)[ids])
    if s is not None and nucleus:
        score.masked_fill_(~_candidates_in_nucleus(s, best, p, rows, scaled), float("-inf"))
    # Each row's winner: its highest score, the lowest id among equals (as argmax takes the first).
    most = torch.full_like(best, float("-inf")).scatter_reduce(0, rows, score, "amax")
    at_top = (score == most[rows]) & (score > float("-inf"))
    winner = torch.full_like(greedy, vocab).scatter_reduce(0, rows[at_top], ids[at_top], "amin")
    return torch.where(sampling & (winner < vocab), winner, greedy)


def host_pick(values: Sequence[float], ids: Sequence[int], temperature: float, top_p: float, key: int,
              count: int) -> int:
    """`pick` among a few candidates the host holds (`values` their logits, `ids` their token ids): the index
    chosen, the one `pick` takes over a row whose other tokens are -inf. Greedy: the highest value, the lowest id
    among equals (as argmax over the vocabulary). Sampled: the race with the draws of those ids."""
    if temperature <= 0:
        return max(range(len(values)), key=lambda i: (values[i], -ids[i]))
    order = sorted(range(len(ids)), key=lambda i: ids[i])  # as the vocabulary lists them: ties to the lowest id
    logits = torch.tensor([[values[i] for i in order]], dtype=torch.float32)
    s, best = _scaled(logits, torch.tensor([temperature]))
    score = s + gumbel(row_bases(torch.tensor([key]), torch.tensor([count]))[:, None],
                       torch.tensor([ids[i] for i in order]) * _signed(_M2) + _signed(_GOLDEN))
    if top_p < 1.0:
        score.masked_fill_(s < nucleus_floor(s, best, torch.tensor([top_p]))[:, None], float("-inf"))
    return order[int(score.argmax(dim=-1))]


def next_tokens(logits: torch.Tensor, settings: object, generator: Optional[torch.Generator]) -> torch.Tensor:
    """One id per row of `logits` (rows x vocab) from a torch.Generator: the reference path's and the tests' own
    schema driver (debate.engine.constrained_row.SchemaRow); the engine's batch picks with `pick`. The same race
    and nucleus, its uniforms the generator's BITS-bit integers."""
    temperature = float(getattr(settings, "temperature", 0))
    if temperature <= 0:
        return logits.argmax(dim=-1)
    rows, vocab = logits.shape
    top_p = torch.full((rows,), float(getattr(settings, "top_p", 1.0)), device=logits.device)
    s, best = _scaled(logits, torch.full((rows,), temperature, device=logits.device))
    bits = torch.randint(0, 1 << BITS, (rows, vocab), generator=generator, device="cpu").to(logits.device)
    score = s + unit(bits).log_().neg_().log_().neg_()
    if bool((top_p < 1.0).any()):
        score.masked_fill_(s < nucleus_floor(s, best, top_p)[:, None], float("-inf"))
    return score.argmax(dim=-1)
