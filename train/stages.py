"""The four stages of Moderator post-training, each reading the previous one's files under `--out`.

    OUT/debates/                  synth: the zero-shot DebateCV run (resumable like run_debate.py)
    OUT/syndec.jsonl              synth: SynDeC records
    OUT/corrections.jsonl         correct: one Corrector reply per wrong record (appended as it goes)
    OUT/syndec.corrected.jsonl    correct: the records with corrected justifications
    OUT/sft/adapter/              sft: the D-SFT LoRA adapter (+ checkpoints/, metrics.jsonl, summary.json)
    OUT/dpo/adapter/              dpo: the D-DPO LoRA adapter, trained from the D-SFT one (same layout)

A stage whose final output exists is skipped; `--overwrite` redoes the stages asked for. Everything the
stages asked for need is checked before OUT is created or changed, and before any weight loads.
"""
import contextlib
import json
import logging
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from tqdm import tqdm

from debate.data import prompts
from debate.engine import engine, errors, gguf, models, offline
from debate.pipeline import config, config_file, lock, method_table, records, run_claims, runner, stops
from train import corrector, examples, loop, lora, losses, preflight, syndec
from train.preflight import missing_syndec, paths, syndec_source
from train.settings import STAGES, TrainSettings, uses_demo_model, with_models

# What the stages say goes to this logger; train_moderator.py prints it as plain lines on stdout.
log = logging.getLogger(__name__)
REPLACED = ".replaced"  # under OUT: a stage's earlier outputs while --overwrite redoes it


def outputs(stage: str, out: Union[str, os.PathLike]) -> List[Path]:
    """The files and folders under OUT a stage writes and `--overwrite` replaces (synth's debates are the
    inner run's, which replaces them itself, claim by claim, like run_debate.py --overwrite)."""
    p = paths(out)
    return {"synth": [p["syndec"]], "correct": [p["corrections"], p["corrected"]], "sft": [p["sft"]],
            "dpo": [p["dpo"]]}[stage]


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def replacing(stage: str, out: Union[str, os.PathLike], overwrite: bool) -> Iterator[None]:
    """`--overwrite`: the stage's earlier outputs wait in OUT/.replaced/<stage>/ while it runs, are deleted
    once it has finished, and are put back if it fails, so a failed redo never costs a finished stage."""
    # Under `accelerate launch` every process runs this; only the first moves files.
    if not overwrite or os.environ.get("RANK", "0") != "0":
        yield
        return
    aside = Path(out) / REPLACED / stage
    targets = outputs(stage, out)
    if aside.exists():
        # An earlier --overwrite of this stage was killed: what is aside is still the output to keep.
        for target in targets:
            _remove(target)
    else:
        aside.mkdir(parents=True)
        for target in targets:
            if target.exists():
                os.replace(target, aside / target.name)
    try:
        yield
    except BaseException as err:
        for target in targets:
            _remove(target)
        for kept in aside.iterdir():
            os.replace(kept, Path(out) / kept.name)
        aside.rmdir()
        # What the redo had saved went with it: the line a stop prints must not promise a --resume from it.
        stops.note(err, f"the {stage} stage's earlier output, back in {out}", replace=True,
                   resume="the same command starts the stage over")
        raise
    else:
        shutil.rmtree(aside)
    finally:
        with contextlib.suppress(OSError):
            (Path(out) / REPLACED).rmdir()  # only once empty


