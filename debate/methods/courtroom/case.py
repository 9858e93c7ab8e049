"""What every stage of the courtroom shares: the case and hearing records, the retrieval library, one
batched turn of a role (`ask`, which also counts each role's tokens per stage) and the texts the roles read
(the evidence pool, recent messages, testimony)."""
import re
from collections import defaultdict
from dataclasses import dataclass, field, replace

from debate.data import knowledge_store
from debate.data.parsing import read_fields
from debate.data.prompts import load_prompt, render
from debate.engine import engine, retrieval, store_search
from debate.methods import turns

SIDES = ("plaintiff", "defense")


SIDE_NAMES = {"plaintiff": "Plaintiff Counsel", "defense": "Defense Counsel"}


# Pool statuses the counsels, the witness and the judges see: what the court admitted and what P-RAG
# discovered. Disputed, dropped and unscored candidates stay out of the debate (the paper's section 2.3).
SHOWN = ("admitted", "discovered")


POOL_ORDER = {s: k for k, s in enumerate(("admitted", "disputed", "unscored", "dropped"))}


@dataclass
class Library:
    """What the courtroom retrieves with: the encoder and the corpus index shared by every claim."""
    embedder: object
    corpus: object = None  # retrieval.Index, or None: each claim searches its own evidence
    source: str = "claim evidence"  # what the corpus is, for the record
    store: str = None  # a --knowledge-store directory: each claim searches its own store file instead
    bm25_k: int = 500  # a store's sentences BM25 passes to the dense search (the stage's --bm25-k)


def library_from(options, passages=None, store=None, bm25_k=500):
    """The encoder and corpus index of `options` (a Courtroom config): the --corpus file, else `passages`
    (the dataset's own corpus, a list of {id, text, url?, title?}), else none; --claim-evidence-only: none.
    With `store` (--knowledge-store) each claim searches BM25's `bm25_k` best sentences of its own store file."""
    embedder = retrieval.load_embedder(options.embedder)
    if options.claim_evidence_only:
        return Library(embedder)
    if store:
        return Library(embedder, source=f"knowledge store {store}", store=str(store), bm25_k=bm25_k)
    if options.corpus:
        return Library(embedder, retrieval.corpus_index(options.corpus, embedder), str(options.corpus))
    if passages:
        return Library(embedder, retrieval.passage_index(passages, embedder, source="the dataset's corpus"),
                       "dataset corpus")
    return Library(embedder)


def index_for(library, claim):
    """The index `claim` searches: its own knowledge-store file, else the shared corpus, else its own evidence."""
    if library.store:  # built once per claim (its Case holds it), its embeddings once per store (on disk)
        return _store_index(library, claim)
    return library.corpus or retrieval.index_of(retrieval.evidence_passages(claim), library.embedder)


def _store_index(library, claim):
    """The dense index of the claim's store as the debate stage searches it: BM25's `library.bm25_k` best sentences
    for the claim, streamed from the file, and only those embedded (cached on disk by the file's content); a claim
    without a store file (--missing-store skip) searches its own evidence."""
    path = knowledge_store.store_file(library.store, claim["claim_id"])
    if not path.is_file():
        return retrieval.index_of(retrieval.evidence_passages(claim), library.embedder)
    return store_search.store_index(path, claim["claim"], library.bm25_k, library.embedder)


@dataclass
class Hearing:
    counsels: dict  # side -> the RoleModel that argues it
    speakers: dict  # side -> the role whose model argues it (swapped in the rerun; its temperature goes with it)
    convs: dict  # critic, court -> engine.Conversation (the counsels' turns are stateless, one-shot)
    pool: list  # the current evidence pool: admitted exhibits, then what P-RAG discovered {"passage", "status", ...}
    vectors: object  # P-RAG's novelty pool: embeddings of what P-RAG accepted (and, in the rerun, the exhibits)
    messages: list = field(default_factory=list)  # (speaker, text) in order: the debate history
    rounds: list = field(default_factory=list)  # per round {"round", "plaintiff", "defense", "testimony", ...}
    totals: list = field(default_factory=list)  # reflection total per round: the SUM of both counsels' (S_total)
    reflections: dict = field(default_factory=dict)  # side -> its last reflection
    reflection_log: list = field(default_factory=list)  # every reflection, for the judges
    novelty_means: list = field(default_factory=list)  # per round: mean novelty of what P-RAG admitted, 0 if none
    relevance: list = field(default_factory=list)  # mean query cosine of each round's admitted passages
    queries: list = field(default_factory=list)  # every P-RAG call, in order
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
    pool: list = field(default_factory=list)  # every negotiated candidate, with its admissibility status
    hearings: list = field(default_factory=list)
    consistency: float = None  # 0-10
    consistency_fields: dict = field(default_factory=dict)
    tokens: dict = field(default_factory=lambda: defaultdict(lambda: [0, 0]))  # (role, stage) -> [in, out]
    retrieval_calls: int = 0
    retrieved: int = 0  # passages returned by all retrieval calls (the authors' per-claim "evidence" count)


def tuned(settings, opts, role):
    """`settings` at the temperature of `role` (a role name or judge seat); the engine keeps one setting."""
    return replace(settings, temperature=opts.temperature_of(role))


