"""A step's decode rows on a CPU: sdpa a row (the eager attention's call before the kernel) against the CPU kernel's
one call for all of them (debate/engine/decode_rows.c through debate.engine.cpu_kernel; issue 59).

    python bench/bench_decode_rows.py                 # one thread, float32 and bfloat16
    python bench/bench_decode_rows.py --rows 16 --layers 4 --calls 10

Random tensors shaped as a run's cache: `--rows` slots, each row reading all its columns (500 to 4,000), at the tiny
Llama's heads (bench_gpu.py's TINY: 8 query heads over 4 key heads of 32), Gemma 3 270M's (4 over 1 of 256) and
Llama-3.1-8B's (32 over 8 of 128). A step's layers each have their own cache (`--layers` of them), so that, as in a
run, a row's keys and values come from memory, not from the last call's caches. Printed: ms a step (every layer's
rows), the keys and values read a second, and the largest difference from sdpa in float32 over the same numbers.
Run it on an idle machine, pinned (`taskset -c 0`): both ways are bound by the core's memory and arithmetic.
"""
import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from debate.engine import cpu_kernel  # noqa: E402


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--calls", type=int, default=10, help="steps timed (the best one is printed)")
    p.add_argument("--threads", type=int, default=1)
    return p


def best_of(fn, calls):
    fn()
    best = float("inf")
    for _ in range(calls):
        began = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - began)
    return best


def main():
    args = build_parser().parse_args()
    torch.set_num_threads(args.threads)
    ok, why = cpu_kernel.available()
    if not ok:
        print(f"error: the CPU kernel could not be built: {why}", file=sys.stderr)
        return 1
    gen = torch.Generator().manual_seed(59)
    print("| heads (query/key, dim) | dtype | columns | sdpa a row, ms a step | the kernel, ms a step | speed-up | "
          "kernel's read, GB/s | largest difference |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for heads, kv_heads, dim in ((8, 4, 32), (4, 1, 256), (32, 8, 128)):
        groups, n = heads // kv_heads, args.rows
        for columns in (500, 2800, 4000):
            layers = [(torch.randn(n, kv_heads, columns, dim, generator=gen),
                       torch.randn(n, kv_heads, columns, dim, generator=gen)) for _ in range(args.layers)]
            query = torch.randn(1, n, heads, dim, generator=gen).transpose(1, 2)  # transformers' layout
            rows = torch.tensor([[slot, slot, 0, columns] for slot in range(n)], dtype=torch.int64)
            for dtype in (torch.float32, torch.bfloat16):
                q = query.to(dtype)
                cache = [(k.to(dtype), v.to(dtype)) for k, v in layers]
                out = torch.empty(n, heads, dim, dtype=dtype)
                reference = F.scaled_dot_product_attention(
                    q.float().transpose(1, 2).reshape(n, kv_heads, groups, dim),
                    *(t.float() for t in cache[0])).reshape(n, heads, dim)

                def by_sdpa():
                    for keys, values in cache:
                        for slot in range(n):
                            piece = F.scaled_dot_product_attention(q[:, :, slot].reshape(1, kv_heads, groups, dim),
                                                                   keys[slot:slot + 1], values[slot:slot + 1])
                            out[slot] = piece.reshape(heads, dim)

                def by_kernel():
                    for keys, values in cache:
                        cpu_kernel.decode_rows(q, keys, values, out, rows, dim ** -0.5, columns)

                a, b = best_of(by_sdpa, args.calls), best_of(by_kernel, args.calls)
                cpu_kernel.decode_rows(q, cache[0][0], cache[0][1], out, rows, dim ** -0.5, columns)
                gap = (out.float() - reference).abs().max().item()
                read = 2 * args.layers * n * kv_heads * columns * dim * q.element_size()
                print(f"| {heads}/{kv_heads}, {dim} | {str(dtype)[6:]} | {columns:,} | {a * 1e3:.2f} | "
                      f"{b * 1e3:.2f} | {a / b:.2f}x | {read / b / 1e9:.1f} | {gap:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
