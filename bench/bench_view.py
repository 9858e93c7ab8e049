"""The HTML report (eval.view) of a large run: seconds to build it, its size, and how the page behaves in Chromium.

    python bench/bench_view.py [--claims 500] [--turn-chars 2000]     # a 500-claim DebateCV run, then its report
    python bench/bench_view.py --source tiny --claims 8               # the run made by the tests' tiny model
    python bench/bench_view.py --run RUN_DIR [--screenshot PNG --open 1]   # the report of a run you have

The run (into --out, made again only when its settings change):
- `--source scripted` (the default): DebateCV's own protocol (debate/methods/debatecv.py), its prompts and
  records, over the first --claims claims of AVeriTeC dev with golden evidence (the shared data, as the tests
  find it; the demo claims, repeated, when it is not there), with the engine's generate replaced by a script:
  every reply is --turn-chars characters of the claim's own evidence words (2,000 characters: about the 512
  tokens of a full turn of a Llama-3-sized vocabulary), no Moderator ends a debate early (every claim has the
  3 x 3 + 1 turns of a debate at --max-rounds 3), and structured replies carry choice probabilities. So the
  transcripts are as long as the CLI's defaults allow, made in seconds, the worst case for the report.
- `--source tiny`: `run_debate.py` with the tests' tiny random Llama (tests/tiny_models.py), greedy,
  --max-new-tokens tokens a turn. A real run, but on a CPU a 500-claim run of full-length turns takes hours,
  and its byte-level vocabulary spells text in more tokens than a real model's (shorter turns).

Then the report is built (timed, best of --repeat), with and without prompts, and opened in headless
Chromium (tests/browser.py; skipped with --no-browser): the load, a text filter over every row and the
opening of a debate are timed inside the page. --screenshot saves the page with a debate open.
"""
import argparse
import datetime
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eval import view  # noqa: E402


