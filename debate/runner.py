"""One verification run: claims in, a resumable output directory with predictions and scores out."""
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import torch
from tqdm import tqdm

from debate import data, debatecv, engine, models, records
from debate.prompts import PromptError
from eval import averitec, report
from eval.averitec import InputError
from eval.wordnet import WordNetMissingError

METHODS = {"debatecv": debatecv.run_batch}


def run_config(args):
    """Every setting of the run, with what identifies the software it ran on."""
    config = dict(vars(args))
    config["versions"] = {"python": platform.python_version()}
    for package in ("debatecv", "torch", "transformers", "peft", "bitsandbytes", "accelerate"):
        try:
            config["versions"][package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    try:
        config["git_commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
            text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        config["git_commit"] = None
    return config


def load_claims(args):
    data_dir = None if args.split == "demo" else data.resolve_data_dir(args.data_dir)
    claims = data.load_split(args.split, data_dir)
    retrieved = args.retrieved_file or data.retrieved_path(args.split, data_dir)
    claims = data.attach_evidence(claims, args.evidence, retrieved)
    return claims[: args.limit] if args.limit else claims


def load_agents(args):
    paths = {"affirmative": args.debater_model, "negative": args.debater_model, "moderator": args.moderator_model}
    adapters = {"moderator": args.moderator_adapter}
    return models.load_roles(paths, adapters, use_4bit=args.use_4bit)


def run(args, log=print):
    """Debate every claim not yet done in `args.output_dir`; write outputs; return the metrics."""
    models.set_offline()
    default = None
    if not args.debater_model or not args.moderator_model:
        default = models.default_model_path()
    args.debater_model = args.debater_model or default
    args.moderator_model = args.moderator_model or default
    if args.split == data.DEMO_SPLIT and args.evidence == "retrieved":
        log("the demo set has no retrieved evidence: using its golden evidence")
        args.evidence = "golden"
    args.output_dir = args.output_dir or f"runs/{args.split}-{args.evidence}-{args.method}"

    claims = load_claims(args)  # bad data stops here, before a model is loaded or a file written
    config = run_config(args)
    done = records.prepare(args.output_dir, config, overwrite=args.overwrite)
    # Claims with evidence of similar length share a batch, so few rows are padded to a far longer one.
    todo = sorted((c for c in claims if c["claim_id"] not in done),
                  key=lambda c: sum(len(e["question"]) + len(e["answer"]) for e in c["evidence"]))
    log(f"{len(claims)} claims, {len(claims) - len(todo)} already done in {args.output_dir}, {len(todo)} to go")

    if todo:
        agents = load_agents(args)
        config["models"] = models.model_info(agents)
        records.write_json(Path(args.output_dir) / records.CONFIG, config)
        settings = engine.Settings(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                   top_p=args.top_p, seed=args.seed, reuse_cache=args.reuse_cache)
        generator = None  # one random stream for the whole run, not one per batch
        if args.temperature > 0:
            device = next(agents["moderator"].model.parameters()).device
            generator = torch.Generator(device=device).manual_seed(args.seed)
        writer = records.Writer(args.output_dir)
        bar = tqdm(total=len(claims), initial=len(claims) - len(todo), unit="claim", desc=args.method,
                   dynamic_ncols=True)
        start = time.time()
        try:
            for i in range(0, len(todo), args.batch_size):
                METHODS[args.method](
                    agents, todo[i:i + args.batch_size], settings, max_rounds=args.max_rounds,
                    generator=generator, on_finish=lambda record: (writer.write(record), bar.update(1)))
        finally:
            writer.close()
            bar.close()
        log(f"debated {len(todo)} claims in {time.time() - start:.1f}s")
    return finish(args, claims, log)


def finish(args, claims, log=print):
    """Score the run directory's predictions against the claims' gold labels and write the reports."""
    out = Path(args.output_dir)
    wanted = {c["claim_id"] for c in claims}
    # A directory resumed with a smaller --limit holds more claims than this run asked for.
    predictions = [p for p in records.read_predictions(out) if p["claim_id"] in wanted]
    submission = records.submission(predictions, claims)
    records.write_json(out / records.SUBMISSION, submission)
    references = [c for c in claims if c.get("label")]
    if not references:
        log("no gold labels for this split: predictions written, nothing scored")
        return None
    metrics = averitec.score(submission, data.as_references(references))
    metrics["evidence_condition"] = args.evidence
    records.write_json(out / records.METRICS, metrics)
    log(report.summary_table(metrics))
    return metrics


FULL_TURN, DEMO_TURN = 512, 96  # default tokens per turn; the demo's shorter turns keep the CPU demo to minutes


def check_cli(parser, args, positive):
    """The settings both CLIs share: fill the per-split turn length, refuse values that make no run."""
    if args.max_new_tokens is None:
        args.max_new_tokens = DEMO_TURN if args.split == data.DEMO_SPLIT else FULL_TURN
    for name in positive:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        parser.error("--temperature must be >= 0 and --top-p in (0, 1]")


def main_guard(fn):
    """Turn the toolkit's own errors into one clear line and exit code 2; a traceback helps nobody there."""
    try:
        return fn()
    except (data.DataError, models.ModelLoadError, records.RunConflict, PromptError, InputError,
            WordNetMissingError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2)
