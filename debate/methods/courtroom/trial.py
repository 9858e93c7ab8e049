"""PROClaim (Chowdhury et al. 2026): a courtroom debate with progressive retrieval, batched over claims.

1. Premises: the argument miner (on the critic's model) breaks the claim into premises.
2. Evidence negotiation: seed retrieval with the claim itself, shared retrieval per premise, and a
   supporting and a challenging query (the miner writes them) for each counsel's pool; each counsel then sees the shared pool and
   both sides' pools and names what it discloses and what it challenges (negotiation injection); the
   court rates every candidate's relevance and credibility; weight = product, admitted / disputed /
   dropped by the two thresholds (panel.admissibility).
3. A hearing, round by round until a stopping rule holds (panel.stop_reason) or the round cap:
   - discovery (P-RAG), until an early exit stops it (panel.prag_exit): each counsel names its
     evidential gap; the gap and the counsel's last reflected discovery need, with the last four
     messages, are turned into a query, which the court refines; its top-k passages enter the pool
     when novel enough (novelty = 1 - max cosine to the pool);
   - arguments: the plaintiff counsel (for the claim), then the defense counsel;
   - expert witness: each counsel may request one; the court grants or denies it; a granted expert
     testifies (unless --no-witness);
   - self-reflection: each counsel scores its logic, novelty and rebuttal and names a discovery need;
   - the critic scores each side (logic, evidence, rebuttal) and says whether the case is resolved;
     the court says whether to wait or close.
4. Role switch: the counsels' models swap sides and the hearing is held again (up to --switch-rounds
   rounds) from the negotiated evidence; the consistency analyzer (critic's model) scores the two
   hearings. With one model for both counsels and greedy decoding the rerun would repeat the first
   hearing token for token, so it is skipped and the output says so.
5. A panel of judges (one per --judge-models path) reads the whole case record (both hearings, the
   evidence and testimony, P-RAG's queries, the critic's evaluations, the reflections) and votes
   Supported / Not Supported / Inconclusive; panel.vote maps the vote onto the AVeriTeC labels (a split
   goes to the Chief Justice) and panel.confidence gives the confidence. Under greedy decoding, seats
   held by the same model vote alike, so each distinct model is asked once.

Each role samples at its own temperature (Courtroom.temperatures, the paper's by default).
"""
import re
from dataclasses import dataclass, field, replace

from debate import engine, panel, retrieval, turns
from debate.config import ROUNDS, Courtroom
from debate.labels import REFUTED, SUPPORTED
from debate.parsing import number_in, read_fields, yes_no
from debate.prompts import load_prompt, render

SIDES = ("plaintiff", "defense")
SIDE_NAMES = {"plaintiff": "Plaintiff Counsel", "defense": "Defense Counsel"}
SHOWN = ("admitted", "discovered", "disputed", "unscored")  # pool statuses the counsels and the panel see
POOL_ORDER = {s: k for k, s in enumerate(("admitted", "disputed", "unscored", "dropped"))}
SCHEMAS = ("critic_premises", "counsel_search", "counsel_disclosure", "court_admissibility", "counsel_gap",
           "courtroom_query", "court_query", "counsel_expert", "court_witness", "counsel_reflection", "critic_round",
           "court_ready", "critic_consistency", "judge_case")  # the JSON answers it asks for (debate.schema)


def model_of(n_judges):
    """Role -> model flag; judge seat i runs on the i-th --judge-models path."""
    roles = {"plaintiff": "debater", "defense": "defense", "court": "moderator", "critic": "moderator",
             "witness": "debater"}
    roles.update({f"judge_{i + 1}": f"judge_{i + 1}" for i in range(n_judges)})
    return roles


MAX_PREMISES = 10  # a guard against runaway lists; the paper sets no number


@dataclass
class Library:
    """What the courtroom retrieves with: the encoder and, with --corpus, the shared corpus index."""
    embedder: object
    corpus: object = None  # retrieval.Index, or None: each claim searches its own evidence


def library_from(options, log=print):
    """The encoder and corpus index of `options` (a Courtroom config)."""
    embedder = retrieval.load_embedder(options.embedder)
    corpus = retrieval.corpus_index(options.corpus, embedder, log) if options.corpus else None
    return Library(embedder, corpus)


