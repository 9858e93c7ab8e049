"""One verification run: claims in, a resumable output directory with predictions and scores out."""
import contextlib
import json
import platform
import signal
import subprocess
import sys
import time
from dataclasses import fields, replace
from importlib import metadata
from pathlib import Path

from debate.methods import baselines, debatecv, explain, madr, proclaim_baselines, turns
from debate.methods.courtroom import case as courtroom_case, trial as courtroom
from debate.data import claims as data, prompts
from debate.engine import engine, models, retrieval, scheduler
from debate.pipeline import evidence, lock, progress, records, shards, stops, store_retrieval
from debate.pipeline.config import COURTROOM_METHODS, ConfigError, Courtroom, to_dict
from debate.data.prompts import PromptError
from debate.data.inputs import DataError
from debate.engine.retrieval import RetrievalError
from debate.engine.schema import SchemaBudgetError
from eval import (averitec, evidence as evidence_scores, faithfulness, metrics as label_scores, proclaim_measures,
                  report, trials as trial_metrics)
from eval.averitec import InputError
from eval import wordnet
from eval.wordnet import WordNetMissingError


def _fixed(table):
    return lambda config: dict(table)


# The JSON answers each method asks for, checked against --max-new-tokens before any claim runs.
SCHEMAS = {"debatecv": debatecv.SCHEMAS, **baselines.SCHEMAS, "courtroom": courtroom.SCHEMAS,
           **proclaim_baselines.SCHEMAS}

# name -> (function over a batch of claims, its roles -> model flag, its keyword options from the config)
METHODS = {
    "debatecv": (debatecv.run_batch, _fixed(debatecv.MODEL_OF), lambda c: {"max_rounds": c.generation.max_rounds}),
    "rag-cot": (baselines.rag_cot, _fixed(baselines.RAG_COT_MODELS), lambda c: {}),
    "majority": (baselines.majority, _fixed(baselines.RAG_COT_MODELS), lambda c: {"voters": c.method.voters}),
    "cooperation": (baselines.cooperation, _fixed(baselines.COOPERATION_MODELS),
                    lambda c: {"max_rounds": c.generation.max_rounds}),
    # The courtroom and PROClaim's Table 4 baselines also get their retrieval library (method_options).
    "courtroom": (courtroom.run_batch, lambda c: courtroom.model_of(len(c.models.judge_models)),
                  lambda c: {"max_rounds": c.generation.max_rounds, "options": c.courtroom}),
    "standard-mad": (proclaim_baselines.standard_mad, _fixed(proclaim_baselines.STANDARD_MAD_MODELS),
                     lambda c: {"max_rounds": c.generation.max_rounds, "options": c.courtroom}),
    "single-call": (proclaim_baselines.single_call, _fixed(proclaim_baselines.SINGLE_CALL_MODELS),
                    lambda c: {"options": c.courtroom}),
}


# --task explain: name -> (function over a batch of claims, its roles -> model flag, its keyword options)
EXPLAIN_METHODS = {
    "zero-shot": (explain.zero_shot, _fixed(explain.EXPLAINER), lambda c: {}),
    "cot": (explain.cot, _fixed(explain.EXPLAINER), lambda c: {}),
    "self-refine": (explain.self_refine, _fixed(explain.SELF_REFINE_MODELS),
                    lambda c: {"max_iterations": c.madr.self_refine_iterations}),
    "madr": (madr.explain, _fixed(madr.EXPLAIN_MODELS),
             lambda c: {"max_iterations": c.madr.madr_iterations, "temperature": c.madr.madr_temperature}),
}
EXPLAIN_SCHEMAS = {**explain.SCHEMAS, "madr": explain.SCHEMAS["zero-shot"] + madr.SCHEMAS}


def method_entry(config):
    """(function, roles, options) of the config's method, from its task's table."""
    return (EXPLAIN_METHODS if config.method.task == "explain" else METHODS)[config.method.method]


