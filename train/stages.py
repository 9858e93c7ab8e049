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
import os
import shutil
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from tqdm import tqdm

from debate.pipeline import config, config_file, evidence, lock, method_table, records, runner, stops
from debate.engine import engine, models
from debate.data import prompts
from train import corrector, examples, lora, loop, losses, syndec

STAGES = ("synth", "correct", "sft", "dpo")
REPLACED = ".replaced"  # under OUT: a stage's earlier outputs while --overwrite redoes it


def paths(out):
    out = Path(out)
    return {"debates": out / "debates", "syndec": out / "syndec.jsonl", "corrections": out / "corrections.jsonl",
            "corrected": out / "syndec.corrected.jsonl", "sft": out / "sft", "dpo": out / "dpo"}


def done(stage, out):
    p = paths(out)
    return {"synth": p["syndec"].exists(), "correct": p["corrected"].exists(),
            "sft": (p["sft"] / "adapter" / "adapter_config.json").exists(),
            "dpo": (p["dpo"] / "adapter" / "adapter_config.json").exists()}[stage]


def outputs(stage, out):
    """The files and folders under OUT a stage writes and `--overwrite` replaces (synth's debates are the
    inner run's, which replaces them itself, claim by claim, like run_debate.py --overwrite)."""
    p = paths(out)
    return {"synth": [p["syndec"]], "correct": [p["corrections"], p["corrected"]], "sft": [p["sft"]],
            "dpo": [p["dpo"]]}[stage]


def _remove(path):
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def replacing(stage, out, overwrite):
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


def synth_config(args):
    """The RunConfig of the synth stage's zero-shot run: DebateCV into OUT/debates on golden evidence (the paper's),
    or on a retrieved-evidence file (HerO's format, e.g. what `run_debate.py --retrieve-only` saved)."""
    retrieved = getattr(args, "retrieved_file", None)
    return config.build(method="debatecv", dataset=args.dataset, split=args.split, data_dir=args.data_dir,
                        evidence="retrieved" if retrieved else "golden", retrieved_file=retrieved,
                        limit=args.limit, debater_model=args.debater_model, moderator_model=args.model,
                        batch_size=args.batch_size, temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                        max_new_tokens=args.max_new_tokens, max_rounds=args.max_rounds, use_4bit=args.use_4bit,
                        structured=args.structured, output_dir=str(paths(args.out)["debates"]),
                        overwrite=args.overwrite, **_debate_retrieval(args))


def _debate_retrieval(args):
    """run_debate.py's --debate-retrieval and the source it searches, as train_moderator.py passes them on."""
    if not getattr(args, "debate_retrieval", False):
        return {}
    return {"debate_retrieval": True, "knowledge_store": args.knowledge_store, "corpus": args.corpus,
            "embedder": args.embedder}


def synth(args, log=print):
    """Zero-shot DebateCV over the split (golden evidence, or --retrieved-file's), then SynDeC records from its outputs."""
    p = paths(args.out)
    synth_run = synth_config(args)
    runner.run(synth_run, log=log)
    inputs = evidence.read(synth_run)  # golden or a retrieved file: nothing to retrieve
    rows = syndec.build(p["debates"], inputs.claims, inputs.labels)
    syndec.write(p["syndec"], rows)
    right = sum(r["correct"] for r in rows)
    log(f"synth: {len(rows)} SynDeC records in {p['syndec']}: {right} correct (for D-SFT), "
        f"{len(rows) - right} wrong (for the Corrector, then D-DPO)")


