"""One verification run: claims in, a resumable output directory with predictions and scores out."""
import argparse
import platform
import signal
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path

from debate import (baselines, courtroom, data, debatecv, engine, madr, models, progress, prompts, records, retrieval,
                    turns)
from debate.prompts import PromptError
from debate.retrieval import RetrievalError
from debate.schema import SchemaBudgetError
from eval import averitec, report
from eval.averitec import InputError
from eval import wordnet
from eval.wordnet import WordNetMissingError


def _fixed(table):
    return lambda args: dict(table)


# The JSON answers each method asks for, checked against --max-new-tokens before any claim runs.
SCHEMAS = {"debatecv": debatecv.SCHEMAS, **baselines.SCHEMAS, "courtroom": courtroom.SCHEMAS}

# name -> (function over a batch of claims, its roles -> model flag, its keyword options from the CLI)
METHODS = {
    "debatecv": (debatecv.run_batch, _fixed(debatecv.MODEL_OF), lambda a: {"max_rounds": a.max_rounds}),
    "rag-cot": (baselines.rag_cot, _fixed(baselines.RAG_COT_MODELS), lambda a: {}),
    "majority": (baselines.majority, _fixed(baselines.RAG_COT_MODELS), lambda a: {"voters": a.voters}),
    "cooperation": (baselines.cooperation, _fixed(baselines.COOPERATION_MODELS),
                    lambda a: {"max_rounds": a.max_rounds}),
    "courtroom": (courtroom.run_batch, lambda a: courtroom.model_of(len(a.judge_models)),
                  lambda a: {"options": courtroom.options_from(a), "library": courtroom.library_from(a)}),
}


# The most turns one claim can take, per method, for the time left before a batch has finished (an
# upper bound: a debate may stop early). The courtroom's depends on its discovery; there is none.
TURNS_AT_MOST = {"debatecv": lambda a: 3 * a.max_rounds + 1, "rag-cot": lambda a: 1, "majority": lambda a: a.voters,
                 "cooperation": lambda a: 2 * a.max_rounds + 1}


# Model flag of a role (as model_roles names it) -> the argument holding its path.
FLAG_ARGS = {"debater": "debater_model", "moderator": "moderator_model", "defense": "defense_model",
             "refine": "refine_model"}


COURTROOM_OPTIONS = ("corpus", "embedder", "top_k", "novelty_threshold", "novelty_stop", "plateau_delta",
                     "admit_threshold", "dispute_threshold", "reflection_weights", "vote_weight", "quality_weight",
                     "role_switch", "witness")


def _unused_options(args):
    """The method flags this run's method and refinement never read: they are left out of config.json."""
    unused = [] if args.method == "courtroom" else list(COURTROOM_OPTIONS)
    unused += [] if args.method == "majority" else ["voters"]
    unused += [] if args.refine == "madr" else ["madr_iterations"]
    return unused


