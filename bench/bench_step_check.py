"""How far the compiled decode step's logits are from the eager step's (issue 58's self-check and its tolerance).

    python bench/bench_step_check.py                  # tiny Llama and tiny Gemma 3, float32 and bf16, this CPU

One step of 8 rows (5 live, one 700 columns long beside short ones, as tests/test_row_attention.py builds them) over
a 768-column bucket, compiled (flex attention) against eager, from the same cache. Prints each model's largest
difference as a share of the row's logit range (what debate.engine.compiled_step.mismatch compares with
CHECK_TOLERANCE), what the self-check decided, and the tolerance. Each model compiles once (a minute or two here).
"""
import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from debate.engine import compiled_step, decode_step, step_stats  # noqa: E402
from tests.test_row_attention import LENGTHS, SLOTS, Place  # noqa: E402
from tests.tiny_models import build_tiny_gemma, build_tiny_llama  # noqa: E402


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    return parser


def main():
    args = build_parser().parse_args()
    folder = tempfile.mkdtemp()
    print(f"torch {torch.__version__}, CPU")
    print(f"{'model':<8} {'dtype':<9} {'gap / range':>12} {'tolerance':>10}  self-check")
    for name, build in (("llama", build_tiny_llama), ("gemma", build_tiny_gemma)):
        for dtype_name in args.dtypes:
            dtype = getattr(torch, dtype_name)
            path = build(f"{folder}/{name}-{dtype_name}", seed=0)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
            place = Place(model)
            columns = 3 * decode_step.COLUMN_BUCKET  # past the longest row (700), as tests/test_row_attention.py
            eager = place.run(SLOTS, columns, compiled=False)[:len(LENGTHS)].float()
            compiled = place.run(SLOTS, columns, compiled=True)[:len(LENGTHS)].float()
            span = eager.amax(dim=-1) - eager.amin(dim=-1)
            gap = float(((compiled - eager).abs().amax(dim=-1) / span).max())
            stats = step_stats.stats_of(model)
            verdict = ", ".join(stats.checked) or f"fell back: {stats.flex_failed or stats.failed}"
            print(f"{name:<8} {dtype_name:<9} {gap:>12.2e} {compiled_step.tolerance(dtype):>10g}  {verdict}")


if __name__ == "__main__":
    main()
