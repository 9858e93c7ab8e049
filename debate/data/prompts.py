"""Prompt texts: one file per prompt under prompts/, filled in with str.format placeholders.

A `PromptSet` is the prompts one run reads: the shipped files, or (the CLI's --prompts DIR) the files of
DIR overriding them by name, for instance to run a paper's appendix prompts word for word. Each override
must take exactly the placeholders of the prompt it replaces: the protocol code fills those and nothing
else. `checked_set(DIR)` checks a folder and makes its set; `using(prompt_set)` makes it the one that
`render` and the rest read for the length of a `with` block (a run, one `Verifier.verify` call). The set in
use is a context variable, not a module global, so two Verifiers in one process keep their own prompts and
nothing outlives the block; outside any block the shipped files are read.
"""
import contextlib
import contextvars
import hashlib
import importlib.resources
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Union

from debate.data.inputs import read_text

# The `prompts` package's folder: the checkout's prompts/ or, installed from a wheel, its copy in
# site-packages (package data), whatever the current directory.
PROMPT_DIR = Path(str(importlib.resources.files("prompts")))

# Every prompt the code renders (tests/test_prompts.py checks the code names no other), so that a run
# can check them all before it loads a model or writes a file.
NAMES = ("affirmative_opening", "cooperation_assistant_meta", "cooperation_final", "cooperation_start",
         "cooperation_user_meta", "corrector", "counsel_argument", "counsel_disclosure", "counsel_expert",
         "counsel_gap", "counsel_instruction_defense", "counsel_instruction_plaintiff", "counsel_meta",
         "counsel_reflection", "counsel_search", "counsel_stance_defense", "counsel_stance_plaintiff",
         "court_admissibility", "court_meta", "court_query", "court_ready", "court_witness", "courtroom_argument",
         "courtroom_critic", "courtroom_hearing", "courtroom_no_switch", "courtroom_passage", "courtroom_prag",
         "courtroom_query", "courtroom_reflection", "courtroom_request", "courtroom_round", "courtroom_switch",
         "courtroom_testimony", "critic_consistency", "critic_meta", "critic_premises", "critic_round",
         "debate_turn", "debater_meta", "debater_rebuttal", "evidence_item", "evidence_kind_passages",
         "evidence_kind_qa", "evidence_passage", "judge_case", "judge_mad", "judge_meta",
         "madr_context", "madr_error_typology", "madr_free_feedback", "madr_judge",
         "madr_judge_meta", "madr_no_verdict", "madr_refine", "madr_revise",
         "madr_typology_feedback", "madr_typology_question", "majority_ballot", "majority_vote", "moderator_final",
         "moderator_meta", "moderator_round", "negative_opening", "no_evidence", "ragcot", "verdict_answer",
         "verdict_labels", "witness_meta", "witness_testimony") + (
    # the explanation task and its faithfulness judge (debate/methods/explain.py, debate/methods/geval_judge.py)
    "explain_cot", "explain_zero_shot", "geval_document", "geval_sentence", "geval_typology", "geval_typology_step",
    "self_refine_feedback", "self_refine_revise") + (
    # retrieval from a knowledge store, HerO's strategy (debate/methods/hero_retrieval.py)
    "hero_example", "hero_question", "hyde_fc", "sfr_query") + (
    # DebateCV's retrieval during the debate (debate/methods/debate_retrieval.py)
    "debate_evidence_added", "debate_query")


class PromptError(ValueError):
    """A prompt file that is missing, malformed, or rendered with the wrong fields."""


@dataclass(frozen=True)
class PromptSet:
    """The prompt files one run reads: `directory`'s overrides (None: none) before the shipped ones.

    `files` maps each override's name to the sha256 of its text and `hash` is one sha256 over them all (the
    run's config records both). Texts are cached per set: a run renders from the same few files every turn,
    and a later run (a new set) sees an edited file."""
    directory: Optional[Path] = None
    files: Dict[str, str] = field(default_factory=dict)
    hash: Optional[str] = None
    _texts: Dict[Path, str] = field(default_factory=dict, compare=False, repr=False)

    def path(self, name: str) -> Path:
        """The file prompt `name` is read from: the override directory's when it has one, else the shipped one."""
        if self.directory is not None and (self.directory / f"{name}.txt").is_file():
            return self.directory / f"{name}.txt"
        return PROMPT_DIR / f"{name}.txt"

    def text(self, path: Path) -> str:
        if path not in self._texts:
            self._texts[path] = read_text(path).rstrip("\n")
        return self._texts[path]

    def info(self) -> Optional[Dict[str, Any]]:
        """{"dir", "files", "hash"} for the run's config, or None for the shipped prompts."""
        if self.directory is None:
            return None
        return {"dir": str(self.directory), "files": dict(self.files), "hash": self.hash}