# The most turns one claim can take, per method, for the time left before a batch has finished (an
# upper bound: a debate may stop early). The courtroom's depends on its discovery; there is none.
TURNS_AT_MOST = {"debatecv": lambda c: 3 * c.generation.max_rounds + 1, "rag-cot": lambda c: 1,
                 "majority": lambda c: c.method.voters, "cooperation": lambda c: 2 * c.generation.max_rounds + 1}
EXPLAIN_TURNS_AT_MOST = {"zero-shot": lambda c: 1, "cot": lambda c: 1,
                         "self-refine": lambda c: 1 + 2 * c.madr.self_refine_iterations,
                         "madr": lambda c: 1 + 2 + 3 * c.madr.madr_iterations + 1}


# Model flag of a role (as model_roles names it) -> the setting holding its path.
FLAG_ARGS = {"debater": "debater_model", "moderator": "moderator_model", "defense": "defense_model",
             "refine": "refine_model", "court": "court_model", "critic": "critic_model", "witness": "witness_model"}


def _unused_options(config):
    """The method settings this run's method and refinement never read: they are left out of config.json."""
    unused = [] if config.method.method in COURTROOM_METHODS else [f.name for f in fields(Courtroom)]
    unused += [] if config.method.method == "majority" else ["voters"]
    madr_runs = config.method.refine == "madr" or (config.method.task, config.method.method) == ("explain", "madr")
    unused += [] if madr_runs else ["madr_iterations", "madr_temperature"]
    unused += [] if (config.method.task, config.method.method) == ("explain", "self-refine") else [
        "self_refine_iterations"]
    return unused


