"""PROClaim's other measures (Appendices D, E, M and O, sections 4.2 and 4.7), computed from a courtroom run's
saved records, so a run made before they existed can be scored again; no torch, no model.

Each measure is one small function over plain values; `measures` gathers them over a run's predictions
(predictions.jsonl) and the digest of its transcripts (`read_digests`: the counsels' arguments and the
consistency analyzer's reply, nothing else is kept). A measure whose records are missing (an older run,
an ablation without the part it measures) is None, never 0.

What is read, by field:
- panel votes: prediction["votes"] (the judges' Supported / Not Supported / Inconclusive, None unreadable);
- final confidence: prediction["confidence"], correctness: prediction["label"] == gold label;
- rounds and stopping: prediction["rounds"], ["rounds_switched"], ["total_rounds"], ["stop_reason"] and
  prediction["hearings"][k]["stop_reason"] (k = 0 the primary hearing, 1 the role-switched one);
- reflection totals S per round: prediction["hearings"][k]["reflection_totals"] (the sum of both counsels');
- per-round confidence (Appendix E): prediction["hearings"][k]["round_confidence"], one per round of that
  hearing; no run writes it yet, so D_r is None until one does;
- role-play consistency: prediction["consistency_fields"]["Model A" / "Model B"] when saved, else the
  consistency analyzer's reply in the transcript (the turn of round "role-switch", role "critic");
- concessions: the counsels' arguments in the transcript (the turns whose prompt is the argument prompt,
  counsel_argument.txt), per side argued.
"""
import json
import os
import re
import string
from collections import Counter
from pathlib import Path
from typing import Any, Collection, Dict, Iterable, List, Mapping, Optional, Pattern, Sequence, Tuple, Union

from debate.data.parsing import number_in, read_fields
from debate.data.prompts import raw_prompt

UNREADABLE = "(unreadable)"  # an unreadable vote, a class of its own (as in eval/trials.py)

# Appendix M's calibration bins, as the authors' bucket analysis (its Table 12) draws them: one bin below
# 0.5, then one per tenth; the last holds 1.0 itself.
PAPER_ECE_EDGES = (0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)

# Explicit yielding to the other side (Appendix O names "I concede", "you make a good point", "I partially
# agree"); matched case-blind on word boundaries. Ours, in the same sense; see docs/FIDELITY.md.
CONCESSION_MARKERS = ("i concede", "i partially concede", "i agree", "i partially agree", "you make a good point",
                      "you are right", "you are correct", "my opponent is right", "my opponent is correct",
                      "that is a fair point", "that is a valid point", "i must admit", "i acknowledge that my")
_CONCESSION = re.compile(r"\b(?:" + "|".join(re.escape(m).replace(r"\ ", r"\s+") for m in CONCESSION_MARKERS)
                         + r")\b", re.IGNORECASE)

# The paper's own figures, printed beside ours.
PAPER: Dict[str, Any] = {
    "evidence_pool": 67.5, "rounds_total": 5.47, "rounds_total_no_reflection": 7.06, "rounds_primary": "2-3",
    "novelty_share": 0.031, "fleiss_kappa": 0.4513, "ece": 0.034, "reflection_change": 0.3823,
    "role_play": {"plaintiff": 7.80, "defense": 6.22}, "concessions": {"plaintiff": 0.03, "defense": 0.01},
    "ks": "D1 1.14, D2 0.02, D3 0.46, D5 0.16"}


def mean_known(values: Iterable[Any]) -> Optional[float]:
    """The mean of the values that are not None (a measure a record lacks is left out, never counted as 0)."""
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


# --- the panel (Appendix O.4; Appendix D lives in eval/trials.py) -----------------------------------------

