"""The courtroom's control flow with scripted agents and the real all-MiniLM-L6-v2 encoder: negotiation and
admissibility, progressive retrieval and its novelty filter, the four stopping rules and the cap, the role
switch, the witness, the judges' panel and the confidence."""
import json
import re

import pytest

from debate import courtroom, engine, panel, retrieval, turns
from debate.labels import SUPPORTED
from tests import scripted

TOPICS = ["The Eiffel Tower in Paris is 330 metres tall.",
          "Bananas are a good source of potassium.",
          "The Amazon river carries more water than any other river.",
          "Mount Everest is the highest mountain above sea level.",
          "Honey bees communicate the location of flowers by dancing.",
          "The Great Wall of China is thousands of kilometres long.",
          "Penguins live almost only in the southern hemisphere.",
          "Venus spins in the opposite direction to most planets.",
          "Coffee beans are the seeds of the coffee plant.",
          "The violin has four strings tuned in fifths."]
CLAIM = {"claim_id": 7, "claim": "The Eiffel Tower is 330 metres tall.", "label": SUPPORTED,
         "evidence": [{"question": "How tall is it?", "answer": TOPICS[0], "url": "https://example.org/a"}]}


@pytest.fixture(scope="module")
def embedder():
    return retrieval.load_embedder()


def library(embedder, texts=TOPICS):
    passages = [{"id": f"p{i}", "text": t, "url": f"https://example.org/{i}"} for i, t in enumerate(texts)]
    return courtroom.Library(embedder, retrieval.index_of(passages, embedder))


def js(**fields):
    return json.dumps(fields)


class Court:
    """Scripted replies for every courtroom prompt; tests override what they exercise.

    Defaults: premises and search queries name the claim, every passage is admitted (0.9 x 0.9), each
    counsel's round-r query names a topic no one has asked for yet (so novelty stays high), no one stops
    the hearing, reflections are unreadable (no plateau), and every judge votes Supported.
    """

    def __init__(self, **override):
        self.premises = [CLAIM["claim"]]
        self.search = CLAIM["claim"]
        self.scores = lambda passage: (0.9, 0.9)
        self.query = lambda side, round_no: TOPICS[2 * round_no - (side == "plaintiff")]
        self.argument = lambda side, round_no, model: f"{side} argues round {round_no}"
        self.reflection = lambda side, round_no: "no idea"
        self.resolved = lambda round_no: "No"
        self.ready = lambda round_no: "No"
        self.consistency = 8
        self.judge = lambda model: js(**{"Evidence Strength": 6, "Argument Validity": 6, "Scientific Reliability": 6,
                                         "Justification": f"{model} finds it supported", "Verdict": "Supported"})
        self.__dict__.update(override)
        self.reflections = {}

    def __call__(self, model, conv, prompt):
        side = "plaintiff" if "Plaintiff Counsel in a court" in conv.system else \
            "defense" if "Defense Counsel in a court" in conv.system else None
        found = re.search(r"Round (\d+)", prompt)
        round_no = int(found.group(1)) if found else None
        if "atomic premises" in prompt:
            return js(Premises=self.premises)
        if "Before the hearing" in prompt:
            return js(Query=self.search)
        if "offers this item as evidence" in prompt:
            relevance, credibility = self.scores(prompt)
            return js(Relevance=relevance, Credibility=credibility)
        if "evidential gap" in prompt:
            return js(Gap=f"{side} gap {round_no}")
        if "seeks more evidence" in prompt:
            asker = "plaintiff" if "Plaintiff Counsel seeks" in prompt else "defense"
            n = int(re.search(r"(plaintiff|defense) gap (\d+)", prompt).group(2))
            return js(Query=self.query(asker, n))
        if "Present your argument" in prompt:
            return self.argument(side, round_no, model)
        if conv.system.startswith("You are an independent expert witness"):
            return f"Expert answer to: {prompt}"
        if "Reflect on your argument" in prompt:
            self.reflections[(id(conv))] = self.reflections.get(id(conv), 0) + 1
            return self.reflection(side, self.reflections[id(conv)])
        if "Score each side" in prompt:
            return js(**{"Plaintiff Score": 5, "Defense Score": 5, "Unresolved Premises": "-",
                         "Resolved": self.resolved(round_no)})
        if "ready for deliberation" in prompt:
            return js(Ready=self.ready(round_no), Reason="-")
        if "argued twice" in prompt:
            return js(Consistency=self.consistency, Reason="-")
        if "Score the case" in prompt:
            return self.judge(model)
        raise AssertionError(f"unscripted prompt: {prompt[:80]}")


ROLES = courtroom.model_of(3)


