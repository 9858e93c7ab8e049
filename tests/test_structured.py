"""Structured decoding (debate.data.answer_schemas, debate.engine.schema_program and the engine): any model
answers with the object its prompt asks for, choices are scored as whole values, and free generation is untouched
when it is off."""
import json
import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import run_debate
from debate.data import answer_schemas
from debate.data.labels import LABELS
from debate.data.prompts import PROMPT_DIR, PromptError, raw_prompt
from debate.engine import chat, engine, schema_program
from debate.methods import turns
from tests.tiny_models import build_tiny_llama

SCHEMA_NAMES = sorted(p.name[: -len(".schema.json")] for p in PROMPT_DIR.glob("*.schema.json"))


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny"), seed=0))


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return AutoModelForCausalLM.from_pretrained(tiny_path).eval(), AutoTokenizer.from_pretrained(tiny_path)


@pytest.fixture(scope="module")
def soft(tmp_path_factory):
    """A tiny model with small weights, so its choice probabilities are spread rather than 0 or 1."""
    path = build_tiny_llama(tmp_path_factory.mktemp("soft"), seed=3, initializer_range=0.005)
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def the_object(text):
    """The JSON object of a reply (after any reasoning, which never holds a '{')."""
    return json.loads(text[text.index("{"):])


# ---------------------------------------------------------------- the declared schemas


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_each_schema_declares_the_keys_its_prompt_asks_for_in_the_prompts_order(name):
    keys = answer_schemas.load(name).keys
    text = raw_prompt(name)
    if name in ("ragcot", "majority_vote"):
        text += raw_prompt("verdict_answer")  # rendered into it as {answer}
    if name == "cooperation_final":
        text += raw_prompt("verdict_answer")
    # The order that counts is the JSON example's (a prompt may name keys in its steps before it).
    example = text.find("{{")
    text = text[example:] if example >= 0 else text
    positions = [text.find(f'"{k}"') for k in keys]
    assert all(p >= 0 for p in positions), (name, keys)
    assert positions == sorted(positions), (name, keys)


def test_a_bad_schema_file_is_refused_with_its_file_and_field(tmp_path, monkeypatch):
    monkeypatch.setattr(answer_schemas, "PROMPT_DIR", tmp_path)
    answer_schemas.load.cache_clear()
    try:
        (tmp_path / "broken.schema.json").write_text(json.dumps({"fields": [{"key": "Verdict", "type": "choice"}]}))
        with pytest.raises(PromptError, match=r"broken\.schema\.json: fields\[0\].*values"):
            answer_schemas.load("broken")
        (tmp_path / "late.schema.json").write_text(json.dumps({"fields": [
            {"key": "A", "type": "text", "when": {"B": "Yes"}}, {"key": "B", "type": "choice", "values": ["Yes"]}]}))
        with pytest.raises(PromptError, match="earlier fields"):
            answer_schemas.load("late")
        (tmp_path / "odd.schema.json").write_text(json.dumps({"fields": [
            {"key": "A", "type": "choice", "values": ["Yes", "No"], "scored": True}]}))
        with pytest.raises(PromptError, match=r"odd\.schema\.json: fields\[0\].*'scored'.*number field only"):
            answer_schemas.load("odd")
    finally:
        answer_schemas.load.cache_clear()


def test_numbers_take_the_values_of_their_range_and_only_g_evals_are_scored():
    assert answer_schemas.load("court_admissibility").fields[0].values == tuple(f"{i / 10:.1f}" for i in range(11))
    assert answer_schemas.load("judge_case").fields[1].values == tuple(str(i) for i in range(11))
    # G-Eval's score is the probability-weighted mean of 1-5: its distribution is read, so it is scored.
    numbers = {(n, f.key): f.scored for n in SCHEMA_NAMES for f in answer_schemas.load(n).fields if f.kind == "number"}
    assert {k for k, scored in numbers.items() if scored} == {("geval_document", "Faithfulness"),
                                                              ("geval_sentence", "Faithfulness")}


