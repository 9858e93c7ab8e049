"""Prompt files: each renders with exactly its placeholders and fails clearly without them."""
import pytest

import debate.data.prompts as prompts
from debate.data.labels import AVERITEC
from debate.data.parsing import KEYS
from debate.data.prompts import (
    PromptError,
    format_evidence,
    load_prompt,
    placeholders,
    render,
    verdict_answer,
    verdict_criteria,
)

# The protocol code relies on these names; a renamed placeholder must fail here first.
PLACEHOLDERS = {
    "debater_meta": {"claim", "evidence"},
    "affirmative_opening": {"claim"},
    "negative_opening": {"opponent_argument"},
    "debater_rebuttal": {"opponent_argument"},
    "moderator_meta": {"claim", "evidence", "labels"},
    "moderator_round": {"round", "affirmative_argument", "negative_argument", "label_choices", "label_answer"},
    "moderator_final": {"affirmative_argument", "negative_argument", "claim", "label_choices", "label_answer"},
    "evidence_item": {"index", "question", "answer", "url"},
    "evidence_passage": {"index", "text", "url"},
    "evidence_kind_qa": set(),
    "evidence_kind_passages": set(),
    "no_evidence": set(),
    "corrector": {"debate", "insights", "gold_verdict"},
    "debate_turn": {"round", "speaker", "argument"},
    "verdict_labels": {"criteria"},
    "verdict_answer": {"label_answer"},
    "ragcot": {"claim", "evidence", "answer", "label_choices", "evidence_kind"},
    "majority_vote": {"count", "answers", "claim", "evidence", "answer", "label_choices"},
    "majority_ballot": {"index", "reply"},
    "cooperation_user_meta": {"claim", "evidence", "evidence_kind"},
    "cooperation_assistant_meta": {"claim", "evidence", "evidence_kind"},
    "cooperation_start": set(),
    "cooperation_final": {"answer", "label_choices", "evidence_kind"},
    "madr_error_typology": set(),
    "madr_context": {"claim", "evidence", "verdict", "justification"},
    "madr_no_verdict": set(),
    "madr_typology_question": set(),
    "madr_judge_meta": {"context"},
    "madr_typology_feedback": set(),
    "madr_free_feedback": set(),
    "madr_revise": {"other_feedback"},
    "madr_judge": {"typology_feedback", "free_feedback"},
    "madr_refine": {"typology_feedback", "free_feedback"},
    "explain_zero_shot": {"claim", "label", "evidence"},
    "explain_cot": {"claim", "label", "evidence"},
    "self_refine_feedback": set(),
    "self_refine_revise": set(),
    "geval_document": {"typology", "typology_step", "evidence", "explanation"},
    "geval_sentence": {"typology", "typology_step", "evidence", "sentence"},
    "geval_typology": {"typology"},
    "geval_typology_step": set(),
    "hyde_fc": {"claim"},
    "sfr_query": {"query"},
    "hero_question": {"examples", "claim", "evidence"},
    "debate_query": {"round", "side"},
    "debate_evidence_added": {"evidence"},
    "hero_example": {"index", "example"},
    "counsel_meta": {"side", "stance"},
    "counsel_stance_plaintiff": set(),
    "counsel_stance_defense": set(),
    "counsel_instruction_plaintiff": set(),
    "counsel_instruction_defense": set(),
    "counsel_search": {"direction", "side", "claim"},
    "counsel_disclosure": {"shared", "own", "other"},
    "counsel_gap": {"round", "side", "context"},
    "counsel_argument": {"round", "claim", "side", "instruction", "evidence", "history"},
    "counsel_expert": {"history"},
    "counsel_reflection": {"round", "side", "claim", "own", "opponent", "challenges"},
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
    "judge_mad": {"claim", "plaintiff", "defense", "evidence"},
    "judge_case": {"claim", "plaintiff", "defense", "evidence", "role_switch", "prag", "critic", "reflection"},
    "courtroom_passage": {"index", "text", "url"},
    "courtroom_round": {"round", "plaintiff", "defense", "testimony"},
    "courtroom_hearing": {"title", "rounds"},
    "courtroom_argument": {"round", "text"},
    "courtroom_switch": {"hearing", "evidence", "consistency"},
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
    assert '{"Primary Insight"' in round_text and '{"Justification for Verdict"' in final_text
    meta = render("moderator_meta", **dict(sample_fields("moderator_meta"), labels=verdict_criteria(AVERITEC)))
    for label in ("Supported", "Refuted", "Not Enough Evidence", "Conflicting Evidence/Cherrypicking"):
        assert label in meta


def test_a_prompt_without_fields_reads_with_single_braces():
    # What the model reads: a JSON example written {{ }} in the file must reach it as { }.
    text = verdict_answer(AVERITEC)
    assert '{"Justification' in text and "{{" not in text and "}}" not in text
    with pytest.raises(PromptError, match="missing field"):
        load_prompt("ragcot")  # it takes a field: only render() can fill it


def test_openings_give_each_debater_its_side():
    # The paper's meta prompt is shared; the side comes with each Debater's first prompt.
    assert "affirms that the claim is true" in render("affirmative_opening", claim="C")
    assert "argue that it is false" in render("negative_opening", opponent_argument="A")


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


# --- what each paper asks for, and what it does not -------------------------------------------------

LABELS = ("Supported", "Refuted", "Not Enough Evidence", "Conflicting Evidence/Cherrypicking")
AV = {"label_choices": AVERITEC.choices(), "label_answer": AVERITEC.answer_format()}  # AVeriTeC's label fields
# Instructions the papers never give that change what the agents do (issue 12).
REMOVED = ("do not repeat", "say so", "convinced", "generally known", "already clear", "answer only",
           "nothing before or after", "the moderator was wrong", "wrong verdict", "should have given",
           "rightly point out", "remove statements", "keep what is right")


def rendered_all():
    return {name: render(name, **sample_fields(name)) for name in PLACEHOLDERS
            if not name.startswith(("court", "counsel", "critic", "judge", "witness"))}


@pytest.mark.parametrize("name", sorted(rendered_all()))
def test_no_prompt_carries_an_instruction_the_papers_do_not_give(name):
    text = rendered_all()[name].lower()
    assert not [phrase for phrase in REMOVED if phrase in text]


def test_debater_prompts_follow_the_paper():
    meta = render("debater_meta", claim="<C>", evidence="<E>")
    # Role before objective, claim and evidence last, as in Appendix B.1.
    assert meta.index("role") < meta.index("objective") < meta.index("Claim: <C>") < meta.index("<E>")
    assert "concise" in meta and "respect" in meta
    opening = render("affirmative_opening", claim="<C>")
    assert opening.startswith("Claim: <C>")  # the paper shows the claim in the opening prompt
    assert "core parts" in opening and "(content of the evidence, source URL)" in opening
    assert "first round" in opening  # the rebuttal step may be left out in round 1
    negative = render("negative_opening", opponent_argument="<A>")
    assert negative.index("<A>") < negative.index("false") and "(content of the evidence, source URL)" in negative
    rebuttal = render("debater_rebuttal", opponent_argument="<A>")
    assert "Do you agree" in rebuttal and "weaknesses" in rebuttal


def test_moderator_prompts_follow_the_paper():
    meta = render("moderator_meta", claim="<C>", evidence="<E>", labels=verdict_criteria(AVERITEC))
    assert "only restate what they argued before" in meta  # the paper's one stop signal
    assert meta.index("Claim: <C>") < meta.index("<E>") < meta.index("Verdict criteria")
    for label in LABELS:
        assert f"- {label}:" in meta  # each label with its definition
    round_text = render("moderator_round", round=2, affirmative_argument="<A>", negative_argument="<N>", **AV)
    assert round_text.startswith("Round 2") and round_text.index("<A>") < round_text.index("<N>")
    steps = [round_text.index(f"{i}. ") for i in (1, 2, 3, 4)]
    assert steps == sorted(steps)
    keys = [round_text.index(f'"{key}":') for key in KEYS]
    assert keys == sorted(keys)  # the paper's key order
    final = render("moderator_final", affirmative_argument="<A>", negative_argument="<N>", claim="<C>", **AV)
    # Summary, then the claim, then the labels, then a step-by-step justification BEFORE the JSON.
    assert (final.index("<N>") < final.index("main insights") < final.index("<C>") < final.index(LABELS[3])
            < final.index("step by step") < final.index('{"Justification for Verdict"'))
    assert final.index('"Justification for Verdict"') < final.index('"Verdict"')


def test_corrector_gets_exactly_the_papers_inputs():
    text = render("corrector", debate="<D>", insights="<I>", gold_verdict="Refuted")
    assert text.index("<D>") < text.index("<I>") < text.index("this claim is Refuted")
    assert '{"Justification for Verdict": "..."}' in text
    assert "corrector_meta" not in PLACEHOLDERS  # no system prompt of its own


def test_rag_cot_follows_heros_prompt():
    text = render("ragcot", claim="<C>", evidence="<E>", answer=verdict_answer(AVERITEC), evidence_kind="<K>",
                  label_choices=AVERITEC.choices())
    assert text.index("predict the verdict") < text.index(LABELS[0]) < text.index("do not bear on the claim")
    assert text.index("step by step") < text.index("Claim: <C>") < text.index("<E>") < text.index('{"Justification')


def test_majority_vote_prompt_follows_fact_audit():
    text = render("majority_vote", count=3, answers="<ANSWERS>", claim="<C>", evidence="<E>",
                  answer=verdict_answer(AVERITEC), label_choices=AVERITEC.choices())
    assert "Vote on the 3 answers" in text and "two answers that are most alike" in text
    assert "contradict each other" in text and text.index("<ANSWERS>") < text.index("Claim: <C>")


def test_madr_debaters_tasks_follow_figure_1_and_the_free_one_is_told_not_to_go_by_the_types():
    # Both conversations have the typology as an earlier answer (tests/test_madr.py); the tasks refer to it.
    assert "types of error" in load_prompt("madr_typology_question")
    assert "without going by the error types" in load_prompt("madr_free_feedback")
    assert "read the error types through" in load_prompt("madr_typology_feedback")
    for name in ("madr_typology_feedback", "madr_free_feedback"):
        text = load_prompt(name)
        assert "exact sentence" in text and "not a revised explanation" in text
    revise = render("madr_revise", other_feedback="<F>")
    assert [revise.index(f"Step {i}") for i in (1, 2, 3, 4)] == sorted(revise.index(f"Step {i}") for i in (1, 2, 3, 4))
    assert "do not copy" in revise and revise.rstrip().endswith("<F>")


def test_madr_refiner_changes_only_what_the_feedback_asks():
    text = render("madr_refine", typology_feedback="<F1>", free_feedback="<F2>")
    assert "make no change beyond what the feedback asks for" in text
    assert text.index("<F1>") < text.index("<F2>") < text.index('"Refined Justification"')


def test_averitec_label_fields_render_the_papers_label_wording():
    # On AVeriTeC the label placeholders give back exactly the wording the prompts had before they took a
    # dataset's labels: the default run's prompts are unchanged.
    old_choices = '"Supported", "Refuted", "Not Enough Evidence" or "Conflicting Evidence/Cherrypicking"'
    old_answer = '"Verdict": "Supported, Refuted, Not Enough Evidence, or Conflicting Evidence/Cherrypicking"'
    final = render("moderator_final", affirmative_argument="A", negative_argument="N", claim="C", **AV)
    assert f"from these labels: {old_choices}." in final and old_answer in final
    assert old_answer in verdict_answer(AVERITEC)
    assert verdict_criteria(AVERITEC).splitlines()[1] == \
        "- Supported: the credible evidence given backs the claim in full."


def test_passages_render_as_numbered_texts_with_their_source():
    text = format_evidence([{"text": "Masks cut spread.", "url": "cord 1"}, {"text": "No effect seen.", "url": ""}])
    assert text.splitlines()[0] == "[1] Masks cut spread." and "Source: cord 1" in text
    assert "[2] No effect seen." in text and "(no source given)" in text and "Question" not in text
