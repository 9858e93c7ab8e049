"""Where an eager run's time goes, timed from outside the engine (issue 59's time split): the attention's sdpa calls
(decode rows' and prompt pieces'), the rest of the eager attention, the rest of the model's step forwards, and the
rest of the run.

    python bench/bench_time_split.py                        # bench_peer.py's DebateCV run: 16 claims, tiny Llama
    python bench/bench_time_split.py --tree /tmp/base       # the same run on another checkout (the commit before)
    python bench/bench_time_split.py -- --dtype bfloat16    # flags after `--` go to the run (run_debate.py's)

The run is bench/bench_peer.py's our side (`--method debatecv --model tiny`, the same flags: 16 AVeriTeC dev claims
with HerO's retrieved evidence, batch 16, 160-token turns of drawn lengths, greedy, one thread) in this process. The
hooks wrap names the engine calls through its modules, changing nothing they do:
- `F.scaled_dot_product_attention` as debate.engine.attention sees it (a call without a mask is a decode row's, one
  with a mask a piece's: the eager attention calls it so);
- `cpu_kernel.decode_rows` where the tree has it (a layer's decode rows in one call: counted as its rows' calls,
  so that the read compares across trees);
- `attention.in_two` where the tree has it (a long piece's two calls: a piece's time, its arithmetic counted as one
  masked call's, so that the GFLOPS compare across trees);
- `attention.per_slot` (the eager attention of one layer) and `decode_step.forward` (a step's forward).
The wall is the span of the run's rows (bench_peer.Recorder: the first row's submission to the last one's end), as
the peer bench counts it. Each clock read costs about a microsecond a call (tens of thousands of calls: a fraction of
a second of the run).

Run it on an idle machine, pinned to one core (`taskset -c 0`): the attention's calls are bound by the core's memory
bandwidth (decode rows) and its float32 arithmetic (pieces), both shared with whatever else runs.
"""
import argparse
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--claims", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--turns", type=int, default=160, help="new tokens a turn at most")
    p.add_argument("--turn-lengths", type=int, default=64, help="the drawn turn lengths' mean (bench_gpu.py's)")
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared/data/averitec"))
    p.add_argument("--tree", help="run another checkout's engine (its debate/ and run_debate.py) under these hooks")
    p.add_argument("--out", help="also write the result here (JSON)")
    return p


