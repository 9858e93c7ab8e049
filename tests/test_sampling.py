"""The sampler against the distribution it states (debate.engine.sampling): its draws, its race, its nucleus, its host
twin, at a fixed seed. Each test here fails on a sampler that breaks the contract it names (tests/mutants.py lists
the breakages tried)."""
import math

import pytest
import torch
from scipy.stats import chisquare

from debate.engine import sampling

# A draw whose hash at token 1 has its top 24 bits all set (found by search): the sampler's uniform there was
# (2**24 - 1/2) / 2**24 in float32, which rounds to 1.0, and a token of probability 0 then scored 0 / -0.0 = NaN.
EDGE_KEY, EDGE_COUNT = 20261207, 16181263


def race(logits, temperature=1.0, top_p=1.0, key=7, counts=None, prune=None):
    """`pick` over rows of `logits` (one row repeated when `counts` is given: each row a later draw of one stream)."""
    if counts is not None:
        logits = logits.expand(len(counts), -1)
    rows = logits.shape[0]
    counts = torch.arange(rows) if counts is None else counts
    keys = torch.full((rows,), key, dtype=torch.long)
    return sampling.pick(logits, torch.full((rows,), temperature), torch.full((rows,), top_p), keys, counts,
                         nucleus=top_p < 1, prune=prune)


