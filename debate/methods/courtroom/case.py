"""What every stage of the courtroom shares: the case and hearing records, the retrieval library, one
batched turn of a role (`ask`) and the texts the roles read (the evidence pool, recent messages, testimony)."""
import re
from dataclasses import dataclass, field, replace

from debate.data.parsing import read_fields
from debate.data.prompts import load_prompt, render
from debate.engine import engine, retrieval
from debate.methods import turns


SIDES = ("plaintiff", "defense")


SIDE_NAMES = {"plaintiff": "Plaintiff Counsel", "defense": "Defense Counsel"}


SHOWN = ("admitted", "discovered", "disputed", "unscored")  # pool statuses the counsels and the panel see


POOL_ORDER = {s: k for k, s in enumerate(("admitted", "disputed", "unscored", "dropped"))}


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
    prag_stop: str = None  # why P-RAG stopped retrieving (rules.prag_exit), None while it runs
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


def tuned(settings, opts, role):
    """`settings` at the temperature of `role` (a role name or judge seat); the engine keeps one setting."""
    key = "judge" if role.startswith("judge_") else TEMPERATURE_OF[role]
    return replace(settings, temperature=opts.temperatures[key])


def generator_of(agents, streams, seed, settings, opts):
    """The random stream of `seed`, or None when no role samples."""
    return turns.stream(agents, streams, seed, replace(settings, temperature=max(opts.temperatures.values())))


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
    replies = turns.speak(agent, [i[3] for i in items], [i[4] for i in items], settings, generator, schema_name)
    for (case, stage, role, conv, prompt), reply in zip(items, replies):
        case.said.append({"round": stage, "role": role, "prompt": prompt, "response": reply,
                          **turns.structured_note(conv)})
        if not any(c is conv for c in case.convs):  # identity: two conversations may hold equal text
            case.convs.append(conv)
        if one_shot:
            conv.drop_cache()
    return replies


def passage_text(entry, index):
    p = entry["passage"]
    status = "" if entry["status"] in ("admitted", "discovered") else f" (evidence {entry['status']})"
    return render("courtroom_passage", index=index, text=p["text"], url=p.get("url") or "(no source given)",
                  status=status)


def format_pool(pool, start=0):
    """The counsels' view of pool entries from position `start` on, numbered by pool position."""
    shown = [(i, e) for i, e in enumerate(pool) if i >= start and e["status"] in SHOWN]
    return "\n".join(passage_text(e, i + 1) for i, e in shown) or "(none)"


def court_conversation(case):
    return engine.Conversation(system=render("court_meta", claim=case.claim["claim"]))


def counsel_system(case, side):
    return render("counsel_meta", side=SIDE_NAMES[side], stance=load_prompt(f"counsel_stance_{side}"),
                  instruction=load_prompt(f"counsel_instruction_{side}"), claim=case.claim["claim"],
                  evidence=format_pool(case.pool))


def recent_messages(hearing, n=4):
    """The last `n` messages of the proceedings (P-RAG's debate context)."""
    return "\n".join(f"{speaker}: {text}" for speaker, text in hearing.messages[-n:]) or "(nothing yet)"


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
