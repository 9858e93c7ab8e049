"""DebateCV throughput on one GPU with a random-weight model of Llama-3.1-8B's shape, through the real runner.

    python bench/bench_gpu.py --claims 32 --batch-size 32                 # the full matrix on a GPU
    python bench/bench_gpu.py --tiny --claims 4 --batch-size 4 --turns 16  # CPU smoke run, a tiny model
    python bench/bench_gpu.py --preset compile --out bench/out/compile.json  # the compiled decode step (issue 45)
    python bench/bench_gpu.py --preset compile --tiny --claims 4           # the same on a CPU, a tiny model

It builds the checkpoint itself, once, under --cache: a byte-level BPE tokenizer trained on the AVeriTeC dev
claim text (Llama-3's special tokens and a Llama-3-like chat template) and random bf16 weights of the 8B
shape (16 GB; --tiny: a 4-layer model of the same family). Then for each setting of the matrix (KV reuse
on/off x 4-bit NF4/bf16 x --turns token limits x continuous/fixed batching) it runs DebateCV, 3 rounds + final, greedy,
over the first
--claims dev claims with HerO's retrieved evidence, by `run_debate.main`, and prints claims/h, completion
tokens/s, peak GPU memory, mean GPU utilisation (sampled in a thread) and the engine's Python time per model
call (engine time outside the model's forward, over the forward calls). 4-bit needs bitsandbytes and CUDA;
on CPU only bf16/fp32 rows run. A random model never ends a turn early; with --no-structured (the default
here) its Moderator never stops the debate either, so every claim takes the heaviest shape a debate can.

`--preset compile` (the check of the compiled decode step, sized for about 8 minutes on one H100, unmeasured
until a GPU is lent: building the 16 GB checkpoint the first time adds a minute or two) keeps each precision's
model loaded for all its rows (debate.api.Verifier, one load per precision): NF4, then bf16; for each, a warm-up
of 2 claims that compiles the step, then the timed rows: compiled, 32 claims at batch 32, 3 rounds + final with
192-token turns; eager, the same claims with --eager-rounds (1 by default, to fit the time; a step's cost does not
depend on the round). No synchronising hook in any timed row: the decode steps' time is the engine's own
(debate.engine.step_stats.Stats: each step's device time, from CUDA events around it read with the step's packet,
and beside it the host's time launching it; on a CPU both are the step's wall time).
One JSON: claims/hour, completion tokens/s, ms per decode step, peak GPU memory, graphs compiled, CUDA graphs.

`--turn-lengths MEAN` (off by default; the matrix and the preset both take it) ends each free reply at a drawn
length, as vLLM's serving benchmark fixes each request's output length: a lognormal with that mean and sigma 0.6,
capped by the turn's --turns limit, drawn from a generator seeded by --seed and the reply's context ids (so the same
reply gets the same length however it is batched, and the same seed gives the same records). A random model never
stops a reply early by itself; real replies do, and rows that stop early sit idle in a batch formed by the turn.
Each row reports the decode steps' occupancy: tokens they produced over the rows they ran.
"""
import argparse
import datetime
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import run_debate  # noqa: E402
from debate.engine import engine  # noqa: E402
from tests.tiny_models import BOS, CHAT_TEMPLATE, EOT, PAD, SPECIAL_TOKENS  # noqa: E402

LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8, max_position_embeddings=131072, rope_theta=500000.0)
TINY = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=4, max_position_embeddings=16384)


TURN_SIGMA = 0.6  # --turn-lengths: the lognormal's sigma (the simulation's)


def turn_lengths(mean, seed):
    """A reply's drawn length from its context ids: lognormal with `mean` and TURN_SIGMA (mu = ln(mean) - sigma^2 / 2),
    seeded by `seed` and the ids, so a reply's length does not depend on the batch it runs in."""
    mu = math.log(mean) - TURN_SIGMA ** 2 / 2

    def cap(context_ids):
        key = zlib.crc32(b"%d:" % seed + ",".join(map(str, context_ids)).encode())
        gen = torch.Generator().manual_seed(key)
        normal = float(torch.randn((), generator=gen))
        return max(1, round(math.exp(mu + TURN_SIGMA * normal)))

    return cap


