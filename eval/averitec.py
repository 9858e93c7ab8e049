"""AVeriTeC scoring: label metrics and the evidence-aware AVeriTeC score.

The AVeriTeC score follows the official scorer (Schlichtkrull et al., 2023): per claim, the
predicted evidence strings (at most 10) and the gold strings are compared with pairwise METEOR,
the best one-to-one assignment is found (Hungarian, maximising), and its sum divided by the number
of gold strings is the claim's evidence score. At level L a claim counts when its evidence score is
strictly above L and its label is right; the score is the share of scored claims that count.
Where the reference has a gold justification, the predicted one is scored against it with the same
METEOR (and, for a run refined by MADR, the justification before refinement too).

Without WordNet (eval/wordnet.py) the METEOR-based scores (``wordnet.METEOR_SCORES``) are saved as None and
named in ``not_computed``; the label scores do not need it.

Run ``python -m eval.averitec --predictions P --references R [--evidence E] [--json]``.
"""
import json
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from debate.data import claims
from debate.data.flags import Parser
from debate.data.inputs import DataError
from debate.data.labels import AVERITEC, LABELS, canonical_label
from eval import metrics, wordnet

LEVELS = (0.1, 0.2, 0.25, 0.3, 0.4, 0.5)
MAX_EVIDENCE = 10
UNPARSED = "unparsed"

PathArg = Union[str, Path]
Located = Sequence[Tuple[str, Dict[str, Any]]]  # (where, record): "entry 3" / "line 4" and what it holds
ById = Dict[Union[int, str], Tuple[str, Dict[str, Any]]]  # claim_id -> (where, record)


class InputError(ValueError):
    """Unusable predictions, references or evidence; the message names the file and the entry."""


def level_key(level: float) -> str:
    """Key for a level in the `averitec` dict: 0.25 -> "0.25", 0.1 -> "0.1"."""
    return f"{level:g}"


# ---------------------------------------------------------------- reading files


def read_records(path: PathArg) -> List[Tuple[str, dict]]:
    """(location, record) pairs from a JSON list or a JSONL file; location is "entry i" / "line n" (the
    data wing's reader, debate.data.claims.read_records, its errors as InputError)."""
    try:
        return claims.read_records(path)
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err}") from None
    except DataError as err:
        raise InputError(str(err)) from None


def _claim_id(record: Dict[str, Any], position: int, where: str) -> Union[int, str]:
    # Digit strings and ints name the same claim ("7" == 7); other strings are ids of their own.
    value = record.get("claim_id", position)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InputError(f"{where}: claim_id {value!r} is neither an integer nor a string")
    return value


def _label_of(record: Dict[str, Any], where: str) -> Any:
    # pred_label first: a submission may carry the gold `label` beside the prediction.
    for key in ("pred_label", "label"):
        if key in record:
            return record[key]
    raise InputError(f"{where} has no 'label' (or 'pred_label') key")


def _by_claim_id(located: Located, source: str, kind: str) -> ById:
    # A record without claim_id is taken to be aligned with the reference list (official layout).
    table: ById = {}
    for position, (where, record) in enumerate(located):
        where = f"{source}: {where}"
        cid = _claim_id(record, position, where)
        if cid in table:
            raise InputError(f"{where}: claim_id {cid} appears twice in the {kind}")
        table[cid] = (where, record)
    return table


def load_predictions(path: PathArg) -> List[dict]:
    """Prediction records from a JSON list or JSONL file, checked for a label key and claim_id."""
    located = read_records(path)
    _check_predictions(located, str(path))
    return [record for _, record in located]


def _check_predictions(located: Located, source: str) -> ById:
    table = _by_claim_id(located, source, "predictions")
    for where, record in table.values():
        _label_of(record, where)
    return table


