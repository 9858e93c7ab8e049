"""One verification run: claims in, a resumable output directory with predictions and scores out.

The run reads top to bottom here: its checks, the lock, retrieval, the trials, each trial verified claim by
claim. Which function a method runs and on which models is method_table.py; config.json is config_file.py; scores
and reports are scoring.py."""
import contextlib
import json
import logging
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

from debate.data import claims as data, prompts
from debate.data.inputs import DataError
from debate.data.prompts import PromptError
from debate.engine import errors, kv_pool, models, offline, retrieval, scheduler, step_stats
from debate.engine.retrieval import RetrievalError
from debate.engine.schema_program import SchemaBudgetError
from debate.methods import madr, turns
from debate.pipeline import (
    grown_evidence,
    lock,
    preflight,
    progress,
    records,
    run_claims,
    shards,
    stops,
    store_retrieval,
    threads,
)
from debate.pipeline.config import COURTROOM_METHODS, ConfigError
from debate.pipeline.config_file import config_json, saved_config
from debate.pipeline.method_table import (
    EXPLAIN_TURNS_AT_MOST,
    TURNS_AT_MOST,
    check_schemas,
    check_schemas_early,
    load_agents,
    method_entry,
    method_options,
    model_roles,
    role_models,
    settings_of,
)
from debate.pipeline.scoring import finish, finish_trials, score_retrieved, scoring_notes
from eval.averitec import InputError
from eval.wordnet import WordNetMissingError

log = logging.getLogger(__name__)


def load_claims(config):
    """The run's claims with their evidence (debate/pipeline/run_claims.py); loads the encoder when the retrieved
    evidence comes from a corpus, so call it once the run's checks have passed."""
    return run_claims.retrieve(run_claims.read(config), config).claims


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


def run(config):
    """Debate every claim not yet done in the config's output directory (each trial's, with several
    trials); write outputs; return the metrics (with several trials: their mean and standard deviation).

    `config` is a RunConfig from config.build (the CLI's, or one made in Python); it is never changed.
    Under torchrun (WORLD_SIZE > 1) each process verifies its share of the claims (debate/pipeline/shards.py) and
    only rank 0 returns the metrics; the others return None.
    """
    offline.set_offline()  # hub kernels off too: transformers 5.25 refuses an NF4 load otherwise (offline.py)
    threads.apply(config.generation.threads)  # before any model call: torch's default is every core of the machine
    world = shards.world()
    if world.size > 1 and config.models.device_map:
        raise ConfigError("--device-map auto spreads one model over the node's GPUs; it cannot run under a "
                          f"{world.size}-process launch, which puts one model on each GPU")
    if config.models.device_map and models.precision(config.models.use_4bit)["device"] == "cpu":
        log.info("--device-map auto: no CUDA here, ignored")
    # Overriding prompt files are checked first: a wrong placeholder stops the run before anything loads.
    # The run reads its own set of prompts; nothing of it outlives the run (debate/data/prompts.py).
    # The memory budget it decides once its models are loaded is its own (debate/engine/kv_pool.py).
    with prompts.using(prompts.checked_set(config.method.prompts)) as prompt_set, kv_pool.kept_budgets():
        return _run_checked(config, prompt_set.info(), world)


def _run_checked(config, prompt_info, world):
    """`run` once its prompts are checked and in use."""
    # Validate, then write: every check runs before the output directory is touched or a weight loads.
    inputs = run_claims.read(config)
    store = config.retrieval.knowledge_store if config.data.evidence == "retrieved" else None
    check_run(config, inputs.claims, encoder_needed=inputs.corpus is not None or store is not None
              or config.debate.debate_retrieval)
    grown_evidence.check(config, inputs.claims)  # a store searched only during the debate, before any model loads
    check_schemas_early(config, inputs.labels)  # the JSON answers' token budget, from the tokenizers alone
    retrieval.set_cache_limit(config.retrieval.embedding_cache_mb)
    if store:
        if world.size > 1:
            raise ConfigError("--knowledge-store retrieves in one process: run it once with --retrieve-only, then "
                              "launch the debate with --retrieved-file OUTPUT_DIR/retrieved.jsonl")
        store_retrieval.check(config, inputs.claims)  # a bad store is named before any model loads
    elif inputs.source:
        log.info(f"evidence: retrieved, from {inputs.source}")
    for note in (*inputs.notes, *scoring_notes(config, inputs.claims)):
        log.info(f"note: {note}")
    # One writer per directory, refused before any weight loads (debate/pipeline/lock.py). Rank 0 holds the
    # top directory it merges into; every rank holds the shard it writes (_run_one).
    with preflight.writing_to(config.output.output_dir, error=ConfigError), \
            lock.hold(config.output.output_dir) if not world.rank else contextlib.nullcontext():
        inputs = run_claims.retrieve(inputs, config)
        if store and config.retrieval.retrieve_only:
            return score_retrieved(config, inputs.claims)
        shards.start(world)
        try:
            metrics = _run_trials(config, inputs, prompt_info, world)
            if store:
                score_retrieved(config, inputs.claims)  # the evidence alone, beside the verdicts' scores
            if config.method.method in COURTROOM_METHODS and config.method.task == "verify" and not world.rank:
                log.info(retrieval.cache_summary())  # what the courtroom's searches left in the embedding cache
            return metrics
        except BaseException as err:  # a stop, a full disk, any error: say what is kept (debate/pipeline/stops.py)
            # Say exactly what is kept and what starts again: a claim in progress keeps none of its turns.
            stops.note(err, *kept_and_resume(config, inputs.claims, world))
            raise
        finally:
            shards.stop(world)