class Clock:
    """Seconds and calls by part."""

    def __init__(self):
        self.parts = {}

    def add(self, part, seconds, columns=0, read=0, flops=0, calls=1):
        entry = self.parts.setdefault(part, [0, 0.0, 0, 0, 0])
        entry[0] += calls
        entry[1] += seconds
        entry[2] += columns
        entry[3] += read
        entry[4] += flops

    def timed(self, part, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(part, time.perf_counter() - start)
        return wrapper


def hook(clock):
    """The three hooks (module doc) on the engine's modules as imported from sys.path."""
    import torch.nn.functional as F

    from debate.engine import attention, decode_step

    sdpa = F.scaled_dot_product_attention

    def timed_sdpa(query, key, value, attn_mask=None, **kwargs):
        start = time.perf_counter()
        out = sdpa(query, key, value, attn_mask=attn_mask, **kwargs)
        # What the call must read (its keys and values) and compute (the scores and their weighted sum).
        read = 2 * key.numel() * key.element_size()
        flops = 4 * query.shape[0] * query.shape[1] * query.shape[2] * key.shape[2] * query.shape[3]
        clock.add("decode rows' sdpa" if attn_mask is None else "pieces' sdpa", time.perf_counter() - start,
                  key.shape[-2], read, flops)
        return out

    if hasattr(attention, "in_two"):  # a long piece's two calls (since 59's split): a piece's, timed whole
        two = attention.in_two

        def timed_two(query, keys, values, split, scaling):
            start = time.perf_counter()
            out = two(query, keys, values, split, scaling)
            clock.add("pieces' sdpa", time.perf_counter() - start, keys.shape[-2],
                      2 * keys.numel() * keys.element_size(),
                      4 * query.shape[0] * query.shape[1] * query.shape[2] * keys.shape[2] * query.shape[3])
            return out

        attention.in_two = timed_two
    if hasattr(attention, "cpu_kernel"):  # the decode rows' CPU kernel (since 59's third session): a layer's rows
        from debate.engine import cpu_kernel
        kernel = cpu_kernel.decode_rows

        def timed_kernel(query, key, value, out, rows, scaling, widest):
            start = time.perf_counter()
            kernel(query, key, value, out, rows, scaling, widest)
            columns = int((rows[:, 3] - rows[:, 2]).sum())
            per_column = key.shape[1] * key.shape[3] * key.element_size()
            clock.add("decode rows' sdpa", time.perf_counter() - start, columns, 2 * columns * per_column,
                      4 * query.shape[1] * columns * query.shape[3], calls=rows.shape[0])

        cpu_kernel.decode_rows = timed_kernel
    # The attention module's own view of torch.nn.functional: every other caller keeps the real one.
    attention.F = types.SimpleNamespace(**{**{n: getattr(F, n) for n in dir(F) if not n.startswith("__")},
                                           "scaled_dot_product_attention": timed_sdpa})
    attention.per_slot = clock.timed("eager attention", attention.per_slot)
    decode_step.forward = clock.timed("step forwards", decode_step.forward)


def split(clock, wall):
    """The table's rows: (part, seconds, share of the wall, calls, mean columns a call)."""
    parts = clock.parts
    get = lambda name: parts.get(name, [0, 0.0, 0, 0, 0])  # noqa: E731
    decode, pieces = get("decode rows' sdpa"), get("pieces' sdpa")
    eager, forwards = get("eager attention"), get("step forwards")
    rows = [("decode rows' sdpa (or the CPU kernel)", decode[1], decode[0], decode[2] / max(decode[0], 1)),
            ("prompt pieces' sdpa (or attention.in_two)", pieces[1], pieces[0], pieces[2] / max(pieces[0], 1)),
            ("the eager attention's own work", eager[1] - decode[1] - pieces[1], eager[0], None),
            ("the rest of the step forwards", forwards[1] - eager[1], forwards[0], None),
            ("outside the step forwards", wall - forwards[1], None, None)]
    return [{"part": part, "s": round(s, 2), "share": round(s / wall, 3), "calls": calls,
             "columns": None if columns is None else round(columns)} for part, s, calls, columns in rows], {
        "decode_rows_gb_s": round(decode[3] / max(decode[1], 1e-9) / 1e9, 2),
        "pieces_gflops": round(pieces[4] / max(pieces[1], 1e-9) / 1e9, 1)}


def ceilings(seconds=2.0):
    """This core's own pace, beside which the calls' is read: GB/s summing a 256 MiB float32 tensor (a stream from
    memory, as a decode row's keys and values are read) and GFLOPS of a 2048^3 float32 matmul (a piece's arithmetic
    at its best), each the best of the repeats within `seconds`."""
    import torch

    big, a = torch.ones(64 * 2 ** 20), torch.randn(2048, 2048)
    best_read, best_mm, end = 0.0, 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        big.sum()
        best_read = max(best_read, big.numel() * 4 / (time.perf_counter() - start) / 1e9)
        start = time.perf_counter()
        a @ a
        best_mm = max(best_mm, 2 * 2048 ** 3 / (time.perf_counter() - start) / 1e9)
    return {"stream_gb_s": round(best_read, 2), "matmul_gflops": round(best_mm, 1)}


def child(args):
    tree = Path(args.tree).resolve() if args.tree else ROOT
    sys.path[:0] = [str(tree), str(ROOT)]  # the engine timed (debate/, run_debate.py): this checkout's or --tree's
    from bench import bench_gpu, bench_peer
    clock = Clock()
    hook(clock)
    peer = bench_peer.build_parser().parse_args(["--claims", str(args.claims), "--batch-size", str(args.batch_size),
                                                 "--turns", str(args.turns), "--turn-lengths", str(args.turn_lengths),
                                                 "--data-dir", args.data_dir])
    peer.ours = args.ours
    peer.turn_lengths = args.turn_lengths
    bench_gpu.set_turn_lengths(peer)
    import run_debate

    out_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_time_split-{os.getpid()}"
    with bench_peer.Recorder() as recorder:
        run_debate.main(bench_peer.run_argv(peer, bench_peer.model_dir_of(peer), out_dir))
    rows = recorder.rows
    wall = max(r["finished"] for r in rows) - min(r["submitted"] for r in rows)
    parts, pace = split(clock, wall)
    result = {"tree": str(tree), "rows": len(rows), "wall_s": round(wall, 2), "parts": parts, "pace": pace,
              "ceilings": ceilings()}
    print("RESULT " + json.dumps(result), flush=True)


def parse(argv):
    """The bench's flags, and after `--` more run_debate.py flags for the run (`args.ours`)."""
    cut = argv.index("--") if "--" in argv else len(argv)
    args = build_parser().parse_args(argv[:cut])
    args.ours = argv[cut + 1:]
    return args


def main():
    args = parse(sys.argv[1:])
    if os.environ.get("BENCH_TIME_SPLIT_CHILD"):
        return child(args)
    if args.tree and not (Path(args.tree) / "debate/engine/attention.py").exists():
        print(f"error: --tree {args.tree}: no debate/engine/attention.py there (a checkout after issue 59's packed "
              "step)", file=sys.stderr)
        return 2
    # A child process: the engine imported from the tree timed, nothing of this process's imports in the way.
    env = dict(os.environ, BENCH_TIME_SPLIT_CHILD="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=env, capture_output=True, text=True)
    found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not found:
        print(done.stdout[-3000:] + done.stderr[-3000:], file=sys.stderr)
        return done.returncode or 1
    result = json.loads(found[-1][len("RESULT "):])
    print(f"{result['tree']}: {result['rows']} rows, wall {result['wall_s']} s")
    print("| part | s | share of the wall | calls | mean columns a call |")
    print("|---|---:|---:|---:|---:|")
    for r in result["parts"]:
        print(f"| {r['part']} | {r['s']} | {100 * r['share']:.1f}% | {r['calls'] if r['calls'] is not None else ''} | "
              f"{r['columns'] if r['columns'] is not None else ''} |")
    pace, top = result["pace"], result["ceilings"]
    print(f"decode rows' attention read {pace['decode_rows_gb_s']} GB/s (this core streams {top['stream_gb_s']} GB/s); "
          f"pieces' sdpa computed {pace['pieces_gflops']} GFLOPS (a float32 matmul: {top['matmul_gflops']})")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
