"""A run's wall once compiling is done: --compile against eager, the same claims, in one process (issue 59).

    taskset -c 0 python bench/bench_warm_compile.py --compile      # and beside it, on the other core:
    taskset -c 1 python bench/bench_warm_compile.py --no-compile

DebateCV on AVeriTeC dev's retrieved evidence with bench_gpu.py's tiny Llama (built by `bench_gpu.py --tiny`; its
path with --model), greedy, 160-token turns with no drawn cap, 3 rounds + final, one thread, batch = claims.
`run_debate.main` runs twice in one process: 2 claims first (the compiling, and the self-check's first steps), then
`--claims` claims, timed; the second run's `decode:` line says the steps, ms a step and prompt forwards.
"""
import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import run_debate  # noqa: E402

TINY = Path.home() / ".cache/debatecv/bench/random-tiny-averitec-bpe32000"


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, required=True)
    p.add_argument("--claims", type=int, default=16)
    p.add_argument("--model", default=str(TINY))
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared/data/averitec"))
    return p


def main():
    args = build_parser().parse_args()
    base = ["--split", "dev", "--data-dir", args.data_dir, "--evidence", "retrieved", "--method", "debatecv",
            "--model", args.model, "--max-new-tokens", "160", "--max-rounds", "3", "--temperature", "0",
            "--no-structured", "--threads", "1", "--no-4bit", "--compile" if args.compile else "--no-compile"]
    for label, claims in (("warm-up", 2), ("timed", args.claims)):
        began = time.perf_counter()
        run_debate.main(base + ["--limit", str(claims), "--batch-size", str(claims),
                                "--output-dir", tempfile.mkdtemp(prefix="bench_warm-")])
        print(f"{label}: {claims} claims in {time.perf_counter() - began:.1f} s", flush=True)


if __name__ == "__main__":
    main()
