"""The courtroom's control flow with scripted agents and the real all-MiniLM-L6-v2 encoder: negotiation and
admissibility, progressive retrieval and its novelty filter, the four stopping rules and the cap, the role
switch, the witness, the judges' panel and the confidence."""
import json
import re

import pytest

from debate.data.labels import SUPPORTED, LabelSet
from debate.engine import engine, retrieval
from debate.methods import proclaim_baselines, turns
from debate.methods.courtroom import case, rules, trial
from debate.pipeline import config, method_table
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
    return case.Library(embedder, retrieval.index_of(passages, embedder))


def js(**fields):
    return json.dumps(fields)


NO_SAMPLING = {f"{role}_temperature": 0.0 for role in config.COURTROOM_TEMPERATURES}
# Options built here skip config.build, which fills the defaults that depend on other flags.
SWITCH = {"switch_rounds": None}  # None: the full rerun under the primary's cap (config.build sets max_rounds)


class Court:
    """Scripted replies for every courtroom prompt; tests override what they exercise.

    Defaults: premises and search queries name the claim, every passage is admitted (0.9 x 0.9), each
    counsel's round-r query names a topic no one has asked for yet (so novelty stays high), no one stops
    the hearing, no counsel asks for an expert, reflections are unreadable (no plateau), the critic
    gives each side 0.5 throughout, and every judge votes Supported.
    """

    def __init__(self, **override):
        self.premises = [CLAIM["claim"]]
        self.search = CLAIM["claim"]
        self.scores = lambda passage: (0.9, 0.9)
        self.query = lambda side, round_no: TOPICS[2 * round_no - (side == "plaintiff")]
        self.argument = lambda side, round_no, model: f"{side} argues round {round_no}"
        self.expert = lambda side, round_no: "None"
        self.ruling = lambda expert: "Granted"
        self.reflection = lambda side, round_no: "no idea"
        self.critic = lambda side, round_no: {"Logic": 0.5, "Evidence": 0.5, "Rebuttal": 0.5, "Reasoning": "-"}
        self.resolved = lambda round_no: "No"
        self.ready = lambda round_no: "No"
        self.consistency = 8
        self.judge = lambda model: js(**{"Claim Summary": "-", "Evidence Strength": 6, "Argument Validity": 6,
                                         "Scientific Reliability": 6, "Verdict": "Supported",
                                         "Justification": f"{model} finds it supported"})
        self.__dict__.update(override)
        self.argued = {}  # side -> the round it last argued (the expert request names no round)

    def __call__(self, model, conv, prompt):
        side = "plaintiff" if "Plaintiff Counsel in a legal proceeding" in conv.system else \
            "defense" if "Defense Counsel in a legal proceeding" in conv.system else None
        found = re.search(r"Round (\d+)", prompt, re.IGNORECASE)
        round_no = int(found.group(1)) if found else None
        if "Evaluate the case in six stages" in prompt:
            return self.judge(model)
        if "argued twice" in prompt:
            return js(**{"Model A": 8, "Model B": 8, "Contradictions": "-", "Consistency": self.consistency})
        if conv.system.startswith("You are a scientific expert witness"):
            return "Expert testimony on " + re.search(r"Your role: Expert Witness \((.+?)\)", prompt).group(1)
        if "core logical premises" in prompt:
            return js(Premises=self.premises)
        if "Before the hearing each side searches" in prompt:
            return js(Query=self.search)
        if "disclose what their evidence searches found" in prompt:
            return js(Disclose=[1], Challenge=[2])
        if "Weigh the scientific relevance" in prompt:
            relevance, credibility = self.scores(prompt)
            return js(Relevance=relevance, Credibility=credibility)
        if "critical gap in the exhibits" in prompt:
            return js(Gap=f"{side} gap {round_no}")
        if "write a precise search query" in prompt:
            return js(Query="draft: " + prompt.split("Counsel's request:")[1].split("Give a concise")[0].strip())
        if "proposes this search query" in prompt:
            asker, n = re.search(r"(plaintiff|defense) gap (\d+)", prompt).groups()
            return js(Query=self.query(asker, int(n)))
        if "Give your statement for this round" in prompt:
            self.argued[side] = round_no
            return self.argument(side, round_no, model)
        if "call an expert witness to clarify" in prompt:
            return self.expert(side, self.argued[side])
        if "asks to call an expert witness" in prompt:
            expert = re.search(r"expert witness: (.+)", prompt).group(1)
            return js(Ruling=self.ruling(expert), Reason="-")
        if "Audit your own performance" in prompt:
            return self.reflection(side, round_no)
        if "Score each side from 0.0 to 1.0" in prompt:
            scores = {f"{side.title()} {k}": v for side in ("plaintiff", "defense")
                      for k, v in self.critic(side, round_no).items()}
            return js(**scores, **{"Unresolved Premises": ["premise one"], "Suggested Queries": ["more"],
                                   "Resolved": self.resolved(round_no)})
        if 'Answer "Wait" to go on' in prompt:
            return js(Decision="Close" if self.ready(round_no) == "Yes" else "Wait")
        raise AssertionError(f"unscripted prompt: {prompt[:80]}")


ROLES = trial.model_of(3)


def run(monkeypatch, court, lib, models=None, settings=None, max_rounds=10, **options):
    calls = scripted.install(monkeypatch, court)
    agents = scripted.agents(ROLES, models or {"judge_1": "j1", "judge_2": "j2", "judge_3": "j3"})
    opts = config.Courtroom(**dict({"role_switch": False, **NO_SAMPLING, **SWITCH}, **options))
    record = trial.run_batch(agents, [CLAIM], settings or engine.Settings(), opts, lib, max_rounds=max_rounds,
                             streams=turns.Streams("cpu"))[0]
    return record["prediction"], record["transcript"]["turns"], calls


def prompts_of(said, role, stage=None):
    return [t["prompt"] for t in said if t["role"] == role and (stage is None or t["round"] == stage)]


def argument_prompts(said, side, stage):
    return [p for p in prompts_of(said, side, stage) if "Give your statement" in p]


# --- behaviour 1: only admitted evidence reaches the debate (section 2.3, Appendix K) ----------------