@dataclass
class Hearing:
    counsels: dict  # side -> the RoleModel that argues it
    convs: dict  # plaintiff, defense, critic, court -> engine.Conversation
    pool: list  # evidence entries {"passage", "status", "weight", "round"}
    vectors: object  # embeddings of the pool's passages, in pool order
    seen: dict  # side -> how many pool entries that counsel has been shown
    messages: list = field(default_factory=list)  # (speaker, text) in order, for the discovery queries
    rounds: list = field(default_factory=list)  # per round {"round", "plaintiff", "defense", "testimony", ...}
    totals: list = field(default_factory=list)  # reflection total per round (mean of both counsels)
    reflections: dict = field(default_factory=dict)  # side -> its last reflection
    reflection_log: list = field(default_factory=list)  # every reflection, for the judges
    novelty_means: list = field(default_factory=list)
    relevance: list = field(default_factory=list)  # mean query cosine of each round's admitted passages
    queries: list = field(default_factory=list)
    prag_stop: str = None  # why P-RAG stopped retrieving (panel.prag_exit), None while it runs
    stop_reason: str = ""


@dataclass
class Case:
    claim: dict
    index: object  # retrieval.Index searched for this claim
    convs: list = field(default_factory=list)  # every conversation, for the token counts
    said: list = field(default_factory=list)  # transcript turns
    premises: list = field(default_factory=list)
    stance_queries: dict = field(default_factory=dict)  # side -> its negotiation query
    disclosures: dict = field(default_factory=dict)  # side -> {"Disclose": [...], "Challenge": [...]}
    pool: list = field(default_factory=list)  # negotiated evidence
    vectors: object = None
    hearings: list = field(default_factory=list)
    consistency: float = None  # 0-10
    consistency_fields: dict = field(default_factory=dict)


TEMPERATURE_OF = {"plaintiff": "counsel", "defense": "counsel", "court": "court", "critic": "critic",
                  "witness": "witness"}


def _tuned(settings, opts, role):
    """`settings` at the temperature of `role` (a role name or judge seat); the engine keeps one setting."""
    key = "judge" if role.startswith("judge_") else TEMPERATURE_OF[role]
    return replace(settings, temperature=opts.temperatures[key])


def _generator(agents, streams, seed, settings, opts):
    """The random stream of `seed`, or None when no role samples."""
    return turns.stream(agents, streams, seed, replace(settings, temperature=max(opts.temperatures.values())))


def _fields(reply, keys):
    return read_fields(reply, keys)[0]


def _text(value):
    return value.strip() if isinstance(value, str) else ""


def _word(value, words):
    """The first of `words` a reply field starts with (case-blind), else None; a copied "Wait or Close"
    names both and decides nothing."""
    found = re.findall(r"[a-z]+", str(value).lower()) if value is not None else []
    named = [w for w in found if w in words]
    return named[0] if len(set(named)) == 1 else None


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
    """The argument miner's premises (the paper runs it on the critic's model)."""
    items = [(c, "premises", "critic", engine.Conversation(system=""),
              render("critic_premises", claim=c.claim["claim"])) for c in cases]
    for case, reply in zip(cases, _ask(agents["critic"], items, _tuned(settings, opts, "critic"), generator,
                                       schema_name="critic_premises")):
        value = _fields(reply, ("Premises",)).get("Premises")
        lines = value if isinstance(value, list) else _text(value).splitlines()
        premises = [re.sub(r"^\W*\d*[.)]?\s*", "", str(p)).strip() for p in lines]
        case.premises = [p for p in premises if p][:MAX_PREMISES] or [case.claim["claim"]]


def _counsel_system(case, side):
    return render("counsel_meta", side=SIDE_NAMES[side], stance=load_prompt(f"counsel_stance_{side}"),
                  instruction=load_prompt(f"counsel_instruction_{side}"), claim=case.claim["claim"],
                  evidence=format_pool(case.pool))


def _stance_queries(agents, cases, opts, settings, generator):
    """The stance-conditioned query of each side of each case (the claim itself when unreadable). The
    paper has one LLM write both; its code asks the argument miner's (the critic's model)."""
    items, sides = [], []
    for case in cases:
        for side in SIDES:
            direction = "supporting" if side == "plaintiff" else "challenging"
            items.append((case, "negotiation", "critic", engine.Conversation(system=""),
                          render("counsel_search", direction=direction, side=SIDE_NAMES[side],
                                 claim=case.claim["claim"])))
            sides.append(side)
    for (case, *_), side, reply in zip(items, sides, _ask(agents["critic"], items, _tuned(settings, opts, "critic"),
                                                          generator, schema_name="counsel_search")):
        case.stance_queries[side] = _text(_fields(reply, ("Query",)).get("Query")) or case.claim["claim"]