def config_json(config, roles=None, precision=None):
    """config.json: every setting of the run (flat, by flag name), with what identifies the software it ran on.

    With `roles`, only the model settings those roles use are kept (a DebateCV run names no judges), the
    adapter only when the Moderator's model is used, and only the options of the method and refinement
    run; with `precision` (models.precision), `use_4bit` says whether 4-bit was really used and
    `precision` how the weights are held.
    """
    saved = to_dict(config)
    if roles is not None:
        used = {FLAG_ARGS.get(flag, "judge_models") for flag in roles.values()}
        if used & {"court_model", "critic_model"}:
            used.add("moderator_model")  # their default, and the model --moderator-adapter goes on
        for key in (*FLAG_ARGS.values(), "judge_models"):
            if key not in used:
                saved.pop(key, None)
        if "moderator_model" not in used:
            saved.pop("moderator_adapter", None)
        for key in _unused_options(config):
            saved.pop(key, None)
    if precision is not None:
        saved["use_4bit"] = precision["quantized"]
        saved["precision"] = "nf4" if precision["quantized"] else precision["dtype"]
    saved["versions"] = {"python": platform.python_version()}
    for package in ("debatecv", "torch", "transformers", "peft", "bitsandbytes", "accelerate"):
        try:
            saved["versions"][package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    saved["git_commit"] = None
    checkout = Path(__file__).resolve().parents[2]
    # Only a checkout has a commit: an installed wheel's site-packages may sit inside some other repository.
    if (checkout / ".git").exists():
        try:
            saved["git_commit"] = subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True,
                timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            pass
    return saved


def method_options(config, labels, passages=None, log=print):
    """The keyword options of the config's method: its table's (method_entry), the dataset's labels (every
    method's verdicts, or the label an explanation explains, are among them), and for the courtroom's methods
    their retrieval library over --corpus or `passages` (evidence.Inputs.passages); building it loads the encoder."""
    kwargs = dict(method_entry(config)[2](config), labels=labels)
    if config.method.task == "verify" and config.method.method in COURTROOM_METHODS:
        store = config.retrieval.knowledge_store if config.data.evidence == "retrieved" else None
        kwargs["library"] = courtroom_case.library_from(config.courtroom, passages, log, store=store)
    return kwargs


def load_claims(config, log=print):
    """The run's claims with their evidence (debate/pipeline/evidence.py); loads the encoder when the retrieved
    evidence comes from a corpus, so call it once the run's checks have passed."""
    return evidence.retrieve(evidence.read(config), config, log).claims


def model_roles(config):
    """{role: model flag} of the chosen method, plus MADR's roles when refining."""
    roles = method_entry(config)[1](config)
    if config.method.refine == "madr":
        roles.update(madr.MODEL_OF)
    return roles


def role_models(config, roles):
    """({role: model path}, {role: adapter}) of `roles` ({role: model flag}) under the config's models."""
    m = config.models
    paths = {"debater": m.debater_model, "moderator": m.moderator_model, "defense": m.defense_model,
             "refine": m.refine_model, "court": m.court_model, "critic": m.critic_model, "witness": m.witness_model,
             **{f"judge_{i + 1}": p for i, p in enumerate(m.judge_models)}}
    role_paths = {role: paths[flag] for role, flag in roles.items()}
    # The adapter goes on the Moderator's roles, and on the courtroom's court and critic while they run on
    # the Moderator's model (their default).
    adapters = {role: m.moderator_adapter for role, flag in roles.items()
                if flag == "moderator" or (flag in ("court", "critic") and paths[flag] == m.moderator_model)}
    return role_paths, adapters


def load_agents(config, roles):
    role_paths, adapters = role_models(config, roles)
    return models.load_roles(role_paths, adapters, use_4bit=config.models.use_4bit,
                             device_map=config.models.device_map)


def settings_of(config):
    """The engine's generation settings of a run."""
    g = config.generation
    return engine.Settings(max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_p=g.top_p, seed=g.seed,
                           reuse_cache=g.reuse_cache, structured=g.structured,
                           gpu_memory_fraction=g.gpu_memory_fraction)


def check_run(config, claims, encoder_needed=False):
    """Every check that can refuse the run and needs no model weights: prompts, models, adapters,
    the encoder directory (the courtroom's, or retrieving evidence from a corpus: `encoder_needed`) and corpus, gold
    labels to explain.

    Runs before the output directory is touched and before any weight is loaded, so a typo costs
    seconds and never an earlier run. Raises the toolkit's own errors (main_guard prints them).
    """
    prompts.check_files()
    role_paths, adapters = role_models(config, model_roles(config))
    models.check_roles(role_paths, adapters)
    if config.method.task == "explain":
        unlabelled = [c["claim_id"] for c in claims if not c.get("label")]
        if unlabelled:
            raise DataError(f"--task explain explains each claim's gold label: claim {unlabelled[0]!r} of "
                            f"--split {config.data.split} has none ({len(unlabelled)} of {len(claims)} claims)")
    if config.method.method in COURTROOM_METHODS or encoder_needed:
        encoder = Path(config.courtroom.embedder or retrieval.default_embedder_path())
        if not (encoder / "config.json").is_file():
            raise RetrievalError(f"cannot load sentence encoder {encoder}: not a model directory (no config.json)")
        if config.courtroom.corpus:
            retrieval.load_corpus(config.courtroom.corpus)  # a bad line is named now, not after the encoder has loaded


def meteor_scored(config, claims):
    """Whether finish() would compute METEOR-based scores for this run (AVeriTeC with gold labels)."""
    return (config.method.task != "explain" and config.data.dataset == "averitec"
            and any(c.get("label") for c in claims))


def scoring_notes(config, claims):
    """What the run will not score, said before any model loads: without WordNet, the METEOR-based scores
    (the run itself needs none; RESCORE adds them later)."""
    if meteor_scored(config, claims) and not averitec.meteor_available():
        return [f"{wordnet.missing_reason()} The run goes on: AVeriTeC@k, the evidence score and justification "
                "METEOR will be saved as not computed, every other score as usual."]
    return []


# How a run scored without WordNet gets its METEOR-based scores: the same command again finds every claim done,
# so it loads no model and debates nothing (_verify), and finish() scores the predictions anew.
RESCORE = ("run the same command again to add them: every claim is done, so nothing is debated and no model "
           "loads.")


def run(config, log=print):
    """Debate every claim not yet done in the config's output directory (each trial's, with several
    trials); write outputs; return the metrics (with several trials: their mean and standard deviation).

    `config` is a RunConfig from config.build (the CLI's, or one made in Python); it is never changed.
    Under torchrun (WORLD_SIZE > 1) each process verifies its share of the claims (debate/pipeline/shards.py) and
    only rank 0 returns the metrics; the others return None.
    """
    models.set_offline()
    world = shards.world()
    if world.size > 1 and config.models.device_map:
        raise ConfigError("--device-map auto spreads one model over the node's GPUs; it cannot run under a "
                          f"{world.size}-process launch, which puts one model on each GPU")
    if config.models.device_map and models.precision(config.models.use_4bit)["device"] == "cpu":
        log("--device-map auto: no CUDA here, ignored")
    # Overriding prompt files are checked first: a wrong placeholder stops the run before anything loads.
    prompt_info = prompts.use_prompt_dir(config.method.prompts)

    # Validate, then write: every check runs before the output directory is touched or a weight loads.
    inputs = evidence.read(config)
    store = config.retrieval.knowledge_store if config.data.evidence == "retrieved" else None
    check_run(config, inputs.claims, encoder_needed=inputs.corpus is not None or store is not None)
    if store:
        if world.size > 1:
            raise ConfigError("--knowledge-store retrieves in one process: run it once with --retrieve-only, then "
                              "launch the debate with --retrieved-file OUTPUT_DIR/retrieved.jsonl")
        store_retrieval.check(config, inputs.claims)  # a bad store directory is named before any model loads
    elif inputs.source:
        log(f"evidence: retrieved, from {inputs.source}")
    for note in (*inputs.notes, *scoring_notes(config, inputs.claims)):
        log(f"note: {note}")
    # One writer per directory, refused before any weight loads (debate/pipeline/lock.py). Rank 0 holds the
    # top directory it merges into; every rank holds the shard it writes (_run_one).
    with lock.hold(config.output.output_dir) if not world.rank else contextlib.nullcontext():
        inputs = evidence.retrieve(inputs, config, log)
        if store and config.retrieval.retrieve_only:
            return score_retrieved(config, inputs.claims, log)
        shards.start(world)
        try:
            metrics = _run_trials(config, inputs, prompt_info, world, log)
            if store:
                score_retrieved(config, inputs.claims, log)  # the evidence alone, beside the verdicts' scores
            return metrics
        except BaseException as err:  # a stop, a full disk, any error: say what is kept (debate/pipeline/stops.py)
            # The same command with --overwrite would start over; without it, it resumes what is kept.
            stops.note(err, kept(config, inputs.claims, world), resume="the same command without --overwrite "
                       "resumes" if config.output.overwrite else stops.RESUME)
            raise
        finally:
            shards.stop(world)


def score_retrieved(config, claims, log=print):
    """--retrieve-only: the evidence-only scores of the saved file (eval/evidence.py) where the claims have golden
    AVeriTeC pairs, written to OUTPUT_DIR/retrieved.scores.json; None where there are none to score against."""
    references = data.as_references([c for c in claims if c.get("questions")])
    path = store_retrieval.retrieved_path(config)
    if not references:
        log(f"retrieved evidence saved in {path}; the split has no golden question-answer pairs to score it against")
        return None
    wordnet.load_wordnet()
    rows = [(f"line {n}", row) for n, row in enumerate(records.read_jsonl(path), start=1)]
    scores = evidence_scores.score(rows, [(f"claim {r['claim_id']}", r) for r in references], (str(path), "the split"))
    records.write_json(path.with_name("retrieved.scores.json"), {k: v for k, v in scores.items() if k != "per_claim"})
    log(evidence_scores.summary_line(scores))
    return scores


def kept(config, claims, world=shards.World()):
    """What a run that ends early keeps, in words: "3 of 8 claims written to DIR" for the directory it was
    writing (the last trial begun, this rank's shard)."""
    out = Path(config.output.output_dir)
    if config.generation.trials > 1:
        begun = [k for k in range(1, config.generation.trials + 1) if (out / f"trial-{k}").is_dir()]
        out = out / f"trial-{begun[-1] if begun else 1}"
    if world.size > 1:
        out, claims = shards.shard_dir(out, world), shards.split(claims, world)
    wanted = {c["claim_id"] for c in claims}
    try:
        done = {p["claim_id"] for p in records.read_jsonl(out / records.PREDICTIONS, repair=False)} & wanted
    except (records.RunConflict, OSError):
        done = set()
    return f"{len(done)} of {len(claims)} claims written to {out}"


def _run_trials(config, inputs, prompt_info, world, log):
    trials = config.generation.trials
    if world.rank:
        log = _quiet
    if trials == 1:
        return _run_one(config, inputs, prompt_info, {}, log, world)
    # Trial k runs with seed + k - 1 in its own resumable directory; the agents are loaded once for all.
    top, first_seed, agents, results = Path(config.output.output_dir), config.generation.seed, {}, []
    top.mkdir(parents=True, exist_ok=True)
    for k in range(1, trials + 1):
        trial = replace(config, generation=replace(config.generation, seed=first_seed + k - 1),
                        output=replace(config.output, output_dir=str(top / f"trial-{k}")))
        log(f"trial {k}/{trials}: seed {trial.generation.seed}")
        results.append(_run_one(trial, inputs, prompt_info, agents, log, world))
    if world.rank:
        return None  # rank 0 writes the trials' summary
    saved = dict(config_json(config), trial_seeds=[first_seed + k for k in range(trials)],
                 trial_dirs=[f"trial-{k}" for k in range(1, trials + 1)])
    if prompt_info:
        saved.update(prompts_hash=prompt_info["hash"], prompt_files=prompt_info["files"])
    records.write_json(top / records.CONFIG, saved)
    if any(m is None for m in results):
        return None
    summary = trial_summary(results)
    if config.method.method in COURTROOM_METHODS:
        # PROClaim's Table 3 over the trials (eval/trials.py): each run, the vote over runs, the oracle.
        references = {c["claim_id"]: c.get("label") for c in inputs.claims if c.get("label")}
        runs = [records.read_predictions(top / f"trial-{k}") for k in range(1, trials + 1)]
        # The paper's other measures read the counsels' arguments from each trial's transcripts too.
        wanted = {c["claim_id"] for c in inputs.claims}
        digests = [proclaim_measures.read_digests(top / f"trial-{k}", wanted) for k in range(1, trials + 1)]
        summary["table3"] = trial_metrics.table3(runs, references, digests)
        log(trial_metrics.table3_text(summary["table3"]))
    records.write_json(top / records.METRICS, summary)
    log(report.trials_table(summary))
    if summary.get("not_computed"):
        log(wordnet.not_computed_line(RESCORE))
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


def _quiet(*args, **kwargs):
    """The log of ranks other than 0: rank 0 speaks for the run."""


def _saved_config(config, prompt_info, labels):
    """The config.json of a run (before its models are loaded); `labels`: the dataset's LabelSet."""
    saved = config_json(config, model_roles(config), models.precision(config.models.use_4bit))
    saved["labels"] = list(labels.labels)
    if prompt_info:
        # The files' hash, not the directory's name, identifies the prompts a run used.
        saved.update(prompts_hash=prompt_info["hash"], prompt_files=prompt_info["files"])
    return saved


def _run_one(config, inputs, prompt_info, agents, log, world=shards.World()):
    """One run (one trial) into the config's output directory; `agents` is filled on first need and reused
    after. In a multi-process launch (`world`), this process's shard of it, merged by rank 0."""
    out_dir, overwrite = config.output.output_dir, config.output.overwrite
    shards.check(out_dir, world.size, overwrite)  # before anything is written, on every rank alike
    if world.size == 1:
        with lock.hold(out_dir):  # a trial's directory; the run's own is held already (reentrant)
            _verify(config, inputs.claims, inputs, prompt_info, agents, log)
            return finish(config, inputs.claims, log, inputs.labels)
    if overwrite and world.rank == 0:
        shards.clear(out_dir, keep=world.size)  # another count's shards are no part of this run
    shard = replace(config, output=replace(config.output, output_dir=str(shards.shard_dir(out_dir, world))))
    mine = shards.split(inputs.claims, world)
    log(f"{world.size} processes: rank 0 verifies {len(mine)} of the {len(inputs.claims)} claims")
    with lock.hold(shard.output.output_dir):
        _verify(shard, mine, inputs, prompt_info, agents, log)
        shards.barrier(world)
    if world.rank:
        return None
    shards.merge(out_dir, world.size)
    saved = dict(_saved_config(config, prompt_info, inputs.labels), shards=world.size)
    shard_config = shards.shard_dir(out_dir, world) / records.CONFIG
    if shard_config.exists():
        saved["models"] = json.loads(shard_config.read_text(encoding="utf-8")).get("models")  # rank 0's devices
    records.write_json(Path(out_dir) / records.CONFIG, saved)
    return finish(config, inputs.claims, log, inputs.labels)


def _verify(config, claims, inputs, prompt_info, agents, log):
    """Verify the claims not yet done in the config's output directory, claim by claim into its files."""
    out_dir, overwrite = config.output.output_dir, config.output.overwrite
    roles, labels = model_roles(config), inputs.labels
    saved = _saved_config(config, prompt_info, labels)
    done = records.check(out_dir, saved, overwrite=overwrite)
    if not overwrite:
        records.recover(out_dir)  # every check has passed: what a killed --overwrite left can be settled
    else:
        shards.clear(out_dir)  # a sharded run's shards are no part of this one (a shard has none)
    # Claims with evidence of similar length share a batch, so few rows are padded to a far longer one.
    todo = sorted((c for c in claims if c["claim_id"] not in done),
                  key=lambda c: sum(len(data.evidence_text(e)) for e in c["evidence"]))
    log(f"{len(claims)} claims, {len(claims) - len(todo)} already done in {out_dir}, {len(todo)} to go")

    if todo:
        if not agents:
            agents.update(load_agents(config, roles))
        saved["models"] = models.model_info(agents)
        log("models: " + models.precision_line(saved["models"]))
        settings = settings_of(config)
        check_schemas(config, agents, settings, labels)
        kwargs = method_options(config, labels, inputs.passages, log)  # the courtroom's encoder loads here
        # One random stream per seed for the whole run, not one per batch.
        streams = turns.Streams(turns.device_of(agents))
        hint = (EXPLAIN_TURNS_AT_MOST if config.method.task == "explain" else TURNS_AT_MOST).get(
            config.method.method) if config.method.refine == "none" else None
        bar = progress.ClaimBar(total=len(claims), done=len(claims) - len(todo), desc=config.method.method,
                                turns_hint=hint and hint(config))
        start = time.time()
        # The earlier run (--overwrite) is moved aside here, and deleted once the first claim is written.
        with records.RunDir(out_dir, saved, overwrite=overwrite) as out, bar:
            def write(record):
                with stops.deferred():  # a record is written whole or not at all, Ctrl-C or not
                    out.write(record)
                bar.claim_done(len(record["transcript"].get("turns", ())))

            verify_claims(config, agents, todo, settings, streams, kwargs, write)
        log(f"verified {len(todo)} claims in {time.time() - start:.1f}s")


def check_schemas(config, agents, settings, labels):
    """Refuse a --max-new-tokens too short for the JSON answers the method (and MADR) ask for."""
    table = EXPLAIN_SCHEMAS if config.method.task == "explain" else SCHEMAS
    names = table[config.method.method] + (madr.SCHEMAS if config.method.refine == "madr" else ())
    turns.check_schemas(agents, names, settings, labels)


def verify_claims(config, agents, claims, settings, streams, kwargs, write):
    """Verify `claims` with the config's method (and MADR); `write(record)` gets each claim's record as it is
    decided. `kwargs`: the method's options (`method_options`).

    Continuous (the default): --batch-size claims in progress at once, each claim's turns joining the next
    model call of its model (debate/engine/scheduler.py). Otherwise claims go in fixed batches that move from turn
    to turn together. Under greedy decoding both give the same records."""
    method = method_entry(config)[0]

    def verify(batch):
        if config.method.refine == "madr":
            # A claim is written once its justification is refined, so a crash redoes its batch.
            done_batch = method(agents, batch, settings, streams=streams, **kwargs)
            madr.refine(agents, done_batch, batch, replace(settings, temperature=config.madr.madr_temperature),
                        config.madr.madr_iterations, streams, on_finish=write)
        else:
            method(agents, batch, settings, streams=streams, on_finish=write, **kwargs)

    size = config.generation.batch_size
    if config.generation.continuous:
        scheduler.run(claims, lambda claim: verify([claim]), running=size)
    else:
        for i in range(0, len(claims), size):
            verify(claims[i:i + size])


def finish(config, claims, log=print, labels=None):
    """Score the run directory's predictions against the claims' gold labels and write the reports: AVeriTeC's
    scorer (labels, evidence score, justification METEOR) and submission.json on AVeriTeC, the label metrics
    (eval.metrics) under the dataset's `labels` elsewhere; an explanation run's explanations are summed up
    (their faithfulness is debatecv-geval's to score: debate.pipeline.faithfulness)."""
    out = Path(config.output.output_dir)
    wanted = {c["claim_id"] for c in claims}
    # A directory resumed with a smaller --limit holds more claims than this run asked for.
    predictions = [p for p in records.read_predictions(out) if p["claim_id"] in wanted]
    if config.method.task == "explain":
        metrics = faithfulness.explanation_stats(predictions)
        records.write_json(out / records.METRICS, metrics)
        log(faithfulness.stats_line(metrics))
        log(f"faithfulness: debatecv-geval {out} --judge-model MODEL --protocol all")
        return metrics
    averitec_run = config.data.dataset == "averitec"
    if averitec_run:
        submission = records.submission(predictions, claims)
        records.write_json(out / records.SUBMISSION, submission)
    references = [c for c in claims if c.get("label")]
    if not references:
        log("no gold labels for this split: predictions written, nothing scored")
        return None
    if averitec_run:
        metrics = averitec.score(submission, data.as_references(references))
    else:
        metrics = label_scores.score(predictions, references, labels)
    metrics["dataset"] = config.data.dataset
    metrics["evidence_condition"] = config.data.evidence
    if config.method.method in COURTROOM_METHODS:
        # The panel's agreement, Table 5's evidence and rounds, Appendix P's tokens (eval/trials.py), and the
        # paper's other measures (eval/proclaim_measures.py, which also reads the transcripts).
        metrics.update(trial_metrics.run_extras(predictions, {c["claim_id"]: c.get("label") for c in references},
                                                proclaim_measures.read_digests(out, wanted)))
    records.write_json(out / records.METRICS, metrics)
    log(report.summary_table(metrics, rescore=RESCORE))
    if "proclaim" in metrics and config.generation.trials == 1:
        log(proclaim_measures.measures_text(metrics["proclaim"]["measures"]))
    if config.data.split == "demo":
        log(next_step(out))
    return metrics


def next_step(out):
    """The demo's last line: where its outputs are, how to see them, how to run on one's own claims and model."""
    return (f"next: outputs in {out} (predictions.jsonl, transcripts.jsonl, metrics.json); see them with "
            f"`python -m eval.view {out} -o report.html`; your own claims and model: `python run_debate.py "
            "--dataset jsonl --data-dir DIR --split NAME --model PATH` (DIR/NAME.jsonl beside a card.json)")


def main_guard(fn):
    """Turn the toolkit's own errors into one clear line and exit code 2; a traceback helps nobody there.

    Ctrl-C and SIGTERM (`timeout`, a batch scheduler) stop the run cleanly: one "stopped: ..." line, exit
    130 / 143; a full disk is one line and exit 1 (debate/pipeline/stops.py). Either way what is done stays,
    and a run stopped before its first claim puts its directory back as it was (records.RunDir).
    """
    with stops.handled(signal.SIGINT, signal.SIGTERM), stops.one_line():
        try:
            return fn()
        except (ConfigError, DataError, models.ModelLoadError, records.RunConflict, PromptError, InputError,
                WordNetMissingError, RetrievalError, SchemaBudgetError, lock.LockError) as err:
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2)