# ---------------------------------------------------------------- evidence


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def evidence_strings(record: Dict[str, Any], where: str = "record") -> List[str]:
    """Comparison strings "question answer" of a record.

    Understands the official shape ``questions: [{question, answers: [{answer, answer_type,
    boolean_explanation}]}]`` (Boolean answers get ". " + explanation; a question without answers
    gives "question No answer could be found."), the flat ``evidence: [{question, answer}]`` our
    pipeline and HerO write, and the official ``string_evidence`` list of plain strings. Only the
    first non-empty one of these is used, in that order: a submission that carries the same
    evidence in two shapes must not have it matched twice.
    """
    try:
        if record.get("questions"):
            return _question_strings(record["questions"])
        if record.get("evidence"):
            return [item if isinstance(item, str)
                    else f"{_text(item.get('question'))} {_text(item.get('answer'))}"
                    for item in record["evidence"]]
        return [_text(s) for s in record.get("string_evidence") or []]
    except (AttributeError, TypeError):
        raise InputError(f"{where}: evidence is not in a known shape") from None


def gold_strings(reference: Dict[str, Any], where: str = "reference") -> List[str]:
    """Gold comparison strings: only the reference's annotated `questions`, never other evidence."""
    try:
        return _question_strings(reference.get("questions") or [])
    except (AttributeError, TypeError):
        raise InputError(f"{where}: questions are not in the AVeriTeC shape") from None


def _question_strings(questions: Any) -> List[str]:
    strings: List[str] = []
    for qa in questions:
        answers = qa.get("answers") or []
        if isinstance(answers, dict):
            answers = [answers]
        for answer in answers:
            text = f"{_text(qa.get('question'))} {_text(answer.get('answer'))}"
            if answer.get("answer_type") == "Boolean":
                text += ". " + _text(answer.get("boolean_explanation"))
            strings.append(text)
        if not answers:
            strings.append(f"{_text(qa.get('question'))} No answer could be found.")
    return strings


def evidence_score(candidates: Iterable[str], references: Sequence[str]) -> float:
    """Hungarian-matched METEOR sum over `candidates[:10]` x `references`, / len(references).

    0.0 when either side is empty (the official scorer would divide by zero without gold).
    """
    candidates = list(candidates)[:MAX_EVIDENCE]
    if not candidates or not references:
        return 0.0
    from scipy.optimize import linear_sum_assignment

    from eval.meteor import meteor_matrix

    matrix = meteor_matrix(candidates, list(references))
    rows, cols = linear_sum_assignment(matrix, maximize=True)
    return float(matrix[rows, cols].sum() / len(references))


# ---------------------------------------------------------------- per-claim results


def justification_score(candidate: Optional[str], reference: Optional[str]) -> float:
    """METEOR of a predicted justification against the gold one; 0.0 when the prediction has none."""
    candidate = _text(candidate).strip()
    if not candidate:
        return 0.0
    from eval.meteor import pairwise_meteor

    return pairwise_meteor(candidate, _text(reference).strip())


def _justification_scores(record: Dict[str, Any], reference: Dict[str, Any], meteor: bool = True) -> Dict[str, Any]:
    """The row's justification METEOR (None without a gold justification, or without `meteor`) and, for a
    record refined by MADR, that of its justification before refinement."""
    gold = _text(reference.get("justification")).strip()
    score = justification_score if meteor else (lambda candidate, reference: None)
    scores = {"justification_meteor": score(record.get("justification"), gold) if gold else None,
              "has_gold_justification": bool(gold)}
    if "justification_unrefined" in record:
        scores["justification_meteor_unrefined"] = score(record["justification_unrefined"], gold) if gold else None
    return scores


