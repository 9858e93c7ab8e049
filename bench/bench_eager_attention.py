"""The eager attention's one call a slot, two ways (issue 59's next lever; measured, not built into the engine).

    python bench/bench_eager_attention.py

`debate.engine.attention.per_slot` attends each slot's tokens with one sdpa call over the columns they see, the
query heads against the key heads by `enable_gqa` and a boolean mask. The other way folds each key head's query heads
into the query length ((1, kv_heads, groups x tokens, dim), the layout the compiled step's grid uses) and calls sdpa
over the same keys with the mask repeated a group each, no expansion of keys and values. Both on random tensors at
the tiny Llama's heads (bench_gpu.py's: 8 query heads over 2 key heads of 64) and Gemma 3 270M's (4 over 1 of 256),
a decode token and a 64-token piece, over 500 and 4,000 columns; one thread, the mean of `--calls` calls in µs, and
the largest difference between the two outputs.
"""
import argparse
import time

import torch
import torch.nn.functional as F


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
    for heads, kv_heads, dim in ((8, 2, 64), (4, 1, 256)):
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


if __name__ == "__main__":
    main()