def kept(config, claims, world=shards.World()):
    """What a run that ends early keeps, in words: "3 of 8 claims written to DIR" for the directory it was
    writing (the last trial begun, this rank's shard)."""
    done, total, out = _written(config, claims, world)
    return f"{done} of {total} claims written to {out}"


def kept_and_resume(config, claims, world=shards.World()):
    """(what is kept, what the same command does next), for a stop's one line: "0 claims written: nothing to resume",
    "the 3 claims restart"; the claims not written restart from their first turn (no turn of a claim in progress
    is kept: a claim's record is written whole, once it is decided)."""
    done, total, out = _written(config, claims, world)
    rest = total - done
    restart = (f"the {rest} claims not written restart from their first turn" if rest != 1
               else "the 1 claim not written restarts from its first turn")
    all_restart = (f"the {total} claims restart with the same command" if total != 1
                   else "the 1 claim restarts with the same command")
    if not done:  # under --overwrite, a stop before the first claim puts the earlier run back (records.RunDir)
        return f"0 claims written to {out}: nothing to resume" + (
            " (an earlier run there is put back as it was)" if config.output.overwrite else ""), all_restart
    if config.output.overwrite:
        return (f"{done} of {total} claims written to {out}",
                "the same command without --overwrite resumes" + (f"; {restart}" if rest else ""))
    if not rest:
        return f"all {total} claims written to {out}", "the same command finishes the run (scores and report)"
    return f"{done} of {total} claims written to {out}", f"the same command resumes: {restart}"


def _written(config, claims, world):
    """(claims written, claims of the run, the directory): the last trial begun, this rank's shard."""
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
    return len(done), len(claims), out


def _run_trials(config, inputs, prompt_info, world):
    with progress.quiet() if world.rank else contextlib.nullcontext():  # rank 0 speaks for the run
        return _trials(config, inputs, prompt_info, world)


def _trials(config, inputs, prompt_info, world):
    trials = config.generation.trials
    if trials == 1:
        return _run_one(config, inputs, prompt_info, {}, world)
    # Trial k runs with seed + k - 1 in its own resumable directory; the agents are loaded once for all.
    top, first_seed, agents, results = Path(config.output.output_dir), config.generation.seed, {}, []
    top.mkdir(parents=True, exist_ok=True)
    for k in range(1, trials + 1):
        trial = replace(config, generation=replace(config.generation, seed=first_seed + k - 1),
                        output=replace(config.output, output_dir=str(top / f"trial-{k}")))
        log.info(f"trial {k}/{trials}: seed {trial.generation.seed}")
        results.append(_run_one(trial, inputs, prompt_info, agents, world))
    if world.rank:
        return None  # rank 0 writes the trials' summary
    saved = dict(config_json(config), trial_seeds=[first_seed + k for k in range(trials)],
                 trial_dirs=[f"trial-{k}" for k in range(1, trials + 1)])
    if prompt_info:
        saved.update(prompts_hash=prompt_info["hash"], prompt_files=prompt_info["files"])
    records.write_json(top / records.CONFIG, saved)
    if any(m is None for m in results):
        return None
    return finish_trials(config, inputs.claims, top, results)


