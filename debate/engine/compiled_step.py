"""A model's steps run eagerly or compiled, checked, captured: what turns debate.engine.decode_step.forward into
the step a run takes.

Compiled (`--compile`): the forward is compiled once per model with dynamic sizes (torch.compile, fullgraph; a
handful of graphs a run: a one-token-wide grid, a wider one), every bucket of shapes served by them; on CUDA each
bucket is captured as a CUDA graph the second time it runs (the first warms it on a side stream) and replayed from
then on, every bucket's graph in one memory pool. Its attention is flex's (debate.engine.attention.packed_flex).

The step checks itself (issue 58): the first step through each compiled path (flex, then the masked attention; a
decode step's grid and a wider one apart) and each bucket's first replay are compared with the eager step's logits on
the same inputs (`mismatch`, CHECK_TOLERANCE). Where one fails or disagrees, one line says what failed and what runs
instead, and the step falls back: flex -> the masked attention (decode steps; a step with prompt tokens runs eagerly)
-> eager; a bucket's CUDA graph -> that bucket compiled without one (the other buckets keep theirs). Streams, events
and captures are made on the model's device (`on_device`).

torch 2.13's CPU flex kernel needs two workarounds: its mask function may read only the step's inputs
(debate.engine.attention), and a naming bug in its code generation is patched while it runs
(_distinct_block_size_names), on that torch and device alone (`patch_applies`).
"""
import contextlib
import dataclasses
import logging
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple, cast

import torch

from debate.engine import attention, decode_step
from debate.engine.decode_step import Inputs
from debate.engine.step_stats import Clock, stats_for

log = logging.getLogger(__name__)

# A compiled step's attention: "flex" (each token reads the blocks of its own columns) or "masked" (every column of
# the bucket under an additive mask: the fallback, and what a benchmark sets beside it). Read when a Step is made.
ROW_ATTENTION = "flex"


# The torch versions whose CPU flex attention kernel needs _distinct_block_size_names (the ones it was written for and
# checked on: a version not listed runs its own code generation, and where that fails the self-check falls back).
PATCHED_TORCH = ("2.13.",)


def patch_applies(device: torch.device, version: str = torch.__version__) -> bool:
    """Whether the inductor patch is for this device and torch: a CPU's flex kernel (inductor's C++ template; a GPU's
    is a Triton kernel, which has no such naming) on the versions in PATCHED_TORCH."""
    return device.type == "cpu" and version.startswith(PATCHED_TORCH)


def _distinct_block_size_names() -> bool:
    """Works around torch 2.13's CPU flex attention kernel (inductor's CppFlexAttentionTemplate.modification): it
    names the two block sizes known only at run time as the next size arguments (ks3, say), then swaps those names
    for its runtime variables by plain text replacement in the mask function's code, which also rewrites any longer
    name they begin (a row count named ks37 becomes cur_kvSplitSize7: a C++ compile error). With dynamic shapes a
    mask function that reads a tensor by row nearly always names such a size. Here the two get names no other name
    begins with while that method runs. Whether it was applied (False: the torch internals have moved; a step whose
    kernel then fails falls back to the masked attention, Step._compiled)."""
    try:
        import torch._inductor.compile_fx  # noqa: F401  (imported first: the template's module imports circularly)
        from torch._inductor.codegen import common, cpp_flex_attention_template as template
    except ImportError:
        return False
    flex_template = getattr(template, "CppFlexAttentionTemplate", None)
    original = getattr(flex_template, "modification", None)
    lookup = getattr(common.KernelArgs, "_lookup", None)
    if original is None or lookup is None:
        return False
    if getattr(original, "_debatecv", False):
        return True

    def modification(self: Any, *args: Any, **kwargs: Any) -> Any:
        sizes = set(getattr(self, "block_vars", ()))

        def named(prefix: str, names: Dict[Any, str], name: Any) -> str:
            if name in sizes and name not in names:
                names[name] = f"{prefix}_block{len(names)}_"  # the trailing _: no other name begins with it
            return lookup(prefix, names, name)

        setattr(common.KernelArgs, "_lookup", staticmethod(named))
        try:
            return original(self, *args, **kwargs)
        finally:
            setattr(common.KernelArgs, "_lookup", staticmethod(lookup))

    setattr(modification, "_debatecv", True)
    setattr(flex_template, "modification", modification)
    return True



