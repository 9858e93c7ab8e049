"""What a run needs and does not have, all of it in one message, before torch or transformers is imported.

A new user's first commands are the ones that fail: a missing --model, a split file not downloaded, a retrieved
file not fetched, an output folder on a read-only disk. Each of those used to stop the run alone, after seconds of
imports, so the next try found the next one. Here they are found together from the paths alone (existence,
permissions, a split file read as data), and the CLI says them in one `error:` message.

The deeper checks (a model's config.json and tokenizer, an adapter's base, prompt placeholders, a corpus's lines)
stay in runner.check_run, which runs once the run's modules are imported and still before any weight loads.

Imports only the data wing and the config: nothing here may pull in the engine.
"""
import contextlib
import errno
import os
from pathlib import Path
from typing import Iterable, List, Optional

from debate.data import datasets, prompts
from debate.data.inputs import DataError

NO_MODEL_YET = "<no --model>"  # the CLI's stand-in while it says a missing --model with the rest (cli.parse_run_args)
GGUF_MAGIC = b"GGUF"  # a GGUF file's first bytes (the format's header); the engine's own check reads the same


def model_problem(path: str, flag: str) -> Optional[str]:
    """Why `path` (given with `flag`) cannot be a model, from the file system alone; None when it may be one."""
    real = os.path.realpath(os.path.expanduser(path))
    if not os.path.exists(real):
        return f"{flag} {path}: no such file or directory (a Hugging Face directory or a .gguf file; hub ids are " \
               "not downloaded)"
    if os.path.isdir(real):
        if not os.path.isfile(os.path.join(real, "config.json")):
            return f"{flag} {path}: not a model directory (no config.json)"
        return None
    try:
        with open(real, "rb") as f:
            magic = f.read(len(GGUF_MAGIC))
    except OSError as err:
        return f"{flag} {path}: {err.strerror}"
    return None if magic == GGUF_MAGIC else f"{flag} {path}: not a GGUF file or a model directory"


def model_problems(models) -> List[str]:
    """The problems of a RunConfig's model paths (config.models), each path once, under the flag the user typed it
    with: --model for a path some role took from --model, else the first role's flag naming it."""
    seen, found = set(), []
    fields = ("debater_model", "moderator_model", "defense_model", "court_model", "critic_model", "witness_model",
              "refine_model")
    named = [(f"--{name.replace('_', '-')}", getattr(models, name)) for name in fields]
    named += [("--judge-models", path) for path in models.judge_models or ()]
    # The roles hold --model's path as typed (config._fill_models); one no role took (every role named) is not read.
    if models.model in {path for _, path in named}:
        named.insert(0, ("--model", models.model))
    for flag, path in named:
        if path and path != NO_MODEL_YET and path not in seen:
            seen.add(path)
            problem = model_problem(path, flag)
            if problem:
                found.append(problem)
    if models.moderator_adapter and not Path(models.moderator_adapter).is_dir():
        found.append(f"--moderator-adapter {models.moderator_adapter}: no such directory (a PEFT adapter: "
                     "train_moderator.py writes OUT/dpo/adapter)")
    return found


def missing_retrieved(path: Path, dataset, where: str, given: bool) -> str:
    """The line refusing a retrieved-evidence file that is not there: where to get it (the dataset's default file)
    and what else runs without it."""
    if given or not dataset.retrieved_source:
        fix = "give a file that exists"
    else:
        fix = f"the file is not shipped: get {path.name} for {where} from {dataset.retrieved_source} into {path.parent}"
    return (f"{path}: no such retrieved-evidence file{' (--retrieved-file)' if given else ''}; {fix}, or run with "
            "--evidence golden (the annotated evidence), or with --knowledge-store DIR to retrieve the evidence from "
            "each claim's store (docs/retrieval.md)")


def data_problems(config) -> List[str]:
    """The problems of the run's data: its split (read: it is plain JSON, and its errors name file, line and field),
    the retrieved-evidence file it needs, and the files and folders given by flag."""
    d, found = config.data, []
    dataset = datasets.get(d.dataset)
    try:
        dataset.read(d.split, d.data_dir)
        dataset.labels(d.split, d.data_dir)
    except DataError as err:
        found.append(str(err))
    store = config.retrieval.knowledge_store
    if d.evidence == "retrieved" and not store:
        given = bool(d.retrieved_file)
        path = d.retrieved_file or (dataset.retrieved_file(d.split, d.data_dir) if dataset.retrieved_file else None)
        if path is not None and not Path(path).is_file():
            found.append(missing_retrieved(Path(path), dataset, f"{dataset.name} {d.split}", given))
    if store and not Path(store).is_dir():
        found.append(f"--knowledge-store {store}: no such directory (DIR/<claim_id>.json, AVeriTeC's layout)")
    if config.courtroom.corpus and not Path(config.courtroom.corpus).is_file():
        found.append(f"--corpus {config.courtroom.corpus}: no such file (JSONL passages)")
    if config.method.prompts and not Path(config.method.prompts).is_dir():
        found.append(f"--prompts {config.method.prompts}: no such directory")
    elif config.method.prompts:
        try:  # the override files' names and placeholders: text alone, said with the rest
            prompts.checked_set(config.method.prompts)
        except prompts.PromptError as err:
            found.append(str(err))
    return found


def output_problem(path: str, flag: str = "--output-dir") -> Optional[str]:
    """Why nothing can be written at `path`, from the file system alone (it, or the nearest folder above it that
    exists, is not writable: read-only, or another user's); None when it can."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        return f"{path}: exists and is not a directory; give {flag} DIR"
    probe = target
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not os.access(probe, os.W_OK | os.X_OK):
        where = "" if probe == target else f" (its nearest existing folder {probe} is not writable)"
        return f"{path}: cannot write here{where}: a read-only disk or another user's folder; give {flag} DIR " \
               "on a writable disk"
    return None


UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS}


@contextlib.contextmanager
def writing_to(out_dir: str, flag: str = "--output-dir", error=ValueError):
    """Around the writes into `out_dir`: an OS error refusing a write there (read-only, not ours, made so after the
    check above) becomes `error` with one line suggesting `flag`, instead of the OS's traceback."""
    try:
        yield
    except OSError as err:
        name = getattr(err, "filename", None)
        inside = name is not None and os.path.realpath(name).startswith(os.path.realpath(out_dir))
        if err.errno not in UNWRITABLE or not inside:
            raise
        raise error(f"cannot write {name} ({err.strerror}); give {flag} DIR on a writable disk") from err


def problems(config) -> List[str]:
    """Everything the run needs and does not have, one line each; [] when none."""
    found = model_problems(config.models) + data_problems(config)
    out = output_problem(config.output.output_dir)
    return found + ([out] if out else [])


def message(found: Iterable[str]) -> str:
    """The one `error:` message of several problems: each on its own line, so each can be fixed in one go."""
    found = list(found)
    if len(found) == 1:
        return found[0]
    return f"{len(found)} things stop this run before it starts:\n" + "\n".join(f"  - {p}" for p in found)