def _run_one(config, inputs, prompt_info, agents, world=shards.World()):
    """One run (one trial) into the config's output directory; `agents` is filled on first need and reused
    after. In a multi-process launch (`world`), this process's shard of it, merged by rank 0."""
    out_dir, overwrite = config.output.output_dir, config.output.overwrite
    shards.check(out_dir, world.size, overwrite)  # before anything is written, on every rank alike
    if world.size == 1:
        with lock.hold(out_dir):  # a trial's directory; the run's own is held already (reentrant)
            _verify(config, inputs.claims, inputs, prompt_info, agents)
            return finish(config, inputs.claims, inputs.labels)
    if overwrite and world.rank == 0:
        shards.clear(out_dir, keep=world.size)  # another count's shards are no part of this run
    shard = replace(config, output=replace(config.output, output_dir=str(shards.shard_dir(out_dir, world))))
    mine = shards.split(inputs.claims, world)
    log.info(f"{world.size} processes: rank 0 verifies {len(mine)} of the {len(inputs.claims)} claims")
    with lock.hold(shard.output.output_dir):
        _verify(shard, mine, inputs, prompt_info, agents)
        shards.barrier(world)
    if world.rank:
        return None
    shards.merge(out_dir, world.size)
    saved = dict(saved_config(config, prompt_info, inputs.labels), shards=world.size)
    shard_config = shards.shard_dir(out_dir, world) / records.CONFIG
    if shard_config.exists():
        saved["models"] = json.loads(shard_config.read_text(encoding="utf-8")).get("models")  # rank 0's devices
    records.write_json(Path(out_dir) / records.CONFIG, saved)
    return finish(config, inputs.claims, inputs.labels)


def _verify(config, claims, inputs, prompt_info, agents):
    """Verify the claims not yet done in the config's output directory, claim by claim into its files."""
    out_dir, overwrite = config.output.output_dir, config.output.overwrite
    roles, labels = model_roles(config), inputs.labels
    saved = saved_config(config, prompt_info, labels)
    done = records.check(out_dir, saved, overwrite=overwrite)
    if not overwrite:
        records.recover(out_dir)  # every check has passed: what a killed --overwrite left can be settled
    else:
        shards.clear(out_dir)  # a sharded run's shards are no part of this one (a shard has none)
    # Claims with evidence of similar length share a batch, so few rows are padded to a far longer one.
    todo = sorted((c for c in claims if c["claim_id"] not in done),
                  key=lambda c: sum(len(data.evidence_text(e)) for e in c["evidence"]))
    log.info(f"{len(claims)} claims, {len(claims) - len(todo)} already done in {out_dir}, {len(todo)} to go")

    if todo:
        loaded = not agents
        if loaded:
            agents.update(load_agents(config, roles))
        distinct = models.base_models(agents)
        if loaded:  # once every weight is loaded: the budget every cache and model call of the run stays within
            kv_pool.start_run(distinct, config.generation.gpu_memory_fraction, config.generation.memory_gb,
                              rows=config.generation.batch_size)
        pools = kv_pool.pools_of(distinct)
        for pool in pools:
            pool.reset_stats()  # each trial says its own
        saved["models"] = models.model_info(agents)
        log.info("models: " + models.precision_line(saved["models"]))
        hint = models.bf16_hint(saved["models"])
        if hint:
            log.info(hint)
        settings = settings_of(config, agents)
        check_schemas(config, agents, settings, labels)
        kwargs = method_options(config, labels, inputs.passages)  # the courtroom's encoder loads here
        # One random stream per seed for the whole run, not one per batch.
        streams = turns.Streams(turns.device_of(agents))
        hint = (EXPLAIN_TURNS_AT_MOST if config.method.task == "explain" else TURNS_AT_MOST).get(
            config.method.method) if config.method.refine == "none" else None
        bar = progress.ClaimBar(total=len(claims), done=len(claims) - len(todo), desc=config.method.method,
                                turns_hint=hint and hint(config), steps=lambda: decode_steps(distinct),
                                tokens=lambda: decode_tokens(distinct),
                                max_new_tokens=config.generation.max_new_tokens,
                                side_by_side=config.generation.batch_size)
        start = time.time()
        # The earlier run (--overwrite) is moved aside here, and deleted once the first claim is written.
        with records.RunDir(out_dir, saved, overwrite=overwrite) as out, bar:
            def write(record):
                with stops.deferred():  # a record is written whole or not at all, Ctrl-C or not
                    out.write(record)
                bar.claim_done(len(record["transcript"].get("turns", ())), record["prediction"]["claim_id"])

            in_flight = verify_claims(config, agents, todo, settings, streams, kwargs, write)
        log.info(f"verified {len(todo)} claims in {time.time() - start:.1f}s")
        log.info(kv_pool.summary(pools, in_flight))
        # How each model's decode steps ran (compiled or not, graphs, recompiles), in the run's config.json.
        for role, agent in agents.items():
            stats = step_stats.stats_of(agent.model)
            if stats is not None:
                saved["models"][role]["decode"] = stats.as_record()
        records.write_json(Path(out_dir) / records.CONFIG, saved)
        log.info("decode: " + step_stats.summary(distinct))


