"""The eager attention's calls a slot, each against the way it replaced (issue 59).

    python bench/bench_eager_attention.py

`debate.engine.attention.per_slot` (the step a CPU runs by default) attends each slot's tokens with sdpa over the
columns they see. Two of its calls are measured here against the plain masked call, on random tensors at the tiny
Llama's heads (bench_gpu.py's TINY: 8 query heads over 4 key heads of 32) and Gemma 3 270M's (4 over 1 of 256), one
thread, the mean of `--calls` calls in µs, and the largest difference between the outputs:
1. a decode row (one token) and a 64-token piece, over 500 and 4,000 columns: `enable_gqa` and a boolean mask,
   against each key head's query heads folded into the query length ((1, kv_heads, groups x tokens, dim), the
   compiled grid's layout) over the same keys, the mask repeated a group each (built for decode rows, 91a149d);
2. a piece of 64 to 512 tokens right after a cached prefix (its positions the last columns): one masked call against
   `attention.in_two` (the prefix without a mask, the piece's own columns in a square causal call, merged by their
   log-sum-exps; built for pieces of `attention.SPLIT_TOKENS` tokens and more).
"""
import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from debate.engine import attention  # noqa: E402


def timed(fn, calls):
    for _ in range(5):
        fn()
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - began) / calls * 1e6


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    return p


def main():
    args = build_parser().parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(59)
    print("| heads (query/key, dim) | tokens | columns | enable_gqa + mask, µs | grouped queries + mask, µs | "
          "speed-up | largest difference |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for heads, kv_heads, dim in ((8, 4, 32), (4, 1, 256)):
        groups = heads // kv_heads
        for tokens in (1, 64):
            for columns in (500, 4000):
                q = torch.randn(1, heads, tokens, dim, generator=gen)
                k = torch.randn(1, kv_heads, columns, dim, generator=gen)
                v = torch.randn(1, kv_heads, columns, dim, generator=gen)
                # the rows' positions are the last `tokens` columns: each sees up to its own (causal)
                position = torch.arange(columns - tokens, columns)[:, None]
                mask = torch.arange(columns)[None] <= position
                grouped_mask = mask.repeat(groups, 1)

                def expanded():
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

                def grouped():
                    out = F.scaled_dot_product_attention(q.reshape(1, kv_heads, groups * tokens, dim), k, v,
                                                         attn_mask=grouped_mask)
                    return out.view(1, heads, tokens, dim)

                gap = (expanded() - grouped()).abs().max().item()
                a, b = timed(expanded, args.calls), timed(grouped, args.calls)
                print(f"| {heads}/{kv_heads}, {dim} | {tokens} | {columns:,} | {a:.0f} | {b:.0f} | {a / b:.2f}x | "
                      f"{gap:.1e} |")
    print()
    print("| heads (query/key, dim) | piece tokens | columns | one masked call, µs | in two calls, µs | speed-up | "
          "largest difference |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for heads, kv_heads, dim in ((8, 4, 32), (4, 1, 256)):
        for tokens in (64, 128, 256, 512):
            for columns in (1000, 4000):
                q = torch.randn(1, tokens, heads, dim, generator=gen).transpose(1, 2)  # transformers' layout
                k = torch.randn(1, kv_heads, columns, dim, generator=gen)
                v = torch.randn(1, kv_heads, columns, dim, generator=gen)
                mask = torch.arange(columns)[None] <= torch.arange(columns - tokens, columns)[:, None]

                def masked():
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True, scale=dim ** -0.5)

                def two():
                    return attention.in_two(q, k, v, columns - tokens, dim ** -0.5)

                gap = (masked() - two()).abs().max().item()
                a, b = timed(masked, max(args.calls // 10, 5)), timed(two, max(args.calls // 10, 5))
                print(f"| {heads}/{kv_heads}, {dim} | {tokens} | {columns:,} | {a:.0f} | {b:.0f} | {a / b:.2f}x | "
                      f"{gap:.1e} |")


if __name__ == "__main__":
    main()
