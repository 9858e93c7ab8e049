"""The step checks itself (debate/engine/compiled_step.py, issue 58): the first step through each compiled path
and each captured bucket's first replay against the eager step, on the same inputs; where one fails or disagrees,
one line says what failed and what runs instead, and the step falls back (flex -> masked attention -> eager; a
bucket's CUDA graph -> that bucket without one, the others keeping theirs). No compile here: the failures are
injected in place of the compiled forward and of the CUDA graph API (a CPU has none), so each runs in a second; the
real compiled step's check is asserted in tests/test_compiled_decode.py and tests/test_row_attention.py."""
import contextlib

import pytest
import torch
from transformers import AutoModelForCausalLM

from debate.engine import compiled_step, decode_step, step_stats
from tests.test_row_attention import Place
from tests.tiny_models import build_tiny_llama

COLUMNS = 512


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("llama"), seed=0)


@pytest.fixture
def model(path):
    return AutoModelForCausalLM.from_pretrained(path).eval()  # a model of its own: its checks and fallbacks are new


def fake_compiled(monkeypatch, wrong=lambda flex, rows: 0.0, raises=lambda flex: None):
    """The compiled forward replaced by the eager one, its logits moved by `wrong(flex, rows)` of their range, or
    raising `raises(flex)`; counts its calls and the eager forward's."""
    calls = {"compiled": 0, "eager": 0}
    eager = decode_step.forward

    def counted(*args, **kwargs):
        calls["eager"] += 1
        return eager(*args, **kwargs)

    def step(*args):
        *args, kernel = args
        calls["compiled"] += 1
        flex = kernel == "flex"
        error = raises(flex)
        if error is not None:
            raise error
        logits = eager(*args, "masked")  # the grid under its additive mask, run eagerly: what a compiled step gives
        shift = wrong(flex, logits.shape[0])
        if shift:
            span = logits.amax(dim=-1, keepdim=True) - logits.amin(dim=-1, keepdim=True)
            logits = logits + shift * span * torch.linspace(-1, 1, logits.shape[-1])
        return logits

    monkeypatch.setattr(decode_step, "forward", counted)
    monkeypatch.setattr(compiled_step, "compiled", lambda model: step)
    return calls


def eager_logits(model, lengths):
    return Place(model, lengths=lengths).run(2, COLUMNS, compiled=False)


def test_a_step_within_tolerance_runs_compiled_and_is_checked_once(model, monkeypatch, caplog):
    want = eager_logits(model, (300, 12))
    calls = fake_compiled(monkeypatch, wrong=lambda flex, rows: compiled_step.tolerance(torch.float32) / 4)
    place = Place(model, lengths=(300, 12))
    with caplog.at_level("WARNING", logger="debate.engine.compiled_step"):
        got = [place.run(2, COLUMNS, compiled=True) for _ in range(3)]
    assert caplog.text == ""
    assert place.step.flex and place.step.checked == {("flex attention", False)}
    assert calls == {"compiled": 3, "eager": 1}  # the eager step ran once, beside the first compiled one
    assert step_stats.stats_of(model).checked == ["flex attention"] and step_stats.stats_of(model).steps == 3
    assert torch.allclose(got[0], want, atol=1e-2)


def test_flex_logits_that_disagree_fall_back_to_the_masked_step(model, monkeypatch, caplog):
    want = eager_logits(model, (300, 12))
    calls = fake_compiled(monkeypatch, wrong=lambda flex, rows: 0.3 if flex else 0.0)
    place = Place(model, lengths=(300, 12))
    with caplog.at_level("WARNING", logger="debate.engine.compiled_step"):
        first = place.run(2, COLUMNS, compiled=True)
        place.run(2, COLUMNS, compiled=True)
    lines = caplog.text.strip().splitlines()
    assert len(lines) == 1
    assert "LlamaForCausalLM with flex attention gave logits 0.3 of their range away" in lines[0]
    assert "tolerance 0.001 at float32" in lines[0] and "it attends under a mask instead" in lines[0]
    stats = step_stats.stats_of(model)
    assert not place.step.flex and stats.flex_failed and stats.failed is None
    assert stats.checked == ["masked attention"] and stats.steps == 2
    assert calls["eager"] == 1  # the masked path was checked against the same eager step
    assert torch.allclose(first, want, atol=1e-5)


