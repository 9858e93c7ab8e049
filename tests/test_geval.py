"""G-Eval faithfulness (eval/geval_scores.py, debate/methods/geval_judge.py, debate/pipeline/geval_run.py):
the protocols' prompts, the weighted score on a
scripted judge with known probabilities, resuming, Kendall's tau-c, and the explanation task end to end on a tiny
model."""
import json
import re

import pytest

import run_debate
from debate.data.prompts import load_prompt
from debate.engine import models
from debate.methods import geval_judge as judging
from debate.pipeline import geval_run as judge_run
from eval import geval_scores
from eval.averitec import InputError
from tests import scripted as engine_script

TYPOLOGY_LINE = load_prompt("madr_error_typology").splitlines()[0]


# ---------------------------------------------------------------- the prompts


@pytest.mark.parametrize("protocol", judging.PROTOCOLS)
def test_each_protocol_prompt_carries_the_papers_content_and_the_typology_only_where_it_applies(protocol):
    text = judging.prompt(protocol, "<EVIDENCE>", "<UNIT>")
    # Tables 5-6: one metric, faithfulness 1-5 defined against the evidence, three evaluation steps, the
    # evidence, then the explanation (or its sentence), then the form asking for the score alone.
    assert "Faithfulness (1-5)" in text and "single metric" in text
    assert text.index("Evaluation steps") < text.index("1. Read") < text.index("2. Compare") < text.index("3. Judge")
    assert text.index("<EVIDENCE>") < text.index("<UNIT>") < text.index('{"Faithfulness"')
    sentence = protocol.startswith("sentence")
    assert ("explanation sentence" in text) == sentence
    assert ("from 1 (unfaithful) to 5 (faithful)" in text) == sentence
    assert ("score from 1 to 5" in text) == (not sentence)
    typology = protocol.endswith("typology")
    assert (TYPOLOGY_LINE in text) == typology and ("using the error typology above" in text) == typology
    if typology:
        assert text.index(TYPOLOGY_LINE) < text.index("Evaluation steps")  # "above" the step that uses it


def test_a_free_reply_gives_its_one_score_and_an_unreadable_one_none():
    assert judging.read_probs('{"Faithfulness": 4}') == ({"1": 0.0, "2": 0.0, "3": 0.0, "4": 1.0, "5": 0.0}, "json")
    assert judging.read_probs("Faithfulness: 2")[0]["2"] == 1.0
    for reply in ("I would say it is faithful.", '{"Faithfulness": 7}', '{"Faithfulness": 3.5}'):
        assert judging.read_probs(reply) == (None, "unparsed")
    structured = {"probs": {"Faithfulness": {"1": 0.1, "2": 0.0, "3": 0.0, "4": 0.0, "5": 0.9}}}
    assert judging.read_probs("ignored", structured) == (structured["probs"]["Faithfulness"], "structured")


# ---------------------------------------------------------------- the arithmetic


def test_weighted_score_is_the_probability_weighted_mean_renormalised():
    assert geval_scores.weighted_score({"1": 0.1, "5": 0.9}) == pytest.approx(4.6)
    assert geval_scores.weighted_score({"2": 0.25, "4": 0.25}) == pytest.approx(3.0)  # renormalised over what is there
    assert geval_scores.weighted_score(None) is None and geval_scores.weighted_score({"3": 0.0}) is None


def test_sentence_units_are_punkts_sentences():
    text = "Mr. Smith said so on Jan. 3, 2013. The pens cost $14.99 each!  Nothing else."
    assert geval_scores.units_of("sentence", text) == ["Mr. Smith said so on Jan. 3, 2013.",
                                                       "The pens cost $14.99 each!",
                                                "Nothing else."]
    assert geval_scores.units_of("document-typology", text) == [text.strip()]
    assert geval_scores.units_of("sentence", "  ") == [] and geval_scores.units_of("document", None) == []


@pytest.mark.parametrize("x, y", [
    ([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]),
    ([0, 1, 1, 0, 1, 0, 1], [4.6, 4.9, 3.2, 2.5, 4.9, 4.1, 5.0]),  # ties on both sides, a 2 x many table
    ([3, 3, 1, 2, 5, 4, 4, 1], [1.5, 2.0, 2.0, 3.5, 4.25, 4.25, 1.0, 3.0]),
])
def test_kendall_tau_c_equals_scipys(x, y):
    from scipy.stats import kendalltau  # an oracle only

    assert geval_scores.kendall_tau_c(x, y) == pytest.approx(kendalltau(x, y, variant="c").statistic)


