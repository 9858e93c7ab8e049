"""PROClaim (Chowdhury et al. 2026): a courtroom debate with progressive retrieval, batched over claims.

1. Premises: the presiding judge (court) breaks the claim into atomic premises.
2. Evidence negotiation: shared retrieval per premise plus one stance-conditioned query per counsel
   (top-k each); the court rates every candidate's relevance and credibility; weight = product,
   admitted / disputed / dropped by the two thresholds (panel.admissibility).
3. A hearing, round by round until a stopping rule holds (panel.stop_reason) or the round cap:
   - discovery (P-RAG): each counsel names its evidential gap; a query drafted from the last four
     messages, the gap and the counsel's last reflected discovery need is refined by the court; its
     top-k passages enter the pool when novel enough (novelty = 1 - max cosine to the pool);
   - arguments: the plaintiff counsel (the claim is true), then the defense counsel;
   - an expert witness answers a counsel's "Witness:" question (unless --no-witness);
   - self-reflection: each counsel scores its logic, novelty and rebuttal and names a discovery need;
   - the critic scores the round and says whether the case is resolved; the court says whether it
     is ready for deliberation.
4. Role switch: the counsels' models swap sides and the hearing is held again from the negotiated
   evidence; the court scores the consistency of the two hearings. With one model for both counsels
   and greedy decoding the rerun would repeat the first hearing token for token, so it is skipped
   and the output says so.
5. A panel of judges (one per --judge-models path) votes Supported / Not Supported / Inconclusive;
   panel.vote maps the vote onto the AVeriTeC labels and panel.confidence gives the confidence. Under
   greedy decoding, seats held by the same model vote alike, so each distinct model is asked once.
"""
import re
from dataclasses import dataclass, field

from debate import engine, panel, retrieval, turns
from debate.parsing import number_in, read_fields, yes_no
from debate.prompts import load_prompt, render

SIDES = ("plaintiff", "defense")
SIDE_NAMES = {"plaintiff": "Plaintiff Counsel", "defense": "Defense Counsel"}
WITNESS = re.compile(r"^\W*witness\W*:\s*(.+)$", re.IGNORECASE | re.MULTILINE)
SHOWN = ("admitted", "discovered", "disputed", "unscored")  # pool statuses the counsels and the panel see
POOL_ORDER = {s: k for k, s in enumerate(("admitted", "disputed", "unscored", "dropped"))}
SCHEMAS = ("court_premises", "counsel_search", "court_admissibility", "counsel_gap", "court_query",
           "counsel_reflection", "critic_round", "court_ready", "court_consistency", "judge_case")


def model_of(n_judges):
    """Role -> model flag; judge seat i runs on the i-th --judge-models path."""
    roles = {"plaintiff": "debater", "defense": "defense", "court": "moderator", "critic": "moderator",
             "witness": "debater"}
    roles.update({f"judge_{i + 1}": f"judge_{i + 1}" for i in range(n_judges)})
    return roles


@dataclass
class Options:
    """Every number of the method; the defaults are the paper's."""
    max_rounds: int = 10
    top_k: int = 3
    novelty_threshold: float = 0.20
    novelty_stop: float = 0.10
    plateau_delta: float = 0.05
    admit_threshold: float = 0.5
    dispute_threshold: float = 0.1
    reflection_weights: tuple = (0.4, 0.3, 0.3)
    vote_weight: float = 0.8
    quality_weight: float = 0.3
    role_switch: bool = True
    witness: bool = True
    max_premises: int = 5


def options_from(args):
    return Options(max_rounds=args.max_rounds, top_k=args.top_k, novelty_threshold=args.novelty_threshold,
                   novelty_stop=args.novelty_stop, plateau_delta=args.plateau_delta,
                   admit_threshold=args.admit_threshold, dispute_threshold=args.dispute_threshold,
                   reflection_weights=tuple(args.reflection_weights), vote_weight=args.vote_weight,
                   quality_weight=args.quality_weight, role_switch=args.role_switch, witness=args.witness)


