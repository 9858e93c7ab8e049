"""What a decode step's sampling costs (issue 58): `sampling.pick` alone, ms a call, on this CPU.

    python bench/bench_sampling.py                        # this checkout
    python bench/bench_sampling.py --tree /tmp/base58     # the same calls on another checkout's sampler
    python bench/bench_sampling.py --strays [--tree DIR]  # picks outside the nucleus or on masked tokens, counted

Rows of 1, 8 and 32 at Llama-3's vocabulary (128,256) and Gemma 3's (262,144), top_p 1 and 0.9, temperature 0.7.
The logits are real: the demo model's (Gemma 3 270M) at the last positions of a debate prompt, teacher-forced
(`--logits real`); Llama-3's width takes each row's first 128,256 ids. `--logits flat` draws them from a normal
distribution (every token within reach of the best: the worst case for a pruned race). Greedy argmax is timed
beside them as the floor. One thread (`--threads`), the median of `--repeats` calls after a warm-up.

`--strays` counts instead of timing, as issue 58 counted on e09519c: 400 rows of Llama-3's vocabulary (normal
logits, scale 2), temperature 0.7, 8 draws a row (keys 1..400, counts 0..7). At top_p 0.9: the picks outside the
nucleus, computed in float64 (a token is outside when the tokens strictly more probable than it already hold
top_p + 1e-4). At top_p 1 with half the tokens masked to -inf (a schema's banned tokens, each row's best kept): the
picks on a masked token.
"""
import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

PROMPT = ("You are the Moderator of a fact-checking debate. Claim: the city council approved a budget that cut "
          "school funding by 20 percent in 2023. Evidence: the council's minutes record a vote on the budget; a "
          "local newspaper reported that school funding fell by 4 percent; the mayor said the cut was 20 percent "
          "of the discretionary part. The Affirmative Debater argued that the minutes and the mayor's words "
          "support the claim. The Negative Debater answered that the newspaper's figure refutes it. Judge the "
          "round: summarise what is new, note the evidence gaps, and say whether the debate should go on, then "
          "give a verdict among Supported, Refuted, Not Enough Evidence and Conflicting Evidence.")


def load_sampling(tree):
    if tree is None:
        from debate.engine import sampling
        return sampling
    spec = importlib.util.spec_from_file_location("other_sampling", Path(tree) / "debate/engine/sampling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def real_logits(rows):
    """The demo model's logits at the prompt's last `rows` positions (float32, rows x 262,144)."""
    from debate.engine import gguf, models
    loaded = models.load_model(gguf.default_model_path(), use_4bit=False, dtype=torch.float32, device="cpu")
    ids = loaded.tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.inference_mode():
        logits = loaded.model(input_ids=ids).logits[0, -rows:].float()
    return logits


def strays(sampling, rows=400, draws=8, vocab=128_256):
    """(picks outside the nucleus at top_p 0.9, picks on a masked token at top_p 1, picks in all) of each run."""
    gen = torch.Generator().manual_seed(58)
    logits = torch.randn(rows, vocab, generator=gen) * 2
    temperature = torch.full((rows,), 0.7)
    keys = torch.arange(1, rows + 1, dtype=torch.long)
    probs = torch.softmax(logits.double() / 0.7, dim=-1)
    masked = torch.rand(rows, vocab, generator=gen) < 0.5
    masked[torch.arange(rows), logits.argmax(dim=-1)] = False
    banned = logits.masked_fill(masked, float("-inf"))
    outside = on_masked = 0
    for count in range(draws):
        counts = torch.full((rows,), count, dtype=torch.long)
        chosen = sampling.pick(logits, temperature, torch.full((rows,), 0.9), keys, counts, True, True)
        p = probs.gather(1, chosen[:, None])
        # the mass of the tokens strictly more probable than the pick
        before = (probs * (probs > p)).sum(dim=-1)
        outside += int((before >= 0.9 + 1e-4).sum())
        chosen = sampling.pick(banned, temperature, torch.ones(rows), keys, counts, True, False)
        on_masked += int(masked.gather(1, chosen[:, None]).sum())
    return outside, on_masked, rows * draws


def timed(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", help="another checkout whose debate/engine/sampling.py is timed")
    parser.add_argument("--logits", choices=("real", "flat"), default="real")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--vocabs", type=int, nargs="+", default=[128_256, 262_144])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="write the table here too")
    parser.add_argument("--strays", action="store_true", help="count picks outside the nucleus or on masked tokens")
    return parser


def main():
    args = build_parser().parse_args()
    torch.set_num_threads(args.threads)
    sampling = load_sampling(args.tree)
    if args.strays:
        outside, on_masked, picks = strays(sampling)
        print(f"sampler: {args.tree or 'this checkout'}; {picks:,} picks each: {outside} outside the nucleus "
              f"(top_p 0.9), {on_masked} on a masked token (top_p 1)")
        return
    most = max(args.rows)
    if args.logits == "real":
        base = real_logits(most)
    else:
        base = torch.randn(most, max(args.vocabs), generator=torch.Generator().manual_seed(0)) * 2
    out = []
    print(f"sampler: {args.tree or 'this checkout'}; logits: {args.logits}; {args.threads} thread(s)")
    print(f"{'vocab':>8} {'rows':>5} {'greedy':>8} {'top_p 1':>8} {'top_p .9':>9}  (ms a pick)")
    for vocab in args.vocabs:
        for rows in args.rows:
            logits = base[:rows, :vocab].contiguous()
            temperature = torch.full((rows,), 0.7)
            keys = torch.arange(rows, dtype=torch.long) * 7919 + 1
            counts = torch.arange(rows, dtype=torch.long)
            row = {"vocab": vocab, "rows": rows}
            row["greedy_ms"] = timed(lambda: logits.argmax(dim=-1), args.repeats)
            for top_p, name in ((1.0, "top_p_1_ms"), (0.9, "top_p_0.9_ms")):
                p = torch.full((rows,), top_p)
                row[name] = timed(lambda: sampling.pick(logits, temperature, p, keys, counts, True, top_p < 1),
                                  args.repeats)
            out.append(row)
            print(f"{vocab:>8} {rows:>5} {row['greedy_ms']:>8.2f} {row['top_p_1_ms']:>8.2f} "
                  f"{row['top_p_0.9_ms']:>9.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
