"""The run's memory budget (issue 44) on a CPU: one DebateCV run of --claims claims at --batch-size under several
budgets, each in a fresh process, with its resident set measured, and whether its records equal the unlimited run's.

    python bench/bench_memory_budget.py                                     # budgets none, default, 1, 0.25, 0.08 GiB
    python bench/bench_memory_budget.py --budgets none 0.08 --tree /tmp/base44 --out bench/out/memory_budget.json

    # --tree: another checkout's run_debate.py, unlimited, beside this one's (e.g. the commit before issue 44):
    mkdir -p /tmp/base44 && git archive 3cf5a34 | tar -x -C /tmp/base44

The model is tests.tiny_models.build_wide_llama (written once under --out's folder, or --model): a random-weight
Llama whose cache is large for its compute, so a CPU run's caches reach the budgets set against them. The claims
are the first --claims AVeriTeC dev claims (the shared data, or $DEBATECV_SHARED_DATA) with golden evidence; every
run takes the same flags (--no-structured --temperature 0 --max-new-tokens 6 --max-rounds 1 by default, --run-flags)
and one budget:

- none: --gpu-memory-fraction 0, no budget (the reference row);
- default: no memory flag (on a CPU 0.9 x 0.5 of the RAM available once the weights are loaded);
- a number N: --memory-gb N.

Each run is its own `python -c` process with glibc told to give every block above 64 KiB its own mapping
(MALLOC_MMAP_THRESHOLD_=65536) and transparent huge pages off for the process (prctl 41), so its resident set
follows the live tensors (tests/test_memory_plan.py measures the same way). The child reads its resident set
(/proc/self/statm) once the models are loaded (the runner's load_agents returns; the budget is decided right after),
restarts the high-water mark there, and reads the mark (VmHWM) when the run ends: the peak above the loaded model.
A row also gives the pool's own counts (debate.engine.kv_pool.pool_for("cpu"): the caches' peak, caches dropped,
tokens re-encoded; before issue 48 also the peak counted with a model call), what the model's memory took (its keys
and values (decode place and pages) and reserve, allocated once, from the run's "memory:" line; issue 48 on), the
claims in flight at most (the run's "memory:" line), the run's seconds (wall clock, and the child's CPU time, which
another process on the same core does not inflate), and whether claim_id, label, justification, prompt_tokens and
completion_tokens equal the unlimited run's claim by claim;
the --tree row compares encoded_tokens too (nothing is re-encoded without a budget).
Results are printed as JSON and written to --out.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.tiny_models import averitec_dir, build_wide_llama  # noqa: E402

MIB = 2 ** 20
COMPARED = ("claim_id", "label", "justification", "prompt_tokens", "completion_tokens")
RUN_FLAGS = ["--no-structured", "--temperature", "0", "--max-new-tokens", "6", "--max-rounds", "1"]
GPU_COMMAND = "python bench/bench_gpu.py --claims 32 --batch-size 32 --turns 192 --batching continuous"

# The child: one run in a fresh process, its tree first on sys.path; the measurements on its last stdout line.
CHILD = r"""
import ctypes, json, resource, sys, time
from pathlib import Path
# No transparent huge pages here: a 2 MiB page backing a few small blocks would count pages no tensor uses.
assert ctypes.CDLL(None, use_errno=True).prctl(41, 1, 0, 0, 0) == 0
tree, argv = sys.argv[1], sys.argv[2:]
sys.path.insert(0, tree)
import run_debate
from debate.pipeline import runner

def resident():
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()

def high_water():
    return int(Path("/proc/self/status").read_text().split("VmHWM:")[1].split()[0]) * 1024

seen = {}
load = runner.load_agents

def loaded(*args, **kwargs):  # every model of the run is loaded when this returns; the budget is decided next
    agents = load(*args, **kwargs)
    seen["loaded"] = resident()
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark restarts at the loaded model
    return agents

runner.load_agents = loaded
try:
    from debate.engine import kv_pool
except ImportError:  # a checkout from before the budget
    kv_pool = None