def test_only_admitted_evidence_reaches_counsels_witness_and_judges_and_the_rerun_restores_it(monkeypatch, embedder):
    # Negotiation finds the four first topics (one premise each): the tower is admitted (0.81), the bananas
    # disputed (0.3), the river dropped (0.09), Everest unscored (unreadable rating).
    weights = {"potassium": (0.6, 0.5), "Amazon": (0.3, 0.3), "Everest": (None, None)}
    asked = []

    def query(side, r):  # the first hearing discovers the wall and the penguins, the rerun Venus and coffee;
        asked.append(side)  # each hearing's round 2 asks for them again (nothing new)
        n = len(asked)
        return TOPICS[(5 if n <= 4 else 7) + (n - 1) % 2]

    court = Court(premises=TOPICS[:4], search=TOPICS[0], query=query, ready=lambda r: "Yes",
                  scores=lambda prompt: next((w for k, w in weights.items() if k in prompt), (0.9, 0.9)),
                  expert=lambda side, r: js(**{"Expert Type": "geologist", "Reasoning": "-"}) if side == "plaintiff"
                  else "None")
    models = {"plaintiff": "A", "defense": "B", "judge_1": "j1", "judge_2": "j2", "judge_3": "j3"}
    pred, said, _ = run(monkeypatch, court, library(embedder), models=models, role_switch=True, top_k=1, seed_k=0)
    assert pred["negotiation"] == {"admitted": 1, "disputed": 1, "dropped": 1, "unscored": 1}
    kept_out = ("potassium", "Amazon", "Everest")
    # The counsels saw every candidate while negotiating (negotiation injection happens before admission) ...
    disclosure = " ".join(prompts_of(said, "plaintiff", "negotiation"))
    assert all(k in disclosure for k in kept_out)
    # ... but no counsel, witness or judge prompt of the hearings or the panel shows one that was not admitted.
    debate = [t for t in said if t["round"] not in ("premises", "negotiation")
              and t["role"] in ("plaintiff", "defense", "witness", "judge_1", "judge_2", "judge_3")]
    assert {t["role"] for t in debate} == {"plaintiff", "defense", "witness", "judge_1", "judge_2", "judge_3"}
    assert not [t["role"] for t in debate if any(k in t["prompt"] for k in kept_out)]
    first = argument_prompts(said, "plaintiff", "first-1")[0]
    assert "Eiffel" in first and "Great Wall" in first and "Penguins" in first  # admitted, then discovered
    # The rerun starts again from the originally admitted exhibits: the first hearing's discoveries are gone.
    rerun = argument_prompts(said, "plaintiff", "switched-1")[0]
    assert "Eiffel" in rerun and "Venus" in rerun and "Great Wall" not in rerun and "Penguins" not in rerun
    testimony = prompts_of(said, "witness", "first-1")[0]
    assert "Eiffel" in testimony and "Great Wall" in testimony
    assert [e["answer"] for e in pred["evidence"]] == [TOPICS[0], TOPICS[5], TOPICS[6]]


def test_progressive_retrieval_refuses_a_near_duplicate_and_admits_a_new_passage(monkeypatch, embedder):
    near_duplicate = "The Eiffel Tower in Paris stands 330 metres tall."
    texts = [TOPICS[0], near_duplicate, TOPICS[1], TOPICS[3]]
    asks = {("plaintiff", 1): TOPICS[0], ("defense", 1): near_duplicate}
    court = Court(search=TOPICS[0], query=lambda side, r: asks.get((side, r), "potassium in bananas"),
                  resolved=lambda r: "Yes")
    pred, said, _ = run(monkeypatch, court, library(embedder, texts), top_k=1, seed_k=0)
    assert pred["negotiation"]["admitted"] == 1  # only the tower passage was found before the hearing
    exhibit, duplicate, bananas, again = pred["hearings"][0]["queries"]
    # The primary's novelty pool starts empty (the authors' engine): the exhibit found again is novel, ...
    assert exhibit["admitted"] == 1 and exhibit["novelty"] == [1.0]
    # ... joins the novelty pool, and its near-duplicate is refused.
    assert duplicate["admitted"] == 0 and duplicate["novelty"][0] < 0.20
    assert bananas["admitted"] == 1 and bananas["novelty"][0] >= 0.20 and again["admitted"] == 0
    assert pred["hearings"][0]["discovered"] == 1  # the exhibit is not listed twice
    argument = argument_prompts(said, "plaintiff", "first-2")[0]
    assert "potassium" in argument and argument.count(TOPICS[0]) == 1
    assert not [p for p in prompts_of(said, "plaintiff") + prompts_of(said, "defense") if "stands 330 metres tall." in p
                and "Give your statement" in p]  # never put before the counsels
    assert TOPICS[1] in [e["answer"] for e in pred["evidence"]]


def test_a_calls_candidates_are_scored_together_against_the_pool_before_the_call(monkeypatch, embedder):
    # Two near-identical passages come back from one call: scored one by one the second would be refused;
    # the authors' engine scores them together against the (empty) pool, so both enter.
    near_duplicate = "The Eiffel Tower in Paris stands 330 metres tall."
    court = Court(search=TOPICS[3], query=lambda side, r: TOPICS[0], resolved=lambda r: "Yes")
    pred, _, _ = run(monkeypatch, court, library(embedder, [TOPICS[0], near_duplicate, TOPICS[3]]), top_k=2,
                     seed_k=0)
    first, second = pred["hearings"][0]["queries"][:2]
    assert first["novelty"] == [1.0, 1.0] and first["admitted"] == 2
    assert second["admitted"] == 0 and max(second["novelty"]) < 0.20  # both are in the novelty pool now


@pytest.mark.parametrize("override, rounds, reason", [
    ({"resolved": lambda r: "Yes" if r == 3 else "No"}, 3, "critic_resolved"),
    # No rule but the cap ends round 1 (the authors' orchestrator): a critic resolved from the first
    # round, a court ready to close from the first round, equal reflections from the first round, all
    # end the hearing after round 2.
    ({"resolved": lambda r: "Yes"}, 2, "critic_resolved"),
    ({"ready": lambda r: "Yes"}, 2, "court_ready"),
    ({"reflection": lambda side, r: js(Logic=0.8, Novelty=0.6, Rebuttal=0.7, **{"Discovery Need": "x"})}, 2,
     "reflection_plateau"),
    # When several hold, the paper's order (2.5) names the one reported: plateau, critic, novelty, court.
    ({"reflection": lambda side, r: js(Logic=0.8, Novelty=0.6, Rebuttal=0.7, **{"Discovery Need": "x"}),
      "resolved": lambda r: "Yes", "ready": lambda r: "Yes"}, 2, "reflection_plateau"),
    ({"resolved": lambda r: "Yes", "ready": lambda r: "Yes", "query": lambda side, r: TOPICS[0]}, 2,
     "critic_resolved"),
    # The exhibit asked for again is novel in round 1 (the primary's novelty pool starts empty), so round 1
    # found something: novelty is not exhausted at round 2, and the court's signal ends the hearing.
    ({"ready": lambda r: "Yes", "query": lambda side, r: TOPICS[0]}, 2, "court_ready"),
    ({"query": lambda side, r: TOPICS[0]}, 3, "novelty_exhausted"),
    # Each counsel's total rises 0.048 in round 2 (S_total, their sum, 0.096: go on; their mean would have
    # moved 0.048 and stopped) and 0.02 in round 3 (S_total 0.04 < 0.05: stop).
    ({"reflection": lambda side, r: js(Logic={1: 0.5, 2: 0.62, 3: 0.67, 4: 0.9}[r], Novelty=0.5, Rebuttal=0.5,
                                       **{"Discovery Need": "x"})}, 3, "reflection_plateau"),
    ({"query": lambda side, r: TOPICS[1]}, 3, "novelty_exhausted"),  # new in round 1, nothing new in 2 and 3
    ({}, 4, "max_rounds"),
])
def test_each_stopping_rule_ends_the_hearing(monkeypatch, embedder, override, rounds, reason):
    # Top-1 retrieval: each round's queries find exactly the passage they name.
    pred, said, _ = run(monkeypatch, Court(**override), library(embedder), max_rounds=4, top_k=1, seed_k=0)
    assert (pred["rounds"], pred["stop_reason"]) == (rounds, reason)
    log = pred["hearings"][0]["round_log"]
    assert [r["stop"] for r in log] == [None] * (rounds - 1) + [reason]
    assert log[0]["court"] is None  # the court is first asked to close after round 2
    assert not [p for p in prompts_of(said, "court", "first-1") if 'Answer "Wait" to go on' in p]
    assert {t["round"] for t in said if t["round"].startswith("first-")} == {f"first-{r}" for r in
                                                                             range(1, rounds + 1)}
    if rounds == 3 and reason == "reflection_plateau":  # S_total: the sum of both counsels' 0.4 l + 0.3 n + 0.3 b
        assert pred["hearings"][0]["reflection_totals"] == pytest.approx([1.0, 1.096, 1.136])


