"""Before the hearing: premises, then evidence negotiation and admissibility (PROClaim section 2.3).

Seed retrieval with the claim itself, shared retrieval per premise, and a supporting and a challenging
query (the argument miner writes them) for each counsel's pool; each counsel then sees the shared pool and
both sides' pools and names what it discloses and what it challenges (negotiation injection); the court
rates every candidate's relevance and credibility; weight = product, admitted / disputed / dropped by the
two thresholds (rules.admissibility). Only the admitted items go on to the hearing (hearing.open_hearing)."""
import re

from debate.data.parsing import number_in
from debate.data.prompts import render
from debate.engine import engine, retrieval
from debate.methods.courtroom import rules
from debate.methods.courtroom.case import (
    POOL_ORDER,
    SIDE_NAMES,
    SIDES,
    Case,
    ask,
    counsel_conversation,
    court_conversation,
    field_text,
    generator_of,
    passage_text,
    reply_fields,
    tuned,
)

MAX_PREMISES = 10  # a guard against runaway lists; the paper sets no number


def mine_premises(agents, cases, opts, settings, generator):
    """The argument miner's premises (the paper runs it on the critic's model)."""
    items = [(c, "premises", "critic", engine.Conversation(system=""),
              render("critic_premises", claim=c.claim["claim"])) for c in cases]
    for case, reply in zip(cases, ask(agents["critic"], items, tuned(settings, opts, "critic"), generator,
                                       schema_name="critic_premises")):
        value = reply_fields(reply, ("Premises",)).get("Premises")
        lines = value if isinstance(value, list) else field_text(value).splitlines()
        premises = [re.sub(r"^\W*\d*[.)]?\s*", "", str(p)).strip() for p in lines]
        case.premises = [p for p in premises if p][:MAX_PREMISES] or [case.claim["claim"]]


def write_stance_queries(agents, cases, opts, settings, generator):
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
    for (case, *_), side, reply in zip(items, sides, ask(agents["critic"], items, tuned(settings, opts, "critic"),
                                                          generator, schema_name="counsel_search")):
        case.stance_queries[side] = field_text(reply_fields(reply, ("Query",)).get("Query")) or case.claim["claim"]


def negotiation_queries(agents, claims, settings, options, streams=None):
    """The queries the courtroom's evidence negotiation retrieves with, per claim:
    {"premises": [...], "stance": {"plaintiff": query, "defense": query}} (for the retrieval benchmark).
    `options`: a run config's Courtroom group."""
    opts = options
    generator = generator_of(agents, streams, settings.seed, settings, opts)
    cases = [Case(claim=c, index=None) for c in claims]
    mine_premises(agents, cases, opts, settings, generator)
    write_stance_queries(agents, cases, opts, settings, generator)
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
        return "\n".join(passage_text({"passage": case.index.passages[p], "status": "admitted"}, numbers[p])
                         for p in positions) or "(none)"

    for side in SIDES:
        other = SIDES[1 - SIDES.index(side)]
        items = []
        for case in cases:
            found = pools[id(case)]
            numbers = {p: k + 1 for k, p in enumerate(found["all"])}
            prompt = render("counsel_disclosure", shared=listing(case, found["shared"], numbers),
                            own=listing(case, found[side], numbers), other=listing(case, found[other], numbers))
            items.append((case, "negotiation", side, counsel_conversation(side), prompt))
        for case, reply in zip(cases, ask(agents[side], items, tuned(settings, opts, side), generator,
                                           schema_name="counsel_disclosure")):
            fields = reply_fields(reply, ("Disclose", "Challenge"))
            case.disclosures[side] = {k: _numbers(fields.get(k)) for k in ("Disclose", "Challenge")}


def negotiate(agents, cases, opts, library, settings, generator):
    """Seed retrieval with the claim, shared retrieval per premise, stance-conditioned retrieval per side,
    the counsels' disclosures, then admissibility."""
    write_stance_queries(agents, cases, opts, settings, generator)
    pools = {}
    for case in cases:
        groups = [("shared", [case.claim["claim"]], opts.seed_k)] if opts.seed_k else []
        groups += [("shared", case.premises, opts.top_k)] + [(s, [case.stance_queries[s]], opts.top_k) for s in SIDES]
        found = {"shared": [], "plaintiff": [], "defense": [], "all": []}
        vectors = retrieval.embed(library.embedder, [q for _, queries, _ in groups for q in queries])
        row = 0
        for pool, queries, k in groups:
            for hits in retrieval.search(case.index, vectors[row:row + len(queries)], k):
                case.retrieval_calls += 1
                case.retrieved += len(hits)
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
                            passage=passage_text(dict(entry, status="admitted"), 1))
            scoring.append((case, entry, (case, "negotiation", "court", court_conversation(case), prompt)))
    replies = ask(agents["court"], [s[2] for s in scoring], tuned(settings, opts, "court"), generator,
                   schema_name="court_admissibility")
    for (case, entry, _), reply in zip(scoring, replies):
        fields = reply_fields(reply, ("Relevance", "Credibility"))
        entry["weight"], entry["status"] = rules.admissibility(
            number_in(fields.get("Relevance"), 1), number_in(fields.get("Credibility"), 1),
            opts.admit_threshold, opts.dispute_threshold)
        case.pool.append(entry)
    for case in cases:
        # Admitted first, strongest first (section 2.3): the hearing's pool keeps this order.
        case.pool.sort(key=lambda e: (POOL_ORDER[e["status"]], -(e["weight"] or 0)))