def fleiss_kappa(rows: Iterable[Sequence[Any]]) -> Optional[float]:
    """Fleiss' kappa of a panel (Appendix O.4, "judicial conformity", 0.4513 in the paper).

    `rows`: per claim, every judge's verdict (None: unreadable, a category of its own); claims with fewer
    verdicts than the most any claim has are left out (each must have the same raters). With n raters per
    claim and N claims: P_i = (sum_j n_ij^2 - n) / (n (n - 1)), P_bar = mean P_i, p_j = the share of all
    verdicts in category j, P_e = sum_j p_j^2, kappa = (P_bar - P_e) / (1 - P_e); 1.0 when P_e is 1 (every
    verdict alike). None with fewer than two raters or no claim.
    """
    rows = [[UNREADABLE if v is None else v for v in row] for row in rows]
    raters = max((len(r) for r in rows), default=0)
    rows = [r for r in rows if len(r) == raters]
    if raters < 2 or not rows:
        return None
    totals = Counter(v for r in rows for v in r)
    p_e = sum((count / (len(rows) * raters)) ** 2 for count in totals.values())
    p_bar = mean_known([(sum(c * c for c in Counter(r).values()) - raters) / (raters * (raters - 1)) for r in rows])
    # rows is not empty here, so p_bar is a number
    return 1.0 if p_e >= 1 - 1e-12 else (p_bar - p_e) / (1 - p_e)  # type: ignore[operator]


# --- calibration (Appendix M, Eq. 9) ---------------------------------------------------------------------

def expected_calibration_error(confidences: Iterable[float], corrects: Iterable[bool],
                               edges: Sequence[float] = PAPER_ECE_EDGES) -> Dict[str, Any]:
    """ECE = sum_m |B_m| / N * |acc(B_m) - conf(B_m)| (Eq. 9): bin m holds the predictions whose
    confidence c lies in [edges[m], edges[m+1]) (the last bin includes its upper edge), acc is the share
    right in the bin and conf its mean confidence. Returns {"ece", "n", "bins": [{low, high, n, accuracy,
    confidence}]}, "ece" None for no prediction."""
    pairs = list(zip(confidences, corrects))
    bins: List[Dict[str, Any]] = []
    for m, (low, high) in enumerate(zip(edges, edges[1:])):
        last = m == len(edges) - 2
        inside = [(c, ok) for c, ok in pairs if low <= c < high or (last and c == high)]
        bins.append({"low": low, "high": high, "n": len(inside),
                     "accuracy": mean_known([float(ok) for _, ok in inside]),
                     "confidence": mean_known([c for c, _ in inside])})
    n = len(pairs)
    ece = sum(b["n"] / n * abs(b["accuracy"] - b["confidence"]) for b in bins if b["n"]) if n else None
    return {"ece": ece, "n": n, "bins": bins}


def calibration(predictions: Sequence[Dict[str, Any]], references: Mapping[Any, Optional[str]]) -> Dict[str, Any]:
    """Eq. 9 over a run's claims as the authors' calibration analysis takes them: claims with a gold label and
    a verdict, leaving out those the panel found Inconclusive (their verdict is the rule's, not the
    panel's); correct = the label equals the gold one."""
    kept = [p for p in predictions if references.get(p["claim_id"]) is not None and p.get("label") is not None
            and p.get("confidence") is not None and p.get("panel_verdict") != "Inconclusive"]
    return expected_calibration_error([p["confidence"] for p in kept],
                                      [p["label"] == references[p["claim_id"]] for p in kept])


# --- stability (Appendix E) ------------------------------------------------------------------------------

def ks_statistic(a: Sequence[float], b: Sequence[float]) -> Optional[float]:
    """The two-sample Kolmogorov-Smirnov statistic sup_x |F_a(x) - F_b(x)| of two samples' empirical
    distribution functions; None when either is empty."""
    if not a or not b:
        return None
    a, b = sorted(a), sorted(b)
    i = j = 0
    worst = 0.0
    while i < len(a) and j < len(b):
        x = min(a[i], b[j])
        while i < len(a) and a[i] == x:
            i += 1
        while j < len(b) and b[j] == x:
            j += 1
        worst = max(worst, abs(i / len(a) - j / len(b)))
    return worst


