"""Mutation runs: break the code on purpose, one named breakage at a time, and see which tests catch it (issue 60).

    python tests/mutants.py                    # every breakage: a table of caught / survived and by which test
    python tests/mutants.py --list             # the breakages and the tests each runs, nothing run
    python tests/mutants.py --only sampling    # the breakages whose name contains "sampling"
    python tests/mutants.py --tree /tmp/old    # another checkout (its own tests); a breakage whose code is not
                                               # there is "n/a"

Each breakage replaces one exact piece of a file (it must occur exactly once: a breakage whose code moved fails
loudly, so the list is kept with the code) in a copy of the checkout's tracked files, then runs the tests named for
it (`pytest -x`, the first failure ends the run). A breakage that no test fails SURVIVES: a contract nobody checks.
Run it before a change to the engine lands and after one that touches the contracts below (README, "Developing").
One breakage at a time (`--jobs` runs several, one thread each); the whole list took 7 minutes here with one job.
"""
import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Mutant:
    name: str  # what contract it breaks, in a few words
    path: str  # the file, relative to the checkout
    old: str  # the exact text replaced (once)
    new: str
    tests: Sequence[str]  # pytest node ids or files that should catch it


S = "debate/engine/sampling.py"
STEP = "debate/engine/decode_step.py"
ATTN = "debate/engine/attention.py"
KERNEL = "debate/engine/decode_rows.c"
CHECKED = "debate/engine/compiled_step.py"
STATE = "debate/engine/batch_state.py"
BATCH = "debate/engine/decode_batch.py"
POOL = "debate/engine/kv_pool.py"
THREADS = "debate/pipeline/threads.py"
PAGES = "tests/test_shared_pages.py::test_"
COURT = "tests/test_methods_cli.py::test_each_method_runs_end_to_end[courtroom-fields3]"