@dataclass
class Library:
    """What the courtroom retrieves with: the encoder and, with --corpus, the shared corpus index."""
    embedder: object
    corpus: object = None  # retrieval.Index, or None: each claim searches its own evidence


def library_from(args, log=print):
    embedder = retrieval.load_embedder(args.embedder)
    corpus = retrieval.corpus_index(args.corpus, embedder, log) if args.corpus else None
    return Library(embedder, corpus)


@dataclass
class Hearing:
    counsels: dict  # side -> the RoleModel that argues it
    convs: dict  # plaintiff, defense, critic, court -> engine.Conversation
    pool: list  # evidence entries {"passage", "status", "weight", "round"}
    vectors: object  # embeddings of the pool's passages, in pool order
    seen: dict  # side -> how many pool entries that counsel has been shown
    messages: list = field(default_factory=list)  # (speaker, text) in order, for the discovery queries
    rounds: list = field(default_factory=list)  # per round {"round", "plaintiff", "defense", "testimony"}
    totals: list = field(default_factory=list)  # reflection total per round (mean of both counsels)
    reflections: dict = field(default_factory=dict)  # side -> its last reflection
    novelty_means: list = field(default_factory=list)
    queries: list = field(default_factory=list)
    stop_reason: str = ""


@dataclass
class Case:
    claim: dict
    index: object  # retrieval.Index searched for this claim
    convs: list = field(default_factory=list)  # every conversation, for the token counts
    said: list = field(default_factory=list)  # transcript turns
    premises: list = field(default_factory=list)
    stance_queries: dict = field(default_factory=dict)  # side -> its negotiation query
    pool: list = field(default_factory=list)  # negotiated evidence
    vectors: object = None
    hearings: list = field(default_factory=list)
    consistency: float = None  # 0-10


def _fields(reply, keys):
    return read_fields(reply, keys)[0]


def _text(value):
    return value.strip() if isinstance(value, str) else ""


def _ask(agent, items, settings, generator, one_shot=True, schema_name=None):
    """One batched turn over (case, stage, role, conversation, prompt) items; returns the replies.

    A one-shot conversation (a single question) gives its cache back at once; a hearing's conversations
    keep theirs for their next turn. `schema_name`: the prompt whose JSON answer is asked for.
    """
    replies = turns.speak(agent, [i[3] for i in items], [i[4] for i in items], settings, generator, schema_name)
    for (case, stage, role, conv, prompt), reply in zip(items, replies):
        case.said.append({"round": stage, "role": role, "prompt": prompt, "response": reply,
                          **turns.structured_note(conv)})
        if not any(c is conv for c in case.convs):  # identity: two conversations may hold equal text
            case.convs.append(conv)
        if one_shot:
            conv.drop_cache()
    return replies


def _passage_text(entry, index):
    p = entry["passage"]
    status = "" if entry["status"] in ("admitted", "discovered") else f" (evidence {entry['status']})"
    return render("courtroom_passage", index=index, text=p["text"], url=p.get("url") or "(no source given)",
                  status=status)


def format_pool(pool, start=0):
    """The counsels' view of pool entries from position `start` on, numbered by pool position."""
    shown = [(i, e) for i, e in enumerate(pool) if i >= start and e["status"] in SHOWN]
    return "\n".join(_passage_text(e, i + 1) for i, e in shown) or "(none)"


def _court(case):
    return engine.Conversation(system=render("court_meta", claim=case.claim["claim"]))


def _premises(agents, cases, opts, settings, generator):
    items = [(c, "premises", "court", _court(c), load_prompt("court_premises")) for c in cases]
    for case, reply in zip(cases, _ask(agents["court"], items, settings, generator, schema_name="court_premises")):
        value = _fields(reply, ("Premises",)).get("Premises")
        lines = value if isinstance(value, list) else _text(value).splitlines()
        premises = [re.sub(r"^\W*\d*[.)]?\s*", "", str(p)).strip() for p in lines]
        case.premises = [p for p in premises if p][:opts.max_premises] or [case.claim["claim"]]


