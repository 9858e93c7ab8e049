"""The judges' panel: the case file every judge reads, their votes (each distinct model asked once under
greedy decoding), and the verdict, confidence and label probabilities under the label rule (rules.vote)
on the dataset's labels."""
from debate.data.labels import AVERITEC
from debate.data.parsing import number_in, read_fields
from debate.data.prompts import load_prompt, render
from debate.engine import engine
from debate.methods import turns
from debate.methods.courtroom import rules
from debate.methods.courtroom.case import (
    SHOWN,
    SIDE_NAMES,
    SIDES,
    ask,
    field_text,
    format_pool,
    hearing_text,
    passage_text,
    testimony_text,
    tuned,
)


def _seats(agents, opts):
    """Judge seat -> the seat whose vote it shares: seats of one model that all decode greedily vote once."""
    seats = sorted((r for r in agents if r.startswith("judge_")), key=lambda r: int(r.split("_")[1]))
    first, shared = {}, {}
    for seat in seats:
        if opts.temperature_of(seat) > 0:
            shared[seat] = seat  # a sampling seat draws its own vote
            continue
        shared[seat] = first.setdefault((agents[seat].path, agents[seat].adapter), seat)
    return shared


def _number(value):
    return "?" if value is None else f"{value:.2f}"


def _case_file(case, switch_note):
    """The judges' prompt: the whole case record, in the order of the paper's panel prompt."""
    first = case.hearings[0]
    arguments = {side: "\n\n".join(render("courtroom_argument", round=r["round"], text=r.get(side, "").strip())
                                   for r in first.rounds) or "(none)" for side in SIDES}
    testimony = [testimony_text(t, r["round"]) for r in first.rounds for t in r["testimony"]]
    evidence = "\n".join([format_pool(first.pool)] + testimony)
    if len(case.hearings) > 1:
        second = hearing_text(case.hearings[1], "Second hearing, roles swapped")
        # The rerun's own discoveries are numbered after the admitted exhibits, as the first hearing's are:
        # listed apart, so a "Source N" of either hearing names the passage its counsel read.
        found = "\n".join(passage_text(e, i + 1) for i, e in enumerate(case.hearings[1].pool)
                          if e["status"] == "discovered") or "(none)"
        role_switch = render("courtroom_switch", hearing=second, evidence=found,
                             consistency="?" if case.consistency is None else f"{case.consistency:g}")
    else:
        role_switch = render("courtroom_no_switch", note=switch_note)
    prag = "\n".join(render("courtroom_prag", round=q["round"], side=SIDE_NAMES[q["side"]], query=q["query"],
                            admitted=q["admitted"], retrieved=q["retrieved"],
                            novelty=", ".join(f"{n:.2f}" for n in q["novelty"]) or "-",
                            stop=f"; P-RAG stopping criterion held ({q['prag_criterion']})"
                            if q.get("prag_criterion") else "")
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


def judge_cases(agents, cases, opts, settings, streams, switch_note):
    """Every seat's ballot on every case file: (seats, ballots), see `ballots_of`."""
    prompts = [_case_file(case, switch_note) for case in cases]  # every judge reads the same case file
    return ballots_of(agents, cases, prompts, opts, settings, streams, "judge_case")


def ballots_of(agents, cases, prompts, opts, settings, streams, schema_name):
    """(seat -> the seat whose vote it shares, {(case id, seat): (fields, status, reply, verdict probs)}) of
    the judge seats among `agents` on `prompts` (one per case)."""
    seats = _seats(agents, opts)
    ballots = {}
    for k, seat in enumerate(sorted(set(seats.values()))):
        items = [(case, "panel", seat, engine.Conversation(system=load_prompt("judge_meta")), prompt)
                 for case, prompt in zip(cases, prompts)]
        # Each seat samples from its own stream, so seats on one model can disagree when sampling.
        judge = tuned(settings, opts, seat)
        generator = turns.stream(agents, streams, settings.seed + 1 + k, judge)
        for item, reply in zip(items, ask(agents[seat], items, judge, generator, schema_name=schema_name)):
            fields, status = read_fields(reply, JUDGE_KEYS)
            structured = item[3].structured
            probs = structured["probs"].get("Verdict") if structured else None
            ballots[(id(item[0]), seat)] = (fields, "structured" if structured else status, reply, probs)
    return seats, ballots


def panel_note(agents, seats):
    paths = [agents[s].path for s in seats]
    distinct = len(set(paths))
    note = f"{len(paths)} judges on {distinct} distinct model(s)"
    if distinct < len(paths):
        note += ("; judges sharing a model " + ("repeat one vote (greedy decoding)"
                                                if any(seats[s] != s for s in seats) else "sample independently"))
    return {"judges": paths, "distinct_models": distinct, "note": note}


def reflection_total(case, winner, label, labels=AVERITEC):
    """The reflection total delta_ref reads: the winning side's last one in the LAST hearing held (the rerun
    when there was one: the authors' reset_state clears the reflection history before it, main_pipeline.py).
    The side is the plaintiff's for a Supported panel and the defense's otherwise (Not Supported and
    Inconclusive alike, as the authors pick it); None without a verdict, or without self-reflection (A4)."""
    if label is None:
        return None
    supported = winner == rules.PANEL_SUPPORTED if winner else label == labels.supported
    side = "plaintiff" if supported else "defense"
    return case.hearings[-1].reflections.get(side, {}).get("total")


def decide(case, seats, ballots, opts, labels=AVERITEC):
    votes, qualities, reasons = [], [], []
    for seat, source in seats.items():
        fields, status, reply, _ = ballots[(id(case), source)]
        label = rules.panel_label(fields.get("Verdict"))
        votes.append(label)
        scores = [number_in(fields.get(k), 10) for k in ("Evidence Strength", "Argument Validity",
                                                         "Scientific Reliability")]
        if all(s is not None for s in scores):
            qualities.append(10 * sum(scores) / 3)
        reasons.append((label, field_text(fields.get("Justification")), status, reply))
    winner, count, label = rules.vote(votes, opts.split_decision, opts.chief_justice - 1, opts.inconclusive, labels)
    readable = sum(v is not None for v in votes)
    decided_by = (None if label is None else "majority" if count > readable / 2
                  else "chief_justice" if winner is not None else "rule")
    winner_total = reflection_total(case, winner, label, labels)
    conf, parts = rules.confidence(count / len(votes) if votes else 0.0,
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
        lambda said: rules.vote([dict(zip(sources, said))[seats[seat]] for seat in seats], opts.split_decision,
                                opts.chief_justice - 1, opts.inconclusive, labels)[2], labels.labels)
    # Each judge's own vote on the dataset's labels, for its agreement with the gold label (the paper's
    # kappa_GT, Appendix D): an Inconclusive vote stays a class of its own where the dataset has no such label.
    own = {rules.PANEL_SUPPORTED: labels.supported, rules.PANEL_NOT_SUPPORTED: labels.refuted,
           rules.PANEL_INCONCLUSIVE: labels.nei or rules.PANEL_INCONCLUSIVE}
    return {"verdict": label, "justification": chosen[1], "status": status, "label_probs": label_probs}, chosen[3], {
        "votes": votes, "judge_labels": [own.get(v) for v in votes],
        "vote_probs": {seat: vote_probs[seats[seat]] for seat in seats}, "panel_verdict": winner,
        "decided_by": decided_by, "confidence": round(conf, 4),
        "confidence_parts": {k: round(v, 4) for k, v in parts.items()}}


def panel_evidence(pool):
    """The pool the panel read (admitted and discovered), as question-answer evidence for the AVeriTeC score
    (a passage's text stands as the answer to an empty question)."""
    return [{"question": e["passage"].get("question", ""), "answer": e["passage"].get("answer", e["passage"]["text"]),
             "url": e["passage"].get("url", "")} for e in pool if e["status"] in SHOWN]