def set_turn_lengths(args):
    """Install --turn-lengths' cap in the engine (None: every reply runs to its stop or --turns)."""
    try:
        from debate.engine import decode_batch as holder  # where the engine keeps the cap
    except ImportError:  # the commit before batching by the step (0190a6d) kept it in the generator
        from debate.engine import generator as holder

    holder.reply_cap = turn_lengths(args.turn_lengths, args.seed) if args.turn_lengths else None


def occupancy(out_dir):
    """The decode steps' occupancy of a run, from its config.json (each distinct model once)."""
    config = json.loads((Path(out_dir) / "config.json").read_text())
    decodes = {json.dumps(m.get("decode"), sort_keys=True): m.get("decode") for m in config["models"].values()}
    tokens = sum(d.get("decode_tokens", 0) for d in decodes.values() if d)
    rows = sum(d.get("decode_row_steps", 0) for d in decodes.values() if d)
    return round(tokens / rows, 4) if rows else None


def claim_texts(data_dir):
    claims = json.loads((Path(data_dir) / "dev.json").read_text())
    return [c["claim"] for c in claims]


def build_tokenizer(texts, vocab_size):
    """Byte-level BPE learnt from `texts`, with Llama-3's special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(texts, trainer=trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token=BOS, eos_token=EOT, pad_token=PAD,
                                  clean_up_tokenization_spaces=False)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def checkpoint(cache, tiny, data_dir, vocab_size):
    """The random checkpoint's directory, built on first use (weights made on the GPU when there is one)."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = Path(cache) / f"random-{'tiny' if tiny else 'llama-3.1-8b'}-averitec-bpe{vocab_size}"
    if (out / "config.json").exists():
        return out
    tok = build_tokenizer(claim_texts(data_dir), vocab_size)
    config = LlamaConfig(**(TINY if tiny else LLAMA_8B), vocab_size=len(tok), tie_word_embeddings=False,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         initializer_range=0.2 if tiny else 0.02)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).to(torch.bfloat16 if device == "cuda" else torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    tmp = out.with_name(out.name + ".partial")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(out)
    return out


class Utilisation:
    """Mean GPU utilisation (%) sampled every 0.2 s in a thread: torch.cuda.utilization (pynvml) or nvidia-smi."""

    def __init__(self):
        self.samples, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self):
        try:
            return torch.cuda.utilization()
        except Exception:
            out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i",
                                  str(torch.cuda.current_device())], capture_output=True, text=True, timeout=5)
            return float(out.stdout.split()[0])

    def _run(self):
        while not self._stop.wait(0.2):
            try:
                self.samples.append(self._sample())
            except Exception:
                return

    def __enter__(self):
        if torch.cuda.is_available():
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def mean(self):
        return round(sum(self.samples) / len(self.samples), 1) if self.samples else None


