"""How a model's steps ran: their counts, their time as the device spends it, and the one line a run prints.

Kept a model (weakly: a model let go takes its counts with it), added to by every step of its decode batch
(debate.engine.decode_batch) and its compiled step (debate.engine.compiled_step); read by the run's `decode:` line
(`summary`) and its config.json (`Stats.as_record`).
"""
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch


@dataclass
class Stats:
    """How one model's decode steps ran: graphs made (the first, then each recompile), CUDA graphs captured (one a
    bucket), steps compiled and eager, why it runs eagerly where it does, and occupancy's counts."""

    graphs: int = 0
    cuda_graphs: int = 0
    steps: int = 0  # decode steps through the compiled forward
    eager_steps: int = 0
    failed: Optional[str] = None
    flex_failed: Optional[str] = None  # why the compiled step attends under a mask (its flex attention failed)
    graph_failed: Optional[str] = None  # why a bucket runs without a CUDA graph (the last one that does)
    # What the self-check found equal to the eager step: compiled paths, then captured buckets (Step, CHECK_TOLERANCE)
    checked: List[str] = field(default_factory=list)
    # The steps' time as the device spends it (CUDA events around each step, read with its packet; on a CPU the
    # wall time), for ms a step; and the host's time launching them (on CUDA the kernels may still run after it).
    seconds: float = 0.0
    launch_seconds: float = 0.0
    mixed_seconds: float = 0.0  # the same for the forwards that carried prompt tokens (below)
    # Occupancy: tokens the decode steps produced over the rows they ran (a row that has stopped, an empty slot below
    # the last row in use, or a bucket's padding runs and produces nothing).
    tokens: int = 0
    row_steps: int = 0
    # Forwards that carried prompt tokens (debate.engine.decode_batch's prefill inside the step): beside decode rows
    # (`mixed`, with `mixed_rows` decode rows in all) or alone (`prefill_only`: nothing decoded), and their tokens.
    mixed: int = 0
    mixed_rows: int = 0
    prefill_only: int = 0
    prefill_tokens: int = 0

    @property
    def occupancy(self) -> Optional[float]:
        return self.tokens / self.row_steps if self.row_steps else None

    def as_record(self) -> Dict[str, Any]:
        return {"compiled": self.steps > 0 and self.failed is None, "graphs": self.graphs,
                "decode_tokens": self.tokens, "decode_row_steps": self.row_steps,
                "occupancy": None if self.occupancy is None else round(self.occupancy, 4),
                "recompiles": max(0, self.graphs - 1), "cuda_graphs": self.cuda_graphs, "compiled_steps": self.steps,
                "eager_steps": self.eager_steps, "mixed_forwards": self.mixed, "mixed_decode_rows": self.mixed_rows,
                "prefill_only_forwards": self.prefill_only, "prefill_tokens": self.prefill_tokens,
                "checked": list(self.checked), **({"fallback": self.failed} if self.failed else {}),
                **({"flex_fallback": self.flex_failed} if self.flex_failed else {}),
                **({"graph_fallback": self.graph_failed} if self.graph_failed else {})}


class Clock:
    """A step's time as the device spends it: on CUDA a pair of timing events around the step, added once the host
    has read the step's packet (so reading the time never waits); on a CPU the step's wall time."""

    def __init__(self, stats: Stats, device: torch.device) -> None:
        self.stats, self.device, self.cuda = stats, device, device.type == "cuda"

    def start(self, mixed: bool = False) -> Any:
        """A step's timing begun; `mixed`: a forward that carries prompt tokens (counted apart)."""
        if not self.cuda:
            return [time.perf_counter(), mixed]
        began = torch.cuda.Event(enable_timing=True)
        began.record(torch.cuda.current_stream(self.device))  # the model's stream, not the current device's
        return [began, None, mixed]

    def stop(self, timing: Any) -> None:
        if not self.cuda:
            self._count(timing[1], time.perf_counter() - timing[0])
            return
        timing[1] = torch.cuda.Event(enable_timing=True)
        timing[1].record(torch.cuda.current_stream(self.device))

    def add(self, timing: Any) -> None:
        """The step's device time, once its packet is read (its events are then done)."""
        if self.cuda and timing is not None:
            timing[1].synchronize()  # done already where a packet was read after it
            self._count(timing[2], timing[0].elapsed_time(timing[1]) / 1000)

    def _count(self, mixed: bool, seconds: float) -> None:
        if mixed:
            self.stats.mixed_seconds += seconds
        else:
            self.stats.seconds += seconds


_stats: "weakref.WeakKeyDictionary[torch.nn.Module, Stats]" = weakref.WeakKeyDictionary()


def stats_of(model: torch.nn.Module) -> Optional[Stats]:
    """The model's decode statistics (compiled and eager steps), or None when it has not decoded."""
    return _stats.get(model)


def stats_for(model: torch.nn.Module) -> Stats:
    return _stats.setdefault(model, Stats())


def summary(models: Any) -> str:
    """How the models' decode steps ran, in one line."""
    parts = []
    for model in models:
        stats = stats_of(model)
        if stats is None:
            continue
        name = type(model).__name__
        steps = stats.steps + stats.eager_steps
        ms = f", {stats.seconds / steps * 1000:.1f} ms a step" if steps else ""
        ms += f", occupancy {stats.occupancy:.2f}" if stats.occupancy is not None else ""
        if stats.graphs:
            parts.append(f"{name} compiled, {stats.graphs} graph(s) ({max(0, stats.graphs - 1)} recompiles), "
                         f"{stats.steps} steps through them, {stats.cuda_graphs} CUDA graphs, {stats.eager_steps} "
                         f"eager steps{ms}" + (f" (compiling failed: {stats.failed})" if stats.failed else "")
                         + (f" (flex attention failed: {stats.flex_failed})" if stats.flex_failed else "")
                         + (f" (a CUDA graph failed: {stats.graph_failed})" if stats.graph_failed else "")
                         + (f"; checked against eager: {', '.join(stats.checked)}" if stats.checked else ""))
        else:
            parts.append(f"{name} eager, {stats.eager_steps} steps{ms}")
        if stats.mixed or stats.prefill_only:
            beside = f" beside {stats.mixed_rows / stats.mixed:.1f} decode rows on average" if stats.mixed else ""
            parts[-1] += (f"; prompts fed in {stats.mixed} steps{beside} and {stats.prefill_only} forwards of "
                          f"prompt tokens alone ({stats.prefill_tokens:,} tokens, "
                          f"{stats.mixed_seconds / (stats.mixed + stats.prefill_only) * 1000:.1f} ms a forward)")
    return "; ".join(parts) or "no decode step"