def _counsel_system(case, side):
    return render("counsel_meta", side=SIDE_NAMES[side], stance=load_prompt(f"counsel_stance_{side}"),
                  claim=case.claim["claim"], premises="; ".join(case.premises), evidence=format_pool(case.pool))


def _stance_queries(agents, cases, settings, generator):
    """Each counsel's search query for its own side of each case (the claim itself when unreadable)."""
    for side in SIDES:
        items = [(c, "negotiation", side, engine.Conversation(system=_counsel_system(c, side)),
                  load_prompt("counsel_search")) for c in cases]
        for case, reply in zip(cases, _ask(agents[side], items, settings, generator, schema_name="counsel_search")):
            case.stance_queries[side] = _text(_fields(reply, ("Query",)).get("Query")) or case.claim["claim"]


def negotiation_queries(agents, claims, settings, options=None, streams=None):
    """The queries the courtroom's evidence negotiation retrieves with, per claim:
    {"premises": [...], "stance": {"plaintiff": query, "defense": query}} (for the retrieval benchmark)."""
    opts = options or Options()
    generator = turns.stream(agents, streams, settings.seed, settings)
    cases = [Case(claim=c, index=None) for c in claims]
    _premises(agents, cases, opts, settings, generator)
    _stance_queries(agents, cases, settings, generator)
    return [{"premises": c.premises, "stance": dict(c.stance_queries)} for c in cases]


def _negotiate(agents, cases, opts, library, settings, generator):
    """Shared retrieval per premise and stance-conditioned retrieval per side, then admissibility."""
    _stance_queries(agents, cases, settings, generator)
    scoring = []
    for case in cases:
        queries = case.premises + [case.stance_queries[side] for side in SIDES]
        found = {}
        for hits in retrieval.search(case.index, retrieval.embed(library.embedder, queries), opts.top_k):
            for position, _ in hits:
                found.setdefault(position, None)
        for position in found:
            entry = {"passage": case.index.passages[position], "position": position, "round": 0}
            prompt = render("court_admissibility", passage=_passage_text(dict(entry, status="admitted"), 1))
            scoring.append((case, entry, (case, "negotiation", "court", _court(case), prompt)))
    replies = _ask(agents["court"], [s[2] for s in scoring], settings, generator, schema_name="court_admissibility")
    for (case, entry, _), reply in zip(scoring, replies):
        fields = _fields(reply, ("Relevance", "Credibility"))
        entry["weight"], entry["status"] = panel.admissibility(
            number_in(fields.get("Relevance"), 1), number_in(fields.get("Credibility"), 1),
            opts.admit_threshold, opts.dispute_threshold)
        case.pool.append(entry)
    for case in cases:
        # Admitted first, strongest first; the counsels and the panel read the pool in this order.
        case.pool.sort(key=lambda e: (POOL_ORDER[e["status"]], -(e["weight"] or 0)))
        case.vectors = case.index.vectors[[e["position"] for e in case.pool]]


def _open_hearing(case, counsels):
    convs = {side: engine.Conversation(system=_counsel_system(case, side)) for side in SIDES}
    convs["critic"] = engine.Conversation(system=render("critic_meta", claim=case.claim["claim"],
                                                        premises="; ".join(case.premises)))
    convs["court"] = _court(case)
    # The negotiated pool is in the counsels' system prompts: they have seen all of it.
    hearing = Hearing(counsels=counsels, convs=convs, pool=list(case.pool), vectors=case.vectors,
                      seen={side: len(case.pool) for side in SIDES})
    case.hearings.append(hearing)
    return hearing