def aggregate_rounds(prediction: Dict[str, Any], key: str) -> Optional[List[Any]]:
    """The per-round values `key` of a claim's hearings, primary then role-switched, as one sequence: the
    paper's aggregate round index r runs across both (Appendix E). None when a hearing lacks them."""
    hearings = prediction.get("hearings") or []
    if not hearings or any(not isinstance(h.get(key), list) for h in hearings):
        return None
    return [v for h in hearings for v in h[key]]


def ks_stability(per_claim_rounds: Sequence[Optional[Sequence[Any]]], finals: Sequence[float],
                 max_round: int = 8) -> Dict[str, Dict[str, Any]]:
    """Appendix E's D_r: the KS statistic between the distribution over claims of the confidence at aggregate
    round r and the distribution of the final confidence, for r = 1..max_round (Table 10 shows eight).
    `per_claim_rounds`: each claim's per-round confidences (aggregate rounds); a claim whose debate ended
    before round r is not in round r's sample. Returns {"r": {"D", "claims"}}; {} without per-round data."""
    out: Dict[str, Dict[str, Any]] = {}
    for r in range(1, max_round + 1):
        sample = [rounds[r - 1] for rounds in per_claim_rounds if rounds and len(rounds) >= r
                  and rounds[r - 1] is not None]
        if sample:
            out[str(r)] = {"D": ks_statistic(sample, finals), "claims": len(sample)}  # JSON's keys are text
    return out


# --- argument integrity (Appendix O, section 4.7) --------------------------------------------------------

def reflection_changes(hearings_totals: Iterable[Iterable[Sequence[Optional[float]]]]) -> Dict[str, Any]:
    """Appendix O.3's Delta S: the mean over consecutive rounds of a hearing of |S_t - S_(t-1)|, S the
    round's reflection total (the sum of both counsels'), pooled over every hearing of every claim; a round
    without a total is compared with nothing. Also, per aggregate round r (primary then role-switched
    hearing), the mean signed change S_t - S_(t-1) with S_0 = 0 at the start of each hearing: what the
    authors' logs record as the "score delta" (their 0.3823 is the mean of these, and their Table 10 the
    means per aggregate round; see docs/FIDELITY.md). `hearings_totals`: per claim, a list of per-hearing
    lists of S."""
    absolute: List[float]
    signed: List[float]
    by_round: Dict[int, List[float]]  # aggregate round -> its signed changes
    absolute, signed, by_round = [], [], {}
    for claim in hearings_totals:
        r = 0
        for totals in claim:
            previous: Optional[float] = 0.0
            for t, s in enumerate(totals):
                r += 1
                if s is not None and previous is not None:
                    signed.append(s - previous)
                    by_round.setdefault(r, []).append(s - previous)
                    if t > 0:
                        absolute.append(abs(s - previous))
                previous = s
    return {"mean_abs_change": mean_known(absolute), "pairs": len(absolute),
            "mean_signed_from_zero": mean_known(signed),
            "signed_by_round": {str(r): mean_known(v) for r, v in sorted(by_round.items())}}


def concession_rate(texts: Sequence[str]) -> Dict[str, Any]:
    """Appendix O.2: explicit concessions (CONCESSION_MARKERS) per 1,000 words of a side's arguments.
    `texts`: that side's argument texts. {"concessions", "words", "per_1000"} (per_1000 None without words)."""
    words = sum(len(t.split()) for t in texts)
    found = sum(len(_CONCESSION.findall(t)) for t in texts)
    return {"concessions": found, "words": words, "per_1000": 1000 * found / words if words else None}


def role_play_consistency(pairs: Sequence[Tuple[Optional[float], Optional[float]]]) -> Dict[str, Any]:
    """Appendix O.1: the consistency analyzer's 0-10 score of each model across the role switch, averaged
    over claims: "plaintiff" is the model that argued for the claim first (Model A), "defense" the other
    (Model B), as the paper reports them. `pairs`: per claim (score A, score B), either None."""
    return {"plaintiff": mean_known([a for a, _ in pairs]), "defense": mean_known([b for _, b in pairs]),
            "claims": sum(a is not None or b is not None for a, b in pairs)}