def synth_config(settings: TrainSettings) -> config.RunConfig:
    """The RunConfig of the synth stage's zero-shot run: DebateCV into OUT/debates on golden evidence (the paper's),
    or on a retrieved-evidence file (HerO's format, e.g. what `run_debate.py --retrieve-only` saved)."""
    retrieved = settings.retrieved_file
    return config.build(method="debatecv", dataset=settings.dataset, split=settings.split, data_dir=settings.data_dir,
                        evidence="retrieved" if retrieved else "golden", retrieved_file=retrieved,
                        limit=settings.limit, model=settings.model, debater_model=settings.debater_model,
                        moderator_model=settings.model,
                        batch_size=settings.batch_size, temperature=settings.temperature, top_p=settings.top_p,
                        seed=settings.seed, max_new_tokens=settings.max_new_tokens, max_rounds=settings.max_rounds,
                        use_4bit=settings.use_4bit, memory_gb=settings.memory_gb, compile=settings.compile,
                        structured=settings.structured, output_dir=str(paths(settings.out)["debates"]),
                        overwrite=settings.overwrite, **_debate_retrieval(settings))


def _debate_retrieval(settings: TrainSettings) -> dict:
    """run_debate.py's --debate-retrieval and the source it searches, as train_moderator.py passes them on."""
    if not settings.debate_retrieval:
        return {}
    return {"debate_retrieval": True, "knowledge_store": settings.knowledge_store, "corpus": settings.corpus,
            "embedder": settings.embedder}


def synth(settings: TrainSettings) -> None:
    """Zero-shot DebateCV over the split (golden evidence, or --retrieved-file's), then SynDeC records from its
    outputs."""
    p = paths(settings.out)
    synth_run = synth_config(settings)
    runner.run(synth_run)  # its lines: the `debate` loggers', which train_moderator.py prints too
    inputs = run_claims.read(synth_run)  # golden or a retrieved file: nothing to retrieve
    rows = syndec.build(p["debates"], inputs.claims, inputs.labels)
    syndec.write(p["syndec"], rows)
    right = sum(r["correct"] for r in rows)
    log.info(f"synth: {len(rows)} SynDeC records in {p['syndec']}: {right} correct (for D-SFT), "
        f"{len(rows) - right} wrong (for the Corrector, then D-DPO)")


def correct(settings: TrainSettings) -> None:
    p = paths(settings.out)
    rows = syndec.load(p["syndec"])
    wrong = [r for r in rows if not r["correct"]]
    log.info(f"correct: {len(wrong)} wrong predictions of {len(rows)}; Corrector: {settings.corrector_model}")
    if wrong:
        assert settings.corrector_model is not None  # with_models fills it
        agent = models.load_roles({"corrector": settings.corrector_model}, use_4bit=settings.use_4bit)["corrector"]
        assert settings.max_new_tokens is not None  # settings.from_args fills it per split
        decoding = engine.Settings(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                                   top_p=settings.top_p, seed=settings.seed, structured=settings.structured)
        try:
            with tqdm(total=len(wrong), initial=len(corrector.read_done(p["corrections"])), desc="correct",
                      unit="claim", dynamic_ncols=True) as bar:
                corrections = corrector.correct(agent, rows, p["corrections"], decoding, settings.batch_size,
                                                bar.update)
        except BaseException as err:
            with contextlib.suppress(records.RunConflict, OSError):
                written = len(records.read_jsonl(p["corrections"], repair=False))
                stops.note(err, f"{written} of {len(wrong)} corrections written to {p['corrections']}")
            raise
    else:
        corrections = {}
    merged = corrector.merge(rows, corrections)
    syndec.write(p["corrected"], merged)
    statuses = [corrections[r["claim_id"]]["status"] for r in wrong if r["claim_id"] in corrections]
    log.info(f"correct: wrote {p['corrected']}; corrections by how they were read: "
        + (", ".join(f"{s} {statuses.count(s)}" for s in sorted(set(statuses))) or "none"))


def _records(settings: TrainSettings) -> Tuple[Path, List[dict]]:
    """The SynDeC file a training stage reads: --syndec, else the corrected one, else the uncorrected one."""
    source = syndec_source(settings)
    if not settings.syndec and not source.exists():
        # A training stage run alone on a fresh OUT: say which stages write what it reads.
        raise syndec.SynDeCError(missing_syndec(source))
    return source, syndec.load(source)