def _discover(agents, active, round_no, opts, library, settings, generator, tag):
    """P-RAG: each counsel's gap, a court-refined query, novelty-filtered top-k into the pool."""
    gaps = {}
    for side in SIDES:
        items = [(c, f"{tag}-{round_no}", side, h.convs[side], render("counsel_gap", round=round_no))
                 for c, h in active]
        counsel = active[0][1].counsels[side]
        for (case, hearing), reply in zip(active, _ask(counsel, items, settings, generator, one_shot=False,
                                                       schema_name="counsel_gap")):
            gaps[(id(case), side)] = _text(_fields(reply, ("Gap",)).get("Gap")) or reply.strip()
    items = []
    for case, hearing in active:
        for side in SIDES:
            recent = "\n".join(f"{speaker}: {text}" for speaker, text in hearing.messages[-4:])
            need = _text(hearing.reflections.get(side, {}).get("Discovery Need"))
            draft = "\n".join(x for x in (recent, f"Gap: {gaps[(id(case), side)]}",
                                          f"Discovery need: {need}" if need else "") if x)
            items.append((case, f"{tag}-{round_no}", "court", _court(case),
                          render("court_query", side=SIDE_NAMES[side], draft=draft)))
    replies = _ask(agents["court"], items, settings, generator, schema_name="court_query")
    queries = [_text(_fields(reply, ("Query",)).get("Query")) or gaps[(id(item[0]), side)] or item[0].claim["claim"]
               for item, reply, side in zip(items, replies, SIDES * len(active))]
    vectors = iter(retrieval.embed(library.embedder, queries))  # one encoder call for the whole round
    queries = iter(queries)
    for case, hearing in active:
        novelties = []
        for side in SIDES:
            query = next(queries)
            hits = retrieval.search(case.index, next(vectors)[None], opts.top_k)[0]
            positions = [p for p, _ in hits]
            admitted, scores = retrieval.admit_novel(hearing.vectors, case.index.vectors[positions],
                                                     opts.novelty_threshold)
            for k in admitted:
                hearing.pool.append({"passage": case.index.passages[positions[k]], "position": positions[k],
                                     "status": "discovered", "weight": None, "round": round_no})
            if admitted:
                hearing.vectors = case.index.vectors[[e["position"] for e in hearing.pool]]
            hearing.queries.append({"round": round_no, "side": side, "query": query, "admitted": len(admitted),
                                    "novelty": [round(s, 4) for s in scores]})
            novelties += scores
        hearing.novelty_means.append(sum(novelties) / len(novelties) if novelties else None)


def _answering(hearing, side):
    """What a counsel answers: the plaintiff the defense's last round, the defense this round's plaintiff."""
    if side == "defense":
        return hearing.rounds[-1].get("plaintiff", "")
    return hearing.rounds[-2]["defense"] if len(hearing.rounds) > 1 else ""


def _argue(active, round_no, opts, agents, settings, generator, tag):
    for case, hearing in active:
        hearing.rounds.append({"round": round_no, "testimony": []})
    for side in SIDES:
        items = []
        for case, hearing in active:
            testimony = "\n".join(f"Q: {t['question']}\nA: {t['answer']}"
                                  for r in hearing.rounds for t in r["testimony"])
            prompt = render("counsel_argument", round=round_no,
                            new_evidence=format_pool(hearing.pool, hearing.seen[side]),
                            opponent_argument=_answering(hearing, side).strip() or "(none yet)",
                            testimony=testimony or "(none)")
            hearing.seen[side] = len(hearing.pool)
            items.append((case, f"{tag}-{round_no}", side, hearing.convs[side], prompt))
        counsel = active[0][1].counsels[side]
        for (case, hearing), reply in zip(active, _ask(counsel, items, settings, generator, one_shot=False)):
            hearing.rounds[-1][side] = reply
            hearing.messages.append((SIDE_NAMES[side], reply))
    if not opts.witness:
        return
    items, asked = [], []
    for case, hearing in active:
        for side in SIDES:
            requests = WITNESS.findall(hearing.rounds[-1][side])
            if requests and requests[-1].strip():
                conv = engine.Conversation(system=render("witness_meta", claim=case.claim["claim"],
                                                         evidence=format_pool(hearing.pool)))
                items.append((case, f"{tag}-{round_no}", "witness", conv, requests[-1].strip()))
                asked.append((hearing, side))
    for (hearing, side), item, reply in zip(asked, items, _ask(agents["witness"], items, settings, generator)):
        hearing.rounds[-1]["testimony"].append({"side": side, "question": item[4], "answer": reply.strip()})