def compiled(model: torch.nn.Module) -> Callable[..., torch.Tensor]:
    """The model's compiled decode forward, made on first use; its graphs counted by the backend."""
    fn = _compiled.get(model)
    if fn is None:
        if patch_applies(next(model.parameters()).device):
            _distinct_block_size_names()
        # dynamo counts the graphs of `forward` over every model compiled in the process (one code object), and its
        # default limit (8) is reached at four models of two graphs each (a courtroom's judges on models of their
        # own, a test session): past it a model's step would run eagerly. Room for 32 models.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        stats = stats_for(model)
        inductor = torch._dynamo.lookup_backend("inductor")
        seen: set = set()

        def counting(graph: torch.fx.GraphModule, example_inputs: List[torch.Tensor]) -> Callable[..., Any]:
            # One graph per compile of the frame: dynamo may restart a compile's analysis and call back again.
            compile_id = torch._guards.CompileContext.current_compile_id()
            key = (compile_id.frame_id, compile_id.frame_compile_id) if compile_id is not None else len(seen)
            if key not in seen:
                seen.add(key)
                stats.graphs += 1
            return inductor(graph, example_inputs)

        step = torch.compile(decode_step.forward, backend=counting, fullgraph=True, dynamic=True)

        def fn(*args: Any) -> torch.Tensor:
            # Sizes that happen to be equal at the first step (a step's tokens and its grid's width, say) are not
            # taken for one size: each time they part, a recompile (measured: 8 graphs for a 4-claim run, 2 without).
            # Set while the step runs (and compiles) alone: other models compiled in the process keep the default.
            with torch.fx.experimental._config.patch(use_duck_shape=False):  # type: ignore[attr-defined]
                return step(*args)

        _compiled[model] = fn
    return fn


def compiling(model: torch.nn.Module, settings: Any) -> bool:
    """Whether a step goes through the compiled forward: asked for, and not failed for this model."""
    stats = stats_for(model)
    return bool(getattr(settings, "compile", False)) and stats.failed is None



# The self-check (issue 58): the first step through each compiled path of a model (flex attention, the masked
# attention) and each captured bucket's first replay are compared with the eager step's logits on the same inputs.
# Allowed: this share of each row's logit range (its largest less its smallest eager logit) at the model's compute
# precision. Compiled and eager sum in other orders: measured on this CPU (tiny Gemma 3, one step of 5 rows beside a
# 700-column one, docs/BENCHMARKS.md issue 58), float32 steps differ by 3.5e-7 of the range, bf16 by 6.6e-3; a wrong
# attention (a row reading another's columns, or none of its own) moves logits by a large part of their range. The
# half precisions' allowance is 7x what was measured: a GPU's kernels sum in other orders again, and a check that
# fails for rounding alone would take --compile away from a run that is right.
CHECK_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-3}
HALF_TOLERANCE = 5e-2  # bf16 and fp16


def tolerance(dtype: torch.dtype) -> float:
    return CHECK_TOLERANCE.get(dtype, HALF_TOLERANCE)


