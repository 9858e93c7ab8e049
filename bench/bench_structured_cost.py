"""What structured answers cost in the courtroom: seconds and tokens fed per turn and per reflection, the
most rows any model call ran, and the process's peak memory (issue 37).

    python bench/bench_structured_cost.py --limit 2 --out bench/out/structured-cost \
        -- --max-new-tokens 96
    python bench/bench_structured_cost.py --tree /tmp/base ...      # the same run on another commit's code

Runs `run_debate.py --method courtroom` once (one trial, the paper's caps, Check-COVID's binary test claims
by default) with the engine's batch function timed: every call of `debate.engine.generator.run` is one batch
of turns, and a forward hook on its model counts the calls and the positions fed (padding included: a
padded position costs what a real one does). A turn is one row of a batch; a reflection is a row whose
answer schema is the counsels' self-reflection. `--tree DIR` imports the code from DIR instead (a commit
unpacked with `git archive COMMIT | tar -x -C DIR`), so two commits run the same measurement one after the
other. The timing wraps a function both commits have, so the script itself never changes what it times. Trees
that batch by the step (issue 48 on) have no such function: a turn shares its steps with others; the script says so.

`--reflection-tokens N` times one counsel's self-reflection alone instead (the issue's 140 s case): the embedded
model, the reflection prompt file filled with Check-COVID corpus sentences up to about N tokens, its schema,
greedy, 96 new tokens, `--repeat` times; printed: seconds (each and the median), model calls, positions fed and
the most rows of a call.
"""
import argparse
import json
import resource
import shlex
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFLECTION = "counsel_reflection"
DEFAULT_DATA = "--dataset check-covid --split test-binary --data-dir ../shared/data/check-covid"


