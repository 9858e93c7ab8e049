"""What a decode step costs on the host, eager against compiled (issue 45), counted on a CPU.

    python bench/bench_decode_step.py                      # tiny Llama, float32 and NF4, eager and --compile
    python bench/bench_decode_step.py --tree /tmp/base45   # the eager rows on another checkout's engine

A debate-shaped workload (8 conversations, 3 turns of --new-tokens each, batches shrinking as claims end) goes
through engine.generate on a random Llama of --layers layers (the tiny shape of tests/tiny_models.py, widened by
the flags). For each mode it reports:
- python_one_token_forwards: calls of the model's Python forward that feed one token a row (sys.setprofile);
  compiled, the decode steps run inside the graph and never enter it;
- ops_per_step: top-level ATen operators the profiler sees per decode step (called from Python or from the
  compiled graph, not from inside another operator; torch.profiler over one turn, less a turn of one token, over
  the steps between), and per layer: what an eager step launches one by one, against the compiled graph's calls
  (on a CPU inductor's C++ kernels are not ATen operators; matmuls stay extern calls);
- host_syncs_per_step: calls of Tensor.tolist/.item/__bool__ from the engine's code per decode step (on a GPU
  each waits for the device);
- ms_per_step: the engine's decode-loop clock (debate.engine.step_stats.Stats), on this CPU;
- max_logit_difference_from_eager (compiled rows): one step's logits from the same cache, eager against compiled;
- the tokens, compared with the eager run's.
On a CPU there is no CUDA graph: the GPU figures (one replay a step) need bench/bench_gpu.py --preset compile.
"""
import argparse
import contextlib
import hashlib
import inspect
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402


def workload(engine, model, tok, compile_steps, new_tokens):
    systems = [f"Debate claim {i}. Evidence: " + "the report says so. " * (5 + i * 7 % 13) for i in range(8)]
    convs = [engine.Conversation(system=s) for s in systems]
    # `compile` only when asked for: an older checkout's Settings (--tree) has no such field.
    settings = engine.Settings(max_new_tokens=new_tokens, **({"compile": True} if compile_steps else {}))
    for turn, rows in enumerate((8, 6, 3)):
        engine.generate(model, tok, convs[:rows], [f"Round {turn}: answer claim {i}." for i in range(rows)], settings)
    return [c.generated for c in convs]


@contextlib.contextmanager
def counting_forwards(model, counts):
    code = inspect.unwrap(type(model).forward).__code__

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is code:
            ids = frame.f_locals.get("input_ids")
            if ids is not None and ids.shape[-1] == 1:
                counts["python_one_token_forwards"] += 1

    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(None)


@contextlib.contextmanager
def counting_syncs(counts):
    """Tensor.tolist, .item and bool() called from the engine's own code (debate/engine): the ways it brings a
    device's values to the host (on a GPU each waits for the device). A library's own calls (bitsandbytes' CPU
    kernels make some) are not the engine's and are not counted."""
    from debate import engine as wing  # the checkout's whose engine runs (--tree's, else this one's)

    originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "item", "__bool__")}
    engine_dir = str(Path(wing.__file__).parent)

    def wrap(name, fn):
        def counted(self, *args, **kwargs):
            if sys._getframe(1).f_code.co_filename.startswith(engine_dir):
                counts["host_syncs"] += 1
            return fn(self, *args, **kwargs)
        return counted

    for name, fn in originals.items():
        setattr(torch.Tensor, name, wrap(name, fn))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


def ops_per_step(engine, model, tok, compile_steps, new_tokens):
    """ATen operators a decode step launches: one turn of `new_tokens` less one turn of a single token (its prefill
    and bookkeeping), over the steps between them."""
    from torch.profiler import ProfilerActivity, profile

    def one(tokens):
        conv = engine.Conversation(system="Debate claim 1. Evidence: the report says so. " * 4)
        settings = engine.Settings(max_new_tokens=tokens, **({"compile": True} if compile_steps else {}))
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            engine.generate(model, tok, [conv], ["Round 0: answer."], settings,
                            stop_ids=[-1])  # no stop token: exactly `tokens` picks, tokens - 1 steps

        def top(event):  # an operator called from Python (or a compiled graph), not from inside another operator
            parent = event.cpu_parent
            while parent is not None and not parent.name.startswith("aten::"):
                parent = parent.cpu_parent
            return parent is None
        return sum(1 for e in prof.events() if e.name.startswith("aten::") and top(e))

    one(2)  # warm: the compile (if any) is not counted
    return (one(new_tokens) - one(1)) / (new_tokens - 1)