def negotiation_queries(agents, claims, settings, options=None, streams=None):
    """The queries the courtroom's evidence negotiation retrieves with, per claim:
    {"premises": [...], "stance": {"plaintiff": query, "defense": query}} (for the retrieval benchmark)."""
    opts = options or Courtroom()
    generator = _generator(agents, streams, settings.seed, settings, opts)
    cases = [Case(claim=c, index=None) for c in claims]
    _premises(agents, cases, opts, settings, generator)
    _stance_queries(agents, cases, opts, settings, generator)
    return [{"premises": c.premises, "stance": dict(c.stance_queries)} for c in cases]


def _numbers(value):
    """Item numbers in a reply field (a list or a text), as ints."""
    items = value if isinstance(value, list) else [value]
    return [int(n) for item in items if item is not None for n in re.findall(r"\d+", str(item))]


def _disclose(agents, cases, pools, opts, settings, generator):
    """Negotiation injection: each counsel reviews the shared pool and both sides' pools and names what it
    discloses and what it challenges. The paper gives no rule that acts on the answers; they are kept in
    the record."""
    def listing(case, positions, numbers):
        return "\n".join(_passage_text({"passage": case.index.passages[p], "status": "admitted"}, numbers[p])
                         for p in positions) or "(none)"

    for side in SIDES:
        other = SIDES[1 - SIDES.index(side)]
        items = []
        for case in cases:
            found = pools[id(case)]
            numbers = {p: k + 1 for k, p in enumerate(found["all"])}
            prompt = render("counsel_disclosure", shared=listing(case, found["shared"], numbers),
                            own=listing(case, found[side], numbers), other=listing(case, found[other], numbers))
            items.append((case, "negotiation", side, engine.Conversation(system=_counsel_system(case, side)), prompt))
        for case, reply in zip(cases, _ask(agents[side], items, _tuned(settings, opts, side), generator,
                                           schema_name="counsel_disclosure")):
            fields = _fields(reply, ("Disclose", "Challenge"))
            case.disclosures[side] = {k: _numbers(fields.get(k)) for k in ("Disclose", "Challenge")}


def _negotiate(agents, cases, opts, library, settings, generator):
    """Seed retrieval with the claim, shared retrieval per premise, stance-conditioned retrieval per side,
    the counsels' disclosures, then admissibility."""
    _stance_queries(agents, cases, opts, settings, generator)
    pools = {}
    for case in cases:
        groups = [("shared", [case.claim["claim"]], opts.seed_k)] if opts.seed_k else []
        groups += [("shared", case.premises, opts.top_k)] + [(s, [case.stance_queries[s]], opts.top_k) for s in SIDES]
        found = {"shared": [], "plaintiff": [], "defense": [], "all": []}
        vectors = retrieval.embed(library.embedder, [q for _, queries, _ in groups for q in queries])
        row = 0
        for pool, queries, k in groups:
            for hits in retrieval.search(case.index, vectors[row:row + len(queries)], k):
                for position, _ in hits:
                    if position not in found[pool]:
                        found[pool].append(position)
                    if position not in found["all"]:
                        found["all"].append(position)
            row += len(queries)
        pools[id(case)] = found
    _disclose(agents, cases, pools, opts, settings, generator)
    scoring = []
    for case in cases:
        for position in pools[id(case)]["all"]:
            entry = {"passage": case.index.passages[position], "position": position, "round": 0}
            prompt = render("court_admissibility", claim=case.claim["claim"],
                            passage=_passage_text(dict(entry, status="admitted"), 1))
            scoring.append((case, entry, (case, "negotiation", "court", _court(case), prompt)))
    replies = _ask(agents["court"], [s[2] for s in scoring], _tuned(settings, opts, "court"), generator,
                   schema_name="court_admissibility")
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


def _recent(hearing, n=4):
    """The last `n` messages of the proceedings (P-RAG's debate context)."""
    return "\n".join(f"{speaker}: {text}" for speaker, text in hearing.messages[-n:]) or "(nothing yet)"


