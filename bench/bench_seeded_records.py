"""Whether a seed fixes a sampled run's records: the same claims, model and seed at several batch sizes, continuous and
fixed batching, and killed mid-run then resumed, each compared claim by claim with the first.

    python bench/bench_seeded_records.py --claims 8 --temperature 0.7 --seed 3 --out bench/out/seeded.json
    python bench/bench_seeded_records.py --tree /tmp/base52        # the same runs of another checkout

Each run is `run_debate.py` in a fresh process (the tree first on sys.path): DebateCV on the first --claims AVeriTeC
dev claims with their gold evidence (--data-dir), a tiny random Llama (tests.tiny_models.build_tiny_llama, built once
under --cache), 2 rounds, the Moderator's JSON under its schema, sampled at --temperature. The cases: --batch-size 1
(the reference), 4 and 8, continuous; 4 and 8 with --no-continuous; and --batch-size 4 killed (SIGKILL, no clean-up)
once --kill-after claims are written, then the same command run again, which resumes. Prints, for each case, whether
predictions.jsonl and transcripts.jsonl equal the reference's claim by claim (all but encoded_tokens, which
depends on the pages the claims run before left), and the first field that differs.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_same_records import CHILD, first_difference  # noqa: E402
from tests.tiny_models import build_tiny_llama  # noqa: E402


def flags(args, model, out, batch_size, extra=()):
    return ["--split", "dev", "--data-dir", args.data_dir, "--evidence", "golden", "--model", str(model),
            "--limit", str(args.claims), "--batch-size", str(batch_size), "--max-rounds", "2", "--max-new-tokens",
            str(args.max_new_tokens), "--temperature", str(args.temperature), "--seed", str(args.seed),
            "--output-dir", str(out), *extra]


def start(tree, argv, log):
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    return subprocess.Popen([sys.executable, "-c", CHILD, str(tree), *argv], cwd=tree, env=env,
                            stdout=subprocess.DEVNULL, stderr=log)


def run(tree, argv, out, kill_after=None):
    """One run (killed once `kill_after` claims are on disk, then resumed); its records by claim."""
    log = open(Path(out).parent / f"{Path(out).name}.log", "w")
    proc = start(tree, argv, log)
    predictions = Path(out) / "predictions.jsonl"
    if kill_after is not None:
        while not (predictions.exists() and predictions.read_text().count("\n") >= kill_after):
            if proc.poll() is not None:
                raise SystemExit(f"the run ended before {kill_after} claims were written: {argv}")
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc = start(tree, argv, log)  # the same command: it resumes
    if proc.wait() != 0:
        raise SystemExit(f"the run failed in {tree}: {' '.join(argv)} (log: {log.name})")
    # encoded_tokens left out: what the pages the claims before it left saved depends on which ran before
    return {name: {str(r["claim_id"]): {k: v for k, v in r.items() if k != "encoded_tokens"}
                   for r in map(json.loads, (Path(out) / name).read_text().splitlines())}
            for name in ("predictions.jsonl", "transcripts.jsonl")}


def compare(got, want):
    where = None
    for name in want:
        for claim in sorted(set(want[name]) | set(got[name])):
            where = where or first_difference(got[name].get(claim), want[name].get(claim), f"{name}[{claim}]")
    return {"equal": where is None, "first_difference": where}


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", default=str(ROOT), help="the checkout to run (default: this one)")
    p.add_argument("--claims", type=int, default=8)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--kill-after", type=int, default=3, help="claims written before the kill")
    p.add_argument("--data-dir", default=os.environ.get("DEBATECV_DATA", str(ROOT.parent / "shared/data/averitec")))
    p.add_argument("--cache", default=str(Path.home() / ".cache/debatecv/bench-seeded"))
    p.add_argument("--out", help="also write the JSON result here")
    return p


def main():
    args = build_parser().parse_args()
    if not (Path(args.data_dir) / "dev.json").exists():
        print(f"error: {args.data_dir}/dev.json not found (--data-dir)", file=sys.stderr)
        return 2
    model = Path(args.cache) / "llama"
    if not (model / "config.json").exists():
        build_tiny_llama(model, seed=0)
    cases = [("batch 1, continuous", 1, [], None), ("batch 4, continuous", 4, [], None),
             ("batch 8, continuous", 8, [], None), ("batch 4, fixed batches", 4, ["--no-continuous"], None),
             ("batch 8, fixed batches", 8, ["--no-continuous"], None),
             (f"batch 4, killed after {args.kill_after} claims and resumed", 4, [], args.kill_after)]
    results, reference = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, batch_size, extra, kill_after) in enumerate(cases):
            out = Path(tmp) / f"run{i}"
            began = time.perf_counter()
            got = run(args.tree, flags(args, model, out, batch_size, extra), out, kill_after)
            seconds = round(time.perf_counter() - began, 1)
            if reference is None:
                reference = got
                row = {"case": name, "reference": True, "claims": len(got["predictions.jsonl"]), "seconds": seconds}
            else:
                row = {"case": name, **compare(got, reference), "seconds": seconds}
            results.append(row)
            print(json.dumps(row), flush=True)
    result = {"tree": args.tree, "claims": args.claims, "temperature": args.temperature, "seed": args.seed,
              "cases": results}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(r.get("equal", True) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