def _reflect_and_review(active, round_no, opts, agents, settings, generator, tag):
    """Self-reflection of both counsels, the critic's review and the court's readiness; returns the
    per-case (critic resolved, court ready) decisions."""
    for side in SIDES:
        items = [(c, f"{tag}-{round_no}", side, h.convs[side], load_prompt("counsel_reflection")) for c, h in active]
        counsel = active[0][1].counsels[side]
        for (case, hearing), reply in zip(active, _ask(counsel, items, settings, generator, one_shot=False,
                                                       schema_name="counsel_reflection")):
            fields = _fields(reply, ("Logic", "Novelty", "Rebuttal", "Discovery Need"))
            parts = [number_in(fields.get(k), 1) for k in ("Logic", "Novelty", "Rebuttal")]
            hearing.reflections[side] = {"Logic": parts[0], "Novelty": parts[1], "Rebuttal": parts[2],
                                         "Discovery Need": _text(fields.get("Discovery Need")),
                                         "total": panel.reflection_score(*parts, weights=opts.reflection_weights)}
    for case, hearing in active:
        totals = [hearing.reflections[s]["total"] for s in SIDES if hearing.reflections[s]["total"] is not None]
        hearing.totals.append(sum(totals) / len(totals) if totals else None)
    decisions = {}
    for role, prompt_name, key in (("critic", "critic_round", "Resolved"), ("court", "court_ready", "Ready")):
        items = [(c, f"{tag}-{round_no}", role, h.convs[role],
                  render(prompt_name, round=round_no, plaintiff_argument=h.rounds[-1]["plaintiff"],
                         defense_argument=h.rounds[-1]["defense"])) for c, h in active]
        for (case, hearing), reply in zip(active, _ask(agents[role], items, settings, generator, one_shot=False,
                                                       schema_name=prompt_name)):
            fields = _fields(reply, ("Plaintiff Score", "Defense Score", "Unresolved Premises", key))
            hearing.rounds[-1][role] = {k: v for k, v in fields.items() if isinstance(v, (str, int, float))}
            decisions.setdefault(id(hearing), {})[role] = yes_no(fields.get(key)) is True
    return decisions


def _hold_hearings(agents, cases, counsels, opts, library, settings, generator, tag):
    active = [(case, _open_hearing(case, counsels)) for case in cases]
    for round_no in range(1, opts.max_rounds + 1):
        if not active:
            break
        _discover(agents, active, round_no, opts, library, settings, generator, tag)
        _argue(active, round_no, opts, agents, settings, generator, tag)
        decisions = _reflect_and_review(active, round_no, opts, agents, settings, generator, tag)
        still = []
        for case, hearing in active:
            said = decisions[id(hearing)]
            hearing.stop_reason = panel.stop_reason(
                round_no, opts.max_rounds, said["critic"], said["court"], hearing.totals, hearing.novelty_means,
                opts.plateau_delta, opts.novelty_stop)
            if hearing.stop_reason is None:
                still.append((case, hearing))
            else:
                for conv in hearing.convs.values():
                    conv.drop_cache()  # the memory goes to the hearings still running, then to the panel
        active = still


def _hearing_text(hearing, title):
    rounds = []
    for r in hearing.rounds:
        testimony = "".join(f"\nExpert witness (asked by the {SIDE_NAMES[t['side']]}): {t['answer']}"
                            for t in r["testimony"])
        rounds.append(render("courtroom_round", round=r["round"], plaintiff=r.get("plaintiff", "").strip(),
                             defense=r.get("defense", "").strip(), testimony=testimony))
    return render("courtroom_hearing", title=title, rounds="\n\n".join(rounds))