def test_a_turn_too_short_for_the_object_is_refused_up_front(tiny):
    model, tok = tiny
    compiled = schema_program.compile_for("moderator_round", tok)
    conv = engine.Conversation(system="s")
    with pytest.raises(schema_program.SchemaBudgetError, match=r"--max-new-tokens 10 .*'moderator_round'.* need \d+"):
        engine.generate(model, tok, [conv], ["go"], engine.Settings(max_new_tokens=10), schemas=[compiled])
    assert conv.generated == []  # nothing ran


# ---------------------------------------------------------------- decoding


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_garbage_logits_still_give_the_object_within_the_token_limit(tiny, name):
    model, tok = tiny
    compiled = schema_program.compile_for(name, tok)
    limit = compiled.fixed_cost + 40
    convs = [engine.Conversation(system=f"Claim {i}. " + "Evidence says so. " * i) for i in range(3)]
    replies = engine.generate(model, tok, convs, ["Answer now."] * 3, engine.Settings(max_new_tokens=limit),
                              schemas=[compiled] * 3)
    spec = compiled.spec  # the declared schema with its label list filled in (AVeriTeC's by default)
    for reply, conv in zip(replies, convs):
        obj = the_object(reply)
        assert list(obj) == list(spec.keys)
        assert conv.completion_tokens <= limit
        result = conv.structured
        assert result["schema"] == name and result["fields"].keys() == obj.keys()
        for f in spec.fields:
            active = all(result["fields"].get(k) == v for k, v in f.when)
            if f.kind == "choice" and active:
                assert obj[f.key] in f.values
                assert sum(result["probs"][f.key].values()) == pytest.approx(1, abs=1e-4)
            if f.kind == "number":
                # A number by its value, not its spelling: a two-decimal "0.20" reads back as 0.2.
                assert float(obj[f.key]) in {float(v) for v in f.values}
            if f.kind == "list":
                assert 1 <= len(obj[f.key]) <= f.max_items
            if f.kind == "text" and not active:
                assert obj[f.key] == ""


def test_a_no_round_reply_has_a_verdict_and_a_yes_leaves_it_empty(tiny):
    model, tok = tiny
    compiled = schema_program.compile_for("moderator_round", tok)
    convs = [engine.Conversation(system=f"Claim number {i}. " + "A source. " * i) for i in range(8)]
    engine.generate(model, tok, convs, ["Judge the round."] * 8, engine.Settings(max_new_tokens=140),
                    schemas=[compiled] * 8)
    for conv in convs:
        fields = conv.structured["fields"]
        if fields["Proceeding Necessity"] == "No":
            assert fields["Verdict"] in LABELS
        else:
            assert fields["Verdict"] == "" and fields["Justification for Verdict"] == ""
            assert "Verdict" not in conv.structured["probs"]


def independent_choice_probs(model, tok, conv, prompt, name, key, values):
    """Decode `prompt` under schema `name`, then score `key`'s values again with plain forward passes over
    the whole sequence (no cache, no batch): (the engine's probabilities, the independent ones)."""
    compiled = schema_program.compile_for(name, tok)
    context = chat.context_ids(tok, engine.Conversation(system=conv.system, messages=[
        {"role": "user", "content": prompt}]))
    engine.generate(model, tok, [conv], [prompt], engine.Settings(max_new_tokens=compiled.fixed_cost + 30),
                    schemas=[compiled])
    result = conv.structured
    before = context + conv.generated[-1][:result["offsets"][key]]
    quote = tok('"', add_special_tokens=False)["input_ids"]
    scores = []
    with torch.no_grad():
        for value in values:
            ids = tok(value, add_special_tokens=False)["input_ids"] + quote[:1]
            logp = torch.log_softmax(model(input_ids=torch.tensor([before + ids])).logits[0].float(), dim=-1)
            scores.append(sum(float(logp[len(before) + j - 1, t]) for j, t in enumerate(ids)))
    expected = torch.softmax(torch.tensor(scores, dtype=torch.float64), dim=0).tolist()
    return [result["probs"][key][v] for v in values], expected, result