def mismatch(logits: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> Optional[str]:
    """Why a compiled step's `logits` are not the eager step's `reference` (rows x vocabulary), or None: a value
    that is not finite where the reference's is, or a row further from it than `tolerance(dtype)` of its range."""
    got, want = logits.float(), reference.float()
    finite = torch.isfinite(want)
    if bool((finite & ~torch.isfinite(got)).any()):
        return "gave logits that are not finite where the eager step's are"
    span = (want.masked_fill(~finite, float("-inf")).amax(dim=-1) -
            want.masked_fill(~finite, float("inf")).amin(dim=-1)).clamp(min=1e-6)
    gap = float(((got - want).abs().masked_fill(~finite, 0.0).amax(dim=-1) / span).max())
    if gap > tolerance(dtype):
        return (f"gave logits {gap:.3g} of their range away from the eager step's (tolerance "
                f"{tolerance(dtype):g} at {str(dtype).replace('torch.', '')})")
    return None


def _one_line(err: BaseException) -> str:
    return " ".join(f"failed ({type(err).__name__}: {err})".split())[:300]


def on_device(device: torch.device) -> Any:
    """The model's device as the current CUDA device while its step runs: side streams, events and captures are
    made on the current device, which need not be the model's (a model on cuda:1 while cuda:0 is current)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()



class Step:
    """A model's steps: eagerly, or through its compiled forward, on CUDA each bucket captured once as a CUDA graph
    (one memory pool for all) and replayed; each compiled path and captured bucket checked once against the eager
    step, falling back flex -> masked attention -> eager, a bucket's graph -> no graph (module doc)."""

    def __init__(self, model: torch.nn.Module, windows: Dict[str, Optional[int]], dtype: torch.dtype) -> None:
        self.model, self.windows, self.dtype = model, windows, dtype
        self.groups = decode_step.groups_of(model)
        decode_step.use_step_attention(model)
        self.name = type(model).__name__
        self.stats = stats_for(model)
        # The compiled step's attention (ROW_ATTENTION): flex until it fails or its check does for this model.
        self.flex = ROW_ATTENTION == "flex" and model not in _no_flex
        self.device = next(model.parameters()).device
        self.capture = self.device.type == "cuda"  # whether buckets are captured as CUDA graphs
        self.clock = Clock(self.stats, self.device)
        # What the self-check found equal to the eager step: (path, whether the grid is wider than a token)
        self.checked: set = set()
        self.graphs: Dict[Tuple[int, ...], Tuple[Any, torch.Tensor]] = {}
        self.warm: set = set()  # buckets that ran once on a side stream: the next run captures them
        self.failed: set = set()  # buckets whose capture failed once
        self.no_graph: set = set()  # buckets that run compiled without a CUDA graph (failed twice, or their check)
        self.pool: Any = None

    def _args(self, inputs: Inputs, kernel: str, host: bool = False) -> tuple:
        # what the host says is for the eager step: a compiled one would guard on its values and recompile
        packed = inputs.packed if host else inputs.packed._replace(host=None, rows=None, parts=None)
        return (self.model, inputs.cache, inputs.tokens, inputs.positions, inputs.keep, packed, inputs.columns,
                self.windows, self.groups, self.dtype, kernel)

    def eager(self, inputs: Inputs) -> torch.Tensor:
        """The eager step, slot by slot as the host lists them (what every compiled path is checked against)."""
        return decode_step.forward(*self._args(inputs, "eager", host=True))

    def run(self, compile_step: bool, inputs: Inputs) -> torch.Tensor:
        """The logits of one step (kept x vocabulary)."""
        if not compile_step or self.stats.failed is not None or (inputs.mixed and not self.flex):
            self.stats.eager_steps += 1
            return self.eager(inputs)
        with on_device(self.device):
            if self.capture and inputs.bucket not in self.no_graph:
                return self._replayed(inputs)
            return self._compiled(inputs)

    def _path(self, inputs: Inputs) -> Tuple[str, bool]:
        return ("flex attention" if self.flex else "masked attention", inputs.packed.width.shape[0] > 1)

    def _reference(self, inputs: Inputs) -> torch.Tensor:
        """The eager step on the device's own view of the metadata (one read: a row the host does not know has
        stopped sees what the compiled step gives it)."""
        packed = inputs.packed._replace(host=attention.host_of(inputs.packed), parts={})
        return decode_step.forward(*self._args(dataclasses.replace(inputs, packed=packed), "eager", host=True)).clone()

    def _compiled(self, inputs: Inputs, reference: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The compiled step; the first through each path checked against the eager step, which runs first (so the
        keys and values the compiled step writes are the ones kept)."""
        path = self._path(inputs)
        if path not in self.checked and reference is None:
            reference = self._reference(inputs)
        try:
            logits = compiled(self.model)(*self._args(inputs, "flex" if self.flex else "masked"))
        except torch.OutOfMemoryError:
            raise
        except Exception as err:
            return self._fall_back(inputs, _one_line(err), reference)
        if path not in self.checked:
            problem = mismatch(logits, cast(torch.Tensor, reference), self.dtype)
            if problem is not None:
                return self._fall_back(inputs, problem, reference)
            self.checked.add(path)
            self.stats.checked.append(path[0] + (" (prompt tokens)" if path[1] else ""))
        self.stats.steps += 1
        return logits

    def _fall_back(self, inputs: Inputs, why: str, reference: Optional[torch.Tensor]) -> torch.Tensor:
        """flex -> masked attention (compiled, checked in turn; a step with prompt tokens eagerly) -> eager, said in
        one line each."""
        if self.flex:  # flex's kernel failed or disagreed: the masked attention, compiled, from now on
            self.flex = False
            _no_flex.add(self.model)
            self.stats.flex_failed = why
            log.warning("--compile: the decode step of %s with flex attention %s; it attends under a mask instead"
                        " (steps with prompt tokens run eagerly)", self.name, why)
            if not inputs.mixed:
                return self._compiled(inputs, reference)
            self.stats.eager_steps += 1
            return self.eager(inputs)
        # A graph break, a backend failure, wrong logits: this model steps eagerly from now on, this step too (run
        # again, so that the cache holds the eager step's keys and values).
        self.stats.failed = why
        log.warning("--compile: the decode step of %s with masked attention %s; it runs eagerly", self.name, why)
        self.stats.eager_steps += 1
        return self.eager(inputs)

    def _replayed(self, inputs: Inputs) -> torch.Tensor:
        """The bucket's CUDA graph replayed; captured the second time the bucket runs (the first runs it on a side
        stream, where lazy initialisations happen outside any capture, as PyTorch's CUDA graph notes advise), its
        first replay checked against the eager step. A bucket whose capture fails twice or whose check fails runs
        compiled without a graph; the other buckets keep theirs. A bucket's inputs are the same buffers at every
        step (debate.engine.decode_batch fills them), so the graph reads what the step was given."""
        bucket = inputs.bucket
        if bucket in self.graphs:
            graph, out = self.graphs[bucket]
            graph.replay()
            self.stats.steps += 1
            return out
        stream = torch.cuda.current_stream(self.device)
        if bucket not in self.warm:
            self.warm.add(bucket)
            side = torch.cuda.Stream(device=self.device)
            side.wait_stream(stream)
            with torch.cuda.stream(side):
                out = self._compiled(inputs)
            stream.wait_stream(side)
            return out
        if inputs.mixed and not self.flex:
            self.stats.eager_steps += 1
            return self.eager(inputs)
        try:
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                out = compiled(self.model)(*self._args(inputs, "flex" if self.flex else "masked"))
        except torch.OutOfMemoryError:
            raise
        except Exception as err:
            # A first failure of a bucket is most often a recompile inside the capture (a guard that failed on this
            # bucket's shapes): the bucket warms again outside any capture, then is captured. A second failure
            # leaves this bucket without a graph, said once.
            self.warm.discard(bucket)
            if bucket in self.failed:
                self._no_graph(bucket, _one_line(err))
            self.failed.add(bucket)
            return self._compiled(inputs)
        reference = self._reference(inputs)  # before the replay: the replay's keys and values are the ones kept
        graph.replay()
        problem = mismatch(out, reference, self.dtype)
        if problem is not None:
            self._no_graph(bucket, problem)
            return self._compiled(inputs)
        self.graphs[bucket] = (graph, out)
        self.stats.checked.append("CUDA graph " + "x".join(str(n) for n in bucket))
        self.stats.cuda_graphs += 1
        self.stats.steps += 1
        return out

    def _no_graph(self, bucket: Tuple[int, ...], why: str) -> None:
        self.no_graph.add(bucket)
        self.stats.graph_failed = why
        log.warning("--compile: the CUDA graph of %s's step for bucket %s (tokens, slots, width, columns, kept) %s;"
                    " that bucket runs compiled without a graph, the others keep theirs", self.name,
                    "x".join(str(n) for n in bucket), why)

    def close(self) -> None:
        """Let go of the captured graphs and their pool (the place seen anew: every bucket warms again before it is
        captured, over the new state's tensors)."""
        self.graphs.clear()
        self.warm.clear()
        self.failed.clear()
        self.pool = None


_compiled: "weakref.WeakKeyDictionary[torch.nn.Module, Callable[..., torch.Tensor]]" = weakref.WeakKeyDictionary()
_no_flex: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()  # models whose flex attention failed once
