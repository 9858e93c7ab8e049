"""The settings of Moderator post-training: one frozen dataclass, the one place each default is written.

`train_moderator.py`'s parser reads its defaults from `TrainSettings`, `from_args` turns what it parsed
into settings (filling the per-split default, refusing values that make no run), and the stages, the
loop and LoRA read those settings and never change them. The run side does the same with
debate/pipeline/config.py's `RunConfig`.
"""
import argparse
from dataclasses import dataclass, fields, replace
from typing import Callable, List, Optional

from debate.pipeline.config import DEMO_MODEL, DEMO_SPLIT, DEMO_TURN, FULL_TURN, PAPER_TEMPERATURE, no_model

STAGES = ("synth", "correct", "sft", "dpo")
SCHEDULES = ("cosine", "linear", "constant")
# The flags that take a count: each must be at least 1.
POSITIVE = ("batch_size", "max_new_tokens", "max_rounds", "lora_r", "lora_alpha", "epochs", "micro_batch",
            "grad_accum", "max_length", "save_every")


@dataclass(frozen=True)
class TrainSettings:
    """Every flag of train_moderator.py, by its `dest`; the DebateCV paper's Appendix C gives the learning rate,
    epochs, LoRA rank and alpha, the debate's rounds and temperature; every other default is ours."""
    stage: str = "all"
    out: str = "runs/syndec"
    overwrite: bool = False
    # synthesis
    dataset: str = "averitec"
    split: str = "train"
    data_dir: Optional[str] = None
    retrieved_file: Optional[str] = None
    debate_retrieval: bool = False  # synthesis debates that retrieve as they go (run_debate.py's flag, ours)
    knowledge_store: Optional[str] = None  # with debate_retrieval: each claim's store, searched during the debate
    corpus: Optional[str] = None  # with debate_retrieval: JSONL passages searched instead
    embedder: Optional[str] = None  # with debate_retrieval: the sentence encoder (None: the shipped one)
    limit: Optional[int] = None
    batch_size: int = 8
    max_new_tokens: Optional[int] = None  # None: DEMO_TURN on the demo split, else FULL_TURN (`from_args`)
    max_rounds: int = 3
    temperature: float = PAPER_TEMPERATURE
    top_p: float = 1.0
    structured: bool = True
    memory_gb: Optional[float] = None  # the synthesis run's memory budget in GiB (run_debate.py's --memory-gb, ours)
    compile: Optional[bool] = None  # the synthesis run's decode step compiled (run_debate.py's --compile, ours)
    # models (None: the embedded model on the demo split, a refusal on another; `demo`: the embedded model on any
    # split; the Debaters and the Corrector default to --model)
    model: Optional[str] = None
    debater_model: Optional[str] = None
    corrector_model: Optional[str] = None
    use_4bit: Optional[bool] = None
    # training
    syndec: Optional[str] = None
    sft_include_corrected: bool = False
    init_adapter: Optional[str] = None
    sft_adapter: Optional[str] = None
    lora_r: int = 128
    lora_alpha: int = 256
    lora_dropout: float = 0.05
    lr: float = 2e-5
    epochs: int = 2
    micro_batch: int = 1
    grad_accum: int = 8
    warmup_ratio: float = 0.03
    schedule: str = "cosine"
    max_length: int = 4096
    beta: float = 0.1
    gradient_checkpointing: bool = True
    save_every: int = 50
    resume: bool = False
    seed: int = 0


DEFAULTS = TrainSettings()


def problem(settings: TrainSettings) -> Optional[str]:
    """The first setting that makes no training run, as the flag's one-line error; None when all are fine."""
    found = problems(settings)
    return found[0] if found else None


def problems(settings: TrainSettings) -> List[str]:
    """Every setting that makes no training run, each as the flag's one-line error; [] when all are fine."""
    found = [f"--{name.replace('_', '-')} must be at least 1" for name in POSITIVE if getattr(settings, name) < 1]
    if settings.limit is not None and settings.limit < 1:
        found.append("--limit must be at least 1")
    if settings.temperature < 0 or not 0 < settings.top_p <= 1:
        found.append("--temperature must be >= 0 and --top-p in (0, 1]")
    if (settings.lr <= 0 or settings.beta <= 0 or not 0 <= settings.warmup_ratio < 1
            or not 0 <= settings.lora_dropout < 1):
        found.append("--lr and --beta must be positive, --warmup-ratio and --lora-dropout in [0, 1)")
    if settings.model is None and settings.split != DEMO_SPLIT:
        found.append(no_model(settings.split, "--model") + " (the Moderator trained here)")
    return found


def from_args(args: argparse.Namespace, parser: Optional[argparse.ArgumentParser] = None,
              check: Optional[Callable[[TrainSettings], List[str]]] = None) -> TrainSettings:
    """The settings of parsed flags, the per-split turn length filled in; a bad value is the parser's one
    `error:` message (a ValueError without a parser). `check(settings)`: what the stages need and lack
    (train/preflight.py), said in the same message."""
    given = {f.name: getattr(args, f.name) for f in fields(TrainSettings) if hasattr(args, f.name)}
    settings = TrainSettings(**given)
    if settings.max_new_tokens is None:
        settings = replace(settings, max_new_tokens=DEMO_TURN if settings.split == DEMO_SPLIT else FULL_TURN)
    own = problems(settings)
    found = own + (check(settings) if check else [])
    if found:
        if parser is None:
            raise ValueError(found[0])
        from debate.pipeline import preflight

        if found == own:
            parser.error(preflight.message(found))  # the flags' values: the pointer to --help helps
        parser.exit(2, f"error: {preflight.message(found)}\n")
    return settings


def uses_demo_model(settings: TrainSettings) -> bool:
    """Whether a model of the settings is the embedded one (no --model, or `demo` in a model flag)."""
    return settings.model is None or DEMO_MODEL in (settings.model, settings.debater_model, settings.corrector_model)


def with_models(settings: TrainSettings, default_model: Optional[str]) -> TrainSettings:
    """The settings with every model path filled: --model (else `default_model`, the embedded model's path, which
    `demo` names too), the others from it."""
    def path(value: Optional[str]) -> Optional[str]:
        return default_model if value == DEMO_MODEL else value

    model = path(settings.model) or default_model
    return replace(settings, model=model, debater_model=path(settings.debater_model) or model,
                   corrector_model=path(settings.corrector_model) or model)