def test_label_probs_are_the_softmax_of_each_whole_values_log_probability(soft, tmp_path, monkeypatch):
    model, tok = soft
    conv = engine.Conversation(system="You check claims. Claim: the minister said it.")
    got, expected, result = independent_choice_probs(model, tok, conv, "Give the verdict.", "ragcot", "Verdict", LABELS)
    assert got == pytest.approx(expected, abs=1e-5)
    assert result["fields"]["Verdict"] == LABELS[max(range(4), key=lambda k: expected[k])]
    # Labels of many tokens are far less probable under a random model; a choice among values the tiny
    # vocabulary spells in one token each shows the match where the probabilities are spread.
    values = ("claim", "source", "evidence")
    monkeypatch.setattr(answer_schemas, "PROMPT_DIR", tmp_path)
    (tmp_path / "words.schema.json").write_text(json.dumps({"fields": [
        {"key": "Word", "type": "choice", "values": list(values)}]}))
    conv = engine.Conversation(system="You pick a word.")
    got, expected, _ = independent_choice_probs(model, tok, conv, "Which word?", "words", "Word", values)
    assert got == pytest.approx(expected, abs=1e-5)
    assert 0.01 < max(expected) < 0.99  # the test means something: the choice was not a foregone one


def test_sampled_choices_draw_from_the_probabilities(soft, tmp_path, monkeypatch):
    model, tok = soft
    monkeypatch.setattr(answer_schemas, "PROMPT_DIR", tmp_path)
    (tmp_path / "pick.schema.json").write_text(json.dumps({"fields": [
        {"key": "Word", "type": "choice", "values": ["claim", "source", "evidence"]}]}))
    compiled = schema_program.compile_for("pick", tok)
    convs = [engine.Conversation(system="You pick a word.") for _ in range(30)]
    engine.generate(model, tok, convs, ["Which word?"] * 30, engine.Settings(max_new_tokens=40, temperature=1.0),
                    schemas=[compiled] * 30, generator=torch.Generator().manual_seed(5))
    probs = convs[0].structured["probs"]["Word"]
    counts = {v: sum(c.structured["fields"]["Word"] == v for c in convs) for v in probs}
    # Identical rows, so one distribution; greedy would give all of them its top value.
    assert max(probs.values()) < 0.9 and len([v for v in counts if counts[v]]) > 1


def structured_turns(model, tok, reuse, batch_size, name="moderator_round", turns_=2, max_new_tokens=120):
    compiled = schema_program.compile_for(name, tok)
    settings = engine.Settings(max_new_tokens=max_new_tokens, reuse_cache=reuse)
    systems = [f"Debate claim {i}. Evidence: " + "the report says so. " * (i * 5 % 11) for i in range(6)]
    convs = [engine.Conversation(system=s) for s in systems]
    for turn in range(turns_):
        for start in range(0, len(convs), batch_size):
            rows = range(start, min(len(convs), start + batch_size))
            engine.generate(model, tok, [convs[i] for i in rows],
                            [f"Round {turn}: judge claim {i}." + " Really?" * (i % 3) for i in rows], settings,
                            schemas=[compiled] * len(rows))
    return convs


def test_greedy_structured_tokens_identical_across_batch_sizes_and_cache_reuse(tiny):
    model, tok = tiny
    runs = {(reuse, bs): structured_turns(model, tok, reuse, bs) for reuse in (True, False) for bs in (1, 6)}
    reference = runs[(False, 1)]
    for key, convs in runs.items():
        assert [c.generated for c in convs] == [c.generated for c in reference], key
        assert [c.structured["fields"] for c in convs] == [c.structured["fields"] for c in reference], key
    cached, uncached = runs[(True, 6)], runs[(False, 6)]
    assert sum(c.encoded_tokens for c in cached) < sum(c.encoded_tokens for c in uncached)


def reference_greedy(model, tok, context, stops, max_new_tokens):
    """Free greedy decoding the plainest way: a full forward pass over the whole sequence for every token."""
    ids = list(context)
    out = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            token = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            out.append(token)
            if token in stops:
                break
            ids.append(token)
    return out


