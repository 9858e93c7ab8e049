"""Whether this tree's runs write the records another tree's write, record for record (issue 48: batching by the
step must give the greedy records of batching by the turn).

    mkdir -p /tmp/base48 && git archive 0190a6d | tar -x -C /tmp/base48     # the commit before issue 48
    python bench/bench_same_records.py --tree /tmp/base48 --out bench/out/same_records.json

Each case is one `run_debate.py` run, greedy, in a fresh process for each tree (the tree first on sys.path), with the
same model and flags: DebateCV on the embedded demo claims with the Moderator's JSON decoded under its schema
(rows under a schema beside free rows), 2 rounds, continuous batching at --batch-size 4, on
- a tiny random Llama (tests.tiny_models.build_tiny_llama),
- a tiny random Gemma 3 (sliding-window layers beside a full one, window 16: contexts slide many times over),
- the tiny Llama in NF4 (--4bit, bitsandbytes on a CPU) with a random LoRA adapter on the Moderator only
  (--moderator-adapter: a LoRA role beside the base's roles),
- the tiny Llama with fixed batches (--no-continuous) and without cache reuse (--no-cache-reuse),
and the courtroom on the demo claims (--method courtroom, many roles and schemas, one round).
It prints, for each case, whether predictions.jsonl and transcripts.jsonl are equal claim by claim, and where not,
the first field that differs. The models are built once under --cache.
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.tiny_models import build_random_lora, build_tiny_gemma, build_tiny_llama  # noqa: E402

# run_debate.main returns the run's metrics (a dict) or an exit status.
CHILD = ("import sys; sys.path.insert(0, sys.argv[1]); import run_debate; code = run_debate.main(sys.argv[2:]); "
         "sys.exit(code if isinstance(code, int) else 0)")
COMMON = ["--split", "demo", "--temperature", "0", "--batch-size", "4", "--max-rounds", "2", "--max-new-tokens", "110"]


def models(cache):
    """{name: (model path, extra flags)} of the cases, built once under `cache`."""
    cache = Path(cache)
    llama, gemma, adapter = cache / "llama", cache / "gemma", cache / "llama-lora"
    if not (llama / "config.json").exists():
        build_tiny_llama(llama, seed=0)
    if not (gemma / "config.json").exists():
        build_tiny_gemma(gemma, seed=0)
    if not (adapter / "adapter_config.json").exists():
        build_random_lora(llama, adapter)
    return {
        "tiny Llama, continuous": (llama, []),
        "tiny Gemma 3, continuous": (gemma, []),
        "tiny Llama NF4, LoRA Moderator": (llama, ["--4bit", "--moderator-adapter", str(adapter)]),
        "tiny Llama, fixed batches": (llama, ["--no-continuous"]),
        "tiny Llama, no cache reuse": (llama, ["--no-cache-reuse"]),
        "tiny Llama, courtroom": (llama, ["--method", "courtroom", "--max-rounds", "1", "--max-new-tokens", "8",
                                          "--no-structured", "--limit", "3"]),
    }


def run(tree, model, extra, out, ignore=()):
    """One run's records by claim, less the top-level fields `ignore` names."""
    argv = [*COMMON, "--model", str(model), *extra, "--output-dir", str(out)]
    done = subprocess.run([sys.executable, "-c", CHILD, str(tree), *argv], cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the run failed in {tree}: {' '.join(argv)}\n{done.stderr[-3000:]}")
    return {name: {str(r["claim_id"]): {k: v for k, v in r.items() if k not in ignore}
                   for r in map(json.loads, (out / name).read_text().splitlines())}
            for name in ("predictions.jsonl", "transcripts.jsonl")}


def first_difference(a, b, path=""):
    """Where two JSON values first differ, as a path, or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            found = first_difference(a.get(key), b.get(key), f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None if len(a) == len(b) else f"{path} (length {len(a)} against {len(b)})"
    return None if a == b else path


def build_parser():
    """The flags (tests/test_docs.py checks the documented commands against them)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", required=True, help="the other checkout (e.g. the commit before, with git archive)")
    p.add_argument("--cache", default=str(Path.home() / ".cache/debatecv/bench/same-records"))
    p.add_argument("--out", help="also write the JSON result here")
    p.add_argument("--ignore", nargs="*", default=[], metavar="FIELD",
                   help="prediction fields left out of the comparison (e.g. encoded_tokens, which pages shared by "
                   "prefix lower)")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    rows = []
    work = Path(tempfile.mkdtemp(prefix="same-records-"))
    for name, (model, extra) in models(args.cache).items():
        mine = run(ROOT, model, extra, work / f"{len(rows)}-this", args.ignore)
        theirs = run(Path(args.tree).resolve(), model, extra, work / f"{len(rows)}-other", args.ignore)
        row = {"case": name, "claims": len(mine["predictions.jsonl"])}
        for file in mine:
            diffs = {cid: first_difference(mine[file].get(cid), theirs[file].get(cid))
                     for cid in sorted(set(mine[file]) | set(theirs[file]))}
            diffs = {cid: d for cid, d in diffs.items() if d}
            row[file] = "equal" if not diffs else diffs
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"tree": str(args.tree), "ignored": args.ignore, "cases": rows}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(r["predictions.jsonl"] == r["transcripts.jsonl"] == "equal" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