def test_default_cap_is_ten_rounds(monkeypatch, embedder):
    court = Court(query=lambda side, r: TOPICS[(2 * r + (side == "defense")) % len(TOPICS)] + f" {r}")
    pred, _, _ = run(monkeypatch, court, library(embedder, TOPICS + [f"Fact number {i}." for i in range(30)]),
                     novelty_stop=0.0)
    assert (pred["rounds"], pred["stop_reason"]) == (10, "max_rounds")


def test_counsel_turns_are_stateless_and_reflection_feeds_only_discovery(monkeypatch, embedder):
    # Logic rises each round, so the reflection total never plateaus before the court closes in round 3.
    court = Court(reflection=lambda side, r: js(Logic={1: 0.2, 2: 0.6, 3: 1.0}[r], Novelty=0.5, Rebuttal=0.0,
                                                **{"Discovery Need": f"{side} needs proof {r}",
                                                   "Refined Stance": f"{side} stance {r}"}),
                  expert=lambda side, r: js(**{"Expert Type": "None", "Reasoning": f"{side} reasons {r}"}),
                  argument=lambda side, r, model: f"{side} argues round {r}",
                  ready=lambda r: "Yes" if r == 3 else "No")
    history = []  # the messages each counsel turn's conversation held before its reply
    base = court.__call__

    def reply(model, conv, prompt):
        if "Counsel in a legal proceeding" in conv.system:
            history.append(len(conv.messages))
        return base(model, conv, prompt)

    pred, said, _ = run(monkeypatch, reply, library(embedder))
    assert history and set(history) == {1}  # every counsel turn is one prompt in a fresh conversation
    counsel_prompts = " ".join(t["prompt"] for t in said if t["role"] in ("plaintiff", "defense"))
    # Nothing of a reflection, a gap or an expert request is carried into a later counsel prompt ...
    assert "needs proof" not in counsel_prompts and "stance" not in counsel_prompts
    assert "gap 1" not in counsel_prompts and "reasons" not in counsel_prompts
    # ... the discovery need reaches P-RAG's next query (Appendix I), and only it.
    round2_queries = [p for p in prompts_of(said, "court", "first-2") if "write a precise search query" in p]
    assert "plaintiff gap 2. Focus also on: plaintiff needs proof 1" in round2_queries[0]
    assert "defense gap 2. Focus also on: defense needs proof 1" in round2_queries[1]
    # The per-turn prompt carries the claim, the pool and the recent proceedings (this round's plaintiff too).
    third = argument_prompts(said, "defense", "first-3")[0]
    assert CLAIM["claim"] in third and "Eiffel" in third and "plaintiff argues round 3" in third
    assert "defense argues round 2" in third
    # Self-reflection reads the counsel's own last two arguments and the opponent's last two (H.7).
    audit = next(p for p in prompts_of(said, "defense", "first-3") if "Audit your own performance" in p)
    assert "defense argues round 2" in audit and "plaintiff argues round 3" in audit
    assert "defense argues round 1" not in audit and "plaintiff argues round 1" not in audit
    # Supported wins, so the plaintiff's last reflection counts: total 0.4 + 0.15 = 0.55 -> +0.03.
    assert pred["confidence_parts"]["reflection"] == pytest.approx((0.55 - 0.5) * 0.6, abs=1e-4)


# --- behaviours 3 and 4: P-RAG searches a corpus, and measures novelty against the current pool -------

def test_prag_finds_a_passage_outside_the_claims_own_evidence_in_the_datasets_corpus(monkeypatch, embedder,
                                                                                      tmp_path):
    monkeypatch.setenv("DEBATECV_CACHE", str(tmp_path))
    passages = [{"id": f"c{i}", "text": t, "url": f"https://example.org/{i}"} for i, t in enumerate(TOPICS)]
    court = Court(ready=lambda r: "Yes")  # round 1's queries name the bananas and the river
    options = config.Courtroom(role_switch=False, top_k=1, seed_k=0, **NO_SAMPLING)
    lib = case.library_from(options, passages=passages)
    pred, said, _ = run(monkeypatch, court, lib, top_k=1, seed_k=0)
    assert pred["corpus"] == "dataset corpus"
    own = {e["answer"] for e in CLAIM["evidence"]}
    found = [q for q in pred["hearings"][0]["queries"] if q["admitted"]]
    assert [q["round"] for q in found] == [1, 1, 2, 2] and TOPICS[1] not in own
    assert TOPICS[1] in argument_prompts(said, "plaintiff", "first-1")[0]
    # Searching the claim's own evidence only (ours), P-RAG has nothing new to find.
    lib = case.library_from(config.Courtroom(claim_evidence_only=True), passages=passages)
    pred, _, _ = run(monkeypatch, Court(ready=lambda r: "Yes"), lib, top_k=1, seed_k=0)
    assert pred["corpus"] == "claim evidence" and pred["hearings"][0]["discovered"] == 0


def test_a_candidate_dropped_at_admissibility_can_be_rediscovered(monkeypatch, embedder):
    # The river passage is found in negotiation and dropped (0.09); the plaintiff's round-1 query names it.
    court = Court(premises=TOPICS[:2], search=TOPICS[0], ready=lambda r: "Yes",
                  scores=lambda prompt: (0.3, 0.3) if "Amazon" in prompt else (0.9, 0.9),
                  query=lambda side, r: TOPICS[2] if side == "plaintiff" else TOPICS[3])
    pred, said, _ = run(monkeypatch, court, library(embedder, TOPICS[:4]), top_k=1, seed_k=0)
    assert pred["negotiation"]["dropped"] == 0 and pred["negotiation"]["admitted"] == 2
    court.premises = TOPICS[:3]
    pred, said, _ = run(monkeypatch, court, library(embedder, TOPICS[:4]), top_k=1, seed_k=0)
    assert pred["negotiation"]["dropped"] == 1
    plaintiff_q = pred["hearings"][0]["queries"][0]
    # Novelty is against the admitted pool (tower, bananas), not the dropped candidate: the river is new.
    assert plaintiff_q["admitted"] == 1 and plaintiff_q["novelty"][0] > 0.5
    assert "Amazon" in argument_prompts(said, "plaintiff", "first-1")[0]


def test_role_switch_reruns_with_the_counsels_models_swapped(monkeypatch, embedder):
    court = Court(argument=lambda side, r, model: f"{side} argued by {model}", ready=lambda r: "Yes")
    models = {"plaintiff": "model-A", "defense": "model-B", "judge_1": "j1", "judge_2": "j2", "judge_3": "j3"}
    pred, said, calls = run(monkeypatch, court, library(embedder), models=models, role_switch=True)
    assert pred["role_switch"] == "rerun" and len(pred["hearings"]) == 2
    argued = {(t["round"], t["role"]): t["response"] for t in said if "Give your statement" in t["prompt"]}
    assert argued[("first-1", "plaintiff")] == "plaintiff argued by model-A"
    assert argued[("switched-1", "plaintiff")] == "plaintiff argued by model-B"
    assert argued[("switched-1", "defense")] == "defense argued by model-A"
    consistency = next(t["prompt"] for t in said if t["round"] == "role-switch")
    assert "plaintiff argued by model-A" in consistency and "plaintiff argued by model-B" in consistency
    assert pred["consistency"] == 8.0
    assert pred["confidence_parts"]["role_switch"] == pytest.approx(0.10)  # consistency 8 >= 7
    judge_prompt = prompts_of(said, "judge_1")[0]
    assert "Second hearing" in judge_prompt and "plaintiff argued by model-B" in judge_prompt


