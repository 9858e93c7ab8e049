"""Engine throughput on CPU: DebateCV with a tiny random-weight Llama, KV-cache reuse on/off, batch 1/8.

    python bench/bench_engine.py [--claims 16] [--max-new-tokens 96] [--out bench/out/engine.json]

Claims come from AVeriTeC dev with HerO's retrieved evidence when ../shared/data is there (the demo set
otherwise). A random model never ends a turn early and never lets the Moderator stop, so every claim
runs all rounds plus the final prompt with full-length turns: the heaviest shape a debate can take.
"""
import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from debate.engine import engine, models
from debate.methods import debatecv
from tests.tiny_models import bench_claims, build_tiny_llama  # noqa: E402


def measure(agents, claims, reuse, batch_size, max_new_tokens, rounds):
    # Free generation, as this benchmark has always measured it (its 4-token warm-up is below any schema's budget;
    # bench_gpu.py --structured measures the structured path).
    settings = engine.Settings(max_new_tokens=max_new_tokens, reuse_cache=reuse, structured=False)
    start = time.perf_counter()
    out = []
    for i in range(0, len(claims), batch_size):
        out += debatecv.run_batch(agents, claims[i:i + batch_size], settings, max_rounds=rounds)
    seconds = time.perf_counter() - start
    preds = [r["prediction"] for r in out]
    return {
        "reuse_cache": reuse, "batch_size": batch_size, "claims": len(claims), "seconds": round(seconds, 2),
        "claims_per_hour": round(len(claims) / seconds * 3600, 1),
        "encoded_prompt_tokens_per_claim": round(sum(p["encoded_tokens"] for p in preds) / len(preds)),
        "context_tokens_per_claim": round(sum(p["prompt_tokens"] for p in preds) / len(preds)),
        "completion_tokens_per_claim": round(sum(p["completion_tokens"] for p in preds) / len(preds)),
        "replies": [[t["response"] for t in r["transcript"]["turns"]] for r in out],
    }


def build_parser():
    """The flags (tests/test_docs.py checks the documented commands against them)."""
    p = argparse.ArgumentParser()
    p.add_argument("--claims", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "bench/out/engine.json"))
    return p


def main():
    p = build_parser()
    args = p.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    claims, source = bench_claims(args.claims, "retrieved")
    with tempfile.TemporaryDirectory() as tmp:
        # Big enough that encoding, not Python overhead, dominates; still random weights.
        path = build_tiny_llama(Path(tmp) / "model", seed=0, hidden_size=256, intermediate_size=688,
                                num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4)
        agents = models.load_roles({r: str(path) for r in debatecv.ROLES}, {}, use_4bit=False)
        measure(agents, claims[:2], True, 2, 4, 1)  # warm-up
        rows = [measure(agents, claims, reuse, bs, args.max_new_tokens, args.rounds)
                for bs in (1, 8) for reuse in (False, True)]
    same = len({json.dumps(r.pop("replies")) for r in rows}) == 1
    result = {
        "date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads)", "claims_source": source,
        "max_new_tokens": args.max_new_tokens, "max_rounds": args.rounds,
        "model": "random-weight Llama: hidden 256, 4 layers, 8 heads / 4 KV heads, byte-level BPE vocab",
        "same_replies_in_all_runs": same, "runs": rows,
    }
    for bs in (1, 8):
        off, on = [r for r in rows if r["batch_size"] == bs]
        result[f"batch{bs}_encoded_token_ratio"] = round(off["encoded_prompt_tokens_per_claim"]
                                                         / on["encoded_prompt_tokens_per_claim"], 2)
        result[f"batch{bs}_speedup"] = round(off["seconds"] / on["seconds"], 2)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