if kv_pool is not None:
    start_run = kv_pool.start_run

    def started(*args, **kwargs):  # the run's budget as decided (the runner puts the process's own back after it)
        pools = start_run(*args, **kwargs)
        seen["budget"] = max((p.budget for p in pools if p.budget is not None), default=None)
        return pools

    kv_pool.start_run = started
start = time.time()
run_debate.main(argv)  # the CPU time below is the whole process's (imports and loading included)
used = resource.getrusage(resource.RUSAGE_SELF)
result = {"seconds": round(time.time() - start, 1), "cpu_seconds": round(used.ru_utime + used.ru_stime, 1),
          "loaded": seen.get("loaded"), "high_water": high_water()}
if kv_pool is not None:
    pool = kv_pool.pool_for("cpu")
    # peak_counted and calls: the pool's counts of a model call's admission, before batching by the step (issue 48)
    result.update(budget=seen.get("budget"), peak_held=pool.peak_held, peak_counted=getattr(pool, "peak_counted", None),
                  dropped=pool.dropped, reencoded=pool.reencoded, calls=getattr(pool, "calls", None))
print("BENCH " + json.dumps(result))
"""


def budget_flags(budget):
    """run_debate.py's memory flags for a --budgets entry."""
    if budget == "none":
        return ["--gpu-memory-fraction", "0"]
    if budget == "default":
        return []
    return ["--memory-gb", budget]