def _finish(stage_dir: Path, model: Any, loaded: Any, summary: dict, counts: Mapping[str, int],
            accelerator: Accelerator) -> None:
    summary["truncation"] = dict(counts)
    if accelerator.is_main_process:
        lora.save_adapter(accelerator.unwrap_model(model), stage_dir / "adapter", loaded)
        records.write_json(stage_dir / loop.SUMMARY, summary)
    accelerator.wait_for_everyone()
    log.info(f"{stage_dir.name}: {summary['steps']} steps over {summary['examples']} examples in "
             f"{summary['seconds']} s ({summary['tokens_per_s']} tokens/s); last loss {summary['last'].get('loss')}; "
             f"long records: {', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}; "
             f"adapter: {stage_dir / 'adapter'}")


def sft(settings: TrainSettings, stop_after: Optional[int] = None) -> dict:
    """D-SFT on the correct records (plus the corrected ones with --sft-include-corrected)."""
    source, rows = _records(settings)
    train_rows, dpo_rows = syndec.split(rows)
    if settings.sft_include_corrected:
        train_rows += dpo_rows
    if not train_rows:
        raise syndec.SynDeCError(
            f"{source}: no record to train D-SFT on (0 of {len(rows)} predictions were right"
            + ("" if settings.sft_include_corrected else "; --sft-include-corrected adds the corrected ones") + ")")
    accelerator = Accelerator()
    assert settings.model is not None  # with_models fills it
    model, tokenizer, loaded = lora.load_trainable(
        settings.model, adapter=settings.init_adapter, r=settings.lora_r, alpha=settings.lora_alpha,
        dropout=settings.lora_dropout,
        use_4bit=settings.use_4bit, gradient_checkpointing=settings.gradient_checkpointing, device=accelerator.device)
    data, counts = examples.build(tokenizer, train_rows, examples.sft_example, settings.max_length)
    if not data:
        raise syndec.SynDeCError(f"{source}: every D-SFT record is longer than --max-length {settings.max_length}")
    log.info(f"sft: {len(data)} examples from {source}")
    stage_dir = paths(settings.out)["sft"]
    pad = tokenizer.pad_token_id
    summary = loop.train(model, data, losses.sft_loss, lambda b: losses.collate(b, pad, accelerator.device),
                         loop.TrainConfig.of(settings), stage_dir, loaded, accelerator, resume=settings.resume,
                         stop_after=stop_after,
                         desc="D-SFT", fingerprint={"source": str(source), "examples": len(data),
                                                    "max_length": settings.max_length})
    if summary["finished"]:
        _finish(stage_dir, model, loaded, summary, counts, accelerator)
    return summary


def reference_logps(model: Any, data: List[dict], pad: int, accelerator: Accelerator,
                    batch_pairs: int = 1) -> torch.Tensor:
    """Log-probabilities of chosen and rejected under the model as it is now (the D-SFT model): [n, 2].

    Computed once before D-DPO changes the adapter, so no second copy of the model is kept.
    """
    model.eval()
    rank, world = accelerator.process_index, accelerator.num_processes
    mine = list(range(rank, len(data), world))
    rows: List[Tuple[int, float, float]] = []  # (pair, chosen, rejected)
    with torch.no_grad(), loop.autocast(accelerator.device, model):
        for i in tqdm(range(0, len(mine), batch_pairs), desc="reference", unit="pair",
                      disable=not accelerator.is_main_process, dynamic_ncols=True):
            idx = mine[i:i + batch_pairs]
            batch = losses.collate([data[j]["chosen"] for j in idx] + [data[j]["rejected"] for j in idx],
                                   pad, accelerator.device)
            logps, _ = losses.sequence_logps(model, batch)
            n = len(idx)
            rows += [(j, float(logps[k]), float(logps[n + k])) for k, j in enumerate(idx)]
    rows = gather_object(rows) if world > 1 else rows
    out = torch.zeros(len(data), 2, dtype=torch.float64)
    for j, chosen, rejected in rows:
        out[j, 0], out[j, 1] = chosen, rejected
    model.train()
    return out


