"""What the stages asked for need and do not have, all of it in one message, before torch is imported.

`train_moderator.py --stage dpo` on a fresh folder used to say the model was missing, then, on the next try, the
SynDeC file. Here the model, the split the synth stage reads, the SynDeC file and adapters a later stage reads, and
whether --out is writable are found together from the paths alone (debate/pipeline/preflight.py's checks); the
deeper ones (a model's config and tokenizer, an adapter's base, the SynDeC records themselves) stay in
train/stages.py's `check`, still before any weight loads.

The layout of OUT (`paths`) and whether a stage is done (`done`) live here, so this module needs no torch.
"""
import os
from pathlib import Path
from typing import Dict, List, Sequence, Union

from debate.data import datasets
from debate.data.inputs import DataError
from debate.pipeline import preflight
from train.settings import DEMO_MODEL, STAGES, TrainSettings


def paths(out: Union[str, os.PathLike]) -> Dict[str, Path]:
    out = Path(out)
    return {"debates": out / "debates", "syndec": out / "syndec.jsonl", "corrections": out / "corrections.jsonl",
            "corrected": out / "syndec.corrected.jsonl", "sft": out / "sft", "dpo": out / "dpo"}


def done(stage: str, out: Union[str, os.PathLike]) -> bool:
    p = paths(out)
    return {"synth": p["syndec"].exists(), "correct": p["corrected"].exists(),
            "sft": (p["sft"] / "adapter" / "adapter_config.json").exists(),
            "dpo": (p["dpo"] / "adapter" / "adapter_config.json").exists()}[stage]


def todo(settings: TrainSettings) -> List[str]:
    """The stages this command runs: those asked for, less those already done in OUT (unless --overwrite)."""
    wanted = STAGES if settings.stage == "all" else (settings.stage,)
    return [stage for stage in wanted if settings.overwrite or not done(stage, settings.out)]


def missing_syndec(source: Path) -> str:
    """The line refusing a training stage run alone on an OUT with no SynDeC file: which stages write it."""
    return (f"{source}: no such SynDeC file; --stage synth writes it (then --stage correct the corrected one), "
            f"--stage all runs every stage in order, or give --syndec FILE")


def syndec_source(settings: TrainSettings) -> Path:
    """The SynDeC file a training stage reads: --syndec, else the corrected one, else the uncorrected one."""
    p = paths(settings.out)
    return Path(settings.syndec) if settings.syndec else p["corrected"] if p["corrected"].exists() else p["syndec"]


def problems(settings: TrainSettings, stages: Sequence[str] = ()) -> List[str]:
    """Everything the stages in `stages` (default: `todo`) need and lack, one line each; [] when none. A model
    not given at all is the settings' own problem (train.settings.problems), not repeated here."""
    stages = list(stages or todo(settings))
    if not stages:
        return []
    found, p = [], paths(settings.out)
    models = [("--model", settings.model)]
    models += [("--debater-model", settings.debater_model)] if "synth" in stages else []
    models += [("--corrector-model", settings.corrector_model)] if "correct" in stages else []
    seen = set()
    for flag, path in models:
        if path and path != DEMO_MODEL and path not in seen:
            seen.add(path)
            problem = preflight.model_problem(path, flag)
            if problem:
                found.append(problem)
    if "synth" in stages:
        dataset = datasets.get(settings.dataset)
        try:
            dataset.read(settings.split, settings.data_dir)
        except DataError as err:
            found.append(str(err))
        if settings.retrieved_file and not Path(settings.retrieved_file).is_file():
            found.append(f"--retrieved-file {settings.retrieved_file}: no such file")
    if "correct" in stages and "synth" not in stages and not p["syndec"].exists():
        found.append(missing_syndec(p["syndec"]))
    if {"sft", "dpo"} & set(stages) and not {"synth", "correct"} & set(stages):
        source = syndec_source(settings)
        if not source.is_file():
            found.append(missing_syndec(source) if not settings.syndec else f"--syndec {source}: no such file")
    if "sft" in stages and settings.init_adapter and not Path(settings.init_adapter).is_dir():
        found.append(f"--init-adapter {settings.init_adapter}: no such directory")
    if "dpo" in stages and ("sft" not in stages or settings.sft_adapter):
        adapter = Path(settings.sft_adapter or p["sft"] / "adapter")
        if not adapter.is_dir():
            found.append(f"no D-SFT adapter at {adapter}; run --stage sft first or give --sft-adapter")
    out = preflight.output_problem(settings.out, "--out")
    return found + ([out] if out else [])