def run(monkeypatch, court, lib, models=None, settings=None, **options):
    calls = scripted.install(monkeypatch, court)
    agents = scripted.agents(ROLES, models or {"judge_1": "j1", "judge_2": "j2", "judge_3": "j3"})
    opts = courtroom.Options(**dict({"max_rounds": 10, "role_switch": False}, **options))
    record = courtroom.run_batch(agents, [CLAIM], settings or engine.Settings(), opts, lib,
                                 streams=turns.Streams("cpu"))[0]
    return record["prediction"], record["transcript"]["turns"], calls


def hearing_system(calls):
    """The plaintiff counsel's system prompt in the hearing (after the negotiation)."""
    return next(c.systems[0] for c in calls if "Plaintiff Counsel in a court" in c.systems[0]
                and "evidential gap" in c.prompts[0])


def prompts_of(said, role, stage=None):
    return [t["prompt"] for t in said if t["role"] == role and (stage is None or t["round"] == stage)]


def test_negotiation_admits_disputes_and_drops_by_admissibility_weight(monkeypatch, embedder):
    weights = {"potassium": (0.6, 0.5), "Amazon": (0.3, 0.3)}  # 0.3 disputed, 0.09 dropped; others 0.81
    court = Court(scores=lambda prompt: next((w for k, w in weights.items() if k in prompt), (0.9, 0.9)),
                  resolved=lambda r: "Yes")
    pred, said, calls = run(monkeypatch, court, library(embedder, TOPICS[:3]))
    assert pred["negotiation"] == {"admitted": 1, "disputed": 1, "dropped": 1, "unscored": 0}
    counsel_system = hearing_system(calls)
    assert "Eiffel" in counsel_system and "potassium" in counsel_system and "(evidence disputed)" in counsel_system
    assert "Amazon" not in counsel_system  # a dropped item never reaches the counsels
    assert counsel_system.index("Eiffel") < counsel_system.index("potassium")  # admitted first
    answers = [e["answer"] for e in pred["evidence"]]
    assert TOPICS[0] in answers and TOPICS[2] not in answers


def test_unreadable_admissibility_is_unscored_and_shown_as_such(monkeypatch, embedder):
    court = Court(scores=lambda prompt: (None, None), resolved=lambda r: "Yes")
    pred, _, calls = run(monkeypatch, court, library(embedder, TOPICS[:2]))
    assert pred["negotiation"] == {"admitted": 0, "disputed": 0, "dropped": 0, "unscored": 2}
    assert "(evidence unscored)" in hearing_system(calls)


def test_progressive_retrieval_refuses_a_near_duplicate_and_admits_a_new_passage(monkeypatch, embedder):
    near_duplicate = "The Eiffel Tower in Paris stands 330 metres tall."
    texts = [TOPICS[0], near_duplicate, TOPICS[1], TOPICS[3]]
    court = Court(search=TOPICS[0],
                  query=lambda side, r: near_duplicate if side == "plaintiff" else "potassium in bananas",
                  resolved=lambda r: "Yes")
    pred, said, _ = run(monkeypatch, court, library(embedder, texts), top_k=1)
    assert pred["negotiation"]["admitted"] == 1  # only the tower passage was found before the hearing
    plaintiff_q, defense_q = pred["hearings"][0]["queries"]
    assert plaintiff_q["admitted"] == 0 and plaintiff_q["novelty"][0] < 0.20  # the near-duplicate is refused
    assert defense_q["admitted"] == 1 and defense_q["novelty"][0] >= 0.20
    assert pred["hearings"][0]["discovered"] == 1
    arguments = prompts_of(said, "plaintiff", "first-1")
    argument = next(p for p in arguments if "Present your argument" in p)
    assert "potassium" in argument and "stands 330" not in argument  # the new passage is put before the court
    assert TOPICS[1] in [e["answer"] for e in pred["evidence"]]


@pytest.mark.parametrize("override, rounds, reason", [
    ({"resolved": lambda r: "Yes" if r == 2 else "No"}, 2, "critic_resolved"),
    ({"ready": lambda r: "Yes"}, 1, "court_ready"),
    ({"reflection": lambda side, r: js(Logic=0.5, Novelty=0.5, Rebuttal=0.5 + 0.01 * r, **{"Discovery Need": "x"})},
     3, "reflection_plateau"),
    ({"query": lambda side, r: TOPICS[1]}, 3, "novelty_exhausted"),  # new in round 1, nothing new in 2 and 3
    ({}, 4, "max_rounds"),
])
def test_each_stopping_rule_ends_the_hearing(monkeypatch, embedder, override, rounds, reason):
    # Top-1 retrieval: each round's queries find exactly the passage they name.
    pred, said, _ = run(monkeypatch, Court(**override), library(embedder), max_rounds=4, top_k=1)
    assert (pred["rounds"], pred["stop_reason"]) == (rounds, reason)
    assert {t["round"] for t in said if t["round"].startswith("first-")} == {f"first-{r}" for r in
                                                                             range(1, rounds + 1)}


