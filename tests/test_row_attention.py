"""The compiled step's attention over each token's own columns (issues 53 and 59; debate/engine/attention.py, one
flex call over a step's packed tokens under a block mask): on the tiny Llama and the tiny Gemma 3 (sliding-window
layers), a decode step beside a long row, and a step carrying prompt pieces beside decode rows, give the eager step's
logits, where each slot attends alone; a row reads no column past its length (garbage written there changes nothing),
a sliding-window layer none before its window, a row that is not live column 0 alone (finite); buckets of other
shapes share the graph. Each model compiles once (CI time)."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from debate.engine import attention, compiled_step, decode_step, generator, kv_store, step_stats
from tests.tiny_models import build_tiny_gemma, build_tiny_llama

LENGTHS = (700, 40, 97, 5, 256)  # one long row beside short ones; 256: a length on a block's edge
SLOTS, COLUMNS = 8, 1280


class Place:
    """A store of SLOTS slots, each live row's random context prefilled into its slot, and the batch's state as
    decode_batch keeps it (views of tensors one entry longer than the slots)."""

    def __init__(self, model, lengths=LENGTHS):
        self.model = model
        self.dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
        self.store = kv_store.Store(kv_store.layer_shapes(model, self.dtype), (SLOTS + 1) * COLUMNS, SLOTS, COLUMNS)
        self.store.ready(COLUMNS)
        generator_ = torch.Generator().manual_seed(0)
        with torch.inference_mode():
            for row, length in enumerate(lengths):
                ids = torch.randint(10, 400, (length,), generator=generator_).tolist()
                if ids:
                    generator.prefill(model, self.store.slot_cache(row, 0), ids, 0)
        self.lengths = torch.zeros(SLOTS + 1, dtype=torch.long)
        self.lengths[:len(lengths)] = torch.tensor(lengths)
        self.live = torch.zeros(SLOTS + 1, dtype=torch.bool)
        self.live[:len(lengths)] = True
        self.tokens = torch.arange(5, 5 + SLOTS + 1)[:, None]
        self.columns = torch.arange(COLUMNS + 1)
        self.step = compiled_step.Step(model, decode_step.layer_windows(model), self.dtype)

    def inputs(self, rows, columns, pieces=(), compiled=True):
        """A step's inputs (decode_step.Inputs) over the first `rows` slots and `columns` columns: each slot below
        `rows` not given a piece feeds one token at its length (live or not, as decode_batch's decode rows), then each
        piece (slot, first column, ids) feeds its ids from its first column."""
        pieced = {slot for slot, _, _ in pieces}
        decode = [r for r in range(rows) if r not in pieced]
        tokens = self.tokens[decode, 0].tolist() + [i for _, _, ids in pieces for i in ids]
        slots = decode + [slot for slot, _, ids in pieces for _ in ids]
        positions = self.lengths[decode].tolist() + [first + i for _, first, ids in pieces for i in range(len(ids))]
        start, count = self.lengths[:rows].clone(), self.live[:rows].long()
        host = [(r, [at], [int(self.lengths[r])]) for at, r in enumerate(decode) if self.live[r]]
        at = len(decode)
        for slot, first, ids in pieces:
            start[slot], count[slot] = first, len(ids)
            host.append((slot, list(range(at, at + len(ids))), list(range(first, first + len(ids)))))
            at += len(ids)
        slot_t, position_t = torch.tensor(slots), torch.tensor(positions)
        width = max([1] + [len(ids) for _, _, ids in pieces])
        packed = attention.Packed(slot_t, position_t - start[slot_t], start, count, torch.empty(width), host,
                                  len(decode))
        keep = torch.tensor(list(range(len(decode))) + [len(decode) + sum(len(p[2]) for p in pieces[:i + 1]) - 1
                                                          for i in range(len(pieces))])
        cache = self.store.step_cache(rows, columns, slot_t, position_t)
        return decode_step.Inputs(torch.tensor(tokens), position_t, keep, packed, self.columns[:columns],
                                  generator.cache_kwarg(self.model, cache), mixed=width > 1)

    def run(self, rows, columns, compiled, pieces=()):
        """One step's logits (each live row writes its token's keys and values at its length, each piece its ids at
        their columns: the same at every run)."""
        with torch.inference_mode():
            return self.step.run(compiled, self.inputs(rows, columns, pieces, compiled)).clone()

    def scribble(self, keep, nan=False):
        """Garbage in every column of every slot that `keep(row, column)` is False for: large finite values, or NaN
        (which poisons any attention that reads it, masked or not: NaN times a zero weight is NaN)."""
        generator_ = torch.Generator().manual_seed(1)
        kept = torch.tensor([[bool(keep(row, c)) for c in range(COLUMNS)] for row in range(SLOTS)])[:, None, :, None]
        for keys, values in self.store.layers:
            for t in (keys, values):
                garbage = torch.full(t.shape, float("nan")) if nan else torch.randn(t.shape, generator=generator_) * 1e4
                t.copy_(torch.where(kept, t, garbage))


def check(model):
    """The compiled step against the eager one, garbage past the rows' lengths, other buckets; what it ran."""
    place = Place(model)
    rows, columns = SLOTS, 3 * decode_step.COLUMN_BUCKET  # 8 rows (3 not live) over 768 columns, past 700
    eager = place.run(rows, columns, compiled=False)
    compiled = place.run(rows, columns, compiled=True)
    assert place.step.flex == (compiled_step.ROW_ATTENTION == "flex") and step_stats.stats_of(model).flex_failed is None
    assert place.step.checked == {("flex attention" if place.step.flex else "masked attention", False)}  # checked
    live = len(LENGTHS)
    assert torch.allclose(compiled[:live], eager[:live], atol=1e-4), (compiled[:live] - eager[:live]).abs().max()
    assert torch.isfinite(compiled).all()  # the rows that are not live read column 0 alone
    graphs = step_stats.stats_of(model).graphs

    # Garbage past each live row's length (after the token written now) changes none of its logits.
    place.scribble(lambda row, c: row >= live or c <= place.lengths[row])
    again = place.run(rows, columns, compiled=True)
    assert torch.equal(again[:live], compiled[:live])
    # NaN in the blocks past each live row's last one: the step never reads them (an additive mask over every
    # column would give NaN logits).
    place.scribble(lambda row, c: row >= live or c // attention.BLOCK <= place.lengths[row] // attention.BLOCK,
                   nan=True)
    again = place.run(rows, columns, compiled=True)
    assert torch.equal(again[:live], compiled[:live])

    # Other buckets (fewer rows, wider columns) share the graph: no recompile.
    place.run(4, columns, compiled=True)
    place.run(rows, columns + decode_step.COLUMN_BUCKET, compiled=True)
    assert step_stats.stats_of(model).graphs == graphs
    return place, rows, columns, compiled


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = build_tiny_llama(tmp_path_factory.mktemp("llama"), seed=0)
    return AutoModelForCausalLM.from_pretrained(path).eval()