def test_a_masked_step_that_disagrees_too_runs_eagerly(model, monkeypatch, caplog):
    want = eager_logits(model, (300, 12))
    fake_compiled(monkeypatch, wrong=lambda flex, rows: 0.3)
    place = Place(model, lengths=(300, 12))
    eager_before = step_stats.stats_of(model).eager_steps
    with caplog.at_level("WARNING", logger="debate.engine.compiled_step"):
        first = place.run(2, COLUMNS, compiled=True)
        second = place.run(2, COLUMNS, compiled=True)
    lines = caplog.text.strip().splitlines()
    assert len(lines) == 2
    assert "with flex attention gave logits" in lines[0] and "attends under a mask instead" in lines[0]
    assert "with masked attention gave logits" in lines[1] and lines[1].endswith("it runs eagerly")
    stats = step_stats.stats_of(model)
    assert stats.failed and stats.checked == [] and stats.steps == 0 and stats.eager_steps - eager_before == 2
    assert torch.allclose(first, want, atol=1e-5) and torch.allclose(second, want, atol=1e-5)


def test_a_step_that_raises_falls_back_and_says_why(model, monkeypatch, caplog):
    fake_compiled(monkeypatch, raises=lambda flex: RuntimeError("simulated kernel failure") if flex else None)
    place = Place(model, lengths=(300, 12))
    with caplog.at_level("WARNING", logger="debate.engine.compiled_step"):
        place.run(2, COLUMNS, compiled=True)
    assert "with flex attention failed (RuntimeError: simulated kernel failure); it attends under a mask" in caplog.text
    assert step_stats.stats_of(model).checked == ["masked attention"]


def test_non_finite_logits_fail_the_check():
    reference = torch.tensor([[1.0, 2.0, float("-inf")], [0.0, 5.0, 1.0]])
    assert compiled_step.mismatch(reference.clone(), reference, torch.float32) is None
    broken = reference.clone()
    broken[1, 0] = float("nan")
    assert "not finite" in compiled_step.mismatch(broken, reference, torch.float32)
    near = reference + torch.tensor([[0.0, 0.0, 0.0], [0.04, 0.0, 0.0]])  # 0.008 of row 1's range
    assert compiled_step.mismatch(near, reference, torch.float32) is not None
    assert compiled_step.mismatch(near, reference, torch.bfloat16) is None


class FakeCuda:
    """What Step._replayed calls of torch.cuda, on a CPU: a capture records the step's call and a replay runs it again
    into the same output (as a CUDA graph reruns its kernels over the same buffers); `fail_rows` fails every capture
    of that bucket, `wrong_rows` makes that bucket's replays wrong. Records the devices streams are asked for."""

    def __init__(self, monkeypatch, fail_rows=None, wrong_rows=None):
        self.devices, self.capturing = [], None
        self.fail_rows, self.wrong_rows = fail_rows, wrong_rows
        fake = self

        class Graph:
            def __init__(self):
                self.run, self.replays = None, 0

            def replay(self):
                self.replays += 1
                self.run()

        @contextlib.contextmanager
        def graph(g, pool=None, capture_error_mode=None):
            fake.capturing = g
            try:
                yield
            finally:
                fake.capturing = None

        class Stream:
            def __init__(self, device=None):
                fake.devices.append(device)

            def wait_stream(self, other):
                pass

        def current_stream(device=None):
            fake.devices.append(device)
            return Stream.__new__(Stream)

        for name, value in (("CUDAGraph", Graph), ("graph", graph), ("Stream", Stream),
                            ("current_stream", current_stream), ("stream", lambda s: contextlib.nullcontext()),
                            ("graph_pool_handle", lambda: object())):
            monkeypatch.setattr(torch.cuda, name, value)

    def compiled(self, monkeypatch):
        eager = decode_step.forward

        def step(*args):
            *args, kernel = args
            rows = args[2].shape[0]  # the step's tokens: one a decode row
            if self.capturing is not None:
                if rows == self.fail_rows:
                    raise RuntimeError("simulated capture failure")
                out = torch.empty_like(eager(*args, "masked"))
                shift = 0.5 if rows == self.wrong_rows else 0.0

                def run():
                    out.copy_(eager(*args, "masked") + shift)
                self.capturing.run = run
                return out
            return eager(*args, "masked")

        monkeypatch.setattr(compiled_step, "compiled", lambda model: step)