def test_judges_read_what_the_rerun_discovered_numbered_as_its_counsels_cited_it(monkeypatch, embedder):
    # The first hearing's queries find the bananas and the river; the rerun's find the wall and the penguins.
    asked = []

    def query(side, round_no):  # two rounds per hearing: the first asks for topics 1-4, the rerun 5-8
        asked.append(side)
        return TOPICS[len(asked)]

    court = Court(query=query, ready=lambda r: "Yes")
    models = {"plaintiff": "model-A", "defense": "model-B", "judge_1": "j1", "judge_2": "j2", "judge_3": "j3"}
    pred, said, _ = run(monkeypatch, court, library(embedder), models=models, role_switch=True, top_k=1, seed_k=0)
    assert pred["role_switch"] == "rerun" and len(asked) == 8
    rerun_plaintiff = argument_prompts(said, "plaintiff", "switched-1")[0]
    number = re.search(r"\[(\d+)\] The Great Wall", rerun_plaintiff).group(1)
    judge = prompts_of(said, "judge_1")[0]
    first, second = judge.split("Second hearing, roles swapped")
    assert "Great Wall" not in first and "Penguins" not in first  # the first hearing's pool did not hold them
    assert f"[{number}] The Great Wall" in second and "Penguins" in second
    assert "Bananas" in first


def test_role_switch_is_skipped_with_one_model_under_greedy_decoding_and_can_be_turned_off(monkeypatch, embedder):
    court = Court(ready=lambda r: "Yes")
    pred, said, _ = run(monkeypatch, court, library(embedder), models={"plaintiff": "M", "defense": "M"},
                         role_switch=True)
    assert pred["role_switch"].startswith("skipped") and len(pred["hearings"]) == 1
    assert not any(t["round"].startswith("switched") for t in said) and pred["consistency"] is None
    pred, _, _ = run(monkeypatch, Court(ready=lambda r: "Yes"), library(embedder), role_switch=False,
                     models={"plaintiff": "A", "defense": "B"})
    assert pred["role_switch"] == "off" and len(pred["hearings"]) == 1


def test_witness_is_requested_by_a_counsel_and_granted_or_denied_by_the_court(monkeypatch, embedder):
    def expert(side, r):
        asked = {("plaintiff", 1): "cardiologist", ("defense", 1): "astrologer"}.get((side, r))
        return js(**{"Expert Type": asked, "Reasoning": "to settle it"}) if asked else "None"

    court = Court(expert=expert, ruling=lambda e: "Granted" if e == "cardiologist" else "Denied, not needed",
                  ready=lambda r: "Yes" if r == 2 else "No")
    pred, said, _ = run(monkeypatch, court, library(embedder))
    rulings = [t["prompt"] for t in said if "asks to call an expert witness" in t["prompt"]]
    assert len(rulings) == 2 and "Plaintiff Counsel asks" in rulings[0] and "astrologer" in rulings[1]
    witness = [t for t in said if t["role"] == "witness"]
    assert [(t["round"], t["response"]) for t in witness] == [("first-1", "Expert testimony on cardiologist")]
    for side in ("plaintiff", "defense"):  # both counsels hear the testimony in the next round
        argument_prompt = next(p for p in prompts_of(said, side, "first-2") if "Give your statement" in p)
        assert "Expert testimony on cardiologist" in argument_prompt
    judge_prompt = prompts_of(said, "judge_1")[0]
    assert "Expert witness (cardiologist, round 1, called by the Plaintiff Counsel)" in judge_prompt
    assert "astrologer" not in judge_prompt.split("ADMITTED EVIDENCE")[1]
    pred, said, _ = run(monkeypatch, Court(expert=expert, ready=lambda r: "Yes"), library(embedder), witness=False)
    assert not any(t["role"] == "witness" or "expert witness" in t["prompt"] for t in said)


def test_panel_majority_verdict_and_confidence(monkeypatch, embedder):
    votes = {"j1": ("Supported", 6), "j2": ("Not Supported", 8), "j3": ("Supported", 4)}

    def judge(model):
        verdict, score = votes[model]
        return js(**{"Evidence Strength": score, "Argument Validity": score, "Scientific Reliability": score,
                     "Verdict": verdict, "Justification": f"{model}: {verdict}"})

    pred, said, calls = run(monkeypatch, Court(judge=judge, ready=lambda r: "Yes"), library(embedder))
    assert pred["votes"] == ["Supported", "Not Supported", "Supported"]
    assert (pred["label"], pred["panel_verdict"], pred["justification"]) == (SUPPORTED, "Supported", "j1: Supported")
    # 0.8 * 2/3 + 0.3 * 6/10 (mean of 6, 8, 4); no role switch, no readable reflection.
    assert pred["confidence"] == pytest.approx(0.8 * 2 / 3 + 0.18, abs=1e-4)
    assert [c.model for c in calls if any("six stages" in p for p in c.prompts)] == ["j1", "j2", "j3"]
    assert pred["decided_by"] == "majority"
    assert pred["panel"]["distinct_models"] == 3


def test_the_same_judge_model_three_times_votes_once_under_greedy_and_says_so(monkeypatch, embedder):
    models = {f"judge_{i}": "J" for i in (1, 2, 3)}
    pred, _, calls = run(monkeypatch, Court(ready=lambda r: "Yes"), library(embedder), models=models)
    assert [c.model for c in calls if any("six stages" in p for p in c.prompts)] == ["J"]
    assert pred["votes"] == ["Supported"] * 3 and pred["panel"]["distinct_models"] == 1
    assert "repeat one vote" in pred["panel"]["note"]
    # Sampling: each seat draws its own vote from its own stream.
    pred, _, calls = run(monkeypatch, Court(ready=lambda r: "Yes"), library(embedder), models=models,
                         judge_temperature=0.3)
    judge_calls = [c for c in calls if any("six stages" in p for p in c.prompts)]
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
    records = trial.run_batch(agents, [CLAIM, other], engine.Settings(),
                              config.Courtroom(role_switch=False, **NO_SAMPLING),
                              case.Library(embedder), max_rounds=10)
    evidence = {r["prediction"]["claim_id"]: [e["answer"] for e in r["prediction"]["evidence"]] for r in records}
    assert evidence == {7: [TOPICS[0]], 8: [TOPICS[1]]}  # each claim only ever sees its own items
    assert records[1]["prediction"]["evidence"][0]["question"] == "What is in bananas?"
    # Both claims went through every phase together: one batched call per turn type.
    assert all(len(c.prompts) == 2 for c in calls if c.model == "plaintiff")
    assert rules.vote([p["prediction"]["votes"][0] for p in records])[2] == SUPPORTED


def test_a_claim_with_no_evidence_and_no_corpus_still_goes_to_the_panel(monkeypatch, embedder):
    scripted.install(monkeypatch, Court(ready=lambda r: "Yes" if r == 2 else "No"))
    agents = scripted.agents(ROLES, {"judge_1": "j1", "judge_2": "j2", "judge_3": "j3"})
    record = trial.run_batch(agents, [dict(CLAIM, evidence=[])], engine.Settings(),
                             config.Courtroom(role_switch=False, **NO_SAMPLING),
                             case.Library(embedder), max_rounds=10)[0]
    pred = record["prediction"]
    assert pred["evidence"] == [] and pred["negotiation"] == {"admitted": 0, "disputed": 0, "dropped": 0, "unscored": 0}
    # Two rounds that admitted nothing have novelty 0 (the authors' orchestrator): novelty exhaustion, which
    # the paper checks before the court's signal.
    assert (pred["rounds"], pred["stop_reason"]) == (2, "novelty_exhausted")
    assert pred["hearings"][0]["novelty_means"] == [0.0, 0.0] and pred["label"] == SUPPORTED
    assert [r["novelty"] for r in pred["hearings"][0]["round_log"]] == [None, None]  # nothing was retrieved