def decode_steps(models):
    """The decode steps the models have taken in this process (debate.engine.step_stats's count), for the bar."""
    return sum(s.steps + s.eager_steps for s in map(step_stats.stats_of, models) if s is not None)


def decode_tokens(models):
    """The tokens the models' decode steps are generating in this process, as they go, for the bar: the engine's rows
    a step (step_stats' `row_steps`, one token a row a step). Its `tokens` would be exact but counts a reply only
    when it ends; a row that stopped before its batch's last counts here until it leaves, so this runs a little
    ahead of the replies' own count."""
    return sum(s.row_steps for s in map(step_stats.stats_of, models) if s is not None)


def verify_claims(config, agents, claims, settings, streams, kwargs, write):
    """Verify `claims` with the config's method (and MADR); `write(record)` gets each claim's record as it is
    decided. `kwargs`: the method's options (`method_options`). Returns the most claims in progress at once.

    Continuous (the default): --batch-size claims in progress at once at most, fewer while the memory budget has no
    room for another, each claim's turn joining its model's decode batch at the next step (debate/engine/scheduler.py).
    Otherwise claims go in fixed batches that move from turn to turn together. Under greedy decoding both give the
    same records. A claim one of whose conversations cannot go on (errors.ContextOverflow: its context would pass
    the model's window, or it alone needs more memory than the budget) is written with a note and no verdict."""
    method = method_entry(config)[0]
    written = set()

    def recorded(record):
        written.add(record["prediction"]["claim_id"])
        write(record)

    def verify(batch):
        if config.method.refine == "madr":
            # A claim is written once its justification is refined, so a crash redoes its batch.
            done_batch = method(agents, batch, settings, streams=streams, **kwargs)
            madr.refine(agents, done_batch, batch, replace(settings, temperature=config.madr.madr_temperature),
                        config.madr.madr_iterations, streams, on_finish=recorded)
        else:
            method(agents, batch, settings, streams=streams, on_finish=recorded, **kwargs)

    def guarded(batch):
        try:
            verify(batch)
        except errors.ContextOverflow as err:
            rest = [c for c in batch if c["claim_id"] not in written]
            if len(batch) > 1:  # a fixed batch: its claims not yet written again, each alone, to find whose it was
                for claim in rest:
                    guarded([claim])
            elif rest:
                log.warning(f"claim {rest[0]['claim_id']}: not verified, {err}")
                recorded(overflow_record(rest[0], err))

    size = config.generation.batch_size
    if config.generation.continuous:
        return scheduler.run(claims, lambda claim: guarded([claim]), running=size)
    for i in range(0, len(claims), size):
        guarded(claims[i:i + size])
    return min(size, len(claims))


def overflow_record(claim, err):
    """The record of a claim that could not be debated to its end: no verdict, and why in its note; the tokens its
    known conversations used, and their messages in its transcript (the method's own turns went with it)."""
    convs = [c for c in err.conversations if c is not None]
    record = turns.record(claim, {"status": "unparsed", "verdict": None, "justification": ""}, [], convs)
    note = f"not verified: {err}"
    record["prediction"].update(parse_status="context_overflow", note=note)
    record["transcript"].update(note=note, conversations=[{"system": c.system, "messages": c.messages}
                                                          for c in convs])
    return record


def main_guard(fn):
    """Turn the toolkit's own errors into one clear line and exit code 2; a traceback helps nobody there.

    Ctrl-C and SIGTERM (`timeout`, a batch scheduler) stop the run cleanly: one "stopped: ..." line, exit
    130 / 143; a full disk is one line and exit 1 (debate/pipeline/stops.py). Either way what is done stays,
    and a run stopped before its first claim puts its directory back as it was (records.RunDir).
    """
    with stops.handled(signal.SIGINT, signal.SIGTERM), stops.one_line():
        try:
            return fn()
        except (ConfigError, DataError, errors.ModelLoadError, records.RunConflict, PromptError, InputError,
                WordNetMissingError, RetrievalError, SchemaBudgetError, lock.LockError) as err:
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2)