def _discover(agents, active, round_no, opts, library, settings, generator, tag):
    """P-RAG: each counsel's gap (plus its last discovery need) becomes a query, the court refines it,
    and its novel top-k passages enter the pool; then the early exits are checked."""
    active = [(c, h) for c, h in active if h.prag_stop is None]
    if not active:
        return
    stage = f"{tag}-{round_no}"
    requests = {}
    for side in SIDES:
        items = [(c, stage, side, h.convs[side], render("counsel_gap", round=round_no, side=SIDE_NAMES[side],
                                                        context=_recent(h))) for c, h in active]
        counsel = active[0][1].counsels[side]
        for (case, hearing), reply in zip(active, _ask(counsel, items, _tuned(settings, opts, side), generator,
                                                       one_shot=False, schema_name="counsel_gap")):
            gap = _text(_fields(reply, ("Gap",)).get("Gap")) or reply.strip()
            need = _text(hearing.reflections.get(side, {}).get("Discovery Need"))
            requests[(id(case), side)] = render("courtroom_request", gap=gap, need=need) if need else gap
    court = _tuned(settings, opts, "court")
    pairs = [(case, hearing, side) for case, hearing in active for side in SIDES]
    # Step 2 (the P-RAG engine's query formulation) and step 3 (the court's refinement), Appendix I.
    items = [(c, stage, "court", engine.Conversation(system=""),
              render("courtroom_query", context=_recent(h), request=requests[(id(c), side)])) for c, h, side in pairs]
    drafts = [_text(_fields(r, ("Query",)).get("Query")) or requests[(id(c), side)]
              for (c, h, side), r in zip(pairs, _ask(agents["court"], items, court, generator,
                                                     schema_name="courtroom_query"))]
    items = [(c, stage, "court", _court(c), render("court_query", side=SIDE_NAMES[side], query=draft,
                                                  context=_recent(h))) for (c, h, side), draft in zip(pairs, drafts)]
    queries = [_text(_fields(r, ("Query",)).get("Query")) or draft
               for draft, r in zip(drafts, _ask(agents["court"], items, court, generator, schema_name="court_query"))]
    vectors = iter(retrieval.embed(library.embedder, queries))  # one encoder call for the whole round
    queries = iter(queries)
    for case, hearing in active:
        novelties, retrieved, relevance = [], [], []
        for side in SIDES:
            query = next(queries)
            hits = retrieval.search(case.index, next(vectors)[None], opts.top_k)[0]
            positions = [p for p, _ in hits]
            admitted, scores = retrieval.admit_novel(hearing.vectors, case.index.vectors[positions],
                                                     opts.novelty_threshold)
            for k in admitted:
                hearing.pool.append({"passage": case.index.passages[positions[k]], "position": positions[k],
                                     "status": "discovered", "weight": None, "round": round_no})
                relevance.append(hits[k][1])
            if admitted:
                hearing.vectors = case.index.vectors[[e["position"] for e in hearing.pool]]
            hearing.queries.append({"round": round_no, "side": side, "query": query, "admitted": len(admitted),
                                    "retrieved": len(positions), "novelty": [round(s, 4) for s in scores]})
            novelties += scores
            retrieved += scores
        hearing.novelty_means.append(sum(novelties) / len(novelties) if novelties else None)
        mean_relevance = sum(relevance) / len(relevance) if relevance else 0.0
        previous = hearing.relevance[-1] if hearing.relevance else None
        hearing.relevance.append(mean_relevance)
        hearing.prag_stop = panel.prag_exit(retrieved, mean_relevance, previous, round_no, opts.redundancy_limit,
                                            opts.relevance_gain)
        if hearing.prag_stop:
            hearing.queries[-1]["prag_stop"] = hearing.prag_stop


def _argue(active, round_no, opts, settings, generator, tag):
    for case, hearing in active:
        hearing.rounds.append({"round": round_no, "testimony": []})
    for side in SIDES:
        items = []
        for case, hearing in active:
            prompt = render("counsel_argument", round=round_no,
                            new_evidence=format_pool(hearing.pool, hearing.seen[side]), history=_recent(hearing))
            hearing.seen[side] = len(hearing.pool)
            items.append((case, f"{tag}-{round_no}", side, hearing.convs[side], prompt))
        counsel = active[0][1].counsels[side]
        for (case, hearing), reply in zip(active, _ask(counsel, items, _tuned(settings, opts, side), generator,
                                                       one_shot=False)):
            hearing.rounds[-1][side] = reply
            hearing.messages.append((SIDE_NAMES[side], reply))