def run_config(args, roles=None, precision=None):
    """Every setting of the run, with what identifies the software it ran on.

    With `roles`, only the model flags those roles use are kept (a DebateCV run names no judges), the
    adapter only when the Moderator's model is used, and only the options of the method and refinement
    run; with `precision` (models.precision), `use_4bit` says whether 4-bit was really used and
    `precision` how the weights are held.
    """
    config = dict(vars(args))
    if roles is not None:
        used = {FLAG_ARGS.get(flag, "judge_models") for flag in roles.values()}
        for key in (*FLAG_ARGS.values(), "judge_models"):
            if key not in used:
                config.pop(key, None)
        if "moderator_model" not in used:
            config.pop("moderator_adapter", None)
        for key in _unused_options(args):
            config.pop(key, None)
    if precision is not None:
        config["use_4bit"] = precision["quantized"]
        config["precision"] = "nf4" if precision["quantized"] else precision["dtype"]
    config["versions"] = {"python": platform.python_version()}
    for package in ("debatecv", "torch", "transformers", "peft", "bitsandbytes", "accelerate"):
        try:
            config["versions"][package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    config["git_commit"] = None
    checkout = Path(__file__).resolve().parent.parent
    # Only a checkout has a commit: an installed wheel's site-packages may sit inside some other repository.
    if (checkout / ".git").exists():
        try:
            config["git_commit"] = subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True,
                timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            pass
    return config


def load_claims(args):
    data_dir = None if args.split == "demo" else data.resolve_data_dir(args.data_dir)
    claims = data.load_split(args.split, data_dir)
    retrieved = args.retrieved_file or data.retrieved_path(args.split, data_dir)
    claims = data.attach_evidence(claims, args.evidence, retrieved)
    return claims[: args.limit] if args.limit else claims


def resolve_models(args, default=None):
    """Fill every model flag the user left out: --model, else the embedded default; in place."""
    base = args.model or default
    args.debater_model = args.debater_model or base
    args.moderator_model = args.moderator_model or base
    args.defense_model = args.defense_model or args.debater_model
    args.judge_models = list(args.judge_models or [args.moderator_model] * 3)
    args.refine_model = args.refine_model or args.moderator_model


def model_roles(args):
    """{role: model flag} of the chosen method, plus MADR's roles when refining."""
    roles = METHODS[args.method][1](args)
    if args.refine == "madr":
        roles.update(madr.MODEL_OF)
    return roles


def role_models(args, roles):
    """({role: model path}, {role: adapter}) of `roles` ({role: model flag}) under the CLI's flags."""
    paths = {"debater": args.debater_model, "moderator": args.moderator_model, "defense": args.defense_model,
             "refine": args.refine_model, **{f"judge_{i + 1}": p for i, p in enumerate(args.judge_models)}}
    role_paths = {role: paths[flag] for role, flag in roles.items()}
    adapters = {role: args.moderator_adapter for role, flag in roles.items() if flag == "moderator"}
    return role_paths, adapters


def load_agents(args, roles):
    role_paths, adapters = role_models(args, roles)
    return models.load_roles(role_paths, adapters, use_4bit=args.use_4bit)


def check_run(args, claims):
    """Every check that can refuse the run and needs no model weights: prompts, models, adapters, WordNet,
    the courtroom's encoder directory and corpus.

    Runs before the output directory is touched and before any weight is loaded, so a typo costs
    seconds and never an earlier run. Raises the toolkit's own errors (main_guard prints them).
    """
    prompts.check_files()
    role_paths, adapters = role_models(args, model_roles(args))
    models.check_roles(role_paths, adapters)
    if any(c.get("label") for c in claims):
        wordnet.load_wordnet()  # the METEOR scores of finish() need it; better now than after every claim
    if args.method == "courtroom":
        encoder = Path(args.embedder or retrieval.default_embedder_path())
        if not (encoder / "config.json").is_file():
            raise RetrievalError(f"cannot load sentence encoder {encoder}: not a model directory (no config.json)")
        if args.corpus:
            retrieval.load_corpus(args.corpus)  # a bad line is named now, not after the encoder has loaded


def run(args, log=print):
    """Debate every claim not yet done in `args.output_dir` (each trial's, with --trials); write outputs;
    return the metrics (with several trials: their mean and standard deviation)."""
    models.set_offline()
    # Overriding prompt files are checked first: a wrong placeholder stops the run before anything loads.
    prompt_info = prompts.use_prompt_dir(getattr(args, "prompts", None))
    named = args.model or (args.debater_model and args.moderator_model)
    resolve_models(args, None if named else models.default_model_path())
    if args.split == data.DEMO_SPLIT and args.evidence == "retrieved":
        log("the demo set has no retrieved evidence: using its golden evidence")
        args.evidence = "golden"
    suffix = "-madr" if args.refine == "madr" else ""
    args.output_dir = args.output_dir or f"runs/{args.split}-{args.evidence}-{args.method}{suffix}"

    # Validate, then write: every check runs before the output directory is touched or a weight loads.
    claims = load_claims(args)
    check_run(args, claims)
    trials = getattr(args, "trials", 1)
    if trials == 1:
        return _run_one(args, claims, prompt_info, {}, log)
    # Trial k runs with seed + k - 1 in its own resumable directory; the agents are loaded once for all.
    top, first_seed, agents, results = Path(args.output_dir), args.seed, {}, []
    top.mkdir(parents=True, exist_ok=True)
    for k in range(1, trials + 1):
        trial = argparse.Namespace(**vars(args))
        trial.seed, trial.output_dir = first_seed + k - 1, str(top / f"trial-{k}")
        log(f"trial {k}/{trials}: seed {trial.seed}")
        results.append(_run_one(trial, claims, prompt_info, agents, log))
    config = dict(run_config(args), trial_seeds=[first_seed + k for k in range(trials)],
                  trial_dirs=[f"trial-{k}" for k in range(1, trials + 1)])
    if prompt_info:
        config.update(prompts_hash=prompt_info["hash"], prompt_files=prompt_info["files"])
    records.write_json(top / records.CONFIG, config)
    if any(m is None for m in results):
        return None
    summary = trial_summary(results)
    records.write_json(top / records.METRICS, summary)
    log(report.trials_table(summary))
    return summary


def trial_summary(results):
    """Every numeric metric of the trials' metrics, as {"mean", "std", "values"}; nested dicts keep their shape.

    std is the sample standard deviation (n - 1 in the denominator), 0 for one trial. A value that is not
    a number in every trial (a label name, a list, a key some trial lacks) is kept as is when all trials
    agree on it, else as the list of the trials' values.
    """
    def merge(values):
        if all(isinstance(v, dict) for v in values):
            keys = list(dict.fromkeys(k for v in values for k in v))  # a key some trials lack gets None there
            return {k: merge([v.get(k) for v in values]) for k in keys}
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            mean = sum(values) / len(values)
            var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
            return {"mean": mean, "std": var ** 0.5, "values": list(values)}
        return values[0] if all(v == values[0] for v in values) else list(values)

    return dict(merge(results), trials=len(results))


def _run_one(args, claims, prompt_info, agents, log):
    """One run (one trial) into `args.output_dir`; `agents` is filled on first need and reused after."""
    method, _, options = METHODS[args.method]
    roles = model_roles(args)
    config = run_config(args, roles, models.precision(args.use_4bit))
    if prompt_info:
        # The files' hash, not the directory's name, identifies the prompts a run used.
        config.update(prompts_hash=prompt_info["hash"], prompt_files=prompt_info["files"])
    done = records.check(args.output_dir, config, overwrite=args.overwrite)
    kwargs = options(args)  # once per run; the courtroom loads its encoder and checks its corpus here
    if not args.overwrite:
        records.recover(args.output_dir)  # every check has passed: what a killed --overwrite left can be settled
    # Claims with evidence of similar length share a batch, so few rows are padded to a far longer one.
    todo = sorted((c for c in claims if c["claim_id"] not in done),
                  key=lambda c: sum(len(e["question"]) + len(e["answer"]) for e in c["evidence"]))
    log(f"{len(claims)} claims, {len(claims) - len(todo)} already done in {args.output_dir}, {len(todo)} to go")

    if todo:
        if not agents:
            agents.update(load_agents(args, roles))
        config["models"] = models.model_info(agents)
        settings = engine.Settings(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                   top_p=args.top_p, seed=args.seed, reuse_cache=args.reuse_cache,
                                   structured=args.structured)
        turns.check_schemas(agents, SCHEMAS[args.method] + (madr.SCHEMAS if args.refine == "madr" else ()),
                            settings)
        # One random stream per seed for the whole run, not one per batch.
        streams = turns.Streams(turns.device_of(agents))
        hint = TURNS_AT_MOST.get(args.method) if args.refine == "none" else None
        bar = progress.ClaimBar(total=len(claims), done=len(claims) - len(todo), desc=args.method,
                                turns_hint=hint and hint(args))
        start = time.time()
        # The earlier run (--overwrite) is moved aside here, and deleted once the first claim is written.
        with records.RunDir(args.output_dir, config, overwrite=args.overwrite) as out, bar:
            def write(record):
                out.write(record)
                bar.claim_done()

            for i in range(0, len(todo), args.batch_size):
                batch = todo[i:i + args.batch_size]
                bar.batch(len(batch))
                if args.refine == "madr":
                    # A claim is written once its justification is refined, so a crash redoes the batch.
                    done_batch = method(agents, batch, settings, streams=streams, **kwargs)
                    for record in madr.refine(agents, done_batch, batch, settings, args.madr_iterations, streams):
                        write(record)
                else:
                    method(agents, batch, settings, streams=streams, on_finish=write, **kwargs)
        log(f"verified {len(todo)} claims in {time.time() - start:.1f}s")
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


def _terminated(signum, frame):
    raise SystemExit(128 + signum)


def main_guard(fn):
    """Turn the toolkit's own errors into one clear line and exit code 2; a traceback helps nobody there.

    SIGTERM (`timeout`, a batch scheduler) becomes SystemExit, so a run stopped before its first claim
    still puts its directory back as it was (records.RunDir) instead of dying mid-way.
    """
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main else None
    try:
        return fn()
    except (data.DataError, models.ModelLoadError, records.RunConflict, PromptError, InputError,
            WordNetMissingError, RetrievalError, SchemaBudgetError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2)
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
