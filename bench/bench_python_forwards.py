"""How many of a run's model forwards run in Python, eager against --compile (issue 59): counted, not timed.

    python bench/bench_python_forwards.py                  # 4 AVeriTeC dev claims on bench_gpu.py's tiny Llama
    python bench/bench_python_forwards.py --claims 16

The run is bench/bench_gpu.py's CPU row (DebateCV, 3 rounds + final, greedy, batch = claims, 16-token turns, the
retrieved evidence), through `run_debate.main`, once eagerly and once with --compile. Counted from outside the
engine: every call of the model's Python forward that runs one of the batch's steps (the calls given a step's packed
metadata: decode steps and steps with prompt tokens alike; sys.setprofile on the forward's code, so a compiled graph,
which never enters it, is not counted), beside the steps the engine took (debate.engine.step_stats). Under
--compile the Python forwards left are the self-check's eager references (one a compiled path) and any fallback's.
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import run_debate  # noqa: E402


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--claims", type=int, default=4)
    p.add_argument("--turns", type=int, default=16, help="new tokens a turn")
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared/data/averitec"))
    p.add_argument("--cache", default=str(Path.home() / ".cache/debatecv/bench"))
    p.add_argument("--vocab-size", type=int, default=32000)  # bench_gpu.py's
    p.add_argument("--out", help="also write the JSON result here")
    return p


def main():
    args = build_parser().parse_args()
    from transformers import LlamaForCausalLM

    sys.path.insert(0, str(ROOT / "bench"))
    from bench_gpu import checkpoint

    from debate.engine import models, step_stats
    from tests.test_compiled_decode import step_forwards

    path = checkpoint(args.cache, True, args.data_dir, args.vocab_size)
    loaded = []
    load_roles = models.load_roles

    def keeping(*a, **kw):
        roles = load_roles(*a, **kw)
        loaded.extend({id(r.model): r.model for r in roles.values()}.values())
        return roles

    models.load_roles = keeping
    rows = {}
    for mode in ("eager", "compile"):
        loaded.clear()
        out = tempfile.mkdtemp()
        argv = ["--split", "dev", "--data-dir", args.data_dir, "--evidence", "retrieved", "--method", "debatecv",
                "--model", str(path), "--limit", str(args.claims), "--batch-size", str(args.claims),
                "--max-new-tokens", str(args.turns), "--max-rounds", "3", "--temperature", "0", "--no-structured",
                "--threads", "1", "--output-dir", out, "--compile" if mode == "compile" else "--no-compile"]
        _, python = step_forwards(LlamaForCausalLM, lambda: run_debate.main(argv))
        stats = [step_stats.stats_of(m) for m in loaded]
        steps = sum(s.steps + s.eager_steps for s in stats if s is not None)
        rows[mode] = {"python_step_forwards": python, "steps": steps,
                      "compiled_steps": sum(s.steps for s in stats if s is not None),
                      "checked": [c for s in stats if s is not None for c in s.checked],
                      "predictions": [json.loads(line)["label"] for line in
                                      (Path(out) / "predictions.jsonl").read_text().splitlines()]}
        print(mode, json.dumps({k: v for k, v in rows[mode].items() if k != "predictions"}), flush=True)
    share = rows["compile"]["python_step_forwards"] / max(1, rows["eager"]["python_step_forwards"])
    print(f"Python step forwards under --compile: {rows['compile']['python_step_forwards']} of "
          f"{rows['eager']['python_step_forwards']} eagerly ({share:.1%}); the same labels: "
          f"{rows['compile']['predictions'] == rows['eager']['predictions']}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
