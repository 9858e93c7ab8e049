"""Prompt texts: one file per prompt under prompts/, filled in with str.format placeholders."""
import functools
import string
from pathlib import Path

PROMPT_DIR = Path(__file__).resolve().parent.parent / "prompts"


class PromptError(ValueError):
    """A prompt file that is missing, malformed, or rendered with the wrong fields."""


def raw_prompt(name):
    """The text of prompts/<name>.txt as written (placeholders and doubled braces), without its final newline."""
    path = PROMPT_DIR / f"{name}.txt"
    if not path.is_file():
        raise PromptError(f"prompt {name!r}: no file {path}")
    return _read(path)


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
        raise PromptError(f"prompt {name!r} ({PROMPT_DIR / (name + '.txt')}): bad braces: {e}") from None


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