def test_seed_retrieval_searches_with_the_claim_itself(monkeypatch, embedder):
    # Premises and stance queries point elsewhere: only the claim itself finds the tower passage.
    court = Court(premises=["Bananas are rich in potassium."], search="river water volume",
                  ready=lambda r: "Yes")
    scored = lambda said: " ".join(p for p in prompts_of(said, "court", "negotiation"))  # noqa: E731
    _, said, _ = run(monkeypatch, court, library(embedder), top_k=1, seed_k=1)
    assert "Eiffel Tower in Paris" in scored(said)
    _, said, _ = run(monkeypatch, court, library(embedder), top_k=1, seed_k=0)
    assert "Eiffel Tower in Paris" not in scored(said) and "potassium" in scored(said)


def test_negotiation_injection_shows_each_counsel_both_pools(monkeypatch, embedder):
    court = Court(premises=["Bananas are rich in potassium."],
                  ready=lambda r: "Yes")
    court.search = "placeholder"
    searches = {"plaintiff": "river water volume", "defense": "highest mountain"}
    base = court.__call__

    def reply(model, conv, prompt):
        if "Before the hearing each side searches" in prompt:
            side = "plaintiff" if "for the Plaintiff Counsel" in prompt else "defense"
            return js(Query=searches[side])
        return base(model, conv, prompt)

    pred, said, _ = run(monkeypatch, reply, library(embedder), top_k=1, seed_k=0)
    plaintiff = next(p for p in prompts_of(said, "plaintiff", "negotiation") if "discovery pools" in p)
    own, other = plaintiff.split("Your pool:")[1].split("The other side's pool:")
    assert "Amazon" in own and "Everest" in other and "potassium" in plaintiff.split("Your pool:")[0]
    assert pred["disclosures"] == {"plaintiff": {"Disclose": [1], "Challenge": [2]},
                                   "defense": {"Disclose": [1], "Challenge": [2]}}


def test_the_rerun_is_the_full_debate_under_the_primarys_cap_and_rules(monkeypatch, embedder):
    models = {"plaintiff": "A", "defense": "B", "judge_1": "j1", "judge_2": "j2", "judge_3": "j3"}
    big = library(embedder, TOPICS + [f"Fact number {i}." for i in range(30)])
    # No rule fires: the rerun goes on past round 2, to the primary's cap.
    pred, said, _ = run(monkeypatch, Court(), big, models=models, role_switch=True, max_rounds=4, novelty_stop=0.0)
    assert [h["rounds"] for h in pred["hearings"]] == [4, 4]
    assert [h["stop_reason"] for h in pred["hearings"]] == ["max_rounds", "max_rounds"]
    assert "switched-3" in {t["round"] for t in said} and (pred["rounds_switched"], pred["total_rounds"]) == (4, 8)
    # The primary's rules end the rerun too: the critic resolves the case in round 3 of each hearing.
    pred, _, _ = run(monkeypatch, Court(resolved=lambda r: "Yes" if r == 3 else "No"), big, models=models,
                     role_switch=True, max_rounds=10, novelty_stop=0.0)
    assert [(h["rounds"], h["stop_reason"]) for h in pred["hearings"]] == [(3, "critic_resolved")] * 2
    # Its P-RAG state is reset: the iteration counter starts again at 1, the criterion's cap is 10.
    assert [q["round"] for q in pred["hearings"][1]["queries"]][:2] == [1, 1]
    # --switch-rounds is the ablation: the rerun capped lower.
    for cap in (2, 1):
        pred, _, _ = run(monkeypatch, Court(), big, models=models, role_switch=True, max_rounds=4,
                         novelty_stop=0.0, switch_rounds=cap)
        assert [h["rounds"] for h in pred["hearings"]] == [4, cap]
        assert "max_iterations" not in pred["hearings"][1]["prag_criteria"]


def test_the_prag_iteration_criterion_holds_at_round_ten_whatever_the_hearings_cap(monkeypatch, embedder):
    court = Court(query=lambda side, r: TOPICS[(2 * r + (side == "defense")) % len(TOPICS)] + f" {r}")
    big = library(embedder, TOPICS + [f"Fact number {i}." for i in range(30)])
    pred, _, _ = run(monkeypatch, court, big, novelty_stop=0.0, relevance_gain=float("-inf"))
    criteria = pred["hearings"][0]["prag_criteria"]
    assert len(criteria) == 10 and criteria[-1] == "max_iterations" and "max_iterations" not in criteria[:9]
    pred, _, _ = run(monkeypatch, court, big, max_rounds=4, novelty_stop=0.0, relevance_gain=float("-inf"))
    assert "max_iterations" not in pred["hearings"][0]["prag_criteria"]  # a 4-round hearing never reaches it


def test_delta_ref_reads_the_reruns_last_reflection(monkeypatch, embedder):
    # Model A reflects 0.7 of itself, model B 0.38; constant totals plateau at round 2 in each hearing.
    totals = {"A": js(Logic=1.0, Novelty=0.5, Rebuttal=0.5, **{"Discovery Need": "x"}),
              "B": js(Logic=0.2, Novelty=0.5, Rebuttal=0.5, **{"Discovery Need": "x"})}
    court = Court()

    def reply(model, conv, prompt):
        return totals[model] if "Audit your own performance" in prompt else court(model, conv, prompt)

    models = {"plaintiff": "A", "defense": "B", "judge_1": "j1", "judge_2": "j2", "judge_3": "j3"}
    pred, _, _ = run(monkeypatch, reply, library(embedder), models=models, role_switch=True)
    assert [h["rounds"] for h in pred["hearings"]] == [2, 2]
    # Supported: the plaintiff's side. In the rerun model B argues it, so delta_ref = (0.38 - 0.5) x 0.6,
    # where the primary's plaintiff (model A) would have given +0.12.
    assert pred["confidence_parts"]["reflection"] == pytest.approx((0.38 - 0.5) * 0.6, abs=1e-4)
    # Without the rerun, the primary hearing is the last one held.
    pred, _, _ = run(monkeypatch, reply, library(embedder), models=models, role_switch=False)
    assert pred["confidence_parts"]["reflection"] == pytest.approx((0.7 - 0.5) * 0.6, abs=1e-4)


def test_one_counsel_model_reruns_the_role_switch_when_counsels_sample(monkeypatch, embedder):
    pred, said, _ = run(monkeypatch, Court(ready=lambda r: "Yes"), library(embedder),
                        models={"plaintiff": "M", "defense": "M"}, role_switch=True,
                        counsel_temperature=0.5)
    assert pred["role_switch"] == "rerun" and len(pred["hearings"]) == 2


