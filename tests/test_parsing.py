"""Moderator output parsing: every tolerance the parser promises, and that it never invents a verdict."""
import json

import pytest

from debate.data.labels import CEC, NEE, REFUTED, SUPPORTED
from debate.data.parsing import KEYS, STATUSES, parse_moderator

ROUND_STOP = {"Primary Insight": "Both sides agree the letter is fake.", "Evidence Gaps": "None.",
              "Justification for Proceeding": "Nothing new is left to debate.", "Proceeding Necessity": "No",
              "Justification for Verdict": "The source is a satire site.", "Verdict": "Refuted"}
ROUND_GO_ON = dict(ROUND_STOP, **{"Proceeding Necessity": "Yes", "Justification for Verdict": "", "Verdict": ""})


def check(text, status, verdict=None, proceed=None):
    out = parse_moderator(text)
    assert out["status"] == status, out
    assert out["verdict"] == verdict, out
    assert out["proceed"] == proceed, out
    assert out["status"] in STATUSES
    return out


def test_clean_round_json_that_stops():
    out = check(json.dumps(ROUND_STOP), "json", REFUTED, False)
    assert out["fields"] == ROUND_STOP and out["justification"] == "The source is a satire site."


def test_clean_round_json_that_goes_on_has_no_verdict():
    out = check(json.dumps(ROUND_GO_ON, indent=2), "json", None, True)
    assert out["justification"] == ""


def test_final_prompt_answer_has_only_two_keys():
    out = check('{"Justification for Verdict": "Step 1... Step 2...", "Verdict": "Supported"}', "json", SUPPORTED)
    assert out["justification"] == "Step 1... Step 2..."


def test_code_fence_and_prose_around():
    text = "Here is my assessment.\n```json\n" + json.dumps(ROUND_STOP, indent=2) + "\n```\nLet me know."
    out = check(text, "json_repaired", REFUTED, False)
    assert set(out["fields"]) == set(KEYS)


def test_single_quotes_python_dict_and_trailing_comma():
    check("{'Verdict': 'Supported', 'Proceeding Necessity': False, 'Evidence Gaps': None,}",
          "json_repaired", SUPPORTED, False)
    check('{"Verdict": "Refuted", "Proceeding Necessity": "No",\n}', "json_repaired", REFUTED, False)
    check("{'Verdict': 'Refuted', 'Proceeding Necessity': false, 'Evidence Gaps': null}",
          "json_repaired", REFUTED, False)


def test_json_literals_inside_strings_are_not_rewritten():
    out = check("{'Justification for Verdict': 'None of it is true, null and void', 'Verdict': 'Refuted',}",
                "json_repaired", REFUTED)
    assert out["justification"] == "None of it is true, null and void"


def test_curly_quotes():
    check("{\u201cVerdict\u201d: \u201cNot Enough Evidence\u201d}", "json_repaired", NEE)


@pytest.mark.parametrize("key", ["verdict", "VERDICT", "Final Verdict", "final_verdict"])
def test_verdict_key_variants(key):
    check(json.dumps({key: "Refuted"}), "json", REFUTED)


@pytest.mark.parametrize("key", ["proceeding_necessity", "Proceeding necessity", "ProceedingNecessity",
                                 "proceeding-necessity"])
def test_proceeding_key_variants(key):
    check(json.dumps({key: "Yes"}), "json", None, True)


@pytest.mark.parametrize("raw,label", [
    ("Cherry-picking", CEC), ("NOT ENOUGH EVIDENCE", NEE), ("Conflicting Evidence", CEC),
    ("Conflicting Evidence/Cherry-picking", CEC), ("refuted.", REFUTED), ("Supported", SUPPORTED),
    ("Refuted (the letter was satire)", REFUTED),
])
def test_label_variants(raw, label):
    check(json.dumps({"Verdict": raw}), "json", label)


@pytest.mark.parametrize("raw,proceed", [
    ("yes", True), ("No.", False), ("NO", False), (True, True), (False, False), ("true", True),
    ("No, the sides only repeat themselves.", False), ("Yes or No", None), ("maybe", None),
])
def test_proceeding_variants(raw, proceed):
    out = parse_moderator(json.dumps({"Proceeding Necessity": raw, "Verdict": ""}))
    assert out["proceed"] is proceed
    assert out["status"] == ("unparsed" if proceed is None else "json")


def test_missing_keys_are_simply_absent():
    out = check('{"Verdict": "Supported"}', "json", SUPPORTED)
    assert out["fields"] == {"Verdict": "Supported"} and out["justification"] == ""


def test_last_complete_object_with_a_decision_wins():
    text = ('Template: {"Verdict": "Supported", "Proceeding Necessity": "Yes"}\n'
            'My answer: {"Verdict": "Conflicting Evidence", "Proceeding Necessity": "No"}\n'
            'Note: {"confidence": 0.8}')
    check(text, "json_repaired", CEC, False)


def test_nested_object_is_looked_into():
    check(json.dumps({"Moderator": {"Verdict": "Refuted", "Proceeding Necessity": "No"}}), "json", REFUTED, False)


def test_broken_json_falls_back_to_key_regex():
    # unescaped inner quotes: no JSON parser accepts this
    text = '{"Justification for Verdict": "The site calls itself "satire" openly", "Verdict": "Refuted", ' \
           '"Proceeding Necessity": "No"}'
    out = check(text, "fields_regex", REFUTED, False)
    assert out["justification"] == 'The site calls itself "satire" openly'


def test_markdown_style_fields():
    text = "**Proceeding Necessity:** No\n**Justification for Verdict:** The record, however, is clear.\n" \
           "**Verdict:** Not Enough Evidence"
    out = check(text, "fields_regex", NEE, False)
    assert out["justification"] == "The record, however, is clear."


def test_verdict_key_does_not_match_inside_justification_for_verdict():
    out = check('"Justification for Verdict": "weak", "Proceeding Necessity": "Yes"', "fields_regex", None, True)
    assert "Verdict" not in out["fields"]


def test_truncated_answer_without_decision_is_unparsed():
    # cut off at the token limit: the Primary Insight mentions a label, which must not become the verdict
    out = check('{"Primary Insight": "The Affirmative says the claim is Supported by the report, but',
                "unparsed")
    assert "Primary Insight" in out["fields"]


def test_truncated_answer_keeps_the_decision_it_reached():
    check('{"Proceeding Necessity": "No", "Verdict": "Refuted", "Justification for Verdict": "Because the',
          "fields_regex", REFUTED, False)


def test_single_label_in_plain_text():
    check("Having weighed both sides, I find the claim Refuted.", "label_in_text", REFUTED)
    check("The evidence is cherry-picked.", "label_in_text", CEC)


@pytest.mark.parametrize("text", [
    "The claim is not supported by the evidence.",        # negated: Refuted or NEE?
    "It is either Supported or Refuted.",                 # two labels
    "There is no conflicting evidence here.",             # negated
    "The claim isn't refuted by anything.",
    "I am unable to decide.",                             # no label at all
    "",
    '{"Verdict": "Supported | Refuted | Not Enough Evidence"}',  # a copied template
    '{"Verdict": "", "Proceeding Necessity": "Yes or No"}',
    "{'Verdict': 'Mostly true'}",
])
def test_unrecoverable_verdict_is_none_never_a_default(text):
    out = check(text, "unparsed")
    assert out["verdict"] is None and out["proceed"] is None


def test_non_string_input_is_unparsed():
    check(None, "unparsed")