def nucleus_of(logits, temperature, top_p):
    """The nucleus as the module doc defines it, in doubles: the fewest most probable tokens whose mass reaches
    top_p, closed under ties."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    order = sorted(range(len(probs)), key=lambda i: -float(probs[i]))
    kept, mass = set(), 0.0
    for i in order:
        if mass >= top_p and float(probs[i]) < float(probs[order[len(kept) - 1]]):
            break
        kept.add(i)
        mass += float(probs[i])
    return kept, probs


def test_the_hash_is_its_definition():
    keys = torch.tensor([0, 1, -1, 2 ** 62 + 12345, -(2 ** 63)], dtype=torch.long)
    counts = torch.tensor([0, 3, 1000, 7, 2 ** 40])
    got = sampling.uniforms(keys, counts, 300).double()
    for row in range(len(keys)):
        want = torch.tensor(sampling.host_uniforms(int(keys[row]), int(counts[row]), range(300)), dtype=torch.float64)
        assert torch.equal(got[row], want)


def test_uniforms_strictly_inside_0_1_and_noise_finite():
    bits = torch.tensor([0, 1, (1 << sampling.BITS) - 2, (1 << sampling.BITS) - 1])
    u = sampling.unit(bits)
    assert bool((u > 0).all()) and bool((u < 1).all())
    assert u[-1].item() == 1 - 2.0 ** -24 and u[0].item() == 2.0 ** -24  # exact, no rounding
    noise = u.log().neg().log().neg()
    assert bool(torch.isfinite(noise).all())
    assert sampling.G_LOW <= noise.min().item() and noise.max().item() <= sampling.G_HIGH + 1e-5


@pytest.mark.parametrize("prune", [True, False])
def test_a_masked_token_at_the_largest_draw_is_not_picked(prune):
    key, count = torch.tensor([EDGE_KEY]), torch.tensor([EDGE_COUNT])
    salt = sampling.token_salts(4, torch.device("cpu"))[1]
    assert sampling._shr(sampling._mix(sampling.row_bases(key, count) ^ salt), 40).item() == (1 << 24) - 1
    logits = torch.tensor([[0.0, float("-inf"), -1.0, -2.0]])
    for top_p in (1.0, 0.5):
        assert race(logits, 0.7, top_p, key=EDGE_KEY, counts=count, prune=prune).item() != 1
    # top-p: token 1 out of the nucleus rather than masked
    logits = torch.tensor([[0.0, -30.0, -1.0, -2.0]])
    assert race(logits, 0.7, 0.9, key=EDGE_KEY, counts=count, prune=prune).item() != 1


@pytest.mark.parametrize("prune", [True, False])
@pytest.mark.parametrize("temperature", [0.7, 1.6])
def test_picks_follow_the_tempered_distribution(prune, temperature):
    logits = torch.tensor([[2.0, 1.5, 1.5, 0.3, -0.5, float("-inf"), -1.0, 0.0, -3.0, float("-inf"), 1.0, -6.0]])
    n = 60_000
    picks = race(logits, temperature, counts=torch.arange(n), prune=prune)
    seen = torch.bincount(picks, minlength=logits.shape[1])
    assert seen[5] == 0 and seen[9] == 0  # -inf: never
    probs = torch.softmax(logits[0].double() / temperature, dim=-1)
    live = probs > 0
    assert chisquare(seen[live].double().numpy(), (probs[live] * n).numpy()).pvalue > 1e-3


@pytest.mark.parametrize("prune", [True, False])
def test_picks_follow_the_nucleus(prune):
    logits = torch.tensor([[3.0, 2.2, 2.2, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, -4.0]])
    temperature, top_p, n = 0.9, 0.6, 60_000
    kept, probs = nucleus_of(logits[0], temperature, top_p)
    assert kept == {0, 1, 2}  # the boundary falls between 1 and 2, which tie: both in
    picks = race(logits, temperature, top_p, counts=torch.arange(n), prune=prune)
    seen = torch.bincount(picks, minlength=logits.shape[1])
    assert set(seen.nonzero()[:, 0].tolist()) == kept
    want = torch.tensor([float(probs[i]) for i in sorted(kept)], dtype=torch.float64)
    want = want / want.sum() * n
    assert chisquare(seen[sorted(kept)].double().numpy(), want.numpy()).pvalue > 1e-3


@pytest.mark.parametrize("prune", [True, False])
def test_no_masked_or_outside_token_over_millions_of_draws(prune):
    # 28 of 32 tokens masked or outside the nucleus, a million draws: 2**25 uniforms of those tokens, so the
    # largest 24-bit pattern (once in 2**24) comes up about twice, as in a sampled reply of some 300 tokens.
    gen = torch.Generator().manual_seed(58)
    logits = torch.randn(1, 32, generator=gen)
    logits[0, 16:] = float("-inf")
    logits[0, :4] += 4.0
    kept, _ = nucleus_of(logits[0], 1.0, 0.9)
    assert len(kept) < 16
    for start in range(0, 1_000_000, 250_000):
        counts = torch.arange(start, start + 250_000)
        picks = race(logits, 1.0, 0.9, key=EDGE_KEY, counts=counts, prune=prune)
        assert set(torch.unique(picks).tolist()) <= kept
        picks = race(logits, 1.0, 1.0, key=EDGE_KEY, counts=counts, prune=prune)
        assert int(picks.max()) < 16


def test_pruned_and_dense_races_pick_alike():
    gen = torch.Generator().manual_seed(3)
    for scale, vocab in ((0.5, 2000), (3.0, 5000), (8.0, 5000)):
        logits = torch.randn(24, vocab, generator=gen) * scale
        logits[::5, :vocab // 2] = float("-inf")
        temperature = torch.tensor([0.0, 0.3, 0.7, 1.0, 1.3, 2.0] * 4)
        top_p = torch.tensor([1.0, 0.9, 0.5, 0.99] * 6)
        keys = torch.randint(-2 ** 62, 2 ** 62, (24,), generator=gen)
        counts = torch.randint(0, 500, (24,), generator=gen)
        for nucleus in (False, True):
            p = top_p if nucleus else torch.ones(24)
            dense = sampling.pick(logits, temperature, p, keys, counts, True, nucleus, prune=False)
            pruned = sampling.pick(logits, temperature, p, keys, counts, True, nucleus, prune=True)
            assert torch.equal(dense, pruned)
            assert torch.equal(dense[temperature == 0], logits[temperature == 0].argmax(dim=-1))


def test_the_candidates_nucleus_is_the_sorted_one():
    """The pruned race decides each candidate's nucleus from the candidates alone; the sort of the whole row says the
    same of them (ties at the boundary, a boundary past every candidate, rows of top_p 1 included)."""
    gen = torch.Generator().manual_seed(5)
    s = torch.randn(40, 3000, generator=gen) * 4
    s[::3, :200] = 20.0  # ties at the top: the boundary falls inside a tie
    s[1::7] = torch.randn(1, 3000, generator=gen) * 0.05  # nearly flat: every token a candidate
    s[2::9, 10:] -= 40.0  # ten tokens within reach, the rest far below
    best = s.max(dim=-1).values
    top_p = torch.rand(40, generator=gen).clamp(0.05, 1.0)
    top_p[::4] = 1.0
    top_p[3::10] = 0.999999  # past every candidate where the tail is far below
    rows, ids = (s >= (best - sampling.SPREAD)[:, None]).nonzero(as_tuple=True)
    scaled = s[rows, ids]
    got = sampling._candidates_in_nucleus(s, best, top_p, rows, scaled)
    floor = sampling.nucleus_floor(s, best, top_p)
    assert torch.equal(got, scaled >= floor[rows])
    assert bool(got[top_p[rows] >= 1].all()) and not bool(got.all())
    # each nucleus reaches top_p and is the fewest tokens that do, up to ties at its threshold
    for row in range(40):
        if top_p[row] >= 1:
            continue
        w = torch.softmax(s[row].double(), dim=-1)
        assert w[s[row] >= floor[row]].sum() >= top_p[row] - 1e-5
        assert w[s[row] > floor[row]].sum() < top_p[row] + 1e-5


def test_a_row_picks_alike_alone_or_in_a_batch():
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(9, 4000, generator=gen) * 2
    temperature = torch.tensor([0.7] * 8 + [0.0])
    top_p = torch.tensor([1.0, 0.9] * 4 + [1.0])
    keys = torch.randint(-2 ** 62, 2 ** 62, (9,), generator=gen)
    counts = torch.arange(9) * 13
    batch = sampling.pick(logits, temperature, top_p, keys, counts)
    for row in range(9):
        alone = sampling.pick(logits[row:row + 1], temperature[row:row + 1], top_p[row:row + 1], keys[row:row + 1],
                              counts[row:row + 1], True, bool(top_p[row] < 1))
        assert alone.item() == batch[row].item()


def test_identical_rows_draw_differently():
    keys = torch.tensor([sampling.reply_key(1, ("debater", 0.7), [5, 6, 7], n) for n in range(64)])
    assert len(set(keys.tolist())) == 64
    logits = torch.zeros(64, 50)
    picks = sampling.pick(logits, torch.full((64,), 1.0), torch.ones(64), keys, torch.zeros(64, dtype=torch.long),
                          True, False)
    assert len(set(picks.tolist())) > 20  # 64 uniform draws of 50 ids: about 35 distinct
    assert sampling.reply_key(1, ("debater", 0.7), [5, 6, 7], 0) == keys[0].item()  # a key is a pure function


@pytest.mark.parametrize("prune", [True, False])
def test_the_host_twin_picks_as_the_device(prune):
    gen = torch.Generator().manual_seed(21)
    vocab = 500
    for trial in range(200):
        n = int(torch.randint(2, 12, (1,), generator=gen))
        ids = torch.randperm(vocab, generator=gen)[:n].tolist()
        values = (torch.randn(n, generator=gen) * 2).tolist()
        temperature, top_p = [(0.7, 1.0), (1.0, 0.8), (1.5, 0.5), (0.0, 1.0)][trial % 4]
        key, count = int(torch.randint(-2 ** 62, 2 ** 62, (1,), generator=gen)), trial
        row = torch.full((1, vocab), float("-inf"))
        row[0, ids] = torch.tensor(values)
        device = race(row, temperature, top_p, key=key, counts=torch.tensor([count]), prune=prune).item()
        assert ids[sampling.host_pick(values, ids, temperature, top_p, key, count)] == device


def test_reference_draws_follow_the_distribution_and_skip_masked_tokens():
    class Settings:
        temperature, top_p = 0.8, 1.0

    logits = torch.tensor([1.0, 0.0, float("-inf"), -0.5, 0.7])
    gen = torch.Generator().manual_seed(4)
    n = 40_000
    picks = sampling.next_tokens(logits.expand(n, -1), Settings(), gen)
    seen = torch.bincount(picks, minlength=5)
    assert seen[2] == 0
    probs = torch.softmax(logits.double() / 0.8, dim=-1)
    live = probs > 0
    assert chisquare(seen[live].double().numpy(), (probs[live] * n).numpy()).pvalue > 1e-3


def test_spread_bounds_the_noise():
    # The pruned race leaves out tokens more than SPREAD below their row's best: the noise's whole range.
    assert math.isclose(sampling.SPREAD, sampling.G_HIGH - sampling.G_LOW, abs_tol=2e-3)
    u = sampling.unit(torch.tensor([0, (1 << sampling.BITS) - 1]))
    noise = u.log().neg().log().neg()
    assert noise[1] - noise[0] < sampling.SPREAD