def _switch_needed(agents, settings, opts):
    if not opts.role_switch:
        return False, "off"
    a, b = agents["plaintiff"], agents["defense"]
    if a.path == b.path and a.adapter == b.adapter and settings.temperature <= 0:
        return False, ("skipped: both counsels run on one model under greedy decoding, "
                       "so the rerun would repeat the first hearing")
    return True, "rerun"


def _consistency(agents, cases, settings, generator):
    items = [(c, "role-switch", "court", _court(c),
              render("court_consistency", first=_hearing_text(c.hearings[0], "First hearing"),
                     second=_hearing_text(c.hearings[1], "Second hearing"))) for c in cases]
    for case, reply in zip(cases, _ask(agents["court"], items, settings, generator, schema_name="court_consistency")):
        score = number_in(_fields(reply, ("Consistency", "Reason")).get("Consistency"), 10)
        case.consistency = None if score is None else 10 * score


def _seats(agents, settings):
    """Judge seat -> the seat whose vote it shares: under greedy decoding one model votes once."""
    seats = sorted((r for r in agents if r.startswith("judge_")), key=lambda r: int(r.split("_")[1]))
    first = {}
    for seat in seats:
        key = (agents[seat].path, agents[seat].adapter)
        first.setdefault(key, seat)
    return {s: (first[(agents[s].path, agents[s].adapter)] if settings.temperature <= 0 else s) for s in seats}


def _judge(agents, cases, settings, streams):
    seats = _seats(agents, settings)
    ballots = {}  # (case id, seat) -> (fields, status, reply)
    prompts = []  # every judge reads the same case file
    for case in cases:
        hearings = "\n\n".join(_hearing_text(h, t) for h, t in
                               zip(case.hearings, ("First hearing", "Second hearing, counsels' models swapped")))
        prompts.append(render("judge_case", claim=case.claim["claim"], evidence=format_pool(case.hearings[0].pool),
                              hearings=hearings))
    for k, seat in enumerate(sorted(set(seats.values()))):
        items = [(case, "panel", seat, engine.Conversation(system=load_prompt("judge_meta")), prompt)
                 for case, prompt in zip(cases, prompts)]
        # Each seat samples from its own stream, so seats on one model can disagree when sampling.
        generator = turns.stream(agents, streams, settings.seed + 1 + k, settings)
        for item, reply in zip(items, _ask(agents[seat], items, settings, generator, schema_name="judge_case")):
            fields, status = read_fields(reply, ("Evidence Strength", "Argument Validity", "Scientific Reliability",
                                                 "Justification", "Verdict"))
            structured = item[3].structured
            probs = structured["probs"].get("Verdict") if structured else None
            ballots[(id(item[0]), seat)] = (fields, "structured" if structured else status, reply, probs)
    return seats, ballots


def _panel_note(agents, seats):
    paths = [agents[s].path for s in seats]
    distinct = len(set(paths))
    note = f"{len(paths)} judges on {distinct} distinct model(s)"
    if distinct < len(paths):
        note += ("; judges sharing a model " + ("repeat one vote (greedy decoding)"
                                                if any(seats[s] != s for s in seats) else "sample independently"))
    return {"judges": paths, "distinct_models": distinct, "note": note}