def test_default_cap_is_ten_rounds(monkeypatch, embedder):
    court = Court(query=lambda side, r: TOPICS[(2 * r + (side == "defense")) % len(TOPICS)] + f" {r}")
    pred, _, _ = run(monkeypatch, court, library(embedder, TOPICS + [f"Fact number {i}." for i in range(30)]),
                     novelty_stop=0.0)
    assert (pred["rounds"], pred["stop_reason"]) == (10, "max_rounds")


def test_reflection_feeds_the_next_discovery_query_and_the_confidence(monkeypatch, embedder):
    court = Court(reflection=lambda side, r: js(Logic=1.0, Novelty=0.5, Rebuttal=0.0,
                                                **{"Discovery Need": f"{side} needs proof {r}"}),
                  ready=lambda r: "Yes" if r == 2 else "No")
    pred, said, _ = run(monkeypatch, court, library(embedder))
    round2_queries = [p for p in prompts_of(said, "court", "first-2") if "seeks more evidence" in p]
    assert "plaintiff needs proof 1" in round2_queries[0] and "defense needs proof 1" in round2_queries[1]
    # Supported wins, so the plaintiff's last reflection counts: total 0.4 + 0.15 = 0.55 -> +0.03.
    assert pred["confidence_parts"]["reflection"] == pytest.approx((0.55 - 0.5) * 0.6, abs=1e-4)


def test_role_switch_reruns_with_the_counsels_models_swapped(monkeypatch, embedder):
    court = Court(argument=lambda side, r, model: f"{side} argued by {model}", ready=lambda r: "Yes")
    models = {"plaintiff": "model-A", "defense": "model-B", "judge_1": "j1", "judge_2": "j2", "judge_3": "j3"}
    pred, said, calls = run(monkeypatch, court, library(embedder), models=models, role_switch=True)
    assert pred["role_switch"] == "rerun" and len(pred["hearings"]) == 2
    argued = {(t["round"], t["role"]): t["response"] for t in said if "Present your argument" in t["prompt"]}
    assert argued[("first-1", "plaintiff")] == "plaintiff argued by model-A"
    assert argued[("switched-1", "plaintiff")] == "plaintiff argued by model-B"
    assert argued[("switched-1", "defense")] == "defense argued by model-A"
    consistency = next(t["prompt"] for t in said if t["round"] == "role-switch")
    assert "plaintiff argued by model-A" in consistency and "plaintiff argued by model-B" in consistency
    assert pred["consistency"] == 8.0
    assert pred["confidence_parts"]["role_switch"] == pytest.approx(-0.05 + 0.15 * 0.8)
    judge_prompt = prompts_of(said, "judge_1")[0]
    assert "Second hearing" in judge_prompt and "plaintiff argued by model-B" in judge_prompt


def test_role_switch_is_skipped_with_one_model_under_greedy_decoding_and_can_be_turned_off(monkeypatch, embedder):
    court = Court(ready=lambda r: "Yes")
    pred, said, _ = run(monkeypatch, court, library(embedder), models={"plaintiff": "M", "defense": "M"},
                         role_switch=True)
    assert pred["role_switch"].startswith("skipped") and len(pred["hearings"]) == 1
    assert not any(t["round"].startswith("switched") for t in said) and pred["consistency"] is None
    pred, _, _ = run(monkeypatch, Court(ready=lambda r: "Yes"), library(embedder), role_switch=False,
                     models={"plaintiff": "A", "defense": "B"})
    assert pred["role_switch"] == "off" and len(pred["hearings"]) == 1


def test_witness_answers_a_counsels_question_and_both_sides_hear_it(monkeypatch, embedder):
    def argument(side, r, model):
        return f"{side} argues.\nWitness: How tall is the tower?" if (side, r) == ("plaintiff", 1) else f"{side} argues."

    court = Court(argument=argument, ready=lambda r: "Yes" if r == 2 else "No")
    pred, said, _ = run(monkeypatch, court, library(embedder))
    witness = [t for t in said if t["role"] == "witness"]
    assert [(t["round"], t["prompt"]) for t in witness] == [("first-1", "How tall is the tower?")]
    for side in ("plaintiff", "defense"):
        argument_prompt = next(p for p in prompts_of(said, side, "first-2") if "Present your argument" in p)
        assert "Expert answer to: How tall is the tower?" in argument_prompt
    assert "Expert witness (asked by the Plaintiff Counsel)" in prompts_of(said, "judge_1")[0]
    pred, said, _ = run(monkeypatch, Court(argument=argument, ready=lambda r: "Yes"), library(embedder),
                         witness=False)
    assert not any(t["role"] == "witness" for t in said)


