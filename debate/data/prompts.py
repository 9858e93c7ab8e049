"""Prompt texts: one file per prompt under prompts/, filled in with str.format placeholders.

`use_prompt_dir(DIR)` (the CLI's --prompts) lets the files of DIR override the shipped ones by name, for
instance to run a paper's appendix prompts word for word. Each override must take exactly the
placeholders of the prompt it replaces: the protocol code fills those and nothing else.
"""
import functools
import hashlib
import importlib.resources
import string
from pathlib import Path

from debate.data.inputs import read_text

# The `prompts` package's folder: the checkout's prompts/ or, installed from a wheel, its copy in
# site-packages (package data), whatever the current directory.
PROMPT_DIR = Path(str(importlib.resources.files("prompts")))
_override_dir = None  # set by use_prompt_dir

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
    # the explanation task and its faithfulness judge (debate/methods/explain.py, debate/methods/faithfulness_judge.py)
    "explain_cot", "explain_zero_shot", "geval_document", "geval_sentence", "geval_typology", "geval_typology_step",
    "self_refine_feedback", "self_refine_revise") + (
    # retrieval from a knowledge store, HerO's strategy (debate/methods/hero_retrieval.py)
    "hero_example", "hero_question", "hyde_fc") + (
    # DebateCV's retrieval during the debate (debate/methods/debate_retrieval.py)
    "debate_evidence_added", "debate_query")


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
        text = read_text(path).rstrip("\n")
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
    return read_text(path).rstrip("\n")


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


def check_files(names=NAMES):
    """Refuse a missing or malformed prompt file now rather than in the middle of a run; raises PromptError."""
    if not PROMPT_DIR.is_dir():
        raise PromptError(f"no prompt directory {PROMPT_DIR}")
    for name in names:
        placeholders(name)  # reads the file and parses its braces


def format_evidence(items):
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


def evidence_kind(claim):
    """What the claim's dataset calls its evidence, for prompts that name it ("question-answer pairs" for
    AVeriTeC, "evidence passages" for sentence evidence): the claim's `evidence_shape`, QA by default."""
    return load_prompt(f"evidence_kind_{claim.get('evidence_shape') or 'qa'}")


def verdict_criteria(labels):
    """The block that defines each verdict label of a LabelSet (the Moderator's meta prompt)."""
    return render("verdict_labels", criteria=labels.criteria())


def verdict_answer(labels):
    """The JSON answer a verifier is asked for, its Verdict listing the LabelSet's labels."""
    return render("verdict_answer", label_answer=labels.answer_format())