def logits_apart(model):
    """The largest difference between one decode step's logits run eagerly and through the compiled forward, from
    the same cache (4 rows, a 300-token context of random ids, each prefilled into its slot of a store)."""
    from debate.engine import decode_step, generator, kv_store

    if not hasattr(kv_store, "Store"):  # a tree from before batching by the step (issue 48): its own turn buffer
        return None
    generator_ = torch.Generator().manual_seed(0)
    rows, context, columns = 4, 300, 512
    ids = torch.randint(10, 400, (rows, context), generator=generator_)
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    with torch.inference_mode():
        store = kv_store.Store(kv_store.layer_shapes(model, dtype), (rows + 1) * columns, rows, columns)
        store.ready(columns)
        for row in range(rows):
            generator.prefill(model, store.slot_cache(row, 0), ids[row].tolist(), 0)
        from debate.engine import attention, compiled_step

        tokens, slots = torch.tensor([5, 6, 7, 8]), torch.arange(rows)
        lengths = torch.full((rows,), context)
        host = [(r, [r], [context]) for r in range(rows)]
        packed = attention.Packed(slots, torch.zeros(rows, dtype=torch.long), lengths,
                                  torch.ones(rows, dtype=torch.long), torch.empty(1), host, rows)
        cache = generator.cache_kwarg(model, store.step_cache(rows, context + 1, slots, lengths))
        args = (model, cache, tokens, lengths, slots, packed, torch.arange(context + 1),
                decode_step.layer_windows(model), decode_step.groups_of(model), dtype)
        decode_step.use_step_attention(model)
        eager = decode_step.forward(*args, "eager")  # each writes the token's keys and values at column 300
        compiled = compiled_step.compiled(model)(*args[:5], packed._replace(host=None, rows=None), *args[6:], "flex")
        return float((eager - compiled).abs().max())


def measure(args, four_bit, compile_steps):
    from debate.engine import engine, models

    try:
        from debate.engine import step_stats as decode_step  # where the steps' counts are since issue 59
    except ImportError:
        try:
            from debate.engine import decode_step
        except ImportError:  # a checkout from before the static decode step (--tree): no clock of its own
            decode_step = None
    loaded = models.load_model(args.model, use_4bit=four_bit)
    model, tok = loaded.model, loaded.tokenizer
    workload(engine, model, tok, compile_steps, 2)  # warm-up (the compile, when asked for)
    counts = {"python_one_token_forwards": 0, "host_syncs": 0}
    before = decode_step.stats_of(model) if decode_step else None
    before = (before.seconds, before.steps + before.eager_steps) if before else (0.0, 0)
    start = time.perf_counter()
    with counting_forwards(model, counts), counting_syncs(counts):
        tokens = workload(engine, model, tok, compile_steps, args.new_tokens)
    seconds = time.perf_counter() - start
    stats = decode_step.stats_of(model) if decode_step else None
    # Eagerly every decode step is one Python forward of one token; that is the count where no clock says.
    steps = stats.steps + stats.eager_steps - before[1] if stats else counts["python_one_token_forwards"]
    per_step = ops_per_step(engine, model, tok, compile_steps, args.new_tokens)
    apart = logits_apart(model) if compile_steps else None
    return {"weights": "nf4" if four_bit else "float32", "compiled": compile_steps, "seconds": round(seconds, 2),
            "decode_steps": steps, "max_logit_difference_from_eager": apart,
            "ms_per_step": round((stats.seconds - before[0]) / steps * 1000, 2) if stats else None,
            "python_one_token_forwards": counts["python_one_token_forwards"],
            "host_syncs_per_step": round(counts["host_syncs"] / steps, 2),
            "ops_per_step": round(per_step, 1), "ops_per_step_per_layer": round(per_step / args.layers, 1),
            "graphs": stats.graphs if stats else 0, "fallback": stats.failed if stats else None, "tokens": tokens,
            # to set the tokens beside another checkout's run (--tree) at a glance
            "tokens_sha1": hashlib.sha1(json.dumps(tokens).encode()).hexdigest()[:12]}


def build_model(args):
    from tests.tiny_models import build_tiny_llama

    out = Path(args.cache) / f"decode-step-llama-{args.layers}x{args.hidden}"
    if not (out / "config.json").exists():
        build_tiny_llama(out, seed=0, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=2)
    return out


def build_parser():
    """The flags (tests/test_docs.py checks the documented commands against them)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=24, help="tokens a turn (decode steps + 1)")
    p.add_argument("--no-4bit", dest="four_bit", action="store_false", help="float32 weights only")
    p.add_argument("--tree", help="run the eager workloads on this checkout's engine (e.g. the commit before)")
    p.add_argument("--cache", default=str(Path.home() / ".cache/debatecv/bench"))
    p.add_argument("--out", help="also write the JSON result here")
    p.add_argument("--model", help=argparse.SUPPRESS)
    return p


def main():
    args = build_parser().parse_args()
    args.model = args.model or str(build_model(args))
    if args.tree:  # another checkout's engine, eagerly (the commit before, say): imported from there
        sys.path.insert(0, str(Path(args.tree).resolve()))
        for name in [m for m in sys.modules if m == "debate" or m.startswith("debate.")]:
            del sys.modules[name]
    rows = []
    for four_bit in ([False, True] if args.four_bit else [False]):
        for compile_steps in ((False,) if args.tree else (False, True)):
            rows.append(measure(args, four_bit, compile_steps))
            eager = next(r for r in rows if r["weights"] == rows[-1]["weights"] and not r["compiled"])
            rows[-1]["same_tokens_as_eager"] = rows[-1]["tokens"] == eager["tokens"]
            # Replies (conversation turns) that differ: a compiled graph sums in another order, so a near-tie
            # between two tokens' logits can fall the other way (logits within ~1e-5 of the eager ones here).
            rows[-1]["replies_differing"] = sum(a != b for x, y in zip(rows[-1]["tokens"], eager["tokens"])
                                                for a, b in zip(x, y))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "tokens"}), flush=True)
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": torch.__version__,
              "engine": args.tree or str(ROOT),
              "machine": f"{os.uname().machine} CPU, {os.cpu_count()} cores", "layers": args.layers,
              "hidden": args.hidden, "new_tokens": args.new_tokens,
              "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in rows]}
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