class EngineClock:
    """Time inside engine.generate and inside the model's forward calls, to tell Python overhead apart."""

    def __init__(self):
        self.engine_s = self.forward_s = 0.0
        self.calls = 0
        self._hooked, self._start = set(), None

    def _pre(self, module, args, kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self._start = time.perf_counter()

    def _post(self, module, args, kwargs, output):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.forward_s += time.perf_counter() - self._start
        self.calls += 1

    def wrap(self, generate):
        def timed(model, *args, **kwargs):
            if id(model) not in self._hooked:
                self._hooked.add(id(model))
                model.register_forward_pre_hook(self._pre, with_kwargs=True)
                model.register_forward_hook(self._post, with_kwargs=True)
            start = time.perf_counter()
            try:
                return generate(model, *args, **kwargs)
            finally:
                self.engine_s += time.perf_counter() - start
        return timed


class ForwardCount:
    """Every forward of the run's models, counted from outside the engine by its inputs: decode steps (one token a
    row), forwards that carry prompt tokens beside decode rows (a step's packed sequence) and forwards of
    prompt tokens alone (a prefill piece, or a mixed forward with no decode row), and the prompt tokens they carry.
    The same count on the commit before (copy this script into its tree): there every prompt runs alone."""

    def __init__(self):
        self.decode = self.mixed = self.prefill_only = self.prompt_tokens = self.mixed_rows = 0
        self._hooked = set()

    def note(self, module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is None:
            return
        packed = kwargs.get("packed")  # a step's packed sequence (issue 59): its decode rows first, then prompt pieces
        rows = packed.rows if packed is not None else None
        if packed is not None and rows is not None and ids.shape[1] > rows:
            self.prompt_tokens += ids.shape[1] - rows
            self.mixed_rows += rows
            if rows:
                self.mixed += 1
            else:
                self.prefill_only += 1
        elif packed is not None and rows is not None:
            self.decode += 1
            return
        elif ids.shape[1] == 1:
            self.decode += 1
        else:
            self.prefill_only += 1
            self.prompt_tokens += ids.numel()

    def hook(self, models):
        for model in models:
            if id(model) not in self._hooked:
                self._hooked.add(id(model))
                model.register_forward_pre_hook(self.note, with_kwargs=True)

    def as_record(self):
        return {"forwards": self.decode + self.mixed + self.prefill_only, "decode_only": self.decode,
                "mixed": self.mixed, "mixed_decode_rows": self.mixed_rows, "prefill_only": self.prefill_only,
                "prompt_tokens": self.prompt_tokens}


def run_once(path, args, reuse, four_bit, turn_tokens, out_dir, continuous=None):
    argv = ["--split", "dev", "--data-dir", args.data_dir, "--evidence", "retrieved", "--method", "debatecv",
            "--model", str(path), "--limit", str(args.claims), "--batch-size", str(args.batch_size),
            "--max-new-tokens", str(turn_tokens), "--max-rounds", "3", "--temperature", "0",
            "--output-dir", str(out_dir)]
    argv += [] if reuse else ["--no-cache-reuse"]
    argv += [] if four_bit else ["--no-4bit"]
    argv += [] if args.structured else ["--no-structured"]
    argv += [] if continuous is None else ["--continuous" if continuous else "--no-continuous"]
    argv += ["--gpu-memory-fraction", str(args.gpu_memory_fraction)] if args.gpu_memory_fraction is not None else []
    argv += ["--prefill-tokens", str(args.prefill_tokens)] if args.prefill_tokens is not None else []
    clock = EngineClock()
    original = engine.generate
    engine.generate = clock.wrap(original)
    from debate.engine import models as engine_models

    count, load_roles = ForwardCount(), engine_models.load_roles

    def counted_roles(*a, **kw):
        roles = load_roles(*a, **kw)
        count.hook({id(r.model): r.model for r in roles.values()}.values())
        return roles

    engine_models.load_roles = counted_roles
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    try:
        with Utilisation() as util:
            code = run_debate.main(argv)
    finally:
        engine.generate = original
        engine_models.load_roles = load_roles
    seconds = time.perf_counter() - start
    preds = [json.loads(line) for line in (Path(out_dir) / "predictions.jsonl").read_text().splitlines()]
    completion = sum(p["completion_tokens"] for p in preds)
    return {
        "reuse_cache": reuse, "4bit": four_bit, "turn_tokens": turn_tokens, "continuous": continuous,
        "claims": len(preds), "exit": code,
        "seconds": round(seconds, 1), "claims_per_hour": round(len(preds) / seconds * 3600, 1),
        "completion_tokens_per_s": round(completion / seconds, 1),
        "completion_tokens_per_claim": round(completion / len(preds)),
        "context_tokens_per_claim": round(sum(p["prompt_tokens"] for p in preds) / len(preds)),
        "encoded_tokens_per_claim": round(sum(p["encoded_tokens"] for p in preds) / len(preds)),
        "peak_gpu_memory_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available()
        else None,
        "mean_gpu_utilisation_pct": util.mean(),
        "engine_python_ms_per_model_call": round((clock.engine_s - clock.forward_s) / max(clock.calls, 1) * 1000, 2),
        "model_calls": clock.calls,
        "turn_lengths": args.turn_lengths,
        "occupancy": occupancy(out_dir),
        "forwards": count.as_record(),
    }


def preset_compile(args, path):
    """The compiled-decode check (module doc): one row per precision and mode, each model loaded once."""
    from dataclasses import replace

    from debate import api
    try:  # where the steps' counts are since issue 59; an older tree (the commit before) kept them here
        from debate.engine import step_stats as decode_step
    except ImportError:
        from debate.engine import decode_step
    from debate.pipeline import config as run_config
    from tests.tiny_models import bench_claims

    claims, source = bench_claims(args.claims, "retrieved")
    claims = [{"claim_id": c["claim_id"], "claim": c["claim"], "evidence": c["evidence"], "label": c.get("label")}
              for c in claims]
    try:
        import bitsandbytes  # noqa: F401
        precisions = [True, False] if torch.cuda.is_available() else [False]
    except ImportError:
        precisions = [False]
    rows = []
    for four_bit in precisions:
        config = run_config.build(method="debatecv", model=str(path), max_new_tokens=args.turns[0], max_rounds=3,
                                  temperature=0.0, structured=args.structured, use_4bit=four_bit,
                                  batch_size=args.batch_size, compile=True)
        start = time.perf_counter()
        verifier = api.Verifier(config)
        loaded_s = time.perf_counter() - start
        model = next(iter(verifier.agents.values())).model
        start = time.perf_counter()
        verifier.verify(claims[:2])  # compiles the step (two rows: the one dynamic graph every bucket shares)
        warm_s = time.perf_counter() - start
        for compiled in (True, False):
            verifier.settings = replace(verifier.settings, compile=compiled)
            verifier.options["max_rounds"] = 3 if compiled else args.eager_rounds
            batch = claims if compiled else claims[:args.eager_claims]
            before = decode_step.stats_of(model)
            before = ((before.seconds, before.steps + before.eager_steps, before.tokens, before.row_steps,
                       before.launch_seconds) if before else (0.0, 0, 0, 0, 0.0))
            if torch.cuda.is_available():
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            preds = verifier.verify(batch)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            stats = decode_step.stats_of(model)
            steps = stats.steps + stats.eager_steps - before[1]
            completion = sum(p["completion_tokens"] for p in preds)
            rows.append({
                "precision": "nf4" if four_bit else ("bf16" if torch.cuda.is_available() else "fp32"),
                "compiled": compiled, "claims": len(preds), "rounds": verifier.options["max_rounds"],
                "turn_tokens": args.turns[0], "seconds": round(seconds, 1),
                "claims_per_hour": round(len(preds) / seconds * 3600, 1),
                "completion_tokens_per_s": round(completion / seconds, 1),
                "decode_steps": steps,
                # the device's time a step (CUDA events around each step), and the host's time launching one
                "ms_per_decode_step": round((stats.seconds - before[0]) / max(steps, 1) * 1000, 2),
                "host_launch_ms_per_decode_step": round((stats.launch_seconds - before[4]) / max(steps, 1) * 1000, 2),
                "turn_lengths": args.turn_lengths,
                "occupancy": round((stats.tokens - before[2]) / max(stats.row_steps - before[3], 1), 4),
                "peak_gpu_memory_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2)
                if torch.cuda.is_available() else None,
                "graphs_compiled": stats.graphs, "cuda_graphs": stats.cuda_graphs, "fallback": stats.failed,
                "load_seconds": round(loaded_s, 1), "warm_up_seconds": round(warm_s, 1),
            })
            print(json.dumps(rows[-1]), flush=True)
        verifier.close()
    return rows, source


def build_parser():
    """The flags (tests/test_docs.py checks the documented commands against them)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="a small random model of the same family (CPU smoke run)")
    p.add_argument("--claims", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--turns", type=int, nargs="+", default=[192, 512], help="--max-new-tokens values to run")
    p.add_argument("--reuse", choices=("on", "off", "both"), default="both")
    p.add_argument("--precision", choices=("4bit", "bf16", "both"), default="both",
                   help="4-bit runs only on CUDA with bitsandbytes; bf16 means fp32 on CPU (the loader's choice)")
    p.add_argument("--structured", action="store_true", help="decode the Moderator's JSON under its schema "
                   "(the run's default); off here so every claim runs 3 rounds + final")
    p.add_argument("--batching", choices=("continuous", "fixed", "both", "default"), default="both",
                   help="continuous batching, fixed batches, both, or the run's default without the flag "
                   "(for code from before --continuous existed)")
    p.add_argument("--gpu-memory-fraction", type=float, help="passed to the run (default: the run's own)")
    p.add_argument("--prefill-tokens", type=int, help="passed to the run (default: the run's own; the commit before "
                   "issue 53 has no such flag)")
    p.add_argument("--preset", choices=("compile",), help="compile: the compiled decode step's check (module doc) "
                   "instead of the matrix (default: the matrix)")
    p.add_argument("--eager-claims", type=int, default=32, help="--preset compile: claims of the eager rows")
    p.add_argument("--eager-rounds", type=int, default=1, help="--preset compile: rounds of the eager rows")
    p.add_argument("--turn-lengths", type=float, metavar="MEAN", help="end each free reply at a length drawn from a "
                   "lognormal with this mean (sigma 0.6), capped by --turns (module doc); default: off")
    p.add_argument("--seed", type=int, default=0, help="--turn-lengths: the draws' seed")
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--data-dir", default=os.environ.get("DEBATECV_DATA", str(ROOT.parent / "shared/data/averitec")))
    p.add_argument("--cache", default=str(Path.home() / ".cache/debatecv/bench"))
    p.add_argument("--out", help="also write the JSON result here")
    return p


def main():
    p = build_parser()
    args = p.parse_args()
    if not (Path(args.data_dir) / "dev.json").exists():
        print(f"error: {args.data_dir}/dev.json not found (--data-dir)", file=sys.stderr)
        return 2
    path = checkpoint(args.cache, args.tiny, args.data_dir, args.vocab_size)
    set_turn_lengths(args)
    if args.preset == "compile":
        if args.turns == [192, 512]:
            args.turns = [192]
        os.environ.setdefault("DEBATECV_SHARED_DATA", args.data_dir)  # where bench_claims reads the claims
        rows, source = preset_compile(args, path)
        result = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                  "machine": torch.cuda.get_device_name() if torch.cuda.is_available()
                  else f"{platform.machine()} CPU, {os.cpu_count()} cores", "torch": torch.__version__,
                  "model": f"random {'tiny Llama' if args.tiny else 'Llama-3.1-8B shape'}", "claims": source,
                  "batch_size": args.batch_size, "runs": rows}
        return emit(result, args.out)
    try:
        import bitsandbytes  # noqa: F401
        four_bit_ok = torch.cuda.is_available()
    except ImportError:
        four_bit_ok = False
    precisions = {"4bit": [True], "bf16": [False], "both": [True, False]}[args.precision]
    precisions = [q for q in precisions if four_bit_ok or not q] or [False]
    reuses = {"on": [True], "off": [False], "both": [True, False]}[args.reuse]
    batchings = {"continuous": [True], "fixed": [False], "both": [True, False], "default": [None]}[args.batching]
    rows = []
    for turn_tokens in args.turns:
        for four_bit in precisions:
            for reuse in reuses:
                for continuous in batchings:
                    out_dir = Path(tempfile.mkdtemp(prefix="bench_gpu-"))
                    try:
                        rows.append(run_once(path, args, reuse, four_bit, turn_tokens, out_dir, continuous))
                    except torch.OutOfMemoryError as e:  # the engine splits batches; this is the model itself
                        rows.append({"reuse_cache": reuse, "4bit": four_bit, "turn_tokens": turn_tokens,
                                     "continuous": continuous, "error": f"out of memory: {str(e).splitlines()[0]}"})
                    finally:
                        shutil.rmtree(out_dir, ignore_errors=True)
                    print(json.dumps(rows[-1]), flush=True)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": torch.cuda.get_device_name() if torch.cuda.is_available()
        else f"{platform.machine()} CPU, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "model": f"random {'tiny Llama (hidden 256, 4 layers)' if args.tiny else 'Llama-3.1-8B shape'}"
        f", vocabulary {args.vocab_size} (BPE on AVeriTeC dev claims)", "claims": args.claims,
        "batch_size": args.batch_size, "structured": args.structured, "turn_lengths": args.turn_lengths,
        "runs": rows,
    }
    return emit(result, args.out)


def emit(result, out):
    """Print the result as JSON, and write it to `out` too when given; the exit status."""
    print(json.dumps(result, indent=2))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