def test_kendall_tau_c_is_none_where_it_is_undefined():
    assert geval_scores.kendall_tau_c([1], [2]) is None and geval_scores.kendall_tau_c([1, 1, 1], [1, 2, 3]) is None


def test_bootstrap_interval_is_seeded_and_holds_the_mean():
    values = [4.6, 3.0, 4.9, 2.5, 5.0, 4.1]
    low, high = geval_scores.bootstrap_interval(values, samples=2000, seed=3)
    assert low < sum(values) / len(values) < high and geval_scores.bootstrap_interval(values, 2000, 3) == [low, high]
    assert geval_scores.bootstrap_interval([4.0]) == [4.0, 4.0] and geval_scores.bootstrap_interval([]) is None


# ---------------------------------------------------------------- a scripted judge over run directories

# claim_id -> explanation; claim 1's is empty, so it has no score under any protocol.
EXPLANATIONS = {0: "The council voted to drop the fare. Service began in January 2023.", 1: "",
                2: "The report says so."}
# (granularity, typology shown, unit) -> the judge's probabilities of the scores.
PROBS = {
    ("sentence", False, "The council voted to drop the fare."): {"3": 0.5, "4": 0.5},   # 3.5
    ("sentence", False, "Service began in January 2023."): {"5": 1.0},                  # 5.0 -> mean 4.25
    ("sentence", True, "The council voted to drop the fare."): {"2": 0.25, "4": 0.75},  # 3.5
    ("sentence", True, "Service began in January 2023."): {"4": 1.0},                   # 4.0 -> mean 3.75
    ("document", False, EXPLANATIONS[0]): {"4": 0.2, "5": 0.8},                         # 4.8
    ("document", True, EXPLANATIONS[0]): {"1": 0.1, "5": 0.9},                          # 4.6
    ("sentence", False, "The report says so."): {"1": 1.0},                             # 1.0
    ("sentence", True, "The report says so."): {"2": 1.0},                              # 2.0
    ("document", False, "The report says so."): {"2": 0.25, "4": 0.25},                 # 3.0 (renormalised)
    ("document", True, "The report says so."): {"2": 1.0},                              # 2.0
}
EXPECTED = {0: {"sentence": 4.25, "sentence-typology": 3.75, "document": 4.8, "document-typology": 4.6},
            2: {"sentence": 1.0, "sentence-typology": 2.0, "document": 3.0, "document-typology": 2.0}}


def scripted_judge(model, conv, prompt):
    sentence = "Fact-checking explanation sentence:" in prompt
    unit = re.search(r"Fact-checking explanation(?: sentence)?:\n\n(.*)\n\nEvaluation form", prompt, re.S).group(1)
    probs = {s: 0.0 for s in judging.SCORES} | PROBS[("sentence" if sentence else "document",
                                                      TYPOLOGY_LINE in prompt, unit)]
    best = max(probs, key=probs.get)
    return engine_script.Decoded(text=json.dumps({"Faithfulness": int(best)}), fields={"Faithfulness": int(best)},
                                 probs={"Faithfulness": probs})


def run_dir(path, explanations, method="zero-shot"):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"split": "demo", "evidence": "golden", "task": "explain",
                                                  "method": method, "model": "m"}))
    (path / "predictions.jsonl").write_text("".join(json.dumps({"claim_id": cid, "label": "Supported",
                                                                "justification": text}) + "\n"
                                                    for cid, text in explanations.items()))
    return str(path)


@pytest.fixture
def judge(monkeypatch):
    """The judge model replaced by the scripted one; loading it is recorded, its calls are logged."""
    calls = engine_script.install(monkeypatch, scripted_judge)
    loaded = []
    monkeypatch.setattr(models, "check_roles", lambda paths, adapters=None: None)
    monkeypatch.setattr(models, "load_roles", lambda paths, adapters=None, **kw: loaded.append(paths) or
                        engine_script.agents(paths))
    return calls, loaded