def test_a_long_row_beside_short_ones_gives_the_eager_logits_and_reads_only_its_own_columns(llama):
    check(llama)


def test_sliding_window_layers_read_only_their_window(tmp_path):
    """Every layer of this Gemma 3 slides (window 16): a row's logits depend on its last 16 columns alone, so
    garbage before them changes nothing; the eager step, which slices each row's window, agrees."""
    path = build_tiny_gemma(tmp_path / "gemma", seed=0, layer_types=["sliding_attention"] * 3)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    place, rows, columns, compiled = check(model)
    window = decode_step.layer_windows(model)["sliding_attention"]
    live = len(LENGTHS)
    place.scribble(lambda row, c: row >= live or place.lengths[row] - window < c <= place.lengths[row])
    assert torch.equal(place.run(rows, columns, compiled=True)[:live], compiled[:live])


def test_prompt_pieces_beside_decode_rows_give_the_eager_logits(llama):
    """A step that carries prompt pieces (a long one and a short one) beside decode rows: one flex call over the
    packed tokens gives what each slot gives attending alone, the pieces' last tokens' logits and the rows' alike."""
    place = Place(llama, lengths=(700, 40, 0, 97, 0))
    gen = torch.Generator().manual_seed(3)
    pieces = ((2, 0, torch.randint(10, 400, (150,), generator=gen).tolist()),
              (4, 0, torch.randint(10, 400, (9,), generator=gen).tolist()))
    place.live[2] = place.live[4] = False  # joining rows
    columns = 3 * decode_step.COLUMN_BUCKET  # past the longest row's 700
    eager = place.run(5, columns, compiled=False, pieces=pieces)
    compiled = place.run(5, columns, compiled=True, pieces=pieces)
    assert torch.allclose(compiled, eager, atol=1e-4), (compiled - eager).abs().max()
    assert ("flex attention", True) in place.step.checked


