"""Picking the next token from logits: greedy, or temperature and top-p sampling from a row's own random stream.

A sampled reply draws from a stream of its own, keyed by the run's seed and the reply's identity (`reply_key`:
what it continues, its settings, and which of identical rows it is), never from a stream shared with the rows beside
it. Draw n of a row is a pure function of (its key, n, the token id): a counter-based hash (splitmix64's finaliser,
as Philox and JAX's threefry are counter-based), computed on the device for every row and token at once
(`uniforms`). A token is then picked by the exponential race (Gumbel-max): argmax of p_i / E_i with E_i = -log U_i,
which draws token i with probability p_i. So a row's tokens depend on its logits alone: not on which rows run beside
it, in what order, at what batch size, or how many steps the host lags behind the device; a resumed run or another
--batch-size draws the same tokens from the same logits.
"""
import hashlib
import math
import struct
from typing import List, Optional, Sequence

import torch

_MASK64 = (1 << 64) - 1
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_GOLDEN = 0x9E3779B97F4A7C15


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


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 patterns (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    # splitmix64's finaliser; int64 products wrap modulo 2**64 on every torch device
    x = (x ^ _shr(x, 30)) * _signed(_M1)
    x = (x ^ _shr(x, 27)) * _signed(_M2)
    return x ^ _shr(x, 31)


def uniforms(keys: torch.Tensor, counts: torch.Tensor, vocab: int) -> torch.Tensor:
    """(rows, vocab) float32 uniforms in (0, 1): draw `counts[r]` of row `r`'s stream, one a token id."""
    base = _mix(keys * _signed(_GOLDEN) + counts * _signed(_M1))
    ids = torch.arange(vocab, device=keys.device, dtype=torch.long)
    bits = _shr(_mix(base[:, None] ^ (ids[None] * _signed(_M2) + _signed(_GOLDEN))), 40)  # the top 24 bits
    return (bits.to(torch.float32) + 0.5) / float(1 << 24)


def host_uniforms(key: int, count: int, ids: Sequence[int]) -> List[float]:
    """`uniforms` of one row at these ids, in Python (a draw the host makes: among a number's next tokens)."""
    def mix(x: int) -> int:
        x = ((x ^ (x >> 30)) * _M1) & _MASK64
        x = ((x ^ (x >> 27)) * _M2) & _MASK64
        return x ^ (x >> 31)

    base = mix((key * _GOLDEN + count * _M1) & _MASK64)
    return [((mix(base ^ ((i * _M2 + _GOLDEN) & _MASK64)) >> 40) + 0.5) / (1 << 24) for i in ids]


def _probs(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, nucleus: bool) -> torch.Tensor:
    """Each row's distribution at its temperature, cut to its top-p nucleus where `nucleus` (some row's top_p < 1;
    the first token always stays)."""
    probs = torch.softmax(logits.float() / temperature.clamp(min=1e-6)[:, None], dim=-1)
    if nucleus:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        drop = (sorted_probs.cumsum(dim=-1) - sorted_probs) > top_p[:, None]
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
    return probs


def pick(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, keys: torch.Tensor,
         counts: torch.Tensor, sampled: bool = True, nucleus: bool = True) -> torch.Tensor:
    """One id a row, on the logits' device: argmax where the row's temperature is 0, else the exponential race over
    its nucleus with draw `counts[r]` of stream `keys[r]`. The host says what it knows, so nothing is read back:
    `sampled=False` (no row samples) is argmax alone, `nucleus=False` (no row's top_p < 1) skips the sort."""
    greedy = logits.argmax(dim=-1)
    if not sampled:
        return greedy
    race = _probs(logits, temperature, top_p, nucleus) / -torch.log(uniforms(keys, counts, logits.shape[-1]))
    return torch.where(temperature > 0, race.argmax(dim=-1), greedy)


def host_pick(values: Sequence[float], ids: Sequence[int], temperature: float, top_p: float, key: int,
              count: int) -> int:
    """`pick` among a few candidates the host holds (`values` their logits, `ids` their token ids): the index
    chosen. Greedy: the highest value, the lowest id among equals (as argmax over the vocabulary). Sampled: the race
    with the draws of those ids."""
    if temperature <= 0:
        return max(range(len(values)), key=lambda i: (values[i], -ids[i]))
    probs = _probs(torch.tensor([list(values)]), torch.tensor([temperature]), torch.tensor([top_p]), top_p < 1.0)
    race = [p / -math.log(u) for p, u in zip(probs[0].tolist(), host_uniforms(key, count, ids))]
    return max(range(len(race)), key=lambda i: race[i])


def next_tokens(logits: torch.Tensor, settings: object, generator: Optional[torch.Generator]) -> torch.Tensor:
    """One id per row of `logits` (rows x vocab) from a torch.Generator: the reference path's and the tests' own
    schema driver (debate.engine.constrained_row.SchemaRow); the engine's batch picks with `pick`."""
    if getattr(settings, "temperature", 0) <= 0:
        return logits.argmax(dim=-1)
    temperature = torch.tensor([float(getattr(settings, "temperature"))] * logits.shape[0], device=logits.device)
    top_p = torch.tensor([float(getattr(settings, "top_p", 1.0))] * logits.shape[0], device=logits.device)
    probs = _probs(logits, temperature, top_p, bool(getattr(settings, "top_p", 1.0) < 1.0))
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