def instrument(generator_module, calls):
    """Wrap generator.run so each batch appends {seconds, rows, schemas, forwards, fed, max_rows} to `calls`."""
    if not hasattr(generator_module, "run"):
        raise SystemExit("this tree batches by the step (issue 48): a turn has no batch of its own to time, its steps "
                         "shared with other turns; run this benchmark on a tree from before (--tree), and "
                         "bench/bench_gpu.py --turn-lengths for this one")
    original = generator_module.run

    def timed(model, tokenizer, convs, targets, settings, stop_ids, generator, schemas, pad_id):
        seen = {"forwards": 0, "fed": 0, "max_rows": 0}

        def hook(_module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is not None:
                seen["forwards"] += 1
                seen["fed"] += ids.numel()
                seen["max_rows"] = max(seen["max_rows"], ids.shape[0])

        handle = model.register_forward_pre_hook(hook, with_kwargs=True)
        start = time.perf_counter()
        try:
            return original(model, tokenizer, convs, targets, settings, stop_ids, generator, schemas, pad_id)
        finally:
            handle.remove()
            names = [None if s is None else s.spec.name for s in (schemas or [None] * len(convs))]
            calls.append({"seconds": time.perf_counter() - start, "rows": len(convs), "schemas": names,
                          "context": [len(t) for t in targets], **seen})

    generator_module.run = timed


def summarise(calls):
    """Per turn, per reflection, per schema: seconds and positions fed, split evenly over a batch's rows."""
    by_schema = defaultdict(lambda: {"turns": 0, "seconds": 0.0, "fed": 0, "forwards": 0, "context": 0})
    for c in calls:
        for name, context in zip(c["schemas"], c["context"]):
            s = by_schema[name or "free text"]
            s["turns"] += 1
            s["seconds"] += c["seconds"] / c["rows"]
            s["fed"] += c["fed"] / c["rows"]
            s["forwards"] += c["forwards"] / c["rows"]
            s["context"] += context
    turns = sum(c["rows"] for c in calls)
    total = sum(c["seconds"] for c in calls)
    reflection = by_schema.get(REFLECTION, {"turns": 0})

    def per(s, k):
        return s[k] / s["turns"] if s["turns"] else None

    return {
        "batches": len(calls), "turns": turns, "generate_seconds": total,
        "seconds_per_turn": total / turns if turns else None,
        "reflections": reflection["turns"],
        "seconds_per_reflection": per(reflection, "seconds") if reflection["turns"] else None,
        "fed_per_reflection": per(reflection, "fed") if reflection["turns"] else None,
        "forwards_per_reflection": per(reflection, "forwards") if reflection["turns"] else None,
        "prompt_per_reflection": per(reflection, "context") if reflection["turns"] else None,
        "max_rows_in_a_call": max((c["max_rows"] for c in calls), default=0),
        "max_rows_in_a_batch": max((c["rows"] for c in calls), default=0),
        "by_schema": {k: {"turns": v["turns"], "seconds_per_turn": v["seconds"] / v["turns"],
                          "fed_per_turn": v["fed"] / v["turns"], "prompt_per_turn": v["context"] / v["turns"]}
                      for k, v in sorted(by_schema.items())},
    }


def reflection_only(args, calls):
    """One reflection at a ~N-token prompt through engine.generate, as a counsel turn makes it."""
    import statistics

    from debate.engine import engine, gguf, models
    try:
        from debate.engine import schema_program
    except ImportError:  # a --tree from before the module's rename (issue 40)
        from debate.engine import schema as schema_program
    loaded = models.load_model(gguf.default_model_path())
    model, tok = loaded.model, loaded.tokenizer
    docs = [json.loads(line) for line in Path(args.corpus).read_text(encoding="utf-8").splitlines() if line.strip()]
    sentences = [s for doc in docs for s in doc.get("abstract", []) if isinstance(s, str)]
    template = (Path(args.tree or ROOT) / "prompts" / "counsel_reflection.txt").read_text(encoding="utf-8")
    filler, used = [], 0
    for s in sentences:  # the counsel's arguments so far, long enough to make the prompt about N tokens
        if used >= args.reflection_tokens:
            break
        filler.append(s)
        used += len(tok(s, add_special_tokens=False)["input_ids"]) + 1
    text = template.format_map(defaultdict(str, side="plaintiff", opponent="defense", round=3,
                                           claim="Masks reduce the spread of COVID-19.", own=" ".join(filler)))
    compiled = schema_program.compile_for("counsel_reflection", tok)
    settings = engine.Settings(max_new_tokens=96, temperature=0.0)
    seconds = []
    for _ in range(args.repeat):
        conv = engine.Conversation(system="You are counsel in a courtroom debate about a claim.")
        before = len(calls)
        engine.generate(model, tok, [conv], [text], settings, schemas=[compiled])
        seconds.append(sum(c["seconds"] for c in calls[before:]))
    last = calls[-1]
    return {"prompt_tokens": last["context"][0], "seconds": seconds, "median_seconds": statistics.median(seconds),
            "forwards": last["forwards"], "fed": last["fed"], "max_rows_in_a_call": last["max_rows"],
            "fields": conv.structured and conv.structured.get("fields")}


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="flags after -- go to run_debate.py")
    p.add_argument("--tree", help="import the code from this directory (another commit unpacked) instead")
    p.add_argument("--out", default=str(ROOT / "bench" / "out" / "structured-cost"))
    p.add_argument("--data", default=DEFAULT_DATA, help=f"the data flags (default: {DEFAULT_DATA!r})")
    p.add_argument("--limit", type=int, default=2, help="the first N claims (default: 2)")
    p.add_argument("--reflection-tokens", type=int, help="time one reflection at a prompt of about N tokens instead")
    p.add_argument("--repeat", type=int, default=3, help="with --reflection-tokens: how many times (default: 3)")
    p.add_argument("--corpus", default=str(ROOT.parent / "shared" / "data" / "check-covid" / "corpus.json"),
                   help="with --reflection-tokens: the sentences that fill the prompt")
    return p


def main(argv=None):
    args, extra = build_parser().parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    tree = Path(args.tree).resolve() if args.tree else ROOT
    sys.path.insert(0, str(tree))
    import run_debate
    from debate.engine import generator as generator_module
    assert Path(generator_module.__file__).resolve().is_relative_to(tree), generator_module.__file__
    calls = []
    instrument(generator_module, calls)
    if args.reflection_tokens:
        result = {"tree": str(tree), "peak_rss_mib": None, **reflection_only(args, calls)}
        result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(result, indent=2))
        return result
    argv = ["--method", "courtroom", *shlex.split(args.data), "--limit", str(args.limit),
            "--output-dir", args.out, "--overwrite", *extra]
    start = time.perf_counter()
    run_debate.main(argv)
    wall = time.perf_counter() - start
    result = {"tree": str(tree), "argv": argv, "wall_seconds": wall,
              "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **summarise(calls)}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "cost.json").write_text(json.dumps({**result, "calls": calls}, indent=1) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
