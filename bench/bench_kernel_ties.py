"""How far a logit moves between two ways of computing the same model, and so how close two logits must be for a
greedy token to flip: the basis of tests/token_match.py's TIE_TOLERANCE (issue 52).

    python bench/bench_kernel_ties.py --out bench/out/kernel_ties.json

For each model (the tests' tiny Llama and Gemma 3 in float32, the tiny Llama in NF4 through bitsandbytes' CPU
kernels) it decodes debate-like turns greedily with the plain reference path (debate/engine/reference.py), then at
every step's prefix computes the next token's logits four ways:
- `alone`: one full forward pass of the prefix (the reference's own computation),
- `beside`: the same prefix as one row of a batch of 8 prefixes of other lengths, right-padded (other rows in the
  matrix products, as in the engine's batch),
- `cached`: the prefix but its last token encoded first, the last token then one step over that KV cache,
and each of these in a fresh process under `ATEN_CPU_CAPABILITY=avx2` and under `avx512` (torch's CPU kernels; on a
CPU without AVX-512 the second is avx2 again). It reports the largest |logit change| and the largest change of the
top-two gap between every pair of ways (the kernel sets compared on the same prefixes), the smallest top-two gaps
the steps had, and how many steps had a gap within a few candidate tolerances.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# transformers 5.25 asks for hub kernels by default (use_kernels) and refuses to load an NF4 model when the offline
# guard (debate/engine/offline.py) has hidden the `kernels` package it depends on: no hub kernels here.
os.environ.setdefault("USE_HUB_KERNELS", "NO")

import torch  # noqa: E402

from tests.tiny_models import build_tiny_gemma, build_tiny_llama  # noqa: E402

SYSTEMS = [f"Debate claim {i}. Evidence: " + "the report says so. " * (i * 5 % 11) for i in range(4)]
TOLERANCES = (1e-3, 1e-2, 2e-2, 5e-2, 0.1)


def build(cache):
    cache = Path(cache)
    if not (cache / "llama" / "config.json").exists():
        build_tiny_llama(cache / "llama", seed=0)
    if not (cache / "gemma" / "config.json").exists():
        build_tiny_gemma(cache / "gemma", seed=0)
    return {"llama": (cache / "llama", False), "gemma": (cache / "gemma", False), "llama-nf4": (cache / "llama", True)}


def prefixes(model, tok, turns=3, max_new_tokens=12):
    """Every greedy step's prefix of debate-like conversations decoded by the reference path."""
    from debate.engine import chat, engine, reference

    convs = [engine.Conversation(system=s) for s in SYSTEMS]
    out = []
    for turn in range(turns):
        for i, conv in enumerate(convs):
            prompt = f"Round {turn}: answer claim {i}." + " Really?" * (i % 3)
            context = chat.context_ids(tok, engine.Conversation(conv.system, conv.messages + [
                {"role": "user", "content": prompt}], list(conv.generated)))
            reference.generate(model, tok, [conv], [prompt], engine.Settings(max_new_tokens=max_new_tokens))
            reply = conv.generated[-1]
            out += [context + reply[:k] for k in range(len(reply) + 1)]
    return out