def _call_witnesses(agents, active, round_no, opts, settings, generator, tag):
    """Each counsel may request an expert; the court grants or denies it; a granted expert testifies."""
    stage = f"{tag}-{round_no}"
    requests = []  # (case, hearing, side, expert type, reasoning)
    for side in SIDES:
        items = [(c, stage, side, h.convs[side], render("counsel_expert", history=_recent(h))) for c, h in active]
        counsel = active[0][1].counsels[side]
        for (case, hearing), reply in zip(active, _ask(counsel, items, _tuned(settings, opts, side), generator,
                                                       one_shot=False, schema_name="counsel_expert")):
            fields = _fields(reply, ("Expert Type", "Reasoning"))
            expert = _text(fields.get("Expert Type"))
            if expert and expert.lower().strip(".") != "none":
                requests.append((case, hearing, side, expert, _text(fields.get("Reasoning"))))
    items = [(c, stage, "court", _court(c), render("court_witness", side=SIDE_NAMES[side], expert_type=expert,
                                                  reasoning=reasoning or "(none given)"))
             for c, h, side, expert, reasoning in requests]
    granted = []
    for request, reply in zip(requests, _ask(agents["court"], items, _tuned(settings, opts, "court"), generator,
                                             schema_name="court_witness")):
        ruling = _word(_fields(reply, ("Ruling", "Reason")).get("Ruling") or reply, ("granted", "denied"))
        request[1].rounds[-1].setdefault("witness_requests", []).append(
            {"side": request[2], "expert": request[3], "ruling": ruling or "unreadable"})
        if ruling == "granted":
            granted.append(request)
    items = [(c, stage, "witness", engine.Conversation(system=load_prompt("witness_meta")),
              render("witness_testimony", claim=c.claim["claim"], expert_type=expert, expertise=expert,
                     evidence=format_pool(h.pool), history=_recent(h)))
             for c, h, side, expert, _ in granted]
    for (case, hearing, side, expert, _), reply in zip(granted, _ask(agents["witness"], items,
                                                                     _tuned(settings, opts, "witness"), generator)):
        hearing.rounds[-1]["testimony"].append({"side": side, "expert": expert, "answer": reply.strip()})
        hearing.messages.append((f"Expert witness ({expert})", reply.strip()))


def _testimony(t, round_no):
    return render("courtroom_testimony", expert=t["expert"], round=round_no, side=SIDE_NAMES[t["side"]],
                  answer=t["answer"])


def _round_record(hearing):
    r = hearing.rounds[-1]
    testimony = "".join("\n" + _testimony(t, r["round"]) for t in r["testimony"])
    return render("courtroom_round", round=r["round"], plaintiff=r.get("plaintiff", "").strip(),
                  defense=r.get("defense", "").strip(), testimony=testimony)


def _side_scores(fields, side):
    """The critic's sub-scores of one side: {"Logic", "Evidence", "Rebuttal"} as 0-1 (None unreadable),
    and its reasoning."""
    scores = {k: number_in(fields.get(f"{side} {k}"), 1) for k in ("Logic", "Evidence", "Rebuttal")}
    scores["Reasoning"] = _text(fields.get(f"{side} Reasoning"))
    return scores


def _items(value):
    """A list field as a list of strings (a lone text as one item)."""
    if isinstance(value, list):
        return [str(v).strip() for v in value if str(v).strip()]
    return [value.strip()] if isinstance(value, str) and value.strip() else []


