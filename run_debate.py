"""Verify claims with DebateCV on local models.

    python run_debate.py --split demo --limit 3                      # embedded demo claims and model
    python run_debate.py --split dev --evidence retrieved --data-dir DIR --debater-model M --moderator-model M
"""
import argparse

from debate import runner


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = p.add_argument_group("data")
    d.add_argument("--split", default="dev", help="AVeriTeC split file DIR/<split>.json, or 'demo' (embedded)")
    d.add_argument("--data-dir", help="AVeriTeC directory (default: $DEBATECV_DATA, else data/averitec)")
    d.add_argument("--evidence", choices=("golden", "retrieved", "none"), default="retrieved")
    d.add_argument("--retrieved-file", help="retrieved evidence keyed by claim_id "
                   "(default: DIR/<split>.retrieved.hero.jsonl)")
    d.add_argument("--limit", type=int, help="only the first N claims")
    m = p.add_argument_group("models")
    m.add_argument("--method", choices=sorted(runner.METHODS), default="debatecv")
    m.add_argument("--debater-model", help="HF directory or .gguf file (default: embedded Gemma 3 270M)")
    m.add_argument("--moderator-model", help="HF directory or .gguf file (default: embedded Gemma 3 270M)")
    m.add_argument("--moderator-adapter", help="PEFT LoRA directory switched on for the Moderator only")
    m.add_argument("--no-4bit", dest="use_4bit", action="store_false",
                   help="on CUDA, load in bf16 instead of 4-bit NF4")
    g = p.add_argument_group("generation")
    g.add_argument("--batch-size", type=int, default=8, help="claims debated together")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the paper sampled at 0.7)")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--max-new-tokens", type=int,
                   help=f"default {runner.FULL_TURN} ({runner.DEMO_TURN} on the demo split, so the CPU demo ends in minutes)")
    g.add_argument("--max-rounds", type=int, default=3)
    g.add_argument("--no-cache-reuse", dest="reuse_cache", action="store_false",
                   help="re-encode each conversation every turn (for measurement)")
    o = p.add_argument_group("output")
    o.add_argument("--output-dir", help="default: runs/<split>-<evidence>-<method>")
    o.add_argument("--overwrite", action="store_true", help="start over instead of resuming")
    args = p.parse_args(argv)
    runner.check_cli(p, args, ("batch_size", "max_new_tokens", "max_rounds"))
    return args


def main(argv=None):
    args = parse_args(argv)
    return runner.main_guard(lambda: runner.run(args))


if __name__ == "__main__":
    main()