def _per_claim(pred_located: Located, ref_located: Located, evid_located: Located, pred_source: str,
               ref_source: str, evid_source: str, meteor: bool = True) -> Tuple[List[Dict[str, Any]], int]:
    preds = _check_predictions(pred_located, pred_source)
    if meteor:
        wordnet.load_wordnet()  # asked for METEOR: refused here, before any claim, when WordNet is not there
    refs = _by_claim_id(ref_located, ref_source, "references")
    supplied = _by_claim_id(evid_located, evid_source, "evidence") if evid_located else {}
    rows: List[Dict[str, Any]] = []
    for cid, (where, record) in preds.items():
        if cid not in refs:
            raise InputError(f"{where}: claim_id {cid} is not in the references ({ref_source})")
        ref_where, ref = refs[cid]
        gold = canonical_label(ref.get("label"))
        if gold is None:
            raise InputError(f"{ref_where}: gold label {ref.get('label')!r} is not one of {LABELS}")
        candidates = evidence_strings(record, where)
        if not candidates and cid in supplied:
            candidates = evidence_strings(supplied[cid][1], supplied[cid][0])
        pred = canonical_label(_label_of(record, where))
        rows.append({
            "claim_id": cid,
            "gold": gold,
            "pred": pred,
            "correct": pred == gold,
            "n_evidence": min(len(candidates), MAX_EVIDENCE),
            # None, never 0, when METEOR cannot run here: a missing score is not a bad one.
            "evidence_score": evidence_score(candidates, gold_strings(ref, ref_where)) if meteor else None,
            **_justification_scores(record, ref, meteor),
            "record": record,
        })
    return rows, len(refs)


def _located(records: Iterable[Dict[str, Any]]) -> List[Tuple[str, Dict[str, Any]]]:
    return [(f"entry {i}", record) for i, record in enumerate(records)]


# ---------------------------------------------------------------- metrics


def _ratio(num: float, den: float) -> Optional[float]:
    return num / den if den else None


def label_metrics(golds: Sequence[str], preds: Sequence[Optional[str]]) -> dict:
    """Accuracy, macro-F1, per-class precision / recall / F1, confusion and the NEE/CEC false-positive rates over
    the four AVeriTeC labels (eval.metrics.label_metrics)."""
    return metrics.label_metrics(golds, preds, AVERITEC)


def calibration(golds: Sequence[str], probs: Sequence[Optional[dict]], bins: int = metrics.ECE_BINS) -> Optional[dict]:
    """ECE and Brier over the four labels (eval.metrics.calibration)."""
    return metrics.calibration(golds, probs, AVERITEC, bins)


def metrics_from_rows(rows: Sequence[Dict[str, Any]], n_references: Optional[int] = None,
                      levels: Sequence[float] = LEVELS) -> Dict[str, Any]:
    """The full metrics dict from per-claim rows (see `score`).

    Rounds, tokens and parse status come from each row's prediction record, where it has them.
    """
    golds, preds = [r["gold"] for r in rows], [r["pred"] for r in rows]
    probs = [(r.get("record") or {}).get("label_probs") for r in rows]
    out = metrics.scored(golds, preds, probs, AVERITEC)
    n = len(rows)
    meteor = all(r["evidence_score"] is not None for r in rows)
    out["averitec"] = {
        level_key(level): _ratio(sum(r["correct"] and r["evidence_score"] > level for r in rows), n) if meteor
        else None
        for level in levels
    }
    out["evidence_score_mean"] = _ratio(sum(r["evidence_score"] for r in rows), n) if meteor else None
    out["n_without_evidence"] = sum(r["n_evidence"] == 0 for r in rows)
    # Only claims with a gold justification count; rows made by hand may carry no score at all.
    scored = [r["justification_meteor"] for r in rows if r.get("justification_meteor") is not None]
    out["justification_meteor"] = _ratio(sum(scored), len(scored))
    out["n_with_gold_justification"] = len(scored) if meteor else sum(r.get("has_gold_justification", 0) for r in rows)
    if any("justification_meteor_unrefined" in r for r in rows):
        unrefined = [r["justification_meteor_unrefined"] for r in rows
                     if r.get("justification_meteor_unrefined") is not None]
        out["justification_meteor_unrefined"] = _ratio(sum(unrefined), len(unrefined))
    if not meteor:
        out["not_computed"] = [key for key in wordnet.METEOR_SCORES if key in out]
    if n_references is not None:
        out["n_references"] = n_references
        out["n_missing"] = n_references - n
    out.update(metrics.run_stats([r["record"] for r in rows if "record" in r]))
    return out