def _reflect_and_review(active, round_no, opts, agents, settings, generator, tag):
    """Self-reflection of both counsels, the critic's review and the court's wait-or-close; returns the
    per-hearing (critic resolved, court ready) decisions."""
    stage = f"{tag}-{round_no}"
    for side in SIDES:
        items = [(c, stage, side, h.convs[side], render("counsel_reflection", round=round_no, side=SIDE_NAMES[side]))
                 for c, h in active]
        counsel = active[0][1].counsels[side]
        for (case, hearing), reply in zip(active, _ask(counsel, items, _tuned(settings, opts, side), generator,
                                                       one_shot=False, schema_name="counsel_reflection")):
            fields = _fields(reply, ("Logic", "Novelty", "Rebuttal", "Flaws Identified", "Discovery Need",
                                     "Refined Stance"))
            parts = [number_in(fields.get(k), 1) for k in ("Logic", "Novelty", "Rebuttal")]
            hearing.reflections[side] = {"Logic": parts[0], "Novelty": parts[1], "Rebuttal": parts[2],
                                         "Discovery Need": _text(fields.get("Discovery Need")),
                                         "total": panel.reflection_score(*parts, weights=opts.reflection_weights)}
            hearing.reflection_log.append(dict(hearing.reflections[side], round=round_no, side=side))
    for case, hearing in active:
        totals = [hearing.reflections[s]["total"] for s in SIDES if hearing.reflections[s]["total"] is not None]
        hearing.totals.append(sum(totals) / len(totals) if totals else None)
    decisions = {}
    items = [(c, stage, "critic", h.convs["critic"], render("critic_round", round=round_no, record=_round_record(h)))
             for c, h in active]
    keys = tuple(f"{side} {part}" for side in ("Plaintiff", "Defense") for part in ("Logic", "Evidence", "Rebuttal",
                                                                                    "Reasoning"))
    keys += ("Unresolved Premises", "Plaintiff Recommendations", "Defense Recommendations", "Suggested Queries",
             "Resolved")
    for (case, hearing), reply in zip(active, _ask(agents["critic"], items, _tuned(settings, opts, "critic"),
                                                   generator, one_shot=False, schema_name="critic_round")):
        fields = _fields(reply, keys)
        hearing.rounds[-1]["critic"] = {
            "plaintiff": _side_scores(fields, "Plaintiff"), "defense": _side_scores(fields, "Defense"),
            "unresolved": _items(fields.get("Unresolved Premises")),
            "recommendations": {k: _items(fields.get(f"{k} Recommendations")) for k in ("Plaintiff", "Defense")},
            "queries": _items(fields.get("Suggested Queries")),
            "resolved": yes_no(fields.get("Resolved"))}
        decisions[id(hearing)] = {"critic": yes_no(fields.get("Resolved")) is True}
    items = [(c, stage, "court", h.convs["court"], render("court_ready", round=round_no, record=_round_record(h)))
             for c, h in active]
    for (case, hearing), reply in zip(active, _ask(agents["court"], items, _tuned(settings, opts, "court"),
                                                   generator, one_shot=False, schema_name="court_ready")):
        decision = _word(_fields(reply, ("Decision",)).get("Decision") or reply, ("wait", "close"))
        hearing.rounds[-1]["court"] = decision or "unreadable"
        decisions[id(hearing)]["court"] = decision == "close"
    return decisions