def dpo(settings: TrainSettings, stop_after: Optional[int] = None) -> dict:
    """D-DPO from the D-SFT adapter on the corrected records; the reference is the D-SFT model itself."""
    source, rows = _records(settings)
    _, pairs = syndec.split(rows)
    if not pairs:
        raise syndec.SynDeCError(f"{source}: no wrong record with a corrected justification; run --stage correct")
    sft_adapter = settings.sft_adapter or paths(settings.out)["sft"] / "adapter"
    if not Path(sft_adapter).exists():
        raise errors.ModelLoadError(f"no D-SFT adapter at {sft_adapter}; run --stage sft first or give --sft-adapter")
    accelerator = Accelerator()
    assert settings.model is not None  # with_models fills it
    model, tokenizer, loaded = lora.load_trainable(
        settings.model, adapter=str(sft_adapter), use_4bit=settings.use_4bit,
        gradient_checkpointing=settings.gradient_checkpointing, device=accelerator.device)
    data, counts = examples.build(tokenizer, pairs, examples.dpo_example, settings.max_length)
    if not data:
        raise syndec.SynDeCError(f"{source}: every D-DPO record is longer than --max-length {settings.max_length}")
    log.info(f"dpo: {len(data)} preference pairs from {source}, beta {settings.beta}, reference: {sft_adapter}")
    stage_dir = paths(settings.out)["dpo"]
    stage_dir.mkdir(parents=True, exist_ok=True)
    pad = tokenizer.pad_token_id
    fingerprint = {"source": str(source), "examples": len(data), "max_length": settings.max_length,
                   "beta": settings.beta, "sft_adapter": str(sft_adapter)}

    ref_file = stage_dir / "reference.pt"
    saved = torch.load(ref_file, weights_only=False) if ref_file.exists() and settings.resume else None
    if saved is not None and saved["data"] == fingerprint:
        ref = saved["logps"]
    else:
        ref = reference_logps(model, data, pad, accelerator)
        if accelerator.is_main_process:
            torch.save({"data": fingerprint, "logps": ref}, ref_file)
    for example, (chosen, rejected) in zip(data, ref.tolist()):
        example["ref"] = (chosen, rejected)

    def make_batch(batch):
        out = losses.collate([e["chosen"] for e in batch] + [e["rejected"] for e in batch], pad, accelerator.device)
        out["ref"] = torch.tensor([e["ref"] for e in batch], dtype=torch.float32, device=accelerator.device)
        return out

    summary = loop.train(model, data, lambda m, b: losses.dpo_step_loss(m, b, settings.beta), make_batch,
                         loop.TrainConfig.of(settings), stage_dir, loaded, accelerator, resume=settings.resume,
                         stop_after=stop_after,
                         desc="D-DPO", fingerprint=fingerprint)
    if summary["finished"]:
        _finish(stage_dir, model, loaded, summary, counts, accelerator)
    return summary


