"""The eager attention (debate.engine.attention.per_slot, the step a CPU runs by default) against the rule written
out token by token: every token of a step, decode rows and prompt pieces alike, attends over exactly the columns of
its own slot that `attention.sees` gives it, whichever way its slot's call is made (a decode row's grouped query
heads, a piece's masked call, a long piece's two calls merged by their log-sum-exps, a sliding window's mask), and
what a step's first layer makes of the host's view serves its other layers; and the CPU kernel that takes a step's
decode rows in one call (debate.engine.cpu_kernel) against the same rule. No model, no compile."""
import pytest
import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import repeat_kv

from debate.engine import attention, cpu_kernel

HEADS, KV_HEADS, DIM, COLUMNS = 8, 4, 32, 1200  # the tiny Llama's heads


real = cpu_kernel.decode_rows


def by_token(query, key, value, host, window, scaling):
    """Each listed token alone: sdpa over its slot's columns under `sees`, keys repeated to every query head."""
    out = torch.zeros(query.shape[2], HEADS, DIM)
    groups = HEADS // KV_HEADS
    for slot, places, positions in host:
        for place, position in zip(places, positions):
            seen = attention.sees(torch.tensor(position), torch.arange(COLUMNS), window)
            want = F.scaled_dot_product_attention(query[:, :, place:place + 1], repeat_kv(key[slot:slot + 1], groups),
                                                  repeat_kv(value[slot:slot + 1], groups), attn_mask=seen[None],
                                                  scale=scaling)
            out[place] = want[0, :, 0]
    return out[None]


def step(seed=0):
    """A step's tensors and host view: decode rows (slots 0-2, one not live), a piece of 300 tokens after a cached
    prefix of 500 (slot 3: two calls), the same with its decode token after it (slot 4), a fresh prompt of 280 tokens
    (slot 5: the causal call alone), a short piece (slot 6: masked) and a long one whose last place is a bucket's
    padding repeating its last token (slot 7: masked, its positions not consecutive)."""
    gen = torch.Generator().manual_seed(seed)
    host, at = [], 0
    for slot, length in ((0, 900), (1, 40), (2, 1100)):
        host.append((slot, [at], [length]))
        at += 1
    for slot, first, count, extra in ((3, 500, 300, 0), (4, 200, 300, 1), (5, 0, 280, 0), (6, 700, 20, 0),
                                      (7, 100, 299, 0)):
        places, positions = list(range(at, at + count + extra)), list(range(first, first + count + extra))
        at += count + extra
        if slot == 7:
            places, positions = places + [at], positions + [positions[-1]]
            at += 1
        host.append((slot, places, positions))
    query = torch.randn(1, at, HEADS, DIM, generator=gen).transpose(1, 2)  # transformers' layout
    key = torch.randn(8, KV_HEADS, COLUMNS, DIM, generator=gen)
    value = torch.randn(8, KV_HEADS, COLUMNS, DIM, generator=gen)
    empty = torch.zeros(1, dtype=torch.long)
    packed = attention.Packed(empty, empty, empty, empty, torch.empty(1), host=host, parts={})
    return query, key, value, packed


@pytest.mark.parametrize("kernel", ["1", "0"])
def test_every_token_attends_over_its_own_columns_whichever_call_its_slot_takes(kernel, monkeypatch):
    monkeypatch.setenv(cpu_kernel.SWITCH, kernel)
    calls = []
    monkeypatch.setattr(cpu_kernel, "decode_rows", lambda *a: calls.append(a[4].clone()) or real(*a))
    query, key, value, packed = step()
    got = attention.per_slot(query, key, value, packed, None, DIM ** -0.5)
    want = by_token(query, key, value, packed.host, None, DIM ** -0.5)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    parts = {part.slot: part for part in packed.parts[None].slots}
    # each kind of call was taken: the long consecutive pieces in two calls, the rest masked or grouped
    assert [s for s, p in parts.items() if p.split is not None] == [3, 4, 5]
    assert parts[3].split == 500 and parts[5].split == 0
    assert parts[6].mask is not None and parts[7].mask is not None
    assert all(parts[s].mask is None and parts[s].split is None for s in (0, 1, 2))
    # the decode rows went to the kernel, in one call, where it was built and switched on; to sdpa where it was not
    assert packed.parts[None].rows.tolist() == [[0, 0, 0, 901], [1, 1, 0, 41], [2, 2, 0, 1101]]
    assert len(calls) == (1 if kernel == "1" else 0)


def test_a_sliding_window_that_cuts_a_piece_keeps_the_mask():
    """A window of 600: slot 3's piece (positions 500-799) loses columns at its start, so it is masked; slot 5's
    fresh prompt (0-279) sees everything its window allows, its own columns alone, so it still takes two calls."""
    query, key, value, packed = step(1)
    got = attention.per_slot(query, key, value, packed, 600, DIM ** -0.5)
    want = by_token(query, key, value, packed.host, 600, DIM ** -0.5)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    parts = {part.slot: part for part in packed.parts[600].slots}
    assert parts[3].mask is not None and parts[3].split is None and parts[3].low == 0
    assert parts[5].split == 0


def test_a_steps_parts_are_made_once_and_read_by_its_other_layers(monkeypatch):
    query, key, value, packed = step(2)
    first = attention.per_slot(query, key, value, packed, None, DIM ** -0.5)
    made = packed.parts[None]
    monkeypatch.setattr(attention, "sees", lambda *a: (_ for _ in ()).throw(AssertionError("made again")))
    again = attention.per_slot(query, key, value, packed, None, DIM ** -0.5)  # the step's next layer
    assert packed.parts[None] is made and torch.equal(again, first)
    # Without the step's dict (a self-check's reference view) the parts are made at each call.
    monkeypatch.undo()
    alone = attention.per_slot(query, key, value, packed._replace(parts=None), None, DIM ** -0.5)
    assert torch.equal(alone, first)
