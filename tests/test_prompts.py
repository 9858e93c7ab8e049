"""Prompt files: each renders with exactly its placeholders and fails clearly without them."""
import pytest

import debate.prompts as prompts
from debate.parsing import KEYS
from debate.prompts import PromptError, format_evidence, load_prompt, placeholders, render

# The protocol code relies on these names; a renamed placeholder must fail here first.
PLACEHOLDERS = {
    "debater_meta": {"claim", "evidence", "stance"},
    "debater_stance_affirmative": set(),
    "debater_stance_negative": set(),
    "affirmative_opening": set(),
    "negative_opening": {"opponent_argument"},
    "debater_rebuttal": {"opponent_argument"},
    "moderator_meta": {"claim", "evidence", "labels"},
    "moderator_round": {"round", "affirmative_argument", "negative_argument"},
    "moderator_final": {"affirmative_argument", "negative_argument"},
    "evidence_item": {"index", "question", "answer", "url"},
    "no_evidence": set(),
    "corrector_meta": set(),
    "corrector": {"claim", "evidence", "debate", "insights", "predicted_verdict", "gold_verdict"},
    "debate_turn": {"round", "speaker", "argument"},
    "verdict_labels": set(),
    "verdict_answer": set(),
    "ragcot_meta": {"claim", "evidence", "labels"},
    "ragcot": {"answer"},
    "cooperation_user_meta": {"claim", "evidence", "labels"},
    "cooperation_assistant_meta": {"claim", "evidence", "labels"},
    "cooperation_start": set(),
    "cooperation_final": {"answer"},
    "madr_error_typology": set(),
    "madr_context": {"claim", "evidence", "labels", "verdict", "justification"},
    "madr_no_verdict": set(),
    "madr_typology_meta": {"typology", "context"},
    "madr_free_meta": {"context"},
    "madr_judge_meta": {"context"},
    "madr_refiner_meta": {"context"},
    "madr_typology_feedback": set(),
    "madr_free_feedback": set(),
    "madr_revise": {"other_feedback"},
    "madr_judge": {"typology_feedback", "free_feedback"},
    "madr_refine": {"typology_feedback", "free_feedback"},
    "counsel_meta": {"side", "stance", "instruction", "claim", "evidence"},
    "counsel_stance_plaintiff": set(),
    "counsel_stance_defense": set(),
    "counsel_instruction_plaintiff": set(),
    "counsel_instruction_defense": set(),
    "counsel_search": {"direction", "side", "claim"},
    "counsel_disclosure": {"shared", "own", "other"},
    "counsel_gap": {"round", "side", "context"},
    "counsel_argument": {"round", "new_evidence", "history"},
    "counsel_expert": {"history"},
    "counsel_reflection": {"round", "side"},
    "court_meta": {"claim"},
    "court_admissibility": {"claim", "passage"},
    "court_query": {"side", "query", "context"},
    "court_ready": {"round", "record"},
    "court_witness": {"side", "expert_type", "reasoning"},
    "critic_meta": {"claim", "premises"},
    "critic_premises": {"claim"},
    "critic_round": {"round", "record"},
    "critic_consistency": {"first", "second"},
    "witness_meta": set(),
    "witness_testimony": {"claim", "expert_type", "expertise", "evidence", "history"},
    "judge_meta": set(),
    "judge_case": {"claim", "plaintiff", "defense", "evidence", "role_switch", "prag", "critic", "reflection"},
    "courtroom_passage": {"index", "text", "url", "status"},
    "courtroom_round": {"round", "plaintiff", "defense", "testimony"},
    "courtroom_hearing": {"title", "rounds"},
    "courtroom_argument": {"round", "text"},
    "courtroom_switch": {"hearing", "consistency"},
    "courtroom_no_switch": {"note"},
    "courtroom_query": {"context", "request"},
    "courtroom_request": {"gap", "need"},
    "courtroom_prag": {"round", "side", "query", "admitted", "retrieved", "novelty", "stop"},
    "courtroom_critic": {"round", "plaintiff", "defense", "unresolved", "resolved"},
    "courtroom_reflection": {"round", "side", "logic", "novelty", "rebuttal", "total"},
    "courtroom_testimony": {"expert", "round", "side", "answer"},
}