MUTANTS: List[Mutant] = [
    # -- sampling (issue 58): the picks against the distribution they are drawn from
    Mutant("sampling: 24-bit uniforms, the largest rounds to 1.0 (the NaN pick)", S,
           "BITS = 23", "BITS = 24", ["tests/test_sampling.py"]),
    Mutant("sampling: the dense race ignores the nucleus", S,
           "            score.masked_fill_(s < nucleus_floor(s, best, p)[:, None], float(\"-inf\"))\n"
           "        return torch.where(",
           "            pass\n        return torch.where(", ["tests/test_sampling.py"]),
    Mutant("sampling: the pruned race ignores the nucleus", S,
           "        score.masked_fill_(~_candidates_in_nucleus(s, best, p, rows, scaled), float(\"-inf\"))",
           "        pass", ["tests/test_sampling.py"]),
    Mutant("sampling: the pruned race's bound too tight (a winner left out)", S,
           "SPREAD = G_HIGH - G_LOW + 1e-3", "SPREAD = (G_HIGH - G_LOW) / 4", ["tests/test_sampling.py"]),
    Mutant("sampling: the sorted nucleus' threshold just above its boundary token (ties and the token dropped)", S,
           "    floor = ordered.gather(-1, (_kept(ordered, best, _mass(s, best, top_p)) - 1)[:, None])[:, 0]",
           "    floor = ordered.gather(-1, (_kept(ordered, best, _mass(s, best, top_p)) - 1)[:, None])[:, 0] + 1e-6",
           ["tests/test_sampling.py"]),
    Mutant("sampling: the candidates' nucleus threshold just above its boundary token", S,
           "    floor = ordered.gather(-1, (kept - 1)[:, None])[:, 0]\n",
           "    floor = ordered.gather(-1, (kept - 1)[:, None])[:, 0] + 1e-6\n", ["tests/test_sampling.py"]),
    Mutant("sampling: the nucleus one token too wide", S,
           "    return (before < mass[:, None]).sum(dim=-1).clamp(min=1)",
           "    return (before <= mass[:, None]).sum(dim=-1).clamp(min=1) + 1", ["tests/test_sampling.py"]),
    Mutant("sampling: the candidates' nucleus summed in id order, not by logit", S,
           "    order = by_logit[rows[by_logit].sort(stable=True).indices]",
           "    order = torch.arange(rows.shape[0], device=rows.device)", ["tests/test_sampling.py"]),
    Mutant("sampling: the hash's shift arithmetic, not logical", S,
           "    return (x >> bits) & ((1 << (64 - bits)) - 1)", "    return x >> bits", ["tests/test_sampling.py"]),
    Mutant("sampling: one stream for identical rows (occurrence ignored)", S,
           "    digest.update(repr((seed, tuple(parts), occurrence)).encode())",
           "    digest.update(repr((seed, tuple(parts))).encode())", ["tests/test_sampling.py"]),
    Mutant("sampling: the draw number ignored (every draw of a row alike)", S,
           "    return _mix(keys * _signed(_GOLDEN) + counts * _signed(_M1))",
           "    return _mix(keys * _signed(_GOLDEN))", ["tests/test_sampling.py"]),
    Mutant("sampling: the host twin draws by candidate index, not token id", S,
           "                       torch.tensor([ids[i] for i in order]) * _signed(_M2) + _signed(_GOLDEN))",
           "                       torch.tensor(order) * _signed(_M2) + _signed(_GOLDEN))",
           ["tests/test_sampling.py::test_the_host_twin_picks_as_the_device"]),
    Mutant("sampling: the temperature ignored", S,
           "    divisor = temperature.clamp(min=1e-6).to(torch.float32)\n    best = ",
           "    divisor = torch.ones_like(temperature, dtype=torch.float32)\n    best = ", ["tests/test_sampling.py"]),
    # -- the decode step checks itself (issue 58)
    Mutant("step check: no comparison with the eager step", CHECKED,
           "            problem = mismatch(logits, cast(torch.Tensor, reference), self.dtype)",
           "            problem = None", ["tests/test_step_check.py"]),
    Mutant("step check: a tolerance that lets anything through", CHECKED,
           "CHECK_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-3}",
           "CHECK_TOLERANCE = {torch.float32: 10.0, torch.float64: 10.0}", ["tests/test_step_check.py"]),
    Mutant("step check: a bucket's second capture failure drops every bucket's graph", CHECKED,
           "            if bucket in self.failed:\n                self._no_graph(bucket, _one_line(err))",
           "            if bucket in self.failed:\n                self._no_graph(bucket, _one_line(err))\n"
           "                self.capture = False", ["tests/test_step_check.py"]),
    Mutant("step check: streams on the current device, not the model's", CHECKED,
           "        stream = torch.cuda.current_stream(self.device)", "        stream = torch.cuda.current_stream()",
           ["tests/test_step_check.py"]),
    Mutant("step check: the inductor patch on every device", CHECKED,
           '    return device.type == "cpu" and version.startswith(PATCHED_TORCH)', "    return True",
           ["tests/test_step_check.py"]),
    Mutant("step check: the packet's event on the current device's stream, not the model's", STATE,
           "        event.record(torch.cuda.current_stream(self.device))",
           "        event.record(torch.cuda.current_stream())", ["tests/test_step_check.py"]),
    # -- the packed step (issue 59): what a token sees, written once, and the blocks the kernel reads
    Mutant("attention: a sliding window one column too wide", ATTN,
           "        seen = seen & (column > position - window)", "        seen = seen & (column >= position - window)",
           ["tests/test_engine.py::test_greedy_tokens_equal_the_reference_path_for_llama_and_gemma"]),
    Mutant("attention: a block mask lists one block of columns too few", ATTN,
           "        number = torch.where(valid, high - low + 1, real.long())",
           "        number = torch.where(valid, high - low, real.long())", ["tests/test_row_attention.py"]),
    Mutant("eager attention: a long piece's two calls merged with each other's weights", ATTN,
           "    return seen.mul_((weight_seen / total)[..., None]).add_(own.mul_((weight_own / total)[..., None]))",
           "    return seen.mul_((weight_own / total)[..., None]).add_(own.mul_((weight_seen / total)[..., None]))",
           ["tests/test_eager_attention.py"]),
    Mutant("eager attention: a long piece's own columns begin one column late", ATTN,
           "            split = positions[0] - low", "            split = positions[0] - low + 1",
           ["tests/test_eager_attention.py"]),
    Mutant("eager attention: a long piece in two calls under a window that cuts it", ATTN,
           "and (not window or high <= window)", "and (not window or low == 0)",
           ["tests/test_eager_attention.py"]),
    Mutant("CPU kernel: a decode row's last column left out", KERNEL,
           "    const int64_t count = high - low;", "    const int64_t count = high - low - 1;",
           ["tests/test_cpu_kernel.py"]),
    Mutant("CPU kernel: a key head's query heads read another key head's columns", KERNEL,
           "keys + slot * k_slot + head * k_head", "keys + slot * k_slot + (kv_heads - 1 - head) * k_head",
           ["tests/test_cpu_kernel.py"]),
    Mutant("CPU kernel: bfloat16 outputs truncated, not rounded to nearest", KERNEL,
           ": (bf16)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);", ": (bf16)(v.u >> 16);",
           ["tests/test_cpu_kernel.py"]),
    Mutant("eager attention: a piece's first token sent to the CPU kernel as a decode row", ATTN,
           "        if count == 1:\n            rows.append", "        if count >= 1:\n            rows.append",
           ["tests/test_eager_attention.py"]),
    Mutant("packed step: a compiled step's tokens bucketed below their count", STEP,
           "    return bucket_rows(tokens, tokens + 8) if tokens <= 64 else -(-tokens // 64) * 64",
           "    return bucket_rows(tokens, tokens + 8) if tokens <= 64 else tokens // 64 * 64",
           ["tests/test_compiled_decode.py"]),
    # -- pages and caches: by adapter and model (issues 58, 60), under tight budgets, none held at a run's end
    Mutant("pages: a conversation's own cache read under another adapter", POOL,
           " or entry.memory() is not self or entry.adapter != adapter:", " or entry.memory() is not self:",
           [PAGES + "a_conversations_cache_serves_only_the_adapter_that_wrote_it"]),
    Mutant("pages: a row's pages loaded without its adapter", BATCH,
           "row.settings.reuse_cache,\n                                              row.adapter)",
           "row.settings.reuse_cache,\n                                              None)",
           [PAGES + "pages_are_never_shared_across_adapters_whichever_writes_first"]),
    Mutant("pages: a row's page keys hashed without its adapter", BATCH,
           "kv_pool.page_keys(row.target, row.adapter,", "kv_pool.page_keys(row.target, None,",
           [PAGES + "pages_are_never_shared_across_adapters_whichever_writes_first"]),
    Mutant("pages: a prompt's pages published without its adapter", BATCH,
           "mem.publish(slot, row.target[:end], row.adapter)", "mem.publish(slot, row.target[:end], None)",
           [PAGES + "pages_are_never_shared_across_adapters_whichever_writes_first"]),
    Mutant("pages: a cache stored without its adapter", BATCH,
           "row.target + ids[:-1], row.adapter)", "row.target + ids[:-1], None)",
           [PAGES + "pages_are_never_shared_across_adapters_whichever_writes_first"]),
    Mutant("pages: a page's key leaves out the adapter", POOL,
           "        digest.update(repr(adapter).encode())\n", "",
           [PAGES + "pages_are_never_shared_across_adapters_whichever_writes_first"]),
    Mutant("pages: a conversation's own cache read by another model", POOL,
           " or entry.memory() is not self or entry.adapter != adapter:", " or entry.adapter != adapter:",
           [PAGES + "pages_and_caches_are_never_shared_across_models"]),
    Mutant("pages: one memory for every model of a device", POOL,
           "        mem = self.memories.get(model)\n        if mem is None:",
           "        mem = next(iter(self.memories.values()), None)\n        if mem is None:",
           [PAGES + "pages_and_caches_are_never_shared_across_models"]),
    Mutant("pages: a page given back while another cache holds it", POOL,
           "        holding.pop(id(entry), None)\n        if holding:\n            return\n",
           "        holding.pop(id(entry), None)\n",
           [PAGES + "a_cache_dropped_for_room_leaves_the_pages_another_cache_holds"]),
    Mutant("pages: a dropped cache keeps its pages", POOL,
           "        tokens = len(entry.ids)\n        self.release(conv)", "        tokens = len(entry.ids)",
           [PAGES + "a_cache_dropped_for_room_leaves_the_pages_another_cache_holds"]),
    Mutant("pages: a growing place moves a shared page for one of its holders only", POOL,
           "            for entry in holding.values():\n                assert entry.pages is not None",
           "            for entry in list(holding.values())[:1]:\n                assert entry.pages is not None",
           [PAGES + "a_place_that_grows_moves_the_pages_two_caches_hold_and_both_read_them_after"]),
    Mutant("pages: a moved page's index entry left at its old place", POOL,
           "                key = self.key_of[target] = self.key_of.pop(page)\n"
           "                self.index[key] = target",
           "                key = self.key_of[target] = self.key_of.pop(page)",
           [PAGES + "a_place_that_grows_moves_the_pages_two_caches_hold_and_both_read_them_after"]),
    Mutant("pages: publishing takes a page where none is free", POOL,
           "            if not self.free_pages:\n                break\n            page = self.free_pages.pop()",
           "            page = self.free_pages.pop()",
           [PAGES + "a_prompt_published_with_no_free_page_while_other_rows_wait_drops_nothing"]),
    Mutant("pages: publishing drops waiting caches for room", POOL,
           "            if not self.free_pages:\n                break\n            page = self.free_pages.pop()",
           "            for ref, entry in sorted(self.entries.values(), key=lambda item: -item[1].birth):\n"
           "                if self.free_pages:\n                    break\n"
           "                if ref() is not None:\n                    self.evict(ref())\n"
           "                    self._forget_cached()\n"
           "            if not self.free_pages:\n                break\n            page = self.free_pages.pop()",
           [PAGES + "a_prompt_published_with_no_free_page_while_other_rows_wait_drops_nothing"]),
    Mutant("pages: a released cache's pages never given back", POOL,
           "            self._give_pages(entry)\n            entry.ids = []", "            entry.ids = []",
           ["tests/test_run.py::test_a_debatecv_run_ends_with_every_page_given_back"]),
    Mutant("pages: an unheld published page lost (neither cached nor free)", POOL,
           "            self.cached[page] = None  # published: kept for the next context that starts with it",
           "            pass", ["tests/test_run.py::test_a_debatecv_run_ends_with_every_page_given_back"]),
    Mutant("pages: DebateCV leaves a finished claim's caches to the garbage collector", "debate/methods/debatecv.py",
           "        conv.drop_cache()  # the memory goes to the claims still debating", "        pass",
           ["tests/test_run.py::test_a_debatecv_run_ends_with_every_page_given_back"]),
    Mutant("pages: the courtroom leaves a finished hearing's caches to the garbage collector",
           "debate/methods/courtroom/hearing.py",
           "                    conv.drop_cache()  # the memory goes to the hearings still running, then to the panel",
           "                    pass", [COURT]),
    Mutant("pages: the courtroom keeps a one-shot turn's cache", "debate/methods/courtroom/case.py",
           "        if one_shot:\n            conv.drop_cache()", "        if one_shot:\n            pass",
           [COURT]),
    # -- threads (issue 60 item 3)
    Mutant("threads: the host's load counted under an allocation of the job's own", THREADS,
           "    if mine < machine or (quota is not None and quota < machine):", "    if False:",
           ["tests/test_threads.py"]),
    Mutant("threads: a fractional quota rounded up (more threads than the quota runs)", THREADS,
           "    allowed = mine if quota is None else max(1, min(mine, math.floor(quota)))",
           "    allowed = mine if quota is None else max(1, min(mine, math.ceil(quota)))", ["tests/test_threads.py"]),
]