def correct(args, log=print):
    p = paths(args.out)
    rows = syndec.load(p["syndec"])
    wrong = [r for r in rows if not r["correct"]]
    log(f"correct: {len(wrong)} wrong predictions of {len(rows)}; Corrector: {args.corrector_model}")
    if wrong:
        agent = models.load_roles({"corrector": args.corrector_model}, use_4bit=args.use_4bit)["corrector"]
        settings = engine.Settings(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                   top_p=args.top_p, seed=args.seed, structured=args.structured)
        try:
            with tqdm(total=len(wrong), initial=len(corrector.read_done(p["corrections"])), desc="correct",
                      unit="claim", dynamic_ncols=True) as bar:
                corrections = corrector.correct(agent, rows, p["corrections"], settings, args.batch_size,
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
    log(f"correct: wrote {p['corrected']}; corrections by how they were read: "
        + (", ".join(f"{s} {statuses.count(s)}" for s in sorted(set(statuses))) or "none"))


def _records(args):
    """The SynDeC file a training stage reads: --syndec, else the corrected one, else the uncorrected one."""
    p = paths(args.out)
    source = Path(args.syndec) if args.syndec else p["corrected"] if p["corrected"].exists() else p["syndec"]
    return source, syndec.load(source)


def _config(args):
    return loop.TrainConfig(lr=args.lr, epochs=args.epochs, micro_batch=args.micro_batch, grad_accum=args.grad_accum,
                            warmup_ratio=args.warmup_ratio, schedule=args.schedule, save_every=args.save_every,
                            seed=args.seed)


def _finish(stage_dir, model, loaded, summary, counts, accelerator, log):
    summary["truncation"] = dict(counts)
    if accelerator.is_main_process:
        lora.save_adapter(accelerator.unwrap_model(model), stage_dir / "adapter", loaded)
        records.write_json(stage_dir / loop.SUMMARY, summary)
    accelerator.wait_for_everyone()
    log(f"{stage_dir.name}: {summary['steps']} steps over {summary['examples']} examples in {summary['seconds']} s "
        f"({summary['tokens_per_s']} tokens/s); last loss {summary['last'].get('loss')}; "
        f"long records: {', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}; adapter: {stage_dir / 'adapter'}")


def sft(args, log=print, stop_after=None):
    """D-SFT on the correct records (plus the corrected ones with --sft-include-corrected)."""
    source, rows = _records(args)
    train_rows, dpo_rows = syndec.split(rows)
    if args.sft_include_corrected:
        train_rows += dpo_rows
    if not train_rows:
        raise syndec.SynDeCError(
            f"{source}: no record to train D-SFT on (0 of {len(rows)} predictions were right"
            + ("" if args.sft_include_corrected else "; --sft-include-corrected adds the corrected ones") + ")")
    accelerator = Accelerator()
    model, tokenizer, loaded = lora.load_trainable(
        args.model, adapter=args.init_adapter, r=args.lora_r, alpha=args.lora_alpha, dropout=args.lora_dropout,
        use_4bit=args.use_4bit, gradient_checkpointing=args.gradient_checkpointing, device=accelerator.device)
    data, counts = examples.build(tokenizer, train_rows, examples.sft_example, args.max_length)
    if not data:
        raise syndec.SynDeCError(f"{source}: every D-SFT record is longer than --max-length {args.max_length}")
    log(f"sft: {len(data)} examples from {source}")
    stage_dir = paths(args.out)["sft"]
    pad = tokenizer.pad_token_id
    summary = loop.train(model, data, losses.sft_loss, lambda b: losses.collate(b, pad, accelerator.device),
                         _config(args), stage_dir, loaded, accelerator, resume=args.resume, stop_after=stop_after,
                         desc="D-SFT", fingerprint={"source": str(source), "examples": len(data),
                                                    "max_length": args.max_length})
    if summary["finished"]:
        _finish(stage_dir, model, loaded, summary, counts, accelerator, log)
    return summary


def reference_logps(model, data, pad, accelerator, batch_pairs=1):
    """Log-probabilities of chosen and rejected under the model as it is now (the D-SFT model): [n, 2].

    Computed once before D-DPO changes the adapter, so no second copy of the model is kept.
    """
    model.eval()
    rank, world = accelerator.process_index, accelerator.num_processes
    mine = list(range(rank, len(data), world))
    rows = []
    with torch.no_grad(), loop.autocast(accelerator.device):
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


def dpo(args, log=print, stop_after=None):
    """D-DPO from the D-SFT adapter on the corrected records; the reference is the D-SFT model itself."""
    source, rows = _records(args)
    _, pairs = syndec.split(rows)
    if not pairs:
        raise syndec.SynDeCError(f"{source}: no wrong record with a corrected justification; run --stage correct")
    sft_adapter = args.sft_adapter or paths(args.out)["sft"] / "adapter"
    if not Path(sft_adapter).exists():
        raise models.ModelLoadError(f"no D-SFT adapter at {sft_adapter}; run --stage sft first or give --sft-adapter")
    accelerator = Accelerator()
    model, tokenizer, loaded = lora.load_trainable(
        args.model, adapter=str(sft_adapter), use_4bit=args.use_4bit,
        gradient_checkpointing=args.gradient_checkpointing, device=accelerator.device)
    data, counts = examples.build(tokenizer, pairs, examples.dpo_example, args.max_length)
    if not data:
        raise syndec.SynDeCError(f"{source}: every D-DPO record is longer than --max-length {args.max_length}")
    log(f"dpo: {len(data)} preference pairs from {source}, beta {args.beta}, reference: {sft_adapter}")
    stage_dir = paths(args.out)["dpo"]
    stage_dir.mkdir(parents=True, exist_ok=True)
    pad = tokenizer.pad_token_id
    fingerprint = {"source": str(source), "examples": len(data), "max_length": args.max_length,
                   "beta": args.beta, "sft_adapter": str(sft_adapter)}

    ref_file = stage_dir / "reference.pt"
    saved = torch.load(ref_file, weights_only=False) if ref_file.exists() and args.resume else None
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

    summary = loop.train(model, data, lambda m, b: losses.dpo_step_loss(m, b, args.beta), make_batch,
                         _config(args), stage_dir, loaded, accelerator, resume=args.resume, stop_after=stop_after,
                         desc="D-DPO", fingerprint=fingerprint)
    if summary["finished"]:
        _finish(stage_dir, model, loaded, summary, counts, accelerator, log)
    return summary


def check(args, todo):
    """Refuse the stages in `todo` now, for what needs no weights: model and adapter paths, data, prompts,
    WordNet, the SynDeC file a stage reads. Runs before OUT is created or changed and before any load."""
    p = paths(args.out)
    needed = {args.model}
    needed |= {args.debater_model} if "synth" in todo else set()
    needed |= {args.corrector_model} if "correct" in todo else set()
    configs = {path: models.check_model(path) for path in needed}
    prompts.check_files()
    if "synth" in todo:
        synth_run = synth_config(args)
        runner.check_run(synth_run, evidence.read(synth_run).claims)
        precision = models.precision(synth_run.models.use_4bit)
        records.check(synth_run.output.output_dir,
                      config_file.config_json(synth_run, method_table.model_roles(synth_run), precision),
                      overwrite=args.overwrite)
    if "correct" in todo and "synth" not in todo:
        syndec.load(p["syndec"])
    if ("sft" in todo or "dpo" in todo) and not {"synth", "correct"} & set(todo):
        _records(args)
    if "sft" in todo and args.init_adapter:
        models.check_adapter(args.init_adapter, configs[args.model], args.model)
    if "dpo" in todo and ("sft" not in todo or args.sft_adapter):
        sft_adapter = args.sft_adapter or p["sft"] / "adapter"
        if not Path(sft_adapter).exists():
            raise models.ModelLoadError(f"no D-SFT adapter at {sft_adapter}; run --stage sft first or give --sft-adapter")
        models.check_adapter(sft_adapter, configs[args.model], args.model)


def train_config(args, ran, before=None):
    """train_config.json: the settings, the precision really used, and the models each stage that ran used;
    what an earlier invocation recorded of the stages it ran is kept."""
    before = dict(before or {})
    precision = models.precision(args.use_4bit)
    used = {"synth": {"moderator": args.model, "debater": args.debater_model},
            "correct": {"corrector": args.corrector_model}, "sft": {"moderator": args.model},
            "dpo": {"moderator": args.model}}
    config = {**before, **vars(args), "use_4bit": precision["quantized"],
              "precision": "nf4" if precision["quantized"] else precision["dtype"]}
    config["models"] = dict(before.get("models") or {})
    for stage in ran:
        config["models"][stage] = {role: {"path": os.path.realpath(path), **precision}
                                   for role, path in used[stage].items()}
    config["stages_run"] = [s for s in STAGES if s in ran or s in before.get("stages_run", [])]
    return config


def run(args, log=print):
    """Run the stages asked for in order, skipping those already done (unless --overwrite).

    Everything is checked before OUT is touched; with --overwrite a stage's earlier outputs are kept
    aside until it has finished (see `replacing`).
    """
    models.set_offline()
    args.model = args.model or models.default_model_path()
    args.debater_model = args.debater_model or args.model
    args.corrector_model = args.corrector_model or args.model
    wanted = STAGES if args.stage == "all" else (args.stage,)
    todo = [stage for stage in wanted if args.overwrite or not done(stage, args.out)]
    for stage in wanted:
        if stage not in todo:
            log(f"{stage}: already done in {args.out}, skipped (--overwrite redoes it)")
    if not todo:
        return
    check(args, todo)
    # One writer per OUT (debate/pipeline/lock.py), refused before any weight loads: the stages read each
    # other's files, so a lock per stage would still let a second command's D-DPO read a SynDeC file this one
    # rewrites. Under `accelerate launch` the first process holds it for all.
    main = os.environ.get("RANK", "0") == "0"
    with lock.hold(args.out, flag="--out") if main else contextlib.nullcontext():
        Path(args.out).mkdir(parents=True, exist_ok=True)
        config_path = Path(args.out) / "train_config.json"
        ran = []
        try:
            for stage in todo:
                try:
                    with replacing(stage, args.out, args.overwrite):
                        {"synth": synth, "correct": correct, "sft": sft, "dpo": dpo}[stage](args, log=log)
                except BaseException as err:
                    stops.note(err, f"the stages before {stage} in {args.out}",
                               resume=f"the same command goes on from the {stage} stage")
                    raise
                ran.append(stage)
        finally:
            if ran:
                before = json.loads(config_path.read_text()) if config_path.exists() else {}
                records.write_json(config_path, train_config(args, ran, before))