def test_prag_records_redundancy_and_retrieves_again_next_round(monkeypatch, embedder):
    # Both counsels ask for the admitted exhibit: round 1's first call finds it novel (the primary's novelty
    # pool starts empty), and from then on every retrieved passage is a duplicate.
    court = Court(query=lambda side, r: TOPICS[0])
    pred, said, _ = run(monkeypatch, court, library(embedder, TOPICS[:3]), top_k=1, seed_k=1)
    hearing = pred["hearings"][0]
    assert hearing["prag_criteria"] == [None, "redundancy", "redundancy"]
    assert [q["round"] for q in hearing["queries"]] == [1, 1, 2, 2, 3, 3]  # recorded, not obeyed
    assert [p for p in prompts_of(said, "plaintiff", "first-3") if "critical gap in the exhibits" in p]
    # Nothing was accepted in rounds 2 and 3: novelty exhaustion, the debate's rule, ends the hearing.
    assert (pred["rounds"], pred["stop_reason"]) == (3, "novelty_exhausted")
    first, second = hearing["round_log"][:2]
    assert first["admitted"] == ["p0"] and first["novelty_admitted"] == 1.0 and hearing["discovered"] == 0
    assert second["admitted"] == [] and second["novelty_admitted"] == 0.0 and second["novelty"] < 0.15
    assert second["queries"][0]["ids"] == ["p0"] and second["queries"][0]["admitted_ids"] == []


def test_prag_admits_new_passages_in_round_three_and_later(monkeypatch, embedder):
    # Each round's queries name two new passages exactly (cosine 1.0 every round): the relevance gain is 0
    # from round 2 on, which Appendix I names as a stopping criterion; discovery goes on all the same.
    pred, said, _ = run(monkeypatch, Court(ready=lambda r: "Yes" if r == 4 else "No"), library(embedder), top_k=1,
                        seed_k=0)
    hearing = pred["hearings"][0]
    assert (pred["rounds"], pred["stop_reason"]) == (4, "court_ready")
    assert hearing["prag_criteria"] == [None, "relevance_gain", "relevance_gain", "relevance_gain"]
    log = hearing["round_log"]
    assert [r["admitted"] for r in log] == [[f"p{2 * r - 1}", f"p{2 * r}"] for r in (1, 2, 3, 4)]
    start = log[0]["pool_size"] - 2
    assert [r["pool_size"] for r in log] == [start + 2 * r for r in (1, 2, 3, 4)]
    assert all(r["novelty"] >= 0.2 and r["novelty_admitted"] >= 0.2 for r in log)
    assert hearing["discovered"] == 8 and hearing["pool_size"] == start + 8
    assert TOPICS[7] in argument_prompts(said, "plaintiff", "first-4")[0]  # found in round 4, argued from


def test_the_round_log_carries_what_the_measures_read(monkeypatch, embedder):
    court = Court(reflection=lambda side, r: js(Logic={1: 0.5, 2: 0.83}[r], Novelty=0.41, Rebuttal=0.5,
                                                **{"Discovery Need": "x"}),
                  resolved=lambda r: "Yes" if r == 2 else "No")
    models = {"plaintiff": "A", "defense": "B", "judge_1": "j1", "judge_2": "j2", "judge_3": "j3"}
    pred, _, _ = run(monkeypatch, court, library(embedder), models=models, role_switch=True, top_k=1, seed_k=0)
    assert (pred["rounds"], pred["rounds_switched"], pred["total_rounds"]) == (2, 2, 4)
    assert (pred["stop_reason"], pred["stop_reason_switched"]) == ("critic_resolved", "critic_resolved")
    assert [h["phase"] for h in pred["hearings"]] == ["primary", "switched"]
    second = pred["hearings"][0]["round_log"][1]
    # Two decimals survive: 0.4 x 0.83 + 0.3 x 0.41 + 0.3 x 0.5 = 0.605 per side, S = 1.21.
    assert second["reflection"]["plaintiff"] == pytest.approx({"logic": 0.83, "novelty": 0.41, "rebuttal": 0.5,
                                                               "total": 0.605})
    assert second["reflection_total"] == pytest.approx(1.21)
    assert second["critic"] == {"plaintiff": {"logic": 0.5, "evidence": 0.5, "rebuttal": 0.5},
                                "defense": {"logic": 0.5, "evidence": 0.5, "rebuttal": 0.5}, "resolved": True}
    assert second["court"] == "wait" and second["stop"] == "critic_resolved"
    assert pred["hearings"][0]["round_log"][0]["court"] is None  # not asked in round 1
    assert json.loads(json.dumps(pred))["hearings"][1]["round_log"][0]["queries"][0]["side"] == "plaintiff"


def test_judges_read_the_critic_the_prag_record_and_the_reflections(monkeypatch, embedder):
    court = Court(critic=lambda side, r: {"Logic": 0.7 if side == "plaintiff" else 0.2, "Evidence": 0.6,
                                          "Rebuttal": 0.4, "Reasoning": "-"},
                  reflection=lambda side, r: js(Logic=1.0, Novelty=0.5, Rebuttal=0.0, **{"Discovery Need": "x"}),
                  ready=lambda r: "Yes")
    pred, said, _ = run(monkeypatch, court, library(embedder), top_k=1)
    case_file = prompts_of(said, "judge_1")[0]
    critic = case_file.split("CRITIC'S EVALUATIONS")[1]
    assert "Plaintiff logic 0.70, evidence 0.60, rebuttal 0.40; Defense logic 0.20" in critic
    assert "unresolved: premise one" in critic
    prag = case_file.split("EVIDENCE DISCOVERY METRICS")[1]
    assert f'Round 1, Plaintiff Counsel: query "{TOPICS[1]}"; 1 of 1 passages admitted' in prag
    assert "logic 1.00, novelty 0.50, rebuttal 0.00, total 0.55" in case_file.split("SELF-REFLECTION TRENDS")[1]
    assert "(no role switch: off)" in case_file


def test_each_role_samples_at_its_own_temperature(monkeypatch, embedder):
    court = Court(expert=lambda side, r: js(**{"Expert Type": "geologist", "Reasoning": "-"}) if side == "plaintiff"
                  else "None", ready=lambda r: "Yes")
    seen = []
    calls = scripted.install(monkeypatch, court)
    fake = engine.generate

    def logged(model, tokenizer, convs, prompts, settings, generator=None, **kwargs):
        seen.append((model, settings.temperature, generator is not None))
        return fake(model, tokenizer, convs, prompts, settings, generator, **kwargs)

    monkeypatch.setattr(engine, "generate", logged)
    agents = scripted.agents(ROLES, {"plaintiff": "A", "defense": "B", "judge_1": "j1", "judge_2": "j2",
                                     "judge_3": "j3"})
    trial.run_batch(agents, [CLAIM], engine.Settings(), config.Courtroom(**SWITCH), library(embedder), max_rounds=10,
                    streams=turns.Streams("cpu"))
    temperatures = {}
    for model, temperature, sampled in seen:
        temperatures.setdefault(model, set()).add(temperature)
        assert sampled
    assert temperatures == {"A": {0.5}, "B": {0.5}, "court": {0.2}, "critic": {0.3}, "witness": {0.5},
                            "j1": {0.3}, "j2": {0.3}, "j3": {0.3}}
    assert calls
    # Heterogeneous agents: every role its own model and temperature (one judge greedy, so two of the
    # three share nothing with it).
    seen.clear()
    options = config.Courtroom(plaintiff_temperature=0.6, defense_temperature=0.7, judge_temperatures=(0.0, 0.2, 0.4),
                               court_temperature=0.1, critic_temperature=0.25, witness_temperature=0.9, **SWITCH)
    trial.run_batch(agents, [CLAIM], engine.Settings(), options, library(embedder), max_rounds=10,
                    streams=turns.Streams("cpu"))
    temperatures = {}
    for model, temperature, _ in seen:
        temperatures.setdefault(model, set()).add(temperature)
    assert temperatures == {"A": {0.6}, "B": {0.7}, "court": {0.1}, "critic": {0.25}, "witness": {0.9},
                            "j1": {0.0}, "j2": {0.2}, "j3": {0.4}}