# The set `render` reads; set only inside `using`. The scheduler's claim threads run in a copy of the
# context that started them (debate/engine/scheduler.py), so they read their run's set too.
_in_use: contextvars.ContextVar[Optional[PromptSet]] = contextvars.ContextVar("prompt_set", default=None)


@contextlib.contextmanager
def using(prompt_set: PromptSet) -> Iterator[PromptSet]:
    """Read prompts from `prompt_set` inside the block; the set in use before comes back after it."""
    token = _in_use.set(prompt_set)
    try:
        yield prompt_set
    finally:
        _in_use.reset(token)


def in_use() -> PromptSet:
    """The set of the enclosing `using` block; outside one, the shipped prompts (a fresh set, nothing cached)."""
    return _in_use.get() or PromptSet()


def prompt_path(name: str) -> Path:
    """The file prompt `name` is read from in the set in use."""
    return in_use().path(name)


def raw_prompt(name: str) -> str:
    """The text of prompts/<name>.txt as written (placeholders and doubled braces), without its final newline."""
    prompt_set = in_use()
    path = prompt_set.path(name)
    if not path.is_file():
        raise PromptError(f"prompt {name!r}: no file {path}")
    return prompt_set.text(path)


def _fields_of(path: Path, text: str) -> set:
    try:
        return {field for _, field, _, _ in string.Formatter().parse(text) if field is not None}
    except ValueError as e:  # a lone { or } in the file
        raise PromptError(f"{path}: bad braces: {e} (write a literal brace as {{{{ or }}}})") from None


def checked_set(directory: Union[str, Path, None]) -> PromptSet:
    """The prompt set of `directory` (None: the shipped prompts only), every file in it checked.

    Every *.txt in it must be named after a shipped prompt and take exactly that prompt's placeholders; the
    first that does not raises PromptError naming the file.
    """
    if directory is None:
        return PromptSet()
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
        text = read_text(path).rstrip("\n")
        want = _fields_of(shipped, read_text(shipped).rstrip("\n"))
        have = _fields_of(path, text)
        takes = f"(prompt {path.stem!r} takes: {', '.join(sorted(want)) or 'none'})"
        for problem, names in (("missing", want - have), ("unexpected", have - want)):
            if names:
                listed = ", ".join("{" + f + "}" for f in sorted(names))
                raise PromptError(f"{path}: {problem} placeholder(s) {listed} {takes}")
        digests[path.stem] = hashlib.sha256(text.encode("utf-8")).hexdigest()
    combined = hashlib.sha256("".join(f"{n}\0{d}\n" for n, d in sorted(digests.items())).encode()).hexdigest()
    return PromptSet(root.resolve(), digests, combined)


def load_prompt(name: str) -> str:
    """A prompt that takes no fields, as the model reads it: its doubled braces {{ }} are single."""
    return render(name)


def placeholders(name: str) -> set:
    """The set of {field} names prompt `name` expects."""
    text = raw_prompt(name)
    try:
        return {field for _, field, _, _ in string.Formatter().parse(text) if field is not None}
    except ValueError as e:  # a lone { or } in the file
        raise PromptError(f"prompt {name!r} ({prompt_path(name)}): bad braces: {e}") from None


def render(name: str, **fields: Any) -> str:
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


def check_files(names: tuple = NAMES) -> None:
    """Refuse a missing or malformed prompt file now rather than in the middle of a run; raises PromptError."""
    if not PROMPT_DIR.is_dir():
        raise PromptError(f"no prompt directory {PROMPT_DIR}")
    for name in names:
        placeholders(name)  # reads the file and parses its braces


def format_evidence(items: list) -> str:
    """The evidence block of a meta prompt: one numbered item per question-answer pair or passage (an item
    with `text`: an abstract's sentence, a ruling's sentence), or the no-evidence note."""
    if not items:
        return load_prompt("no_evidence")
    return "\n".join(
        render("evidence_passage", index=i, text=item["text"], url=item.get("url") or "(no source given)")
        if "text" in item and "question" not in item else
        render("evidence_item", index=i, question=item["question"], answer=item["answer"],
               url=item.get("url") or "(no source given)")
        for i, item in enumerate(items, start=1))


def evidence_kind(claim: dict) -> str:
    """What the claim's dataset calls its evidence, for prompts that name it ("question-answer pairs" for
    AVeriTeC, "evidence passages" for sentence evidence): the claim's `evidence_shape`, QA by default."""
    return load_prompt(f"evidence_kind_{claim.get('evidence_shape') or 'qa'}")


def verdict_criteria(labels: Any) -> str:
    """The block that defines each verdict label of a LabelSet (the Moderator's meta prompt)."""
    return render("verdict_labels", criteria=labels.criteria())


def verdict_answer(labels: Any) -> str:
    """The JSON answer a verifier is asked for, its Verdict listing the LabelSet's labels."""
    return render("verdict_answer", label_answer=labels.answer_format())