def test_panel_majority_verdict_and_confidence(monkeypatch, embedder):
    votes = {"j1": ("Supported", 6), "j2": ("Not Supported", 8), "j3": ("Supported", 4)}

    def judge(model):
        verdict, score = votes[model]
        return js(**{"Evidence Strength": score, "Argument Validity": score, "Scientific Reliability": score,
                     "Justification": f"{model}: {verdict}", "Verdict": verdict})

    pred, said, calls = run(monkeypatch, Court(judge=judge, ready=lambda r: "Yes"), library(embedder))
    assert pred["votes"] == ["Supported", "Not Supported", "Supported"]
    assert (pred["label"], pred["panel_verdict"], pred["justification"]) == (SUPPORTED, "Supported", "j1: Supported")
    # 0.8 * 2/3 + 0.3 * 6/10 (mean of 6, 8, 4); no role switch, no readable reflection.
    assert pred["confidence"] == pytest.approx(0.8 * 2 / 3 + 0.18, abs=1e-4)
    assert [c.model for c in calls if any("Score the case" in p for p in c.prompts)] == ["j1", "j2", "j3"]
    assert pred["panel"]["distinct_models"] == 3


def test_the_same_judge_model_three_times_votes_once_under_greedy_and_says_so(monkeypatch, embedder):
    models = {f"judge_{i}": "J" for i in (1, 2, 3)}
    pred, _, calls = run(monkeypatch, Court(ready=lambda r: "Yes"), library(embedder), models=models)
    assert [c.model for c in calls if any("Score the case" in p for p in c.prompts)] == ["J"]
    assert pred["votes"] == ["Supported"] * 3 and pred["panel"]["distinct_models"] == 1
    assert "repeat one vote" in pred["panel"]["note"]
    # Sampling: each seat draws its own vote from its own stream.
    settings = engine.Settings(temperature=0.7)
    pred, _, calls = run(monkeypatch, Court(ready=lambda r: "Yes"), library(embedder), models=models,
                         settings=settings)
    judge_calls = [c for c in calls if any("Score the case" in p for p in c.prompts)]
    assert len(judge_calls) == 3 and len({c.generator.initial_seed() for c in judge_calls}) == 3
    assert "sample independently" in pred["panel"]["note"]


def test_no_readable_vote_means_no_verdict_and_the_reply_is_kept(monkeypatch, embedder):
    pred, _, _ = run(monkeypatch, Court(judge=lambda model: "I would rather not say.", ready=lambda r: "Yes"),
                     library(embedder))
    assert (pred["label"], pred["parse_status"]) == (None, "unparsed")
    assert pred["justification"] == "I would rather not say."
    assert pred["confidence"] == pytest.approx(0.0)


def test_claims_without_a_corpus_search_their_own_evidence(monkeypatch, embedder):
    court = Court(ready=lambda r: "Yes")
    calls = scripted.install(monkeypatch, court)
    agents = scripted.agents(ROLES, {"judge_1": "j1", "judge_2": "j2", "judge_3": "j3"})
    other = dict(CLAIM, claim_id=8, evidence=[{"question": "What is in bananas?", "answer": TOPICS[1], "url": ""}])
    records = courtroom.run_batch(agents, [CLAIM, other], engine.Settings(), courtroom.Options(role_switch=False),
                                  courtroom.Library(embedder))
    evidence = {r["prediction"]["claim_id"]: [e["answer"] for e in r["prediction"]["evidence"]] for r in records}
    assert evidence == {7: [TOPICS[0]], 8: [TOPICS[1]]}  # each claim only ever sees its own items
    assert records[1]["prediction"]["evidence"][0]["question"] == "What is in bananas?"
    # Both claims went through every phase together: one batched call per turn type.
    assert all(len(c.prompts) == 2 for c in calls if c.model == "plaintiff")
    assert panel.vote([p["prediction"]["votes"][0] for p in records])[2] == SUPPORTED


def test_a_claim_with_no_evidence_and_no_corpus_still_goes_to_the_panel(monkeypatch, embedder):
    calls = scripted.install(monkeypatch, Court(ready=lambda r: "Yes" if r == 2 else "No"))
    agents = scripted.agents(ROLES, {"judge_1": "j1", "judge_2": "j2", "judge_3": "j3"})
    record = courtroom.run_batch(agents, [dict(CLAIM, evidence=[])], engine.Settings(),
                                 courtroom.Options(role_switch=False), courtroom.Library(embedder))[0]
    pred = record["prediction"]
    assert pred["evidence"] == [] and pred["negotiation"] == {"admitted": 0, "disputed": 0, "dropped": 0, "unscored": 0}
    # Nothing to retrieve is no evidence of exhaustion: the hearing ends by another rule.
    assert (pred["rounds"], pred["stop_reason"]) == (2, "court_ready")
    assert pred["hearings"][0]["novelty_means"] == [None, None] and pred["label"] == SUPPORTED