def run_child(tree, argv, threads):
    """One run of `tree`'s run_debate.py with `argv` in a fresh measured process; its measurements and log."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    start = time.time()
    out = subprocess.run([sys.executable, "-c", CHILD, str(tree), *argv], capture_output=True, text=True, env=env,
                         cwd=tree)
    wall = time.time() - start
    if out.returncode != 0 or "BENCH " not in out.stdout:
        raise SystemExit(f"the run failed ({tree}, {' '.join(argv)}):\n{out.stderr[-3000:]}")
    measured = json.loads(out.stdout.rsplit("BENCH ", 1)[1].splitlines()[0])
    return measured, out.stdout + out.stderr, wall


def log_value(log, pattern):
    found = re.findall(pattern, log)
    return found[-1] if found else None


def predictions(out_dir):
    rows = [json.loads(line) for line in (Path(out_dir) / "predictions.jsonl").read_text(encoding="utf-8")
            .splitlines() if line.strip()]
    return sorted(rows, key=lambda p: str(p["claim_id"]))


def same(rows, reference, keys):
    return [{k: r.get(k) for k in keys} for r in rows] == [{k: r.get(k) for k in keys} for r in reference]


def row(name, tree, budget, measured, log, wall, out_dir):
    preds = predictions(out_dir)
    mib = lambda b: None if b is None else round(b / MIB, 1)  # noqa: E731
    return {
        "run": name, "tree": str(tree), "budget": budget,
        "budget_mib": mib(measured.get("budget")),
        "budget_line": log_value(log, r"memory budget on cpu: ([^\n]*)"),
        "loaded_mib": mib(measured["loaded"]),
        "peak_above_loaded_mib": mib(measured["high_water"] - measured["loaded"]),
        "peak_held_mib": mib(measured.get("peak_held")),
        "peak_counted_mib": mib(measured.get("peak_counted")),
        "dropped": measured.get("dropped"), "reencoded": measured.get("reencoded"),
        "model_calls": measured.get("calls"),
        "claims_in_flight": int(v) if (v := log_value(log, r"(\d+) claims in flight at most")) else None,
        "memory_line": log_value(log, r"(memory: [^\n]*)"),
        "kv_and_reserve": log_value(log, r"keys, values and reserve ([\d.]+ [MG]iB)"),
        "seconds": measured["seconds"], "cpu_seconds": measured["cpu_seconds"], "wall_seconds": round(wall, 1),
        "verify_seconds": float(v) if (v := log_value(log, r"verified \d+ claims in ([\d.]+)s")) else None,
        "claims": len(preds),
        "context_overflow": sum(p.get("parse_status") == "context_overflow" for p in preds),
        "encoded_tokens": sum(p.get("encoded_tokens", 0) for p in preds),
        "_preds": preds,
    }


def build_parser():
    """The flags (tests/test_docs.py checks the documented commands against them)."""
    p = argparse.ArgumentParser(prog="bench/bench_memory_budget.py", description=__doc__.split("\n")[0])
    p.add_argument("--claims", type=int, default=32, help="the first N AVeriTeC dev claims (golden evidence)")
    p.add_argument("--batch-size", type=int, default=32, help="run_debate.py's --batch-size: claims in flight at most")
    p.add_argument("--budgets", nargs="+", default=["none", "default", "1", "0.25", "0.08"],
                   help="one run each: none (--gpu-memory-fraction 0, the reference, always run), default (no "
                   "memory flag), or N (--memory-gb N)")
    p.add_argument("--model", help="a checkpoint for every agent (default: build_wide_llama, written once under the "
                   "folder of --out)")
    p.add_argument("--tree", help="another checkout whose run_debate.py also runs, unlimited, with the same flags and "
                   "model; its records and encoded tokens are compared with this checkout's unlimited run")
    p.add_argument("--run-flags", default=" ".join(RUN_FLAGS),
                   help="run_debate.py flags every run takes, one string given with '=' "
                   "(--run-flags='--max-rounds 2 ...'); default: %(default)s")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each run (default 1: pin the bench "
                   "to one core with taskset)")
    p.add_argument("--out", default=str(ROOT / "bench/out/memory_budget.json"),
                   help="the JSON result; the model and the runs' directories go beside it")
    return p


def main(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    data_dir = averitec_dir()
    if not (data_dir / "dev.json").is_file():
        p.error(f"no AVeriTeC dev split at {data_dir}: set DEBATECV_SHARED_DATA to the shared data folder")
    out = Path(args.out).resolve()  # absolute: a --tree run's working directory is its tree
    work = out.parent / out.stem
    work.mkdir(parents=True, exist_ok=True)
    model = str(Path(args.model).resolve()) if args.model else str(work / "wide")
    if not args.model and not (Path(model) / "config.json").is_file():
        build_wide_llama(model, seed=0)
    common = ["--split", "dev", "--evidence", "golden", "--data-dir", str(data_dir), "--limit", str(args.claims),
              "--batch-size", str(args.batch_size), "--model", model, "--overwrite", *args.run_flags.split()]
    budgets = ["none"] + [b for b in args.budgets if b != "none"]
    rows = []
    for budget in budgets:
        out_dir = work / f"run-{budget}"
        measured, log, wall = run_child(ROOT, common + ["--output-dir", str(out_dir), *budget_flags(budget)],
                                        args.threads)
        rows.append(row(f"budget {budget}", ROOT, budget, measured, log, wall, out_dir))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "_preds"}), flush=True)
    reference = rows[0]["_preds"]
    for r in rows:
        r["same_records_as_unlimited"] = same(r["_preds"], reference, COMPARED)
    if args.tree:
        tree = Path(args.tree).resolve()
        out_dir = work / "run-tree-none"
        measured, log, wall = run_child(tree, common + ["--output-dir", str(out_dir), *budget_flags("none")],
                                        args.threads)
        r = row("other tree, unlimited", tree, "none", measured, log, wall, out_dir)
        r["same_records_as_unlimited"] = same(r["_preds"], reference, COMPARED)
        r["same_encoded_tokens_as_unlimited"] = same(r["_preds"], reference, ("claim_id", "encoded_tokens"))
        print(json.dumps({k: v for k, v in r.items() if k != "_preds"}), flush=True)
        rows.append(r)
    import torch

    result = {"claims": args.claims, "batch_size": args.batch_size, "model": model,
              "run_flags": args.run_flags.split(), "threads": args.threads, "torch": torch.__version__,
              "compared": list(COMPARED), "rows": [{k: v for k, v in r.items() if k != "_preds"} for r in rows],
              "gpu_command": GPU_COMMAND}
    text = json.dumps(result, indent=2)
    out.write_text(text + "\n", encoding="utf-8")
    print(text)
    print(f"saved {out}")
    return result


if __name__ == "__main__":
    main()