def _verdict(case, seats, ballots, opts):
    votes, qualities, reasons = [], [], []
    for seat, source in seats.items():
        fields, status, reply, _ = ballots[(id(case), source)]
        label = panel.panel_label(fields.get("Verdict"))
        votes.append(label)
        scores = [number_in(fields.get(k), 10) for k in ("Evidence Strength", "Argument Validity",
                                                         "Scientific Reliability")]
        if all(s is not None for s in scores):
            qualities.append(10 * sum(scores) / 3)
        reasons.append((label, _text(fields.get("Justification")), status, reply))
    winner, count, label = panel.vote(votes)
    first_hearing = case.hearings[0]
    side = {panel.PANEL_SUPPORTED: "plaintiff", panel.PANEL_NOT_SUPPORTED: "defense"}.get(winner)
    winner_total = first_hearing.reflections.get(side, {}).get("total") if side else None
    conf, parts = panel.confidence(count / len(votes) if votes else 0.0,
                                   sum(qualities) / len(qualities) if qualities else None,
                                   case.consistency, winner_total, opts.vote_weight, opts.quality_weight)
    chosen = next((r for r in reasons if winner and r[0] == winner), None) or next(
        (r for r in reasons if r[0] is not None), reasons[0])
    status = chosen[2] or "unparsed"
    # The label distribution of the panel: each distinct judge votes from its own probabilities, a seat
    # that shares its model's vote (greedy) votes alike, and the label rule maps the votes.
    sources = sorted(set(seats.values()))
    vote_probs = {s: ballots[(id(case), s)][3] for s in sources}
    label_probs = turns.outcome_probs(
        [vote_probs[s] for s in sources],
        lambda said: panel.vote([dict(zip(sources, said))[seats[seat]] for seat in seats])[2])
    return {"verdict": label, "justification": chosen[1], "status": status, "label_probs": label_probs}, chosen[3], {
        "votes": votes, "vote_probs": {seat: vote_probs[seats[seat]] for seat in seats}, "panel_verdict": winner, "confidence": round(conf, 4),
        "confidence_parts": {k: round(v, 4) for k, v in parts.items()}}


def _evidence(pool):
    """The pool the panel read, as question-answer evidence for the AVeriTeC score."""
    return [{"question": e["passage"].get("question", ""), "answer": e["passage"].get("answer", e["passage"]["text"]),
             "url": e["passage"].get("url", "")} for e in pool if e["status"] in SHOWN]


def run_batch(agents, claims, settings, options=None, library=None, streams=None, on_finish=None):
    """Try `claims` together; call `on_finish(record)` as each one is decided; return the records."""
    opts = options or Options()
    generator = turns.stream(agents, streams, settings.seed, settings)
    cases = [Case(claim=c, index=library.corpus or retrieval.index_of(retrieval.evidence_passages(c), library.embedder))
             for c in claims]
    _premises(agents, cases, opts, settings, generator)
    _negotiate(agents, cases, opts, library, settings, generator)
    _hold_hearings(agents, cases, {s: agents[s] for s in SIDES}, opts, library, settings, generator, "first")
    rerun, switch_note = _switch_needed(agents, settings, opts)
    if rerun:
        swapped = {"plaintiff": agents["defense"], "defense": agents["plaintiff"]}
        _hold_hearings(agents, cases, swapped, opts, library, settings, generator, "switched")
        _consistency(agents, cases, settings, generator)
    seats, ballots = _judge(agents, cases, settings, streams)
    records = []
    for case in cases:
        outcome, reply, decision = _verdict(case, seats, ballots, opts)
        first = case.hearings[0]
        counts = {s: sum(e["status"] == s for e in case.pool) for s in ("admitted", "disputed", "dropped", "unscored")}
        records.append(turns.record(
            case.claim, outcome, case.said, case.convs, reply=reply, rounds=len(first.rounds),
            stop_reason=first.stop_reason,
            **decision, premises=case.premises, negotiation=counts, role_switch=switch_note,
            consistency=case.consistency, panel=_panel_note(agents, seats),
            hearings=[{"rounds": len(h.rounds), "stop_reason": h.stop_reason, "queries": h.queries,
                       "novelty_means": h.novelty_means, "reflection_totals": h.totals,
                       "discovered": sum(e["status"] == "discovered" for e in h.pool)} for h in case.hearings],
            evidence=_evidence(first.pool)))
        if on_finish:
            on_finish(records[-1])
    return records