def generator_of(agents, streams, seed, settings, opts):
    """The random stream of `seed`, or None when no role samples."""
    hottest = max(opts.temperature_of(role) for role in agents)
    return turns.stream(agents, streams, seed, replace(settings, temperature=hottest))


STAGES = {"premises": "premises", "negotiation": "negotiation", "first": "primary_debate",
          "switched": "role_switch_debate", "role-switch": "consistency", "panel": "panel", "debate": "debate",
          "verdict": "verdict"}


def stage_of(stage):
    """The cost stage of a transcript stage ("first-3" -> "primary_debate")."""
    return STAGES[str(stage).split("-")[0] if str(stage) != "role-switch" else "role-switch"]


def token_report(case):
    """Tokens in (the prompt an API would bill) and out, in total, per role and per stage (Appendix P)."""
    def summed(key):
        out = {}
        for (role, stage), (n_in, n_out) in case.tokens.items():
            name = role if key == 0 else stage
            out.setdefault(name, {"in": 0, "out": 0})
            out[name]["in"] += n_in
            out[name]["out"] += n_out
        return out

    total_in = sum(v[0] for v in case.tokens.values())
    total_out = sum(v[1] for v in case.tokens.values())
    return {"in": total_in, "out": total_out, "total": total_in + total_out, "by_role": summed(0),
            "by_stage": summed(1)}


def reply_fields(reply, keys):
    return read_fields(reply, keys)[0]


def field_text(value):
    return value.strip() if isinstance(value, str) else ""


def named_word(value, words):
    """The first of `words` a reply field starts with (case-blind), else None; a copied "Wait or Close"
    names both and decides nothing."""
    found = re.findall(r"[a-z]+", str(value).lower()) if value is not None else []
    named = [w for w in found if w in words]
    return named[0] if len(set(named)) == 1 else None


def ask(agent, items, settings, generator, one_shot=True, schema_name=None):
    """One batched turn over (case, stage, role, conversation, prompt) items; returns the replies.

    A one-shot conversation (a single question) gives its cache back at once; a hearing's conversations
    keep theirs for their next turn. `schema_name`: the prompt whose JSON answer is asked for.
    """
    before = [(i[3].prompt_tokens, i[3].completion_tokens) for i in items]
    replies = turns.speak(agent, [i[3] for i in items], [i[4] for i in items], settings, generator, schema_name)
    for (case, stage, role, conv, prompt), reply, (n_in, n_out) in zip(items, replies, before):
        spent = case.tokens[(role, stage_of(stage))]
        spent[0] += conv.prompt_tokens - n_in
        spent[1] += conv.completion_tokens - n_out
        case.said.append({"round": stage, "role": role, "prompt": prompt, "response": reply,
                          **turns.structured_note(conv)})
        if not any(c is conv for c in case.convs):  # identity: two conversations may hold equal text
            case.convs.append(conv)
        if one_shot:
            conv.drop_cache()
    return replies


def passage_text(entry, index):
    p = entry["passage"]
    return render("courtroom_passage", index=index, text=p["text"], url=p.get("url") or "(no source given)")


def format_pool(pool):
    """The evidence pool as the counsels, the witness and the judges read it, numbered by pool position;
    only what SHOWN lets through (the hearing's pool holds nothing else)."""
    return "\n".join(passage_text(e, i + 1) for i, e in enumerate(pool) if e["status"] in SHOWN) or "(none)"


def court_conversation(case):
    return engine.Conversation(system=render("court_meta", claim=case.claim["claim"]))


def counsel_conversation(side):
    """A fresh conversation of one counsel turn: each per-turn prompt carries all the counsel reads
    (the paper's stateless per-turn prompts, H.3-H.4), so nothing of an earlier turn is carried over."""
    return engine.Conversation(system=render("counsel_meta", side=SIDE_NAMES[side],
                                             stance=load_prompt(f"counsel_stance_{side}")))


def recent_messages(hearing, n=4):
    """The last `n` messages of the proceedings (four: P-RAG's debate context, Appendix I)."""
    return "\n".join(f"{speaker}: {text}" for speaker, text in hearing.messages[-n:]) or "(nothing yet)"


def own_arguments(hearing, side, n=2):
    """A counsel's last `n` arguments (self-reflection reads its own two and the opponent's two, H.7)."""
    said = [r[side].strip() for r in hearing.rounds if r.get(side)]
    return "\n\n".join(said[-n:]) or "(none yet)"


def testimony_text(t, round_no):
    return render("courtroom_testimony", expert=t["expert"], round=round_no, side=SIDE_NAMES[t["side"]],
                  answer=t["answer"])


def round_record(hearing):
    r = hearing.rounds[-1]
    testimony = "".join("\n" + testimony_text(t, r["round"]) for t in r["testimony"])
    return render("courtroom_round", round=r["round"], plaintiff=r.get("plaintiff", "").strip(),
                  defense=r.get("defense", "").strip(), testimony=testimony)


def hearing_text(hearing, title):
    rounds = []
    for r in hearing.rounds:
        testimony = "".join("\n" + testimony_text(t, r["round"]) for t in r["testimony"])
        rounds.append(render("courtroom_round", round=r["round"], plaintiff=r.get("plaintiff", "").strip(),
                             defense=r.get("defense", "").strip(), testimony=testimony))
    return render("courtroom_hearing", title=title, rounds="\n\n".join(rounds))
