"""Replay a recorded run's rows on vLLM: bench/bench_peer.py runs this script with the peer's own Python.

    /work/vllm-venv/bin/python bench/peer_replay.py --rows ROWS.json --model DIR --out RESULT.json

It imports the standard library and vLLM only (never the project's code: vLLM's venv has neither our package nor
its dependencies, and the project never imports vLLM). ROWS.json is what bench/bench_peer.py recorded of our run:
each row's context ids, the ids it generated, and when it was submitted and when it finished, on one clock.

Each row is one request, greedy, made to generate exactly as many tokens as our row did (`max_tokens` = `min_tokens`
= that count, `ignore_eos`: a stop id can end it neither early nor late). A row is added once every row that
finished before it was submitted in our run has finished here: the dependencies of a debate's turns (a claim's next
turn needs its last one's reply), kept conservatively, without knowing which claim a row is of. Prefix caching is
on. The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, as bench/bench_peer.py sets).

With --go, it says when it is warmed up and waits for the word to start (bench/bench_peer.py gives it when our run
submits its first row), so both sides' rows run at the same time. One warm-up request (a few ids, shorter than a
cache block, so it leaves no block another row could reuse) runs before the clock starts, so the wall is the
replay's alone, as ours is its rows' span (the model's load and the compiling vLLM does at start are printed beside
it). Writes one JSON object: the replay's wall, the process's (its wait for the word left out), the prompt tokens it
encoded (each request's prompt less its prefix-cache hits), the tokens it generated.
"""
import argparse
import bisect
import json
import os
import sys
import time

PROCESS_START = time.perf_counter()


def build_parser():
    """The flags (tests/test_docs.py builds every bench script's parser)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", required=True, help="the rows bench/bench_peer.py recorded (JSON)")
    p.add_argument("--model", required=True, help="the model as a Hugging Face directory")
    p.add_argument("--eager", action="store_true", help="vLLM's eager mode (enforce_eager); default: its compiled one")
    p.add_argument("--dtype", default="auto", help="vLLM's dtype (default: auto, vLLM's own choice)")
    p.add_argument("--max-num-seqs", type=int, help="requests vLLM runs at once at most (default: vLLM's)")
    p.add_argument("--out", required=True, help="write the result here (JSON)")
    p.add_argument("--go", help="once warmed up, create GO.ready and start the replay when GO exists (our run "
                   "creates it with its first row, so both sides start together)")
    return p


def schedule(rows):
    """For each row, how many rows (in order of finishing in our run) must be done before it starts: those that
    finished before it was submitted."""
    finished = sorted(r["finished"] for r in rows)
    return [bisect.bisect_left(finished, r["submitted"]) for r in rows]


def request_settings(row):
    """A row's request: greedy, exactly as many tokens as our row generated (no stop id ends it sooner or later)."""
    return dict(temperature=0.0, max_tokens=row["generated"], min_tokens=row["generated"], ignore_eos=True)


def replay(engine, rows, params_of, clock=time.perf_counter):
    """Add each row once the rows before it are done, step until all are; (wall seconds, encoded, generated)."""
    need = schedule(rows)
    by_finish = sorted(range(len(rows)), key=lambda i: rows[i]["finished"])
    rank = {i: k for k, i in enumerate(by_finish)}  # a row's place in our run's order of finishing
    waiting = sorted(range(len(rows)), key=lambda i: (need[i], rows[i]["submitted"], i))
    done = [False] * len(rows)
    prefix = 0  # the first `prefix` rows of our order of finishing are all done here
    encoded = generated = 0
    start = clock()
    at = 0
    while at < len(waiting) or engine.has_unfinished_requests():
        while at < len(waiting) and need[waiting[at]] <= prefix:
            i = waiting[at]
            engine.add_request(str(i), {"prompt_token_ids": rows[i]["context"]}, params_of(rows[i]))
            at += 1
        if not engine.has_unfinished_requests():
            raise RuntimeError(f"row {waiting[at]} waits for rows that never ran")  # schedule() makes none
        for out in engine.step():
            if not out.finished:
                continue
            i = int(out.request_id)
            encoded += len(rows[i]["context"]) - (out.num_cached_tokens or 0)
            generated += len(out.outputs[0].token_ids)
            done[rank[i]] = True
            while prefix < len(rows) and done[prefix]:
                prefix += 1
    return clock() - start, encoded, generated


def main(argv=None):
    args = build_parser().parse_args(argv)
    from vllm import LLM, SamplingParams  # the peer's venv only

    rows = json.loads(open(args.rows, encoding="utf-8").read())["rows"]
    if not rows:
        print(f"error: {args.rows} holds no row (--rows)", file=sys.stderr)
        return 2
    longest = max(len(r["context"]) + r["generated"] for r in rows)
    options = dict(model=args.model, dtype=args.dtype, enforce_eager=args.eager, enable_prefix_caching=True,
                   max_model_len=longest + 1, seed=0)
    if args.max_num_seqs:
        options["max_num_seqs"] = args.max_num_seqs
    llm = LLM(**options)
    engine = llm.llm_engine
    loaded = time.perf_counter() - PROCESS_START
    llm.generate([{"prompt_token_ids": rows[0]["context"][:8]}], SamplingParams(max_tokens=4, temperature=0.0),
                 use_tqdm=False)
    llm.reset_prefix_cache()
    warmed = time.perf_counter() - PROCESS_START
    waited = time.perf_counter()
    if args.go:
        open(args.go + ".ready", "w").close()
        while not os.path.exists(args.go):
            time.sleep(0.005)
    waited = time.perf_counter() - waited

    wall, encoded, generated = replay(engine, rows, lambda row: SamplingParams(**request_settings(row)))
    result = {"side": "vllm-eager" if args.eager else "vllm-compiled", "wall_s": round(wall, 2),
              "process_s": round(time.perf_counter() - PROCESS_START - waited, 2), "load_s": round(loaded, 2),
              "warm_up_s": round(warmed - loaded, 2), "rows": len(rows), "prompt_tokens": sum(len(r["context"])
                                                                                               for r in rows),
              "encoded_tokens": encoded, "generated_tokens": generated,
              "dtype": str(llm.llm_engine.model_config.dtype).removeprefix("torch."),
              "block_size": llm.llm_engine.vllm_config.cache_config.block_size}
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(json.dumps(result) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