def test_scripted_judge_gives_the_hand_computed_score_for_each_protocol(judge, tmp_path):
    calls, loaded = judge
    run = run_dir(tmp_path / "zs", EXPLANATIONS)
    result = judge_run.evaluate([run], judge_model="judge-m", samples=500)
    (row,) = result["methods"]
    assert row["name"] == "zero-shot" and loaded == [{"geval_judge": "judge-m"}]
    for protocol in judging.PROTOCOLS:
        got = row["explanations"][protocol]
        assert got["1"] is None  # the empty explanation
        for cid in (0, 2):
            assert got[str(cid)] == pytest.approx(EXPECTED[cid][protocol]), (protocol, cid)
        summary = row["scores"][protocol]
        assert summary["mean"] == pytest.approx((EXPECTED[0][protocol] + EXPECTED[2][protocol]) / 2)
        assert (summary["n"], summary["unscored"]) == (2, 1)
        low, high = summary["interval"]
        assert min(EXPECTED[0][protocol], EXPECTED[2][protocol]) <= low <= summary["mean"] <= high
    # One rating per unit: 3 sentences x 2 + 2 documents x 2 = 10, each its own conversation.
    assert sum(len(c.prompts) for c in calls) == 10 and all(s == "" for c in calls for s in c.systems)
    assert {c.schemas[0].name for c in calls} == {"geval_document", "geval_sentence"}
    # The judge read the claim's evidence, as the run's config says (the demo split's golden evidence).
    assert "7-2 vote" in calls[0].prompts[0]
    table = geval_scores.table(result)
    assert table.splitlines()[0] == ("| method | n | sentence, no typology | sentence, typology | "
                                     "document, no typology | document, typology |")
    assert table.splitlines()[2].startswith("| zero-shot | 3 | 2.62 [") and "| 3.90 [" in table


def test_ratings_are_written_as_made_and_reused_for_the_same_judge_and_explanation(judge, tmp_path):
    calls, loaded = judge
    run = run_dir(tmp_path / "zs", EXPLANATIONS)
    judge_run.evaluate([run], judge_model="judge-m", protocols=["document"], samples=100)
    lines = [json.loads(line) for line in (tmp_path / "zs" / geval_scores.RATINGS).read_text().splitlines()]
    assert [(line["claim_id"], line["protocol"]) for line in lines] == [(0, "document"), (1, "document"),
                                                                        (2, "document")]
    assert lines[0]["units"][0]["probs"]["5"] == 0.8 and lines[0]["score"] == pytest.approx(4.8)
    before = len(calls)
    again = judge_run.evaluate([run], judge_model="judge-m", protocols=["document"], samples=100)
    assert len(calls) == before and again["methods"][0]["explanations"]["document"]["0"] == pytest.approx(4.8)
    # A changed explanation is rated again; so is every one under another judge.
    run_changed = json.loads((tmp_path / "zs" / "predictions.jsonl").read_text().splitlines()[2])
    assert run_changed["claim_id"] == 2
    (tmp_path / "zs" / "predictions.jsonl").write_text(
        "".join(json.dumps({"claim_id": c, "justification": EXPLANATIONS[0] if c == 2 else t}) + "\n"
                for c, t in EXPLANATIONS.items()))
    changed = judge_run.evaluate([run], judge_model="judge-m", protocols=["document"], samples=100)
    assert sum(len(c.prompts) for c in calls[before:]) == 1
    assert changed["methods"][0]["explanations"]["document"]["2"] == pytest.approx(4.8)


def test_several_runs_are_rows_and_people_give_kendalls_tau_c_per_protocol(judge, tmp_path):
    runs = [run_dir(tmp_path / "a", EXPLANATIONS), run_dir(tmp_path / "b", {0: "The report says so.",
                                                                               2: EXPLANATIONS[0]}, method="madr")]
    human = tmp_path / "people.jsonl"
    human.write_text("\n".join(json.dumps(row) for row in [
        {"run": "zero-shot", "claim_id": 0, "score": 1}, {"run": "zero-shot", "claim_id": 2, "score": 0},
        {"run": "b", "claim_id": 0, "score": 0}, {"run": "madr", "claim_id": 2, "score": 0},
        {"run": "madr", "claim_id": 2, "score": 1}]) + "\n")  # two people on one explanation: averaged
    result = judge_run.evaluate(runs, judge_model="judge-m", human=str(human), samples=100)
    assert [row["name"] for row in result["methods"]] == ["zero-shot", "madr"]
    people = {("zero-shot", "0"): 1.0, ("zero-shot", "2"): 0.0, ("madr", "0"): 0.0, ("madr", "2"): 0.5}
    for protocol in judging.PROTOCOLS:
        pairs = [(people[(row["name"], cid)], row["explanations"][protocol][cid])
                 for row in result["methods"] for cid in ("0", "2")]
        assert result["agreement"][protocol] == {
            "tau_c": pytest.approx(geval_scores.kendall_tau_c([p for p, _ in pairs], [s for _, s in pairs])), "n": 4}
    assert "| sentence, typology |" in geval_scores.agreement_table(result["agreement"])