def meteor_available() -> bool:
    """Whether METEOR can run here (WordNet found); the scores that need it are left out otherwise."""
    return wordnet.missing_reason() is None


def score(predictions: Iterable[Dict[str, Any]], references: Iterable[Dict[str, Any]],
          evidence: Optional[Iterable[Dict[str, Any]]] = None, *,
          levels: Sequence[float] = LEVELS, meteor: Optional[bool] = None) -> Dict[str, Any]:
    """Metrics for `predictions` against `references` (both lists of dicts).

    Only predicted claims are scored; `n_missing` counts reference claims with no prediction.
    `evidence` supplies evidence for predictions that carry none. Keys: n, n_references, n_missing, accuracy, macro_f1,
    per_class_f1, confusion (gold ->
    pred -> count, with an "unparsed" column), fpr, n_unparsed, averitec (level string -> score),
    evidence_score_mean, n_without_evidence, justification_meteor (mean METEOR of the predicted
    justification against the gold one, over the n_with_gold_justification claims that have one),
    justification_meteor_unrefined (when any record carries MADR's justification_unrefined), and when
    the records carry them rounds, tokens, parse_status, and calibration (ECE, Brier) over the records with
    `label_probs`.

    `meteor`: compute the METEOR-based scores (True: WordNet must be there), leave them None and list them in
    `not_computed` (False); None (the default) computes them where WordNet is found.
    """
    rows, n_refs = _per_claim(
        _located(predictions), _located(references), _located(evidence or []),
        "predictions", "references", "evidence", meteor_available() if meteor is None else meteor,
    )
    return metrics_from_rows(rows, n_refs, levels)


def score_files(predictions_path: PathArg, references_path: PathArg, evidence_path: Optional[PathArg] = None,
                levels: Sequence[float] = LEVELS, meteor: Optional[bool] = None) -> Dict[str, Any]:
    """`score` over files; errors name the file and the entry (JSON list) or line (JSONL)."""
    rows, n_refs = rows_from_files(predictions_path, references_path, evidence_path,
                                   meteor_available() if meteor is None else meteor)
    return metrics_from_rows(rows, n_refs, levels)


def rows_from_files(predictions_path: PathArg, references_path: PathArg, evidence_path: Optional[PathArg] = None,
                    meteor: bool = True) -> Tuple[List[Dict[str, Any]], int]:
    """Per-claim rows and the reference count, read from files."""
    return _per_claim(
        read_records(predictions_path), read_records(references_path),
        read_records(evidence_path) if evidence_path else [],
        str(predictions_path), str(references_path), str(evidence_path), meteor,
    )


# ---------------------------------------------------------------- command line


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item"):  # numpy scalar
        return value.item()
    return value


def build_parser() -> Parser:
    parser = Parser(prog="python -m eval.averitec", description=__doc__.split("\n")[0])
    parser.add_argument("--predictions", required=True, help="JSON list or JSONL of predictions")
    parser.add_argument("--references", required=True, help="AVeriTeC dev.json-shaped file")
    parser.add_argument("--evidence", help="evidence for predictions that carry none (JSONL/JSON; default: none)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (scores as fractions; the table shows percentages)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from eval.wordnet import WordNetMissingError

    meteor = meteor_available()
    if not meteor:  # said first, before any file is read
        print(f"note: {wordnet.missing_reason()}", file=sys.stderr)
    try:
        metrics = score_files(args.predictions, args.references, args.evidence, meteor=meteor)
    except (InputError, WordNetMissingError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(_jsonable(metrics), sort_keys=True))
    else:
        from eval.report import summary_table

        print(summary_table(metrics, rescore="run this command again to add them."))
    if metrics.get("n") and metrics["n_without_evidence"] == metrics["n"] and not metrics.get("not_computed"):
        print("note: no prediction carries evidence, so every AVeriTeC score is 0 "
              "(pass --evidence with the evidence the system used)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