def test_free_generation_is_plain_greedy_decoding_token_for_token(tiny):
    model, tok = tiny
    stops = set(chat.stop_token_ids(model, tok))
    convs = [engine.Conversation(system=f"Claim {i}: " + "the report says so. " * i) for i in range(3)]
    for turn in range(2):
        contexts = []
        for conv in convs:
            probe = engine.Conversation(system=conv.system, messages=conv.messages + [
                {"role": "user", "content": f"Turn {turn}."}], generated=conv.generated)
            contexts.append(chat.context_ids(tok, probe))
        engine.generate(model, tok, convs, [f"Turn {turn}."] * 3, engine.Settings(max_new_tokens=10, structured=False))
        for conv, context in zip(convs, contexts):
            assert conv.structured is None
            want = reference_greedy(model, tok, context, stops, 10)
            assert conv.generated[-1] == [t for t in want if t not in stops]


# ---------------------------------------------------------------- every method, end to end


@pytest.mark.parametrize("method", ["debatecv", "rag-cot", "majority", "cooperation", "courtroom"])
def test_every_method_gives_readable_structured_replies_and_a_label_for_every_claim(tiny_path, tmp_path, method):
    out = tmp_path / method
    extra = ["--refine", "madr", "--madr-iterations", "1"] if method == "rag-cot" else []
    # The courtroom critic's seven scores need 144 tokens of keys with the tiny model's tokenizer (82 with Gemma's).
    tokens = "160" if method == "courtroom" else "120"
    if method == "courtroom":  # one round each, but a two-round rerun, whose round 2 asks the court (court_ready)
        extra = ["--switch-rounds", "2"]
    run_debate.main(["--split", "demo", "--method", method, "--model", tiny_path, "--max-new-tokens", tokens,
                     "--max-rounds", "1", "--limit", "2", "--batch-size", "2", "--output-dir", str(out), *extra])
    predictions = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 2
    for p in predictions:
        assert p["label"] in LABELS and p["parse_status"] == "structured"
        assert set(p["label_probs"]) == set(LABELS) and sum(p["label_probs"].values()) == pytest.approx(1, abs=1e-4)
    transcripts = [json.loads(line) for line in (out / "transcripts.jsonl").read_text().splitlines()]
    seen = set()
    for t in transcripts:
        for turn in t["turns"]:
            if "schema" in turn:
                seen.add(turn["schema"])
                assert turn["parse_status"] == "structured"
                assert list(the_object(turn["response"])) == list(answer_schemas.load(turn["schema"]).keys)
            elif re.search(r"Answer ONLY with a JSON object", turn["prompt"]):
                pytest.fail(f"a JSON answer was asked for without a schema: {turn['prompt'][:80]}")
    expected = {"debatecv": {"moderator_round"}, "rag-cot": {"ragcot", "madr_judge", "madr_refine"},
                "majority": {"ragcot"}, "cooperation": {"cooperation_final"},
                "courtroom": {"critic_premises", "counsel_search", "counsel_disclosure", "court_admissibility",
                              "counsel_gap", "courtroom_query", "court_query", "counsel_expert", "counsel_reflection",
                              "critic_round", "court_ready", "judge_case"}}[method]
    assert expected <= seen
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["calibration"]["n"] == 2


# ---------------------------------------------------------------- combining votes


def test_the_majority_vote_distribution_enumerates_every_ballot():
    from debate.methods.baselines import majority_vote
    a = {"Supported": 0.5, "Refuted": 0.5}
    b = {"Supported": 0.2, "Refuted": 0.8}
    c = {"Supported": 1.0, "Refuted": 0.0}
    probs = turns.outcome_probs([a, b, c], lambda votes: majority_vote(votes)[0])
    # Supported wins unless both a and b say Refuted (0.5 x 0.8 = 0.4).
    assert probs["Supported"] == pytest.approx(0.6) and probs["Refuted"] == pytest.approx(0.4)
    assert probs["Not Enough Evidence"] == 0 and turns.outcome_probs([a, None], lambda v: v[0]) is None