def test_bad_inputs_are_named_before_the_judge_loads(judge, tmp_path):
    calls, loaded = judge
    run = run_dir(tmp_path / "zs", EXPLANATIONS)
    human = tmp_path / "people.jsonl"
    for text, message in [('{"claim_id": 0, "score": "high"}\n', r"people.jsonl: line 1: score must be a number"),
                          ('{"claim_id": 0, "score": 1}\n{"run": "cot", "claim_id": 0, "score": 1}\n',
                           r"line 2: run 'cot' is none of the rows"),
                          ("{not json\n", r"line 1 is not valid JSON")]:
        human.write_text(text)
        with pytest.raises(InputError, match=message):
            judge_run.evaluate([run], judge_model="judge-m", human=str(human))
    with pytest.raises(InputError, match="no predictions.jsonl"):
        judge_run.evaluate([str(tmp_path)], judge_model="judge-m")
    with pytest.raises(InputError, match="--protocol: paragraph"):
        judge_run.evaluate([run], judge_model="judge-m", protocols=["paragraph"])
    (tmp_path / "zs" / "predictions.jsonl").write_text(json.dumps({"claim_id": 99, "justification": "x"}) + "\n")
    with pytest.raises(InputError, match="claim 99 .* not in its split"):
        judge_run.evaluate([run], judge_model="judge-m")
    assert loaded == [] and calls == []


def test_explanation_stats():
    stats = geval_scores.explanation_stats([
        {"justification": "One. Two.", "prompt_tokens": 10, "completion_tokens": 2,
         "madr": {"revisions": 2, "stop_reason": "max_iterations"}},
        {"justification": "", "prompt_tokens": 4, "completion_tokens": 0,
         "madr": {"revisions": 0, "stop_reason": "agreement"}}])
    assert stats == {"n": 2, "empty": 1, "mean_words": 1.0, "mean_sentences": 1.0, "tokens_per_claim": 8.0,
                     "madr": {"stop_reasons": {"max_iterations": 1, "agreement": 1}, "mean_revisions": 1.0}}
    assert "2 explanations (1 empty)" in geval_scores.stats_line(stats)


# ---------------------------------------------------------------- end to end on a tiny random model


def test_explain_with_madr_then_geval_under_all_four_protocols(tmp_path, capsys):
    from tests.tiny_models import build_tiny_llama

    tiny = str(build_tiny_llama(tmp_path / "tiny", seed=0))
    out = tmp_path / "run"
    metrics = run_debate.main(["--task", "explain", "--method", "madr", "--split", "demo", "--limit", "2",
                               "--model", tiny, "--max-new-tokens", "110", "--madr-iterations", "1",
                               "--output-dir", str(out)])
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert sorted(p["claim_id"] for p in preds) == [0, 1] and metrics["n"] == 2
    for p in preds:
        assert "label" not in p and p["gold_label"] and "justification_unrefined" in p and p["madr"]["judge_calls"] <= 1
    config = json.loads((out / "config.json").read_text())
    assert (config["task"], config["method"], config["madr_temperature"]) == ("explain", "madr", 0.0)
    capsys.readouterr()
    summary = tmp_path / "geval_scores.json"
    assert judge_run.main([str(out), "--judge-model", tiny, "--batch-size", "4", "--samples", "200",
                       "--json", str(summary)]) == 0
    shown = capsys.readouterr().out
    assert "| madr | 2 |" in shown and "document, typology" in shown
    result = json.loads(summary.read_text())
    for protocol in judging.PROTOCOLS:
        for score in result["methods"][0]["explanations"][protocol].values():
            assert score is None or 1.0 <= score <= 5.0
    lines = [json.loads(line) for line in (out / geval_scores.RATINGS).read_text().splitlines()]
    rated = [u for line in lines for u in line["units"]]
    assert rated and all(u["status"] == "structured" and sum(u["probs"].values()) == pytest.approx(1, abs=1e-4)
                         for u in rated)


def test_the_api_scores_like_the_command_line(judge, tmp_path):
    import debate

    run = run_dir(tmp_path / "zs", EXPLANATIONS)
    result = debate.geval(run, judge_model="judge-m", protocols="document", log=lambda *a: None)
    assert result["protocols"] == ["document"]
    assert result["methods"][0]["scores"]["document"]["mean"] == pytest.approx((4.8 + 3.0) / 2)


def test_a_record_with_its_own_evidence_is_judged_against_it(judge, tmp_path):
    calls, loaded = judge
    run = run_dir(tmp_path / "court", {0: "The report says so."})
    pooled = {"claim_id": 0, "justification": "The report says so.",
              "evidence": [{"question": "What did the pool find?", "answer": "A pooled passage.", "url": ""}]}
    (tmp_path / "court" / "predictions.jsonl").write_text(json.dumps(pooled) + "\n")
    judge_run.evaluate([run], judge_model="judge-m", protocols=["document"], samples=10)
    assert "A pooled passage." in calls[0].prompts[0] and "7-2 vote" not in calls[0].prompts[0]