def test_a_three_way_split_goes_to_the_chief_justice(monkeypatch, embedder):
    votes = {"j1": "Not Supported", "j2": "Supported", "j3": "Inconclusive"}

    def judge(model):
        return js(**{"Evidence Strength": 6, "Argument Validity": 6, "Scientific Reliability": 6,
                     "Verdict": votes[model], "Justification": f"{model}: {votes[model]}"})

    pred, _, _ = run(monkeypatch, Court(judge=judge, ready=lambda r: "Yes"), library(embedder))
    assert (pred["label"], pred["decided_by"]) == ("Refuted", "chief_justice")
    assert pred["justification"] == "j1: Not Supported"
    pred, _, _ = run(monkeypatch, Court(judge=judge, ready=lambda r: "Yes"), library(embedder), chief_justice=3)
    assert (pred["label"], pred["panel_verdict"]) == ("Not Enough Evidence", "Inconclusive")
    pred, _, _ = run(monkeypatch, Court(judge=judge, ready=lambda r: "Yes"), library(embedder), chief_justice=3,
                     inconclusive="supported")
    assert pred["label"] == SUPPORTED
    pred, _, _ = run(monkeypatch, Court(judge=judge, ready=lambda r: "Yes"), library(embedder),
                     split_decision="conflicting")
    assert (pred["label"], pred["decided_by"]) == ("Conflicting Evidence/Cherrypicking", "rule")


def test_courtroom_flags_default_to_the_paper_and_temperature_sets_every_role():
    from debate.pipeline import cli

    opts = cli.parse_run_args(["--method", "courtroom", "--model", "m"]).courtroom
    assert opts.temperatures == {"counsel": 0.5, "court": 0.2, "judge": 0.3, "witness": 0.5, "critic": 0.3}
    # The rerun is the full debate under the primary's cap (10; 3 without P-RAG).
    assert (opts.switch_rounds, opts.seed_k, opts.redundancy_limit, opts.relevance_gain, opts.confidence_floor) == \
        (10, 5, 0.70, 0.05, 0.10)
    assert cli.parse_run_args(["--method", "courtroom", "--model", "m", "--no-prag"]).courtroom.switch_rounds == 3
    assert (opts.split_decision, opts.chief_justice, opts.inconclusive) == ("chief-justice", 1, "nee")
    greedy = cli.parse_run_args(["--method", "courtroom", "--model", "m", "--temperature", "0",
                                 "--judge-temperature", "0.7"]).courtroom
    assert greedy.temperatures == {"counsel": 0.0, "court": 0.0, "judge": 0.7, "witness": 0.0, "critic": 0.0}
    assert (opts.prag, opts.reflection, opts.role_switch, opts.single_judge, opts.claim_evidence_only) == \
        (True, True, True, False, False)


def test_ablation_and_heterogeneity_flags_build_their_config():
    from debate.pipeline import cli

    def build(*flags):
        return cli.parse_run_args(["--method", "courtroom", "--model", "m", *flags])

    a3 = build("--no-prag")
    assert (a3.courtroom.prag, a3.generation.max_rounds) == (False, 3)  # Table 6: A3 runs 3 rounds
    assert build("--no-prag", "--max-rounds", "5").generation.max_rounds == 5
    assert build().generation.max_rounds == 10
    a2 = build("--judge-models", "x", "y", "z", "--single-judge")
    assert a2.models.judge_models == ("x",) and a2.courtroom.single_judge
    every = build("--debater-model", "P", "--defense-model", "D", "--court-model", "C", "--critic-model", "K",
                  "--witness-model", "W", "--judge-models", "J1", "J2", "J3", "--plaintiff-temperature", "0.6",
                  "--judge-temperatures", "0.1", "0.2")
    roles, _ = method_table.role_models(every, method_table.model_roles(every))
    assert roles == {"plaintiff": "P", "defense": "D", "court": "C", "critic": "K", "witness": "W",
                     "judge_1": "J1", "judge_2": "J2", "judge_3": "J3"}
    opts = every.courtroom
    assert [opts.temperature_of(r) for r in ("plaintiff", "defense", "judge_1", "judge_2", "judge_3")] == \
        [0.6, 0.5, 0.1, 0.2, 0.3]
    defaults, _ = method_table.role_models(build(), method_table.model_roles(build()))
    assert set(defaults.values()) == {"m"}  # one path: models.load_roles loads it once for every role


@pytest.mark.parametrize("flags, message", [
    (["--switch-rounds", "0"], "--switch-rounds must be at least 1"),
    (["--redundancy-limit", "1.5"], "--redundancy-limit and --confidence-floor must be in"),
    (["--chief-justice", "4"], "--chief-justice must name one of the judge seats"),
    (["--judge-models", "a", "b", "--chief-justice", "3"], "--chief-justice must name one of the judge seats"),
    (["--court-temperature", "-1"], "--court-temperature must be >= 0"),
    (["--judge-temperatures", "0.1", "0.2", "0.3", "0.4"], "one temperature per judge seat (3), got 4"),
    (["--single-judge", "--judge-temperatures", "0.1", "0.2"], "one temperature per judge seat (1), got 2"),
    (["--defense-temperature", "-0.1"], "--defense-temperature must be >= 0"),
])
def test_bad_courtroom_flags_are_refused(flags, message, capsys):
    from debate.pipeline import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.parse_run_args(["--method", "courtroom", "--model", "m", *flags])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


# --- the ablations of Tables 5-6 -------------------------------------------------------------------

TABLE_6 = {  # the paper's component matrix, one column per run (adaptive convergence: on / partial / off)
    "full": {},
    "A1": {"role_switch": False},
    "A2": {"three_judge_panel": False},
    "A3": {"prag": False, "reflection_to_prag": False, "adaptive_convergence": "off"},
    "A4": {"self_reflection": False, "reflection_to_prag": False, "adaptive_convergence": "partial",
           "reflection_confidence": False},
}
ABLATION_OPTIONS = {"full": {}, "A1": {"role_switch": False}, "A2": {"single_judge": True}, "A3": {"prag": False},
                    "A4": {"reflection": False}}