def check(settings: TrainSettings, todo: Sequence[str]) -> None:
    """Refuse the stages in `todo` now, for what needs no weights: model and adapter paths, data, prompts,
    WordNet, the SynDeC file a stage reads. Runs before OUT is created or changed and before any load."""
    p = paths(settings.out)
    # with_models filled them
    assert settings.model is not None and settings.debater_model is not None and settings.corrector_model is not None
    needed = {settings.model}
    needed |= {settings.debater_model} if "synth" in todo else set()
    needed |= {settings.corrector_model} if "correct" in todo else set()
    configs = {path: models.check_model(path) for path in needed}
    prompts.check_files()
    if "synth" in todo:
        synth_run = synth_config(settings)
        runner.check_run(synth_run, run_claims.read(synth_run).claims)
        precision = models.precision(synth_run.models.use_4bit)
        records.check(synth_run.output.output_dir,
                      config_file.config_json(synth_run, method_table.model_roles(synth_run), precision),
                      overwrite=settings.overwrite)
    if "correct" in todo and "synth" not in todo:
        syndec.load(p["syndec"])
    if ("sft" in todo or "dpo" in todo) and not {"synth", "correct"} & set(todo):
        _records(settings)
    if "sft" in todo and settings.init_adapter:
        models.check_adapter(settings.init_adapter, configs[settings.model], settings.model)
    if "dpo" in todo and ("sft" not in todo or settings.sft_adapter):
        sft_adapter = settings.sft_adapter or p["sft"] / "adapter"
        if not Path(sft_adapter).exists():
            raise errors.ModelLoadError(
                f"no D-SFT adapter at {sft_adapter}; run --stage sft first or give --sft-adapter")
        models.check_adapter(sft_adapter, configs[settings.model], settings.model)


STAGE_FUNCTIONS: Dict[str, Callable[[TrainSettings], object]] = {"synth": synth, "correct": correct, "sft": sft,
                                                                  "dpo": dpo}


def train_config(settings: TrainSettings, ran: Sequence[str], before: Optional[dict] = None) -> dict:
    """train_config.json: the settings, the precision really used, and the models each stage that ran used;
    what an earlier invocation recorded of the stages it ran is kept."""
    before = dict(before or {})
    precision = models.precision(settings.use_4bit)
    used = {"synth": {"moderator": settings.model, "debater": settings.debater_model},
            "correct": {"corrector": settings.corrector_model}, "sft": {"moderator": settings.model},
            "dpo": {"moderator": settings.model}}
    config = {**before, **asdict(settings), "use_4bit": precision["quantized"],
              "precision": "nf4" if precision["quantized"] else precision["dtype"]}
    config["models"] = dict(before.get("models") or {})
    for stage in ran:
        config["models"][stage] = {role: {"path": os.path.realpath(str(path)), **precision}
                                   for role, path in used[stage].items()}
    config["stages_run"] = [s for s in STAGES if s in ran or s in before.get("stages_run", [])]
    return config


def run(settings: TrainSettings) -> None:
    """Run the stages asked for in order, skipping those already done (unless --overwrite).

    Everything is checked before OUT is touched; with --overwrite a stage's earlier outputs are kept
    aside until it has finished (see `replacing`).
    """
    offline.set_offline()
    settings = with_models(settings, gguf.default_model_path() if uses_demo_model(settings) else None)
    wanted = STAGES if settings.stage == "all" else (settings.stage,)
    todo = preflight.todo(settings)
    for stage in wanted:
        if stage not in todo:
            log.info(f"{stage}: already done in {settings.out}, skipped (--overwrite redoes it)")
    if not todo:
        return
    check(settings, todo)
    # One writer per OUT (debate/pipeline/lock.py), refused before any weight loads: the stages read each
    # other's files, so a lock per stage would still let a second command's D-DPO read a SynDeC file this one
    # rewrites. Under `accelerate launch` the first process holds it for all.
    main = os.environ.get("RANK", "0") == "0"
    with lock.hold(settings.out, flag="--out") if main else contextlib.nullcontext():
        Path(settings.out).mkdir(parents=True, exist_ok=True)
        config_path = Path(settings.out) / "train_config.json"
        ran = []
        try:
            for stage in todo:
                try:
                    with replacing(stage, settings.out, settings.overwrite):
                        STAGE_FUNCTIONS[stage](settings)
                except BaseException as err:
                    stops.note(err, f"the stages before {stage} in {settings.out}",
                               resume=f"the same command goes on from the {stage} stage")
                    raise
                ran.append(stage)
        finally:
            if ran:
                before = json.loads(config_path.read_text()) if config_path.exists() else {}
                records.write_json(config_path, train_config(settings, ran, before))