def _hold_hearings(agents, cases, counsels, opts, max_rounds, library, settings, generator, tag):
    active = [(case, _open_hearing(case, counsels)) for case in cases]
    for round_no in range(1, max_rounds + 1):
        if not active:
            break
        _discover(agents, active, round_no, opts, library, settings, generator, tag)
        _argue(active, round_no, opts, settings, generator, tag)
        if opts.witness:
            _call_witnesses(agents, active, round_no, opts, settings, generator, tag)
        decisions = _reflect_and_review(active, round_no, opts, agents, settings, generator, tag)
        still = []
        for case, hearing in active:
            said = decisions[id(hearing)]
            hearing.stop_reason = panel.stop_reason(
                round_no, max_rounds, said["critic"], said["court"], hearing.totals, hearing.novelty_means,
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
        testimony = "".join("\n" + _testimony(t, r["round"]) for t in r["testimony"])
        rounds.append(render("courtroom_round", round=r["round"], plaintiff=r.get("plaintiff", "").strip(),
                             defense=r.get("defense", "").strip(), testimony=testimony))
    return render("courtroom_hearing", title=title, rounds="\n\n".join(rounds))


def _switch_needed(agents, opts):
    if not opts.role_switch:
        return False, "off"
    a, b = agents["plaintiff"], agents["defense"]
    if a.path == b.path and a.adapter == b.adapter and opts.temperatures["counsel"] <= 0:
        return False, ("skipped: both counsels run on one model under greedy decoding, "
                       "so the rerun would repeat the first hearing")
    return True, "rerun"


def _consistency(agents, cases, opts, settings, generator):
    """The consistency analyzer (the paper runs it on the critic's model) compares the two hearings."""
    items = [(c, "role-switch", "critic", engine.Conversation(system=""),
              render("critic_consistency", first=_hearing_text(c.hearings[0], "First hearing"),
                     second=_hearing_text(c.hearings[1], "Second hearing"))) for c in cases]
    for case, reply in zip(cases, _ask(agents["critic"], items, _tuned(settings, opts, "critic"), generator,
                                       schema_name="critic_consistency")):
        fields = _fields(reply, ("Model A", "Model B", "Contradictions", "Consistency"))
        score = number_in(fields.get("Consistency"), 10)
        case.consistency = None if score is None else 10 * score
        case.consistency_fields = {k: v for k, v in fields.items() if isinstance(v, (str, int, float))}


def _seats(agents, opts):
    """Judge seat -> the seat whose vote it shares: under greedy decoding one model votes once."""
    seats = sorted((r for r in agents if r.startswith("judge_")), key=lambda r: int(r.split("_")[1]))
    first = {}
    for seat in seats:
        key = (agents[seat].path, agents[seat].adapter)
        first.setdefault(key, seat)
    greedy = opts.temperatures["judge"] <= 0
    return {s: (first[(agents[s].path, agents[s].adapter)] if greedy else s) for s in seats}


def _number(value):
    return "?" if value is None else f"{value:.2f}"


def _case_file(case, switch_note):
    """The judges' prompt: the whole case record, in the order of the paper's panel prompt."""
    first = case.hearings[0]
    arguments = {side: "\n\n".join(render("courtroom_argument", round=r["round"], text=r.get(side, "").strip())
                                   for r in first.rounds) or "(none)" for side in SIDES}
    testimony = [_testimony(t, r["round"]) for r in first.rounds for t in r["testimony"]]
    evidence = "\n".join([format_pool(first.pool)] + testimony)
    if len(case.hearings) > 1:
        second = _hearing_text(case.hearings[1], "Second hearing, roles swapped")
        role_switch = render("courtroom_switch", hearing=second,
                             consistency="?" if case.consistency is None else f"{case.consistency:g}")
    else:
        role_switch = render("courtroom_no_switch", note=switch_note)
    prag = "\n".join(render("courtroom_prag", round=q["round"], side=SIDE_NAMES[q["side"]], query=q["query"],
                            admitted=q["admitted"], retrieved=q["retrieved"],
                            novelty=", ".join(f"{n:.2f}" for n in q["novelty"]) or "-",
                            stop=f"; P-RAG stopped ({q['prag_stop']})" if q.get("prag_stop") else "")
                     for q in first.queries) or "(no retrieval)"

    def side_text(scores):
        return ", ".join(f"{k.lower()} {_number(scores[k])}" for k in ("Logic", "Evidence", "Rebuttal"))

    critic = "\n".join(render("courtroom_critic", round=r["round"], plaintiff=side_text(c["plaintiff"]),
                              defense=side_text(c["defense"]),
                              unresolved="; ".join(c["unresolved"]) or "-",
                              resolved={True: "yes", False: "no"}.get(c["resolved"], "?"))
                       for r in first.rounds for c in [r.get("critic")] if c) or "(none)"
    reflection = "\n".join(render("courtroom_reflection", round=x["round"], side=SIDE_NAMES[x["side"]],
                                  logic=_number(x["Logic"]), novelty=_number(x["Novelty"]),
                                  rebuttal=_number(x["Rebuttal"]), total=_number(x["total"]))
                           for x in first.reflection_log) or "(none)"
    return render("judge_case", claim=case.claim["claim"], plaintiff=arguments["plaintiff"],
                  defense=arguments["defense"], evidence=evidence, role_switch=role_switch, prag=prag,
                  critic=critic, reflection=reflection)


JUDGE_KEYS = ("Claim Summary", "Evidence Strength", "Argument Validity", "Scientific Reliability", "Verdict",
              "Justification")


def _judge(agents, cases, opts, settings, streams, switch_note):
    seats = _seats(agents, opts)
    ballots = {}  # (case id, seat) -> (fields, status, reply)
    prompts = [_case_file(case, switch_note) for case in cases]  # every judge reads the same case file
    for k, seat in enumerate(sorted(set(seats.values()))):
        items = [(case, "panel", seat, engine.Conversation(system=load_prompt("judge_meta")), prompt)
                 for case, prompt in zip(cases, prompts)]
        # Each seat samples from its own stream, so seats on one model can disagree when sampling.
        judge = _tuned(settings, opts, seat)
        generator = turns.stream(agents, streams, settings.seed + 1 + k, judge)
        for item, reply in zip(items, _ask(agents[seat], items, judge, generator, schema_name="judge_case")):
            fields, status = read_fields(reply, JUDGE_KEYS)
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
    winner, count, label = panel.vote(votes, opts.split_decision, opts.chief_justice - 1, opts.inconclusive)
    readable = sum(v is not None for v in votes)
    decided_by = (None if label is None else "majority" if count > readable / 2
                  else "chief_justice" if winner is not None else "rule")
    first_hearing = case.hearings[0]
    side = {SUPPORTED: "plaintiff", REFUTED: "defense"}.get(label)  # the side the verdict went to
    winner_total = first_hearing.reflections.get(side, {}).get("total") if side else None
    conf, parts = panel.confidence(count / len(votes) if votes else 0.0,
                                   sum(qualities) / len(qualities) if qualities else None,
                                   case.consistency, winner_total, opts.vote_weight, opts.quality_weight,
                                   opts.confidence_floor)
    chosen = next((r for r in reasons if winner and r[0] == winner), None) or next(
        (r for r in reasons if r[0] is not None), reasons[0])
    status = chosen[2] or "unparsed"
    # The label distribution of the panel: each distinct judge votes from its own probabilities, a seat
    # that shares its model's vote (greedy) votes alike, and the label rule maps the votes.
    sources = sorted(set(seats.values()))
    vote_probs = {s: ballots[(id(case), s)][3] for s in sources}
    label_probs = turns.outcome_probs(
        [vote_probs[s] for s in sources],
        lambda said: panel.vote([dict(zip(sources, said))[seats[seat]] for seat in seats], opts.split_decision,
                                opts.chief_justice - 1, opts.inconclusive)[2])
    return {"verdict": label, "justification": chosen[1], "status": status, "label_probs": label_probs}, chosen[3], {
        "votes": votes, "vote_probs": {seat: vote_probs[seats[seat]] for seat in seats}, "panel_verdict": winner,
        "decided_by": decided_by, "confidence": round(conf, 4),
        "confidence_parts": {k: round(v, 4) for k, v in parts.items()}}


def _evidence(pool):
    """The pool the panel read, as question-answer evidence for the AVeriTeC score."""
    return [{"question": e["passage"].get("question", ""), "answer": e["passage"].get("answer", e["passage"]["text"]),
             "url": e["passage"].get("url", "")} for e in pool if e["status"] in SHOWN]


def run_batch(agents, claims, settings, options=None, library=None, max_rounds=ROUNDS["courtroom"], streams=None,
              on_finish=None):
    """Try `claims` together, hearings of `max_rounds` rounds at most; call `on_finish(record)` as each one is
    decided; return the records. `options`: a Courtroom config (default: the paper's numbers)."""
    opts = options or Courtroom()
    generator = _generator(agents, streams, settings.seed, settings, opts)
    cases = [Case(claim=c, index=library.corpus or retrieval.index_of(retrieval.evidence_passages(c), library.embedder))
             for c in claims]
    _premises(agents, cases, opts, settings, generator)
    _negotiate(agents, cases, opts, library, settings, generator)
    _hold_hearings(agents, cases, {s: agents[s] for s in SIDES}, opts, max_rounds, library, settings,
                   generator, "first")
    rerun, switch_note = _switch_needed(agents, opts)
    if rerun:
        swapped = {"plaintiff": agents["defense"], "defense": agents["plaintiff"]}
        _hold_hearings(agents, cases, swapped, opts, opts.switch_rounds, library, settings, generator, "switched")
        _consistency(agents, cases, opts, settings, generator)
    seats, ballots = _judge(agents, cases, opts, settings, streams, switch_note)
    records = []
    for case in cases:
        outcome, reply, decision = _verdict(case, seats, ballots, opts)
        first = case.hearings[0]
        counts = {s: sum(e["status"] == s for e in case.pool) for s in ("admitted", "disputed", "dropped", "unscored")}
        records.append(turns.record(
            case.claim, outcome, case.said, case.convs, reply=reply, rounds=len(first.rounds),
            stop_reason=first.stop_reason,
            **decision, premises=case.premises, negotiation=counts, disclosures=case.disclosures,
            role_switch=switch_note, consistency=case.consistency, panel=_panel_note(agents, seats),
            hearings=[{"rounds": len(h.rounds), "stop_reason": h.stop_reason, "queries": h.queries,
                       "novelty_means": h.novelty_means, "prag_stop": h.prag_stop, "reflection_totals": h.totals,
                       "discovered": sum(e["status"] == "discovered" for e in h.pool)} for h in case.hearings],
            evidence=_evidence(first.pool)))
        if on_finish:
            on_finish(records[-1])
    return records
