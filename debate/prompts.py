"""Prompt texts: one file per prompt under prompts/, filled in with str.format placeholders."""
import functools
import string
from pathlib import Path

PROMPT_DIR = Path(__file__).resolve().parent.parent / "prompts"

# Every prompt the code renders (tests/test_prompts.py checks the code names no other), so that a run
# can check them all before it loads a model or writes a file.
NAMES = ("affirmative_opening", "cooperation_assistant_meta", "cooperation_final", "cooperation_start",
         "cooperation_user_meta", "corrector", "corrector_meta", "counsel_argument", "counsel_disclosure",
         "counsel_expert", "counsel_gap", "counsel_instruction_defense", "counsel_instruction_plaintiff",
         "counsel_meta", "counsel_reflection", "counsel_search", "counsel_stance_defense",
         "counsel_stance_plaintiff", "court_admissibility", "court_meta", "court_query", "court_ready",
         "court_witness", "courtroom_argument", "courtroom_critic", "courtroom_hearing", "courtroom_no_switch",
         "courtroom_passage", "courtroom_prag", "courtroom_query", "courtroom_reflection", "courtroom_request",
         "courtroom_round", "courtroom_switch", "courtroom_testimony", "critic_consistency", "critic_meta",
         "critic_premises", "critic_round", "debate_turn", "debater_meta", "debater_rebuttal",
         "debater_stance_affirmative", "debater_stance_negative", "evidence_item", "judge_case", "judge_meta",
         "madr_context", "madr_error_typology", "madr_free_feedback", "madr_free_meta", "madr_judge",
         "madr_judge_meta", "madr_no_verdict", "madr_refine", "madr_refiner_meta", "madr_revise",
         "madr_typology_feedback", "madr_typology_meta", "moderator_final", "moderator_meta", "moderator_round",
         "negative_opening", "no_evidence", "ragcot", "ragcot_meta", "verdict_answer", "verdict_labels",
         "witness_meta", "witness_testimony")


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


def check_files(names=NAMES):
    """Refuse a missing or malformed prompt file now rather than in the middle of a run; raises PromptError."""
    if not PROMPT_DIR.is_dir():
        raise PromptError(f"no prompt directory {PROMPT_DIR}")
    for name in names:
        placeholders(name)  # reads the file and parses its braces


def format_evidence(items):
    """The evidence block of a meta prompt: one numbered item per QA pair, or the no-evidence note."""
    if not items:
        return load_prompt("no_evidence")
    return "\n".join(
        render("evidence_item", index=i, question=item["question"], answer=item["answer"],
               url=item.get("url") or "(no source given)")
        for i, item in enumerate(items, start=1))