def sample_fields(name):
    return {field: f"<{field.upper()}>" for field in PLACEHOLDERS[name]}


def test_every_prompt_file_is_listed():
    assert {p.stem for p in prompts.PROMPT_DIR.glob("*.txt")} == set(PLACEHOLDERS)


@pytest.mark.parametrize("name", sorted(PLACEHOLDERS))
def test_prompt_renders_with_its_placeholders(name):
    assert placeholders(name) == PLACEHOLDERS[name]
    text = render(name, **sample_fields(name))
    for value in sample_fields(name).values():
        assert value in text
    if "{{" not in prompts.raw_prompt(name):  # only the JSON examples keep braces
        assert "{" not in text and "}" not in text
    assert text.strip()


@pytest.mark.parametrize("name", sorted(n for n, fields in PLACEHOLDERS.items() if fields))
def test_missing_field_fails_naming_prompt_and_field(name):
    fields = sample_fields(name)
    dropped = sorted(fields)[0]
    del fields[dropped]
    with pytest.raises(PromptError, match=rf"prompt '{name}': missing field\(s\) .*{dropped}"):
        render(name, **fields)


@pytest.mark.parametrize("name", sorted(PLACEHOLDERS))
def test_unexpected_field_fails_naming_prompt_and_field(name):
    with pytest.raises(PromptError, match=rf"prompt '{name}': unexpected field\(s\) bogus"):
        render(name, bogus="x", **sample_fields(name))


def test_moderator_prompts_name_every_json_key_and_label():
    round_text = render("moderator_round", **sample_fields("moderator_round"))
    for key in KEYS:
        assert f'"{key}"' in round_text
    final_text = render("moderator_final", **sample_fields("moderator_final"))
    assert '"Justification for Verdict"' in final_text and '"Verdict"' in final_text
    # the JSON examples must survive str.format as single braces
    assert "{\n" in round_text and "{\n" in final_text
    meta = render("moderator_meta", **dict(sample_fields("moderator_meta"), labels=load_prompt("verdict_labels")))
    for label in ("Supported", "Refuted", "Not Enough Evidence", "Conflicting Evidence/Cherrypicking"):
        assert label in meta


def test_a_prompt_without_fields_reads_with_single_braces():
    # What the model reads: a JSON example written {{ }} in the file must reach it as { }.
    text = load_prompt("verdict_answer")
    assert "{\n" in text and "{{" not in text and "}}" not in text
    with pytest.raises(PromptError, match="missing field"):
        load_prompt("ragcot")  # it takes a field: only render() can fill it


def test_stances_name_the_side():
    assert "Affirmative" in load_prompt("debater_stance_affirmative")
    assert "Negative" in load_prompt("debater_stance_negative")


def test_format_evidence_numbers_items_and_handles_empty_sets():
    text = format_evidence([{"question": "Q one?", "answer": "A one.", "url": "https://example.org/1"},
                            {"question": "Q two?", "answer": "A two.", "url": ""}])
    assert text.index("[1]") < text.index("Q one?") < text.index("https://example.org/1") < text.index("[2]")
    assert "(no source given)" in text
    assert format_evidence([]) == load_prompt("no_evidence")


def test_missing_prompt_file_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(prompts, "PROMPT_DIR", tmp_path)
    with pytest.raises(PromptError, match=rf"prompt 'debater_meta': no file {tmp_path}/debater_meta.txt"):
        load_prompt("debater_meta")


def test_stray_brace_in_a_prompt_file_is_reported(tmp_path, monkeypatch):
    (tmp_path / "broken.txt").write_text("Answer with a JSON object } like this\n")
    monkeypatch.setattr(prompts, "PROMPT_DIR", tmp_path)
    with pytest.raises(PromptError, match="prompt 'broken'.*bad braces"):
        render("broken")