@torch.inference_mode()
def ways(model, prefix_list):
    """{way: [logits after each prefix]}."""
    import inspect

    # transformers 5 renamed the forward's `past_key_values` to `cache` (the old name warns)
    cache_name = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    alone, beside, cached = [], [], []
    for n, ids in enumerate(prefix_list):
        alone.append(model(input_ids=torch.tensor([ids])).logits[0, -1].float())
        # Seven other prefixes of other lengths beside it, right-padded: its own positions and keys are unchanged.
        rows = [ids] + [prefix_list[(n + 7 * k) % len(prefix_list)] for k in range(1, 8)]
        width = max(len(r) for r in rows)
        batch = torch.tensor([r + [0] * (width - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        beside.append(model(input_ids=batch, attention_mask=mask).logits[0, len(ids) - 1].float())
        first = model(input_ids=torch.tensor([ids[:-1]]), use_cache=True)
        step = model(input_ids=torch.tensor([ids[-1:]]), **{cache_name: first.past_key_values})
        cached.append(step.logits[0, -1].float())
    return {"alone": torch.stack(alone), "beside": torch.stack(beside), "cached": torch.stack(cached)}


def dump(cache, out):
    from debate.engine import models

    result = {}
    for name, (path, nf4) in build(cache).items():
        loaded = models.load_model(str(path), use_4bit=nf4)
        found = prefixes(loaded.model, loaded.tokenizer)
        result[name] = {"prefixes": found, **ways(loaded.model, found)}
    torch.save({"capability": torch.backends.cpu.get_cpu_capability(), "models": result}, out)


def top2_gap(logits):
    top = torch.topk(logits, 2, dim=-1).values
    return top[..., 0] - top[..., 1]


def compare(files):
    runs = {cap: torch.load(f) for cap, f in files.items()}
    report = {"capabilities": {cap: run["capability"] for cap, run in runs.items()}, "models": {}}
    for name in next(iter(runs.values()))["models"]:
        # Ways under each kernel set, on the prefixes both kernel sets reached (a tie may have led them apart).
        keyed = {}
        for cap, run in runs.items():
            data = run["models"][name]
            for way in ("alone", "beside", "cached"):
                keyed[f"{cap}/{way}"] = {tuple(p): data[way][i] for i, p in enumerate(data["prefixes"])}
        common = set.intersection(*(set(k) for k in keyed.values()))
        order = sorted(common)
        stacked = {k: torch.stack([v[p] for p in order]) for k, v in keyed.items()}
        ref = stacked[f"{next(iter(runs))}/alone"]
        pairs = {}
        keys = list(stacked)
        for a in range(len(keys)):
            for b in range(a + 1, len(keys)):
                x, y = stacked[keys[a]], stacked[keys[b]]
                # The change of the gap between the reference's top two tokens, read in both.
                top = torch.topk(ref, 2, dim=-1).indices
                gx = x.gather(1, top[:, :1]) - x.gather(1, top[:, 1:])
                gy = y.gather(1, top[:, :1]) - y.gather(1, top[:, 1:])
                pairs[f"{keys[a]} vs {keys[b]}"] = {"max_logit_change": float((x - y).abs().max()),
                                                      "max_gap_change": float((gx - gy).abs().max()),
                                                      "argmax_differs": int((x.argmax(-1) != y.argmax(-1)).sum())}
        gaps = top2_gap(ref)
        report["models"][name] = {
            "steps": len(order), "logit_range": [float(ref.min()), float(ref.max())],
            "smallest_gaps": sorted(float(g) for g in gaps)[:5],
            "steps_within": {str(t): int((gaps <= t).sum()) for t in TOLERANCES},
            "largest_logit_change": max(p["max_logit_change"] for p in pairs.values()),
            "largest_gap_change": max(p["max_gap_change"] for p in pairs.values()),
            "pairs": pairs,
        }
    return report


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", default=None, help="where the tiny models are built (default: a temporary dir)")
    parser.add_argument("--out", default=None, help="write the report here as JSON")
    parser.add_argument("--dump", default=None, help=argparse.SUPPRESS)  # the child's job: one kernel set's logits
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.dump:
        dump(args.cache, args.dump)
        return
    with tempfile.TemporaryDirectory() as tmp:
        cache = args.cache or tmp
        files = {}
        for cap in ("avx2", "avx512"):
            files[cap] = str(Path(tmp) / f"{cap}.pt")
            env = {**os.environ, "ATEN_CPU_CAPABILITY": cap}
            subprocess.run([sys.executable, __file__, "--cache", cache, "--dump", files[cap]], env=env, check=True)
        report = compare(files)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
