"""Score retrieved evidence on its own, without a verdict: the AVeriTeC scorer's two evidence measures.

For each claim with golden question-answer pairs, the retrieved items (at most 10) are matched one to one with the
golden ones by the Hungarian algorithm over pairwise METEOR, and the matched sum is divided by the number of golden
strings (eval.averitec.evidence_score):
- question-only: the retrieved questions against the golden questions (one string per golden question);
- question+answer: "question answer" strings against the golden "question answer" strings (one per golden answer,
  a Boolean answer followed by its explanation), the strings the AVeriTeC score thresholds.
Each measure is the mean over the claims of the references that the file covers.

    python -m eval.evidence_score RETRIEVED.jsonl --references dev.json [--json]
"""
import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from eval.averitec import MAX_EVIDENCE, InputError, _by_claim_id, evidence_score, gold_strings, read_records


def question_strings(reference: Dict[str, Any]) -> List[str]:
    """The golden questions of a reference, one string per question."""
    return [str(q.get("question") or "") for q in reference.get("questions") or [] if isinstance(q, dict)]


def claim_scores(record: Dict[str, Any], reference: Dict[str, Any], where: str = "record") -> Dict[str, float]:
    """{"question_only", "question_answer"} of one claim's retrieved evidence against its golden pairs."""
    items = record.get("evidence")
    if not isinstance(items, list) or not all(isinstance(e, dict) for e in items):
        raise InputError(f"{where}: field 'evidence': expected a list of {{question, answer, url}} objects")
    items = items[:MAX_EVIDENCE]
    questions = [str(e.get("question") or "") for e in items]
    pairs = [f"{e.get('question') or ''} {e.get('answer') or e.get('text') or ''}" for e in items]
    return {"question_only": evidence_score(questions, question_strings(reference)),
            "question_answer": evidence_score(pairs, gold_strings(reference))}


def score(retrieved: List[Tuple[str, Dict[str, Any]]], references: List[Tuple[str, Dict[str, Any]]],
          sources: Tuple[str, str] = ("retrieved", "references")) -> Dict[str, Any]:
    """Mean scores over the references with golden pairs that `retrieved` covers; both are lists of
    (location, record). Returns {"n", "question_only", "question_answer", "n_missing", "per_claim"}."""
    found = _by_claim_id(retrieved, sources[0], "retrieved evidence")
    refs = _by_claim_id(references, sources[1], "references")
    rows: List[Dict[str, Any]] = []
    missing = 0
    for cid, (where, ref) in refs.items():
        if not ref.get("questions"):
            continue  # an unlabelled claim has nothing to match
        if cid not in found:
            missing += 1
            continue
        rows.append({"claim_id": cid, **claim_scores(found[cid][1], ref, found[cid][0])})
    n = len(rows)
    mean = {k: (sum(r[k] for r in rows) / n if n else None) for k in ("question_only", "question_answer")}
    return {"n": n, **mean, "n_missing": missing, "per_claim": rows}


def score_files(retrieved_path: Union[str, Path], references_path: Union[str, Path]) -> Dict[str, Any]:
    return score(read_records(retrieved_path), read_records(references_path),
                 (str(retrieved_path), str(references_path)))


def summary_line(result: Dict[str, Any]) -> str:
    if not result["n"]:
        return "evidence scores: no claim with golden pairs is in the file"
    text = (f"evidence (Hungarian METEOR over {result['n']} claims): question-only {result['question_only']:.4f}, "
            f"question+answer {result['question_answer']:.4f}")
    return text + (f" ({result['n_missing']} claims of the references not in the file)" if result["n_missing"] else "")


def build_parser() -> argparse.ArgumentParser:
    """The flags of `python -m eval.evidence_score` (tests/test_docs.py checks the documented commands against them)."""
    from debate.data.flags import Parser  # one-line errors; the scoring itself imports nothing above data

    parser = Parser(prog="python -m eval.evidence_score", description=__doc__.split("\n")[0])
    parser.add_argument("retrieved", help="retrieved evidence (JSONL or JSON list of {claim_id, evidence})")
    parser.add_argument("--references", required=True, help="the split with golden pairs (AVeriTeC's dev.json)")
    parser.add_argument("--json", action="store_true", help="print one JSON object, per-claim scores included")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from eval.wordnet import WordNetMissingError

    try:
        result = score_files(args.retrieved, args.references)
    except (InputError, WordNetMissingError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, sort_keys=True) if args.json else summary_line(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
