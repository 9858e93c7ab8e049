"""Prompt texts: one file per prompt under prompts/, filled in with str.format placeholders.

`use_prompt_dir(DIR)` (the CLI's --prompts) lets the files of DIR override the shipped ones by name, for
instance to run a paper's appendix prompts word for word. Each override must take exactly the
placeholders of the prompt it replaces: the protocol code fills those and nothing else.
"""
import functools
import hashlib
import string
from pathlib import Path

PROMPT_DIR = Path(__file__).resolve().parent.parent / "prompts"
_override_dir = None  # set by use_prompt_dir


class PromptError(ValueError):
    """A prompt file that is missing, malformed, or rendered with the wrong fields."""


def prompt_path(name):
    """The file prompt `name` is read from: the override directory's when it has one, else the shipped one."""
    if _override_dir is not None and (_override_dir / f"{name}.txt").is_file():
        return _override_dir / f"{name}.txt"
    return PROMPT_DIR / f"{name}.txt"


def raw_prompt(name):
    """The text of prompts/<name>.txt as written (placeholders and doubled braces), without its final newline."""
    path = prompt_path(name)
    if not path.is_file():
        raise PromptError(f"prompt {name!r}: no file {path}")
    return _read(path)


def _fields_of(path, text):
    try:
        return {field for _, field, _, _ in string.Formatter().parse(text) if field is not None}
    except ValueError as e:  # a lone { or } in the file
        raise PromptError(f"{path}: bad braces: {e} (write a literal brace as {{{{ or }}}})") from None


def use_prompt_dir(directory):
    """Read prompts from `directory` before the shipped ones (None: shipped ones only); check every file.

    Returns {"dir", "files": {name: sha256 of the file}, "hash": one sha256 over all of them} for the run's
    config, or None without a directory. Every *.txt in it must be named after a shipped prompt and take
    exactly that prompt's placeholders; the first that does not raises PromptError naming the file.
    """
    global _override_dir
    _override_dir = None
    if directory is None:
        return None
    root = Path(directory)
    if not root.is_dir():
        raise PromptError(f"--prompts {root}: not a directory")
    files = sorted(root.glob("*.txt"))
    if not files:
        raise PromptError(f"--prompts {root}: no .txt prompt files in it")
    digests = {}
    for path in files:
        shipped = PROMPT_DIR / path.name
        if not shipped.is_file():
            raise PromptError(f"{path}: no shipped prompt is called {path.stem!r} (see {PROMPT_DIR})")
        text = path.read_text(encoding="utf-8").rstrip("\n")
        want = _fields_of(shipped, _read(shipped))
        have = _fields_of(path, text)
        takes = f"(prompt {path.stem!r} takes: {', '.join(sorted(want)) or 'none'})"
        for problem, names in (("missing", want - have), ("unexpected", have - want)):
            if names:
                listed = ", ".join("{" + f + "}" for f in sorted(names))
                raise PromptError(f"{path}: {problem} placeholder(s) {listed} {takes}")
        digests[path.stem] = hashlib.sha256(text.encode("utf-8")).hexdigest()
    _override_dir = root.resolve()
    combined = hashlib.sha256("".join(f"{n}\0{d}\n" for n, d in sorted(digests.items())).encode()).hexdigest()
    return {"dir": str(_override_dir), "files": digests, "hash": combined}


def load_prompt(name):
    """A prompt that takes no fields, as the model reads it: its doubled braces {{ }} are single."""
    return render(name)


@functools.lru_cache(maxsize=None)  # every turn of every claim renders from these few files
def _read(path):
    return path.read_text(encoding="utf-8").rstrip("\n")


def placeholders(name):
    """The set of {field} names prompt `name` expects."""
    text = raw_prompt(name)
    try:
        return {field for _, field, _, _ in string.Formatter().parse(text) if field is not None}
    except ValueError as e:  # a lone { or } in the file
        raise PromptError(f"prompt {name!r} ({prompt_path(name)}): bad braces: {e}") from None


def render(name, **fields):
    """Fill prompt `name` with `fields`; every placeholder must be given and nothing else."""
    expected = placeholders(name)
    missing = sorted(expected - fields.keys())
    unexpected = sorted(fields.keys() - expected)
    if missing:
        raise PromptError(f"prompt {name!r}: missing field(s) {', '.join(missing)}")
    if unexpected:
        raise PromptError(f"prompt {name!r}: unexpected field(s) {', '.join(unexpected)} "
                          f"(it takes: {', '.join(sorted(expected)) or 'none'})")
    return raw_prompt(name).format(**fields)


def format_evidence(items):
    """The evidence block of a meta prompt: one numbered item per QA pair, or the no-evidence note."""
    if not items:
        return load_prompt("no_evidence")
    return "\n".join(
        render("evidence_item", index=i, question=item["question"], answer=item["answer"],
               url=item.get("url") or "(no source given)")
        for i, item in enumerate(items, start=1))
