"""config.json of a run: every setting by flag name, trimmed to the models and options the run uses, with the
precision its weights were held at and what identifies the software it ran on."""
import platform
import subprocess
from dataclasses import fields
from importlib import metadata
from pathlib import Path

from debate.engine import models
from debate.pipeline.config import COURTROOM_METHODS, Courtroom, to_dict
from debate.pipeline.method_table import FLAG_ARGS, model_roles


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
        saved["dtype"] = precision["dtype"]  # in effect: a run resumed where the default differs is told apart
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


def saved_config(config, prompt_info, labels):
    """The config.json of a run (before its models are loaded); `labels`: the dataset's LabelSet."""
    dtype = models.run_dtype(config.models.dtype)
    saved = config_json(config, model_roles(config), models.precision(config.models.use_4bit, dtype=dtype))
    saved["labels"] = list(labels.labels)
    if prompt_info:
        # The files' hash, not the directory's name, identifies the prompts a run used.
        saved.update(prompts_hash=prompt_info["hash"], prompt_files=prompt_info["files"])
    return saved
