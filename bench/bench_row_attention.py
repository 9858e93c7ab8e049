"""What a compiled decode step costs with one long row beside short ones (issue 53), each row attending over its own
columns (flex attention under a block mask) against every row over all the bucket's columns (the additive mask).

    python bench/bench_row_attention.py                    # random Llama and Gemma 3, both kernels, on this CPU
    python bench/bench_row_attention.py --models llama --steps 10

The issue's measure: a step with one 4096-token row beside 31 rows of 256 tokens (b) costs at most 1.3x a step of
32 rows of 256 tokens (a); for a sliding-window model, the same against its window. Each step runs through
debate.engine.compiled_step.Step.run, compiled (as --compile runs it), over a kv_store.Store place of 32 slots whose
caches hold random keys and values (the cost does not depend on them), each row writing its token at its length:
- llama: a random Llama (--hidden, --layers, 8 query heads, 2 key heads), every layer full attention;
- gemma: a random Gemma 3 of the same size, its layers five sliding (--window columns) to one full, Gemma 3's mix;
  a third case (c), 32 rows of --window tokens, is the step the window bounds a sliding layer's reading by.
Per model and kernel: ms a step (the median of --steps steps after 3 warm ones), the ratio b/a (and b/c), the
graphs compiled.

The KV write: kv_store.StepLayer writes each row's token by one in-place index_put_ (slot, head and column indices
side by side). Before issue 53 it wrote through a permuted view of the bucket's keys, which inductor compiled into a
copy of the whole rows x columns view in and back at every layer: a step then cost what its longest row made it,
whatever the attention read (docs/BENCHMARKS.md, issue 53, the rows "as it was").

On a CPU there is no CUDA graph and the attention is one part of a step beside the matmuls; the GPU
figure needs bench/bench_gpu.py --preset compile on a GPU.
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

SLOTS = 32


def build_model(kind, args):
    from tests.tiny_models import build_tiny_gemma, build_tiny_llama

    out = Path(args.cache) / f"row-attention-{kind}-{args.layers}x{args.hidden}"
    if not (out / "config.json").exists():
        shape = dict(hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_hidden_layers=args.layers,
                     num_attention_heads=8, num_key_value_heads=2)
        if kind == "llama":
            build_tiny_llama(out, seed=0, **shape)
        else:
            types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(args.layers)]
            build_tiny_gemma(out, seed=0, head_dim=args.hidden // 8, query_pre_attn_scalar=args.hidden // 8,
                             sliding_window=args.window, layer_types=types, **shape)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(out).eval()


def cases(args, sliding):
    """{name: every slot's length} (a row's length: the column its token is written at, its context before it)."""
    out = {"a": [255] * SLOTS, "b": [4095] + [255] * (SLOTS - 1)}
    if sliding:
        out["c"] = [args.window - 1] * SLOTS
    return out


def decode_inputs(model, store, tokens, lengths, bucket):
    """A decode step's inputs (decode_step.Inputs) over every slot, each writing its token at its length."""
    from debate.engine import attention, decode_step, generator

    slots = torch.arange(SLOTS)
    packed = attention.Packed(slots, torch.zeros(SLOTS, dtype=torch.long), lengths, torch.ones(SLOTS, dtype=torch.long),
                              torch.empty(1))
    cache = store.step_cache(SLOTS, bucket, slots, lengths)
    return decode_step.Inputs(tokens, lengths, slots, packed, torch.arange(bucket),
                              generator.cache_kwarg(model, cache), mixed=False)


def measure(model, args, flex):
    from debate.engine import compiled_step, decode_step, kv_store, step_stats

    dtype = torch.float32
    columns = 4096 + 256  # the widest row's bucket, a multiple of a page
    store = kv_store.Store(kv_store.layer_shapes(model, dtype), (SLOTS + 1) * columns, SLOTS, columns)
    generator_ = torch.Generator().manual_seed(0)
    for keys, values in store.layers:
        keys.copy_(torch.randn(keys.shape, generator=generator_) * 0.5)
        values.copy_(torch.randn(values.shape, generator=generator_) * 0.5)
    store.zeroed = columns
    compiled_step.ROW_ATTENTION = "flex" if flex else "masked"
    step = compiled_step.Step(model, decode_step.layer_windows(model), dtype)
    tokens = torch.arange(5, 5 + SLOTS)
    out = {}
    for name, lengths in cases(args, "sliding_attention" in decode_step.layer_windows(model)).items():
        lengths_t = torch.tensor(lengths)
        bucket = min(-(-(max(lengths) + 1) // decode_step.COLUMN_BUCKET) * decode_step.COLUMN_BUCKET, columns)
        inputs = decode_inputs(model, store, tokens, lengths_t, bucket)
        times = []
        with torch.inference_mode():
            for i in range(3 + args.steps):
                began = time.perf_counter()
                step.run(True, inputs)
                if i >= 3:
                    times.append(time.perf_counter() - began)
        out[name] = round(statistics.median(times) * 1000, 2)
    stats = step_stats.stats_of(model)
    assert stats.failed is None and stats.flex_failed is None, (stats.failed, stats.flex_failed)
    return out


def build_parser():
    """The flags (tests/test_docs.py checks the documented commands against them)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", choices=("llama", "gemma"), default=["llama", "gemma"])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--window", type=int, default=512, help="the Gemma 3 model's sliding window")
    p.add_argument("--steps", type=int, default=20, help="timed steps a case (after 3 warm ones)")
    p.add_argument("--cache", default=str(Path.home() / ".cache/debatecv/bench"))
    p.add_argument("--out", help="also write the JSON result here")
    return p


def main():
    args = build_parser().parse_args()
    from debate.engine import offline

    offline.set_offline()  # as a run sets it before transformers loads (hub kernels off: tests/conftest.py says why)
    from debate.engine import step_stats

    runs = []
    for kind in args.models:
        model = build_model(kind, args)
        for flex in (True, False):
            ms = measure(model, args, flex)
            row = {"model": kind, "attention": "flex" if flex else "masked", "ms_per_step": ms,
                   "b_over_a": round(ms["b"] / ms["a"], 3), "graphs": step_stats.stats_of(model).graphs}
            if "c" in ms:
                row["b_over_c"] = round(ms["b"] / ms["c"], 3)
            runs.append(row)
            print(json.dumps(row), flush=True)
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": torch.__version__,
              "machine": f"{os.uname().machine} CPU, {os.cpu_count()} cores, {torch.get_num_threads()} threads",
              "hidden": args.hidden, "layers": args.layers, "window": args.window, "slots": SLOTS,
              "runs": runs}
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