def test_one_buckets_capture_failure_leaves_the_other_buckets_graphs(model, monkeypatch, caplog):
    cuda = FakeCuda(monkeypatch, fail_rows=2, wrong_rows=8)
    cuda.compiled(monkeypatch)
    lengths = (300, 12, 40, 7, 90, 5)
    place = Place(model, lengths=lengths)
    place.step.capture = True
    want = {rows: place.run(rows, COLUMNS, compiled=False) for rows in (2, 4, 8)}
    live = len(lengths)  # rows 6 and 7 are not live: what they give is never read
    with caplog.at_level("WARNING", logger="debate.engine.compiled_step"):
        for _ in range(5):
            for rows in (2, 4, 8):
                got = place.run(rows, COLUMNS, compiled=True)
                assert torch.allclose(got[:live], want[rows][:live], atol=1e-5)
    step = place.step
    bucket = {rows: (rows, rows, 1, COLUMNS, rows) for rows in (2, 4, 8)}  # (tokens, slots, width, columns, kept)
    assert set(step.graphs) == {bucket[4]}  # captured, checked and replayed
    # replayed at its capture (the check) and at every later step, also after bucket 2 gave up its graph
    assert step.graphs[bucket[4]][0].replays == 4
    assert step.no_graph == {bucket[2], bucket[8]}
    lines = caplog.text.strip().splitlines()
    assert len(lines) == 2
    assert f"for bucket 2x2x1x{COLUMNS}x2 (tokens, slots, width, columns, kept) failed (RuntimeError: simulated" \
        in caplog.text
    assert f"for bucket 8x8x1x{COLUMNS}x8 (tokens, slots, width, columns, kept) gave logits" in caplog.text
    assert all("that bucket runs compiled without a graph, the others keep theirs" in line for line in lines)
    stats = step_stats.stats_of(model)
    assert stats.cuda_graphs == 1 and f"CUDA graph 4x4x1x{COLUMNS}x4" in stats.checked and stats.failed is None
    assert cuda.devices and all(d == step.device for d in cuda.devices)  # never the current device by default


def test_the_inductor_patch_applies_to_a_cpu_on_the_torch_it_was_written_for(path, monkeypatch):
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 1)
    assert compiled_step.patch_applies(cpu, "2.13.0+cpu") and compiled_step.patch_applies(cpu, "2.13.1")
    assert not compiled_step.patch_applies(gpu, "2.13.0+cu130")
    assert not compiled_step.patch_applies(cpu, "2.14.1") and not compiled_step.patch_applies(cpu, "2.1.0")
    patched = []
    monkeypatch.setattr(compiled_step, "_distinct_block_size_names", lambda: patched.append(1) or True)
    compiled_step.compiled(AutoModelForCausalLM.from_pretrained(path).eval())  # lazily: nothing compiles here
    assert patched == ([1] if compiled_step.patch_applies(cpu) else [])
    monkeypatch.setattr(compiled_step, "PATCHED_TORCH", ("0.0.",))  # a torch it was not written for
    before = len(patched)
    compiled_step.compiled(AutoModelForCausalLM.from_pretrained(path).eval())
    assert len(patched) == before


def test_a_steps_packet_is_timed_on_the_models_device_not_the_current_one(monkeypatch):
    """A model on cuda:1 while cuda:0 is current: the event that says the step's packet has reached the host is
    recorded on cuda:1's stream, where the copy was queued (on the current device's, the host would read the packet
    before its copy finished). A CPU has no CUDA: the event, the stream and pinned memory are stood in for."""
    from types import SimpleNamespace

    from debate.engine import batch_state

    asked, recorded = [], []

    class Event:
        def record(self, stream=None):
            recorded.append(stream)

    def current_stream(device=None):
        asked.append(device)
        return ("stream of", device)

    real_empty = torch.empty
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    monkeypatch.setattr(torch, "empty", lambda *a, pin_memory=False, **k: real_empty(*a, **k))
    rows = 3
    state = SimpleNamespace(device=torch.device("cuda", 1), picked=torch.tensor([4, 5, 6]),
                            last=torch.tensor([[1, 2], [3, 4], [5, 6]]), ended=torch.tensor([False, True, False]),
                            waits=torch.tensor([0, 1, 0]))
    event, host = batch_state.State.packet(state, rows)
    assert isinstance(event, Event) and recorded == [("stream of", torch.device("cuda", 1))]
    assert asked == [torch.device("cuda", 1)]
    assert host.tolist() == [[4, 1, 2, 0, 0], [5, 3, 4, 1, 1], [6, 5, 6, 0, 0]]