def scripted_run(args, out):
    """DebateCV's protocol over the bench claims with a scripted engine (see the module doc); returns seconds."""
    from debate.data import claims as data
    from debate.engine import engine, schema_program
    from debate.methods import debatecv
    from debate.pipeline import records
    from eval import averitec
    from tests.tiny_models import bench_claims

    claims, source = bench_claims(args.claims)
    rng = random.Random(0)
    labels = list(averitec.LABELS)

    def prose(claim):
        words = " ".join([claim["claim"]] + [e["answer"] for e in claim["evidence"]]).split() or ["evidence"]
        text = []
        while sum(len(w) + 1 for w in text) < args.turn_chars:
            text.append(rng.choice(words))
        return " ".join(text)[: args.turn_chars]

    def choice(values, top):
        p = rng.uniform(0.4, 0.95)
        return {v: round(p if v == top else (1 - p) / (len(values) - 1), 6) for v in values}

    by_system = {}

    def generate(model, tokenizer, convs, prompts, settings, generator=None, schemas=None):
        replies = []
        for k, (conv, prompt) in enumerate(zip(convs, prompts)):
            claim = by_system.get(conv.system) or next(c for c in claims if c["claim"] in conv.system)
            by_system[conv.system] = claim
            name = schemas[k] if schemas else None
            text = prose(claim)
            conv.structured = None
            if name:
                gold = claim.get("label") or labels[0]
                verdict = gold if rng.random() < 0.6 else rng.choice(labels)
                fields = {"Justification for Verdict": text[: args.turn_chars // 3], "Verdict": verdict}
                probs = {"Verdict": choice(labels, verdict)}
                if name == "moderator_round":  # a Moderator that never ends the debate early
                    fields["Proceeding Necessity"] = "Yes"
                    probs["Proceeding Necessity"] = choice(["Yes", "No"], "Yes")
                text = json.dumps(fields)
                conv.structured = {"schema": name, "fields": fields, "probs": probs}
            context = len(conv.system) + sum(len(m["content"]) for m in conv.messages) + len(prompt)
            conv.messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": text}]
            # About four characters a token, with the earlier turns' cache reused.
            conv.prompt_tokens += context // 4
            conv.encoded_tokens += len(prompt) // 4
            conv.completion_tokens += len(text) // 4
            replies.append(text)
        return replies

    engine.generate, schema_program.compile_for = generate, lambda name, tokenizer, labels=None: name
    agent = type("Scripted", (), {"model": "scripted", "tokenizer": None, "adapter": None, "path": "scripted"})()
    settings = engine.Settings(max_new_tokens=512)
    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    for name in records.RUN_FILES:
        (out / name).unlink(missing_ok=True)
    writer = records.Writer(out)
    done = []
    for i in range(0, len(claims), 16):
        for record in debatecv.run_batch({role: agent for role in debatecv.ROLES}, claims[i:i + 16], settings,
                                         max_rounds=args.max_rounds):
            writer.write(record)
            done.append(record["prediction"])
    writer.close()
    submission = records.submission(done, claims)
    records.write_json(out / records.SUBMISSION, submission)
    records.write_json(out / records.CONFIG, {
        "split": "dev", "evidence": "golden", "method": "debatecv", "max_rounds": args.max_rounds,
        "model": "scripted", "note": f"bench/bench_view.py --source scripted: {source}, replies of "
                                     f"{args.turn_chars} characters from a scripted engine, no model"})
    metrics = averitec.score(submission, data.as_references(claims))
    records.write_json(out / records.METRICS, metrics)
    return time.perf_counter() - start


def tiny_run(args, out):
    """A DebateCV run of the tiny model over --claims claims into `out` (what is done already is kept)."""
    import run_debate
    from tests.tiny_models import averitec_dir, build_tiny_llama

    model = out.with_name(out.name + "-model")
    if not (model / "config.json").is_file():
        build_tiny_llama(model, seed=0)
    if args.claims <= 8:
        data = ["--split", "demo"]
    else:
        data = ["--split", "dev", "--data-dir", str(averitec_dir()), "--evidence", "golden"]
    start = time.perf_counter()
    run_debate.main([*data, "--method", "debatecv", "--model", str(model), "--limit", str(args.claims),
                     "--max-new-tokens", str(args.max_new_tokens), "--max-rounds", str(args.max_rounds),
                     "--temperature", "0", "--batch-size", str(args.batch_size), "--output-dir", str(out)])
    return time.perf_counter() - start


def build_times(run, out, repeat, **options):
    best = None
    for _ in range(repeat):
        start = time.perf_counter()
        view.write(run, out, **options)
        seconds = time.perf_counter() - start
        best = seconds if best is None else min(best, seconds)
    return best, out.stat().st_size


# Timed in the page: from before the work to a task after the next animation frame, so layout and paint count.
FILTER = """new Promise((done) => {
  const s = document.querySelector('.claims[data-run="0"] .search');
  const t0 = performance.now();
  s.value = 'the'; s.dispatchEvent(new Event('input'));
  requestAnimationFrame(() => setTimeout(() => { const t1 = performance.now();
    const shown = document.querySelector('.claims[data-run="0"] .count').textContent;
    s.value = ''; s.dispatchEvent(new Event('input')); done({ms: t1 - t0, shown}); }));
})"""
OPEN = """new Promise((done) => {
  const t0 = performance.now();
  window.addEventListener('hashchange', () => requestAnimationFrame(() => setTimeout(() => done({
    ms: performance.now() - t0, turns: document.querySelectorAll('#debate-body .turn').length}))), {once: true});
  location.hash = 'r0-c%d';
})"""
LOADED = ("(() => { const n = performance.getEntriesByType('navigation')[0]; "
          "return {dom_ms: n.domContentLoadedEventEnd, load_ms: n.loadEventEnd}; })()")


def save_png(data, path):
    """`data` (PNG bytes) to `path`, as 256 colours where Pillow (matplotlib's) is there."""
    try:
        import io

        from PIL import Image
    except ImportError:
        Path(path).write_bytes(data)
        return
    image = Image.open(io.BytesIO(data)).convert("RGB")
    image.quantize(colors=256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE).save(path, optimize=True)


def in_browser(report, screenshot=None, claim=0):
    from tests.browser import Browser, find_chromium

    if not find_chromium():
        return {"skipped": "no Chromium (apt-get install chromium)"}
    with Browser(width=1600, height=1000, timeout=300) as browser:
        start = time.perf_counter()
        browser.open(report.resolve().as_uri())
        wall = time.perf_counter() - start
        out = {"open_seconds": round(wall, 2), **browser.evaluate(LOADED)}
        out["filter"] = browser.evaluate(FILTER)
        out["open_debate"] = browser.evaluate(OPEN % claim)
        if screenshot:
            # The figures and the claim table beside the open debate; 256 colours keep the PNG small.
            browser.evaluate("window.scrollTo(0, document.querySelector('.claims').offsetTop - 600); "
                             "new Promise((done) => requestAnimationFrame(() => setTimeout(done, 50)))")
            save_png(browser.screenshot(), screenshot)
        out["errors"] = browser.errors()
        out["requests_other_than_the_file"] = [u for u in browser.requests()
                                               if not u.startswith(("file:", "data:"))]
    return out


def build_parser():
    """The flags (tests/test_docs.py checks the documented commands against them)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", help="report this run directory instead of making one")
    p.add_argument("--source", choices=("scripted", "tiny"), default="scripted", help="how the run is made")
    p.add_argument("--claims", type=int, default=500)
    p.add_argument("--turn-chars", type=int, default=2000, help="scripted: characters of every reply")
    p.add_argument("--max-new-tokens", type=int, default=512, help="tiny: tokens of every turn at most")
    p.add_argument("--max-rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8, help="tiny: claims in progress together")
    p.add_argument("--out", help="the run directory to make (default bench/out/view-<source>)")
    p.add_argument("--repeat", type=int, default=3, help="builds timed; the best is reported")
    p.add_argument("--no-browser", dest="browser", action="store_false")
    p.add_argument("--screenshot", help="save a PNG of the page with claim --open's debate open")
    p.add_argument("--open", type=int, default=0, help="the claim (row index) whose debate is opened")
    return p


def main():
    p = build_parser()
    args = p.parse_args()

    run_seconds = None
    if args.run is None:
        out = Path(args.out or ROOT / f"bench/out/view-{args.source}")
        run_seconds = (scripted_run if args.source == "scripted" else tiny_run)(args, out)
    run = Path(args.run or out)
    report_dir = ROOT / "bench/out"
    report_dir.mkdir(parents=True, exist_ok=True)
    full = report_dir / "view-report.html"
    lean = report_dir / "view-report-no-prompts.html"
    seconds, size = build_times(run, full, args.repeat)
    lean_seconds, lean_size = build_times(run, lean, args.repeat, prompts=False)
    claims = sum(1 for line in (run / "predictions.jsonl").open() if line.strip())
    turns = sum(len(json.loads(line)["turns"]) for line in (run / "transcripts.jsonl").open() if line.strip())
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.2f}",
        "run": str(run), "source": "--run" if args.run else args.source, "claims": claims, "turns": turns,
        "run_files_mb": round(sum(f.stat().st_size for f in run.glob("*.json*")) / 1e6, 2),
        "run_seconds": round(run_seconds, 1) if run_seconds is not None else None,
        "build_seconds": round(seconds, 2), "report_mb": round(size / 1e6, 2),
        "build_seconds_no_prompts": round(lean_seconds, 2), "report_mb_no_prompts": round(lean_size / 1e6, 2),
    }
    if args.browser:
        result["browser"] = in_browser(full, args.screenshot, args.open)
    out = report_dir / "view.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
