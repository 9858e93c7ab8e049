"""The compiled decode step's attention over each row's own columns (issue 53; debate/engine/decode_step.py, flex
attention under a block mask): on the tiny Llama and the tiny Gemma 3 (sliding-window layers), one step beside a long
row gives the eager step's logits, where each row attends alone; a row reads no column past its length (garbage
written there changes nothing), a sliding-window layer none before its window, a row that is not live column 0 alone
(finite); buckets of other shapes share the graph. Each model compiles once (CI time)."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from debate.engine import decode_step, generator, kv_store
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
                generator.prefill(model, self.store.slot_cache(row, 0), ids, 0)
        self.lengths = torch.zeros(SLOTS + 1, dtype=torch.long)
        self.lengths[:len(lengths)] = torch.tensor(lengths)
        self.live = torch.zeros(SLOTS + 1, dtype=torch.bool)
        self.live[:len(lengths)] = True
        self.tokens = torch.arange(5, 5 + SLOTS + 1)[:, None]
        self.columns = torch.arange(COLUMNS + 1)
        self.step = decode_step.Step(model, decode_step.layer_windows(model), self.dtype)

    def run(self, rows, columns, compiled):
        """One step's logits over the first `rows` slots and `columns` columns (each live row writes its token's
        keys and values at its length: the same at every run)."""
        cache = self.store.decode_cache(rows, columns, self.lengths, keep=compiled)
        ends = None if compiled else [int(n) + 1 if on else 0 for n, on in zip(self.lengths[:rows], self.live[:rows])]
        with torch.inference_mode(), decode_step.decoding(self.model, ends):
            return self.step.run(compiled, generator.cache_kwarg(self.model, cache), self.tokens[:rows],
                                 self.lengths[:rows], self.live[:rows], self.columns[:columns]).clone()

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
    rows, columns = SLOTS, decode_step.bucket_columns(max(LENGTHS) + 1, COLUMNS)  # 8 rows: 3 not live
    eager = place.run(rows, columns, compiled=False)
    compiled = place.run(rows, columns, compiled=True)
    assert place.step.flex == (decode_step.ROW_ATTENTION == "flex") and decode_step.stats_of(model).flex_failed is None
    assert place.step.checked == {"flex attention" if place.step.flex else "masked attention"}  # the self-check ran
    live = len(LENGTHS)
    assert torch.allclose(compiled[:live], eager[:live], atol=1e-4), (compiled[:live] - eager[:live]).abs().max()
    assert torch.isfinite(compiled).all()  # the rows that are not live read column 0 alone
    graphs = decode_step.stats_of(model).graphs

    # Garbage past each live row's length (after the token written now) changes none of its logits.
    place.scribble(lambda row, c: row >= live or c <= place.lengths[row])
    again = place.run(rows, columns, compiled=True)
    assert torch.equal(again[:live], compiled[:live])
    # NaN in the blocks past each live row's last one: the step never reads them (an additive mask over every
    # column would give NaN logits).
    place.scribble(lambda row, c: row >= live or c // decode_step.BLOCK <= place.lengths[row] // decode_step.BLOCK,
                   nan=True)
    again = place.run(rows, columns, compiled=True)
    assert torch.equal(again[:live], compiled[:live])

    # Other buckets (fewer rows, wider columns) share the graph: no recompile.
    place.run(4, columns, compiled=True)
    place.run(rows, columns + decode_step.COLUMN_BUCKET, compiled=True)
    assert decode_step.stats_of(model).graphs == graphs
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


def test_block_masks_list_each_rows_blocks_and_mask_as_the_additive_masks_do():
    """No compile: the block mask's blocks cover exactly the blocks of the columns a row sees, and its mask function
    says what `masks` says, for full and sliding layers and for rows that are not live."""
    block = decode_step.BLOCK
    lengths = torch.tensor([0, 1, block - 1, block, 3 * block + 5, 700, 9])
    live = torch.tensor([True, True, True, True, True, True, False])
    columns = 6 * block + 64  # not a multiple of a block: a slot's width need not be
    windows = {"full_attention": None, "sliding_attention": 100}
    additive = decode_step.masks(lengths, live, torch.arange(columns), windows, torch.float32)
    built = decode_step.block_masks(lengths, live, columns, windows)
    rows = torch.arange(len(lengths))[:, None]
    for kind in windows:
        mask = built[kind]
        seen = mask.mask_mod(rows, 0, 0, torch.arange(columns)[None])
        assert torch.equal(seen, additive[kind][:, 0, 0] == 0)
        for row in range(len(lengths)):
            listed = set(mask.kv_indices[row, 0, 0, :int(mask.kv_num_blocks[row, 0, 0])].tolist())
            assert listed == {int(c) // block for c in torch.nonzero(seen[row])[:, 0]}


def test_a_flex_kernel_that_fails_falls_back_to_the_masked_step_once(tmp_path, monkeypatch, caplog):
    """Where flex attention cannot run (a torch whose CPU kernel does not compile, say), the model's compiled step
    attends under the additive mask from then on, said once, and gives the eager logits."""
    path = build_tiny_llama(tmp_path / "llama", seed=0)
    model = AutoModelForCausalLM.from_pretrained(path).eval()  # a model of its own: its compile state is new

    def broken(*args, **kwargs):
        raise RuntimeError("simulated flex failure")

    monkeypatch.setattr(decode_step, "flex_attention", broken)
    place = Place(model, lengths=(300, 12))
    with caplog.at_level("WARNING", logger="debate.engine.decode_step"):
        compiled = place.run(2, 512, compiled=True)
        place.run(2, 512, compiled=True)
    assert caplog.text.count("flex attention failed") == 1  # dynamo's words about the error come first in the line
    stats = decode_step.stats_of(model)
    assert not place.step.flex and stats.flex_failed and stats.failed is None and stats.steps == 2
    assert torch.allclose(compiled, place.run(2, 512, compiled=False), atol=1e-4)