def test_block_masks_list_each_tokens_blocks_and_mask_as_the_additive_masks_do():
    """No compile: the block mask's blocks cover exactly the blocks of the columns a grid block's tokens see, and its
    mask function says what `grid_masks` says, for full and sliding layers, decode rows, pieces and rows that are not
    live (column 0 alone)."""
    block = attention.BLOCK
    start = torch.tensor([0, 1, block - 1, block, 3 * block + 5, 700, 9, 40])
    count = torch.tensor([1, 1, 1, 1, 1, 1, 0, 300])  # slot 6 not live, slot 7 a piece of 300 tokens
    groups, width = 2, 300
    # Each slot's tokens in the packed sequence: a live slot's `count`, a slot that is not live one token all the same
    present = count.clamp(min=1)
    slot_of = torch.repeat_interleave(torch.arange(len(start)), present)
    offset = torch.cat([torch.arange(int(n)) for n in present])
    packed = attention.Packed(slot_of, offset, start, count, torch.empty(width))
    columns = 6 * block + 64  # not a multiple of a block: a slot's width need not be
    windows = {"full_attention": None, "sliding_attention": 100}
    additive = attention.grid_masks(packed, torch.arange(columns), windows, groups, torch.float32)
    built = attention.block_masks(packed, columns, windows, groups)
    slots = torch.arange(len(start))[:, None, None]
    queries = torch.arange(width * groups)[None, :, None]
    for kind in windows:
        mask = built[kind]
        seen = mask.mask_mod(slots, 0, queries, torch.arange(columns)[None, None])
        assert torch.equal(seen, additive[kind][:, 0] == 0)
        valid = queries[0, :, 0] // groups < count[:, None]  # (slots, queries): the grid's queries of real tokens
        q_block_size = attention.Q_BLOCK
        assert mask.kv_num_blocks.shape[2] == max(2, -(-width * groups // q_block_size))
        for slot in range(len(start)):
            for q_block in range(mask.kv_num_blocks.shape[2]):
                listed = set(mask.kv_indices[slot, 0, q_block, :int(mask.kv_num_blocks[slot, 0, q_block])].tolist())
                span = slice(q_block * q_block_size, (q_block + 1) * q_block_size)
                if valid[slot, span].any():  # the blocks its real tokens see
                    rows = seen[slot, span][valid[slot, span]]
                    assert listed == {int(c) // block for c in torch.nonzero(rows.any(dim=0))[:, 0]}
                elif q_block * q_block_size // groups < present[slot]:  # a row not live: block 0, a finite write
                    assert listed == {0}
                else:  # the grid's padding past the slot's tokens: never read back, so nothing computed
                    assert listed == set()


def test_a_flex_kernel_that_fails_falls_back_to_the_masked_step_once(tmp_path, monkeypatch, caplog):
    """Where flex attention cannot run (a torch whose CPU kernel does not compile, say), the model's compiled step
    attends under the additive mask from then on, said once, and gives the eager logits."""
    path = build_tiny_llama(tmp_path / "llama", seed=0)
    model = AutoModelForCausalLM.from_pretrained(path).eval()  # a model of its own: its compile state is new

    def broken(*args, **kwargs):
        raise RuntimeError("simulated flex failure")

    monkeypatch.setattr(attention, "flex_attention", broken)
    place = Place(model, lengths=(300, 12))
    with caplog.at_level("WARNING", logger="debate.engine.compiled_step"):
        compiled = place.run(2, 512, compiled=True)
        place.run(2, 512, compiled=True)
    assert caplog.text.count("flex attention failed") == 1  # dynamo's words about the error come first in the line
    stats = step_stats.stats_of(model)
    assert not place.step.flex and stats.flex_failed and stats.failed is None and stats.steps == 2
    assert torch.allclose(compiled, place.run(2, 512, compiled=False), atol=1e-4)