@pytest.mark.parametrize("column", sorted(TABLE_6))
def test_each_ablation_switches_off_exactly_its_table_6_column(monkeypatch, embedder, column):
    # Constant reflections plateau in round 2; the critic resolves in round 3; the court never closes.
    court = Court(reflection=lambda side, r: js(Logic=1.0, Novelty=0.5, Rebuttal=0.0, **{"Discovery Need": "more"}),
                  resolved=lambda r: "Yes" if r == 3 else "No",
                  expert=lambda side, r: js(**{"Expert Type": "geologist", "Reasoning": "-"}) if side == "plaintiff"
                  else "None")
    scripted.install(monkeypatch, court)
    options = ABLATION_OPTIONS[column]
    judges = 1 if options.get("single_judge") else 3
    agents = scripted.agents(trial.model_of(judges), {"plaintiff": "A", "defense": "B", "judge_1": "j1",
                                                      "judge_2": "j2", "judge_3": "j3"})
    # The rerun's cap as the flags make it (the primary's: 3 under A3, as the authors ran it; else 10).
    switch_rounds = config.build(method="courtroom", model="m", **options).courtroom.switch_rounds
    opts = config.Courtroom(**{**NO_SAMPLING, "role_switch": True, "top_k": 1, "seed_k": 0,
                               "relevance_gain": float("-inf"), "switch_rounds": switch_rounds, **options})
    record = trial.run_batch(agents, [CLAIM], engine.Settings(), opts, library(embedder), max_rounds=4)[0]
    pred, said = record["prediction"], record["transcript"]["turns"]

    def prompts(role):
        return [t["prompt"] for t in said if t["role"] == role]

    observed = {
        "evidence_negotiation": any("Weigh the scientific relevance" in p for p in prompts("court")),
        "prag": any("critical gap in the exhibits" in p for p in prompts("plaintiff")),
        "expert_witness": any("call an expert witness" in p for p in prompts("plaintiff")),
        "self_reflection": any("Audit your own performance" in p for p in prompts("plaintiff")),
        "reflection_to_prag": any("Focus also on: more" in p for p in prompts("court")),
        "critic": any("Score each side" in p for p in prompts("critic")),
        "adaptive_convergence": {"reflection_plateau": "on", "critic_resolved": "partial",
                                 "max_rounds": "off"}[pred["stop_reason"]],
        "role_switch": any(t["round"].startswith("switched") for t in said),
        "three_judge_panel": len(pred["votes"]) == 3,
        "reflection_confidence": pred["confidence_parts"]["reflection"] != 0,
    }
    expected = {k: True for k in observed} | {"adaptive_convergence": "on"} | TABLE_6[column]
    assert observed == expected == pred["components"]
    # Table 5 counts both hearings' rounds: primary (plateau at 2, critic at 3, the cap of 4) + switched.
    primary = {"on": 2, "partial": 3, "off": 4}[expected["adaptive_convergence"]]
    switched = {"A1": 0, "A3": 3}.get(column, primary)  # the full rerun stops where the primary did
    assert (pred["rounds"], pred["rounds_switched"], pred["total_rounds"]) == (primary, switched, primary + switched)
    assert pred["retrieved"] > 0 and pred["evidence_pool"] >= 1


# --- cost (Appendix P) and the dataset's labels -------------------------------------------------------

def test_tokens_are_counted_per_role_and_stage_and_add_up_to_the_claims_total(monkeypatch, embedder):
    models = {"plaintiff": "A", "defense": "B", "judge_1": "j1", "judge_2": "j2", "judge_3": "j3"}
    pred, said, _ = run(monkeypatch, Court(ready=lambda r: "Yes"), library(embedder), models=models, role_switch=True)
    tokens = pred["tokens"]
    # The scripted engine bills 10 tokens in and 5 out per turn.
    assert (tokens["in"], tokens["out"]) == (10 * len(said), 5 * len(said)) == (pred["prompt_tokens"],
                                                                               pred["completion_tokens"])
    by_stage = {stage: spent["in"] // 10 for stage, spent in tokens["by_stage"].items()}
    assert by_stage == {"premises": 1, "negotiation": sum(t["round"] == "negotiation" for t in said),
                        "primary_debate": sum(t["round"].startswith("first-") for t in said),
                        "role_switch_debate": sum(t["round"].startswith("switched-") for t in said),
                        "consistency": 1, "panel": 3}
    assert {role: spent["out"] // 5 for role, spent in tokens["by_role"].items()} == \
        {role: sum(t["role"] == role for t in said) for role in {t["role"] for t in said}}


BINARY = LabelSet(name="binary", labels=("SUPPORT", "REFUTE"), definitions=("backed", "contradicted"),
                  supported="SUPPORT", refuted="REFUTE")
THREE = LabelSet(name="three", labels=("SUPPORT", "REFUTE", "NEI"), definitions=("backed", "contradicted", "unsure"),
                 supported="SUPPORT", refuted="REFUTE", nei="NEI")


@pytest.mark.parametrize("labels, inconclusive, expected", [
    (BINARY, "nee", "SUPPORT"),  # no not-enough-information label: the paper's burden of refutation
    (THREE, "nee", "NEI"),
    (THREE, "supported", "SUPPORT"),  # the paper's rule asked for on a dataset that has one
])
def test_the_panel_maps_onto_the_datasets_labels_and_no_averitec_label_appears(monkeypatch, embedder, labels,
                                                                               inconclusive, expected):
    scripted.install(monkeypatch, Court(ready=lambda r: "Yes", judge=lambda model: js(**{
        "Evidence Strength": 5, "Argument Validity": 5, "Scientific Reliability": 5, "Verdict": "Inconclusive",
        "Justification": "-"})))
    agents = scripted.agents(ROLES, {"judge_1": "j1", "judge_2": "j2", "judge_3": "j3"})
    opts = config.Courtroom(role_switch=False, inconclusive=inconclusive, **NO_SAMPLING)
    record = trial.run_batch(agents, [dict(CLAIM, label=expected)], engine.Settings(), opts, library(embedder),
                             max_rounds=1, labels=labels)[0]
    assert record["prediction"]["label"] == expected
    assert record["prediction"]["judge_labels"] == [labels.nei or "Inconclusive"] * 3
    text = json.dumps(record)
    assert not [label for label in ("Refuted", "Not Enough Evidence", "Conflicting Evidence") if label in text]


def test_standard_mad_is_two_counsels_three_fixed_rounds_and_one_judge(monkeypatch, embedder):
    court = Court(ready=lambda r: "Yes")
    calls = scripted.install(monkeypatch, lambda model, conv, prompt: js(**{
        "Evidence Strength": 6, "Argument Validity": 6, "Scientific Reliability": 6, "Verdict": "Not Supported",
        "Justification": "judged"}) if "five stages" in prompt else court(model, conv, prompt))
    agents = scripted.agents(proclaim_baselines.STANDARD_MAD_MODELS, {"judge_1": "j1"})
    opts = config.Courtroom(seed_k=2, **NO_SAMPLING)
    record = proclaim_baselines.standard_mad(agents, [CLAIM], engine.Settings(), options=opts,
                                             library=library(embedder), max_rounds=3)[0]
    pred, said = record["prediction"], record["transcript"]["turns"]
    assert [(t["round"], t["role"]) for t in said] == [(f"debate-{r}", s) for r in (1, 2, 3)
                                                        for s in ("plaintiff", "defense")] + [("panel", "judge_1")]
    assert (pred["label"], pred["votes"], pred["retrieved"], pred["evidence_pool"]) == ("Refuted", ["Not Supported"],
                                                                                         2, 2)
    assert pred["confidence"] == pytest.approx(0.8 + 0.3 * 0.6)  # one vote of one: the paper's single-judge formula
    assert "Eiffel" in said[0]["prompt"] and "plaintiff argues round 3" in said[-1]["prompt"]
    assert set(pred["tokens"]["by_stage"]) == {"debate", "panel"} and len(calls) == 7


def test_single_call_mines_premises_pools_their_retrieval_and_asks_once(monkeypatch, embedder):
    court = Court(premises=[TOPICS[1], TOPICS[2]])
    scripted.install(monkeypatch, lambda model, conv, prompt: js(**{
        "Justification for Verdict": "from the pool", "Verdict": "Supported"}) if model == "verifier"
        else court(model, conv, prompt))
    agents = scripted.agents(proclaim_baselines.SINGLE_CALL_MODELS)
    opts = config.Courtroom(seed_k=1, top_k=1, **NO_SAMPLING)
    record = proclaim_baselines.single_call(agents, [CLAIM], engine.Settings(), options=opts,
                                            library=library(embedder))[0]
    pred, said = record["prediction"], record["transcript"]["turns"]
    assert [t["role"] for t in said] == ["critic", "verifier"] and pred["label"] == SUPPORTED
    assert [e["answer"] for e in pred["evidence"]] == TOPICS[:3] and pred["retrieval_calls"] == 3
    assert all(t in said[1]["prompt"] for t in TOPICS[:3])
    assert (pred["prompt_tokens"], pred["tokens"]["in"]) == (20, 20)