# --- debate dynamics (section 4.2, Figure 2) -------------------------------------------------------------

def termination(predictions: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Why the hearings ended, as shares: of the primary hearings (Figure 2's "debate instances"), of the
    role-switched ones, and of all; with mean rounds per claim: primary, role-switched and total."""
    def shares(reasons: List[Optional[str]]) -> Dict[str, Any]:
        reasons = [r or "unknown" for r in reasons]
        counts = Counter(reasons)
        return {"n": len(reasons), "shares": {r: c / len(reasons) for r, c in counts.most_common()}}

    primary = [p.get("stop_reason") for p in predictions]
    switched = [h.get("stop_reason") for p in predictions for h in (p.get("hearings") or [])[1:]]
    return {"primary": shares(primary), "switched": shares(switched), "all": shares(primary + switched),
            "rounds_primary": mean_known([p.get("rounds") for p in predictions]),
            "rounds_switched": mean_known([p.get("rounds_switched") for p in predictions]),
            "rounds_total": mean_known([p.get("total_rounds", p.get("rounds")) for p in predictions])}


def evidence_pool(predictions: Sequence[Dict[str, Any]]) -> Dict[str, Optional[float]]:
    """Table 5's evidence pool per claim in both units: "returned", the passages returned by all retrieval calls
    (the authors' count, run_eval_extended.py: the unit of the paper's 67.5) and "distinct", the distinct passages
    the hearings' pools held; None where no record says."""
    return {"returned": mean_known([p.get("retrieved") for p in predictions]),
            "distinct": mean_known([p.get("evidence_pool") for p in predictions])}


def discovery_by_round(predictions: Sequence[Dict[str, Any]]) -> Optional[Dict[str, Dict[str, Dict[str, Any]]]]:
    """P-RAG's discovery round by round (Figure 3 and Table 5's pool), from each hearing's round_log: for the
    primary and the role-switched hearings apart, per round number, how many hearings held that round, and
    their mean passages retrieved and admitted that round, pool size after it, and novelty of what was
    retrieved (None where no hearing of that round retrieved). None for a run without round logs."""
    phases: Dict[str, Dict[int, List[Dict[str, Any]]]] = {"primary": {}, "switched": {}}  # phase -> round -> its logs
    for p in predictions:
        for k, hearing in enumerate(p.get("hearings") or []):
            for r in hearing.get("round_log") or []:
                phases["primary" if k == 0 else "switched"].setdefault(r["round"], []).append(r)
    if not any(phases.values()):
        return None
    return {phase: {str(n): {"hearings": len(rows),  # JSON's keys are text
                        "retrieved": mean_known([sum(q.get("retrieved", 0) for q in r["queries"]) for r in rows]),
                        "admitted": mean_known([len(r.get("admitted") or []) for r in rows]),
                        "pool_size": mean_known([r.get("pool_size") for r in rows]),
                        "novelty": mean_known([r.get("novelty") for r in rows])}
                    for n, rows in sorted(by_round.items())}
            for phase, by_round in phases.items()}


# --- the records -----------------------------------------------------------------------------------------

def _template(name: str) -> Pattern[str]:
    """A regular expression matching any rendering of prompt `name` (each placeholder: any text)."""
    parts = string.Formatter().parse(raw_prompt(name))
    return re.compile("".join(re.escape(text) + (".*?" if field is not None else "") for text, field, _, _ in parts),
                      re.DOTALL)


def _score(value: Any) -> Optional[float]:
    share = number_in(value, 10)
    return None if share is None else 10 * share


def digest_transcript(row: Dict[str, Any], argument: Optional[Pattern[str]] = None) -> Dict[str, Any]:
    """What the measures read of one transcript line: {"arguments": {side: [text, ...]}, "consistency":
    (score A, score B) or None}. `argument`: the compiled argument-prompt pattern (compiled once by callers)."""
    argument = argument or _template("counsel_argument")
    arguments: Dict[str, List[str]]
    consistency: Optional[Tuple[Optional[float], Optional[float]]]
    arguments, consistency = {"plaintiff": [], "defense": []}, None
    for turn in row.get("turns", []):
        role, prompt = turn.get("role"), turn.get("prompt") or ""
        if role in arguments and "schema" not in turn and argument.fullmatch(prompt):
            arguments[role].append(turn.get("response") or "")
        elif role == "critic" and turn.get("round") == "role-switch":
            fields = read_fields(turn.get("response") or "", ("Model A", "Model B", "Contradictions", "Consistency"))[0]
            consistency = (_score(fields.get("Model A")), _score(fields.get("Model B")))
    return {"arguments": arguments, "consistency": consistency}


def read_digests(run_dir: Union[str, os.PathLike],
                 wanted: Optional[Collection[Any]] = None) -> Dict[Any, Dict[str, Any]]:
    """{claim_id: digest_transcript(...)} of a run directory's transcripts.jsonl, read line by line (the
    prompts are long; only the digest is kept); {} when the file is missing. `wanted`: claim ids to keep."""
    path = Path(run_dir) / "transcripts.jsonl"
    if not path.is_file():
        return {}
    argument, out = _template("counsel_argument"), {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line: the claim is not in predictions.jsonl either
            if wanted is None or row.get("claim_id") in wanted:
                out[row.get("claim_id")] = digest_transcript(row, argument)
    return out


def _consistency_pair(prediction: Dict[str, Any], digest: Optional[Dict[str, Any]]) -> Optional[Tuple[Any, Any]]:
    saved = prediction.get("consistency_fields")
    if isinstance(saved, dict) and ("Model A" in saved or "Model B" in saved):
        return _score(saved.get("Model A")), _score(saved.get("Model B"))
    return (digest or {}).get("consistency")


def measures(predictions: Sequence[Dict[str, Any]], references: Mapping[Any, Optional[str]],
             digests: Optional[Iterable[Optional[Dict[str, Any]]]] = None) -> Dict[str, Any]:
    """Every measure of this module over one set of predictions (a run, or several pooled): `references`
    {claim_id: gold label}, `digests` one digest_transcript(...) per prediction, in order (None for a claim
    without one; the whole list None: the transcript measures are None)."""
    totals = [[h.get("reflection_totals") or [] for h in p.get("hearings") or []] for p in predictions]
    per_round = [aggregate_rounds(p, "round_confidence") for p in predictions]
    finals = [p["confidence"] for p in predictions if p.get("confidence") is not None]
    out = {"claims": len(predictions), "termination": termination(predictions),
           "discovery_by_round": discovery_by_round(predictions), "evidence_pool": evidence_pool(predictions),
           "fleiss_kappa": fleiss_kappa([p.get("votes") or [] for p in predictions]),
           "calibration": calibration(predictions, references),
           "ks_stability": ks_stability([r for r in per_round if r], finals) or None,
           "reflection_change": reflection_changes(totals) if any(any(t) for t in totals) else None,
           "role_play_consistency": None, "concession_rate": None}
    if digests is not None:
        seen = list(digests)
        pairs = [_consistency_pair(p, d) for p, d in zip(predictions, seen)]
        pairs = [pair for pair in pairs if pair is not None]
        # pairs holds no None any more (filtered just above); mypy cannot see that
        out["role_play_consistency"] = role_play_consistency(pairs) if pairs else None  # type: ignore[arg-type]
        if any(d for d in seen):
            out["concession_rate"] = {side: concession_rate([t for d in seen if d for t in d["arguments"][side]])
                                      for side in ("plaintiff", "defense")}
    return out


# --- text ------------------------------------------------------------------------------------------------

def _f(value: Optional[float], digits: int = 3, percent: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{100 * value:.1f}%" if percent else f"{value:.{digits}f}"


def measures_text(m: Dict[str, Any]) -> str:
    """The measures as lines, the paper's figure after each ("paper ...")."""
    term = m["termination"]
    shares = ", ".join(f"{r} {_f(s, percent=True)}" for r, s in term["primary"]["shares"].items()) or "n/a"
    lines = [f"rounds per claim    primary {_f(term['rounds_primary'], 2)}, role-switched "
             f"{_f(term['rounds_switched'], 2)}, total {_f(term['rounds_total'], 2)}   (paper: primary "
             f"{PAPER['rounds_primary']}, total {PAPER['rounds_total']}; {PAPER['rounds_total_no_reflection']} "
             "without self-reflection)",
             f"primary hearings ended by  {shares}   (paper: mostly reflection plateau or judicial signal, "
             f"novelty {_f(PAPER['novelty_share'], percent=True)})"]
    if term["switched"]["n"]:
        lines.append("role-switched ended by     " + ", ".join(
            f"{r} {_f(s, percent=True)}" for r, s in term["switched"]["shares"].items()))
    found = m.get("discovery_by_round")
    for phase in ("primary", "switched"):
        rounds = (found or {}).get(phase)
        if rounds:
            lines.append(f"P-RAG by round, {phase + ' ' * (8 - len(phase))} " + " | ".join(
                f"r{n}: pool {_f(v['pool_size'], 1)}, +{_f(v['admitted'], 1)} of {_f(v['retrieved'], 1)}, "
                f"novelty {_f(v['novelty'], 2)} ({v['hearings']})" for n, v in rounds.items())
                + ("   (paper: novelty near 0.20 from round 4)" if phase == "primary" else ""))
    pool = m.get("evidence_pool") or {}
    if pool.get("returned") is not None or pool.get("distinct") is not None:
        lines.append(f"evidence pool a claim  {_f(pool.get('returned'), 1)} passages returned by all retrieval calls "
                     f"(paper {PAPER['evidence_pool']}, Table 5's unit), {_f(pool.get('distinct'), 1)} distinct")
    lines.append(f"Fleiss' kappa       {_f(m['fleiss_kappa'], 4)}   (paper {PAPER['fleiss_kappa']})")
    cal = m["calibration"]
    lines.append(f"ECE (Eq. 9)         {_f(cal['ece'], 4)} over {cal['n']} claims, bins "
                 + " ".join(f"[{b['low']:.1f},{b['high']:.1f}{']' if b is cal['bins'][-1] else ')'}:{b['n']}"
                            for b in cal["bins"])
                 + f"   (paper {PAPER['ece']})")
    ks = m["ks_stability"]
    lines.append("KS stability D_r    " + (" ".join(f"D{r} {v['D']:.3f}" for r, v in ks.items()) if ks else
                                          "n/a (the records hold no per-round confidence)")
                 + f"   (paper {PAPER['ks']})")
    ref = m["reflection_change"]
    if ref:
        lines.append(f"reflection change   |dS| per round {_f(ref['mean_abs_change'], 4)} over {ref['pairs']} "
                     f"round pairs; authors' signed delta from 0: {_f(ref['mean_signed_from_zero'], 4)}, by "
                     "aggregate round " + " ".join(f"{r}:{v:.3f}" for r, v in ref["signed_by_round"].items()
                                                   if v is not None) + f"   (paper {PAPER['reflection_change']})")
    else:
        lines.append("reflection change   n/a (no reflection totals: self-reflection off, or an older run)")
    rp = m["role_play_consistency"]
    lines.append("role-play /10       " + (f"plaintiff {_f(rp['plaintiff'], 2)}, defense {_f(rp['defense'], 2)} "
                                           f"over {rp['claims']} claims" if rp else "n/a (no role switch)")
                 + f"   (paper {PAPER['role_play']['plaintiff']}, {PAPER['role_play']['defense']})")
    cr = m["concession_rate"]
    lines.append("concessions /1000w  " + (", ".join(f"{side} {_f(v['per_1000'], 2)} ({v['concessions']} in "
                                                     f"{v['words']:,} words)" for side, v in cr.items())
                                           if cr else "n/a (no transcripts)")
                 + f"   (paper {PAPER['concessions']['plaintiff']}, {PAPER['concessions']['defense']})")
    return "\n".join(lines)