def tracked_copy(tree: Path, into: Path) -> None:
    """The checkout's tracked files (and the shared data beside it, linked) in a folder of their own."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=tree, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, files):
        source, target = tree / name.decode(), into / name.decode()
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_file():
            shutil.copy2(source, target)
    shared = tree.parent / "shared"
    if shared.exists() and not (into.parent / "shared").exists():
        (into.parent / "shared").symlink_to(shared)


def apply(mutant: Mutant, into: Path) -> Optional[str]:
    """Break the copy; None, or why the breakage does not apply here."""
    path = into / mutant.path
    if not path.exists():
        return "n/a (no such file)"
    text = path.read_text()
    found = text.count(mutant.old)
    if found != 1:
        return f"n/a (its code occurs {found} times)"
    path.write_text(text.replace(mutant.old, mutant.new))
    return None


def run(mutant: Mutant, tree: Path, timeout: int) -> Tuple[str, str, float]:
    """(caught / SURVIVED / n/a ..., the first test that failed, seconds) for one breakage, in a fresh copy."""
    began = time.time()
    with tempfile.TemporaryDirectory(prefix="mutant-") as folder:
        copy = Path(folder) / "checkout"
        tracked_copy(tree, copy)
        why = apply(mutant, copy)
        if why is not None:
            return why, "", 0.0
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                                   *mutant.tests], cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "caught (timed out)", "", time.time() - began
        failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", done.stdout, re.M)
        if done.returncode == 0:
            return "SURVIVED", "", time.time() - began
        if done.returncode in (1, 2) and (failed or done.returncode == 2):
            return "caught", failed[0] if failed else "(collection error)", time.time() - began
        return f"error (pytest exit {done.returncode})", done.stdout[-300:], time.time() - began


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=[], help="breakages whose name contains any of these")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--tree", type=Path, default=ROOT)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=1200)
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.only or any(word in m.name for word in args.only)]
    if args.list:
        for m in chosen:
            print(f"{m.name}\n    {m.path}; tests: {' '.join(m.tests)}")
        return 0
    print(f"{len(chosen)} breakages of {args.tree}")
    survived = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = pool.map(lambda m: (m, run(m, args.tree, args.timeout)), chosen)
        for m, (verdict, test, seconds) in results:
            survived += verdict == "SURVIVED"
            print(f"| {m.name} | {verdict} | {test} | {seconds:.0f} s |", flush=True)
    print(f"{survived} of {len(chosen)} survived")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
